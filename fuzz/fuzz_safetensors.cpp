// A safetensors file (model.safetensors, a checkpoint's weights): the torch-free header parser
// that load_safetensors trusts to locate every tensor's bytes. Besides the error contract, a
// header that parses must keep the promises the loader's memcpy relies on: every entry's bytes
// lie inside the file, its span is its shape times its dtype's size, and the entries cover the
// data section exactly once, in order.
#include "fuzz_util.h"
#include "io/safetensors_header.h"

namespace {

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phasekv;
  const std::string bytes = fuzz::as_string(data, size);
  fuzz::expect_only_phasekv_errors([&] {
    const SafetensorsHeader h = parse_safetensors_header("fuzz.safetensors", bytes);
    if (h.data_start < 8 || h.data_start > bytes.size()) finding("data section outside the file");
    uint64_t expected = 0;
    for (const SafetensorsEntry& e : h.entries) {
      size_t element = 0;
      for (const auto& [name, s] : safetensors_dtypes())
        if (name == e.dtype) element = s;
      if (element == 0) finding("tensor '" + e.name + "' has dtype '" + e.dtype + "'");
      uint64_t span = element;
      for (int64_t d : e.shape) {
        if (d < 0) finding("negative dimension in '" + e.name + "'");
        span *= static_cast<uint64_t>(d);  // cannot overflow: the parser checked the product
      }
      if (e.begin != expected || e.end - e.begin != span)
        finding("tensor '" + e.name + "' does not continue the data section with its own size");
      expected = e.end;
    }
    if (h.data_start + expected != bytes.size()) finding("unclaimed or missing data bytes");
  });
  return 0;
}
