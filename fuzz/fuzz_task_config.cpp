// task.json of a trained model directory (load_task_config), which every sweep reads first.
#include <filesystem>

#include "fuzz_util.h"
#include "task/task_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phasekv;
  const std::string path = fuzz::input_file("task.json", data, size);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  fuzz::expect_only_phasekv_errors([&] { load_task_config(dir); });
  return 0;
}
