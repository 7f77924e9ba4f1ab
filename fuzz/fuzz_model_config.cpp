// config.json of a model directory: model_config_from_file, then the round trip a saved model
// relies on (to_json -> from_json gives the same config).
#include "config/model_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phasekv;
  const std::string path = fuzz::input_file("config.json", data, size);
  fuzz::expect_only_phasekv_errors([&] {
    const ModelConfig c = model_config_from_file(path);
    const nlohmann::json j = model_config_to_json(c);
    if (model_config_to_json(model_config_from_json(j, "round trip")) != j) {
      std::fprintf(stderr, "fuzz finding: config round trip differs: %s\n", j.dump().c_str());
      std::abort();
    }
  });
  return 0;
}
