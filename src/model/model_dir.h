// A model directory: config.json (ModelConfig) + model.safetensors (weights, f32 or bf16).
// Loading checks every tensor against the config, so a wrong file fails early with a sentence.
#pragma once
#include <string>

#include "config/model_config.h"
#include "model/decoder.h"

namespace phasekv {

void save_model_dir(const std::string& dir, Decoder& model,
                    torch::ScalarType dtype = torch::kFloat32,
                    const std::map<std::string, std::string>& metadata = {});
Decoder load_model_dir(const std::string& dir);
// A short stable identifier of a config (hex of a hash of its canonical JSON).
std::string config_hash(const ModelConfig& cfg);

}  // namespace phasekv
