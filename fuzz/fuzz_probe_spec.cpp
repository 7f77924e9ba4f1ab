// The specs of `phasekv probe` and `phasekv flips`: TOML (the form people write) or, when the input
// starts with '{', JSON (the probe specs the flip search writes). Both parsers read every input,
// as a user may hand either command either file.
#include "fuzz_util.h"
#include "probe/flip_search.h"
#include "probe/probe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phasekv;
  const bool is_json = size > 0 && data[0] == '{';
  const std::string path = fuzz::input_file(is_json ? "spec.json" : "spec.toml", data, size);
  fuzz::expect_only_phasekv_errors([&] { probe_spec_from_file(path); });
  fuzz::expect_only_phasekv_errors([&] { flip_search_spec_from_file(path); });
  return 0;
}
