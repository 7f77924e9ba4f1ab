// A training config: TOML (the form people write) or, when the input starts with '{', the JSON a
// suite run resolves to. Both go through train_config_from_file, as `phasekv train` does.
#include "fuzz_util.h"
#include "train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phasekv;
  const bool is_json = size > 0 && data[0] == '{';
  const std::string path = fuzz::input_file(is_json ? "train.json" : "train.toml", data, size);
  fuzz::expect_only_phasekv_errors([&] { train_config_from_file(path); });
  return 0;
}
