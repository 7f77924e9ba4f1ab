// A reproduction suite file (TOML): load_suite merges each run over the base and validates it.
// The study's base config sits beside every input, so `base = "study-base.toml"` resolves and the
// fuzzer reaches the per-run merging and validation, not only "no such file".
#include <filesystem>

#include "fuzz_util.h"
#include "suite/suite.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phasekv;
  const std::string path = fuzz::input_file("suite.toml", data, size);
  static const bool base_copied = [&] {
    const auto dir = std::filesystem::path(path).parent_path();
    std::filesystem::copy_file(
        std::filesystem::path(PHASEKV_SOURCE_DIR) / "configs/repro/study-base.toml",
        dir / "study-base.toml", std::filesystem::copy_options::overwrite_existing);
    return true;
  }();
  (void)base_copied;
  fuzz::expect_only_phasekv_errors([&] { load_suite(path); });
  return 0;
}
