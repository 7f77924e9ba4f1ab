// A model directory: config.json (ModelConfig) + model.safetensors (weights, f32 or bf16).
// Loading checks every tensor against the config, so a wrong file fails early with a sentence.
#pragma once
#include <string>

#include "config/model_config.h"
#include "io/safetensors.h"
#include "model/decoder.h"

namespace phasekv {

void save_model_dir(const std::string& dir, Decoder& model,
                    torch::ScalarType dtype = torch::kFloat32,
                    const std::map<std::string, std::string>& metadata = {});
Decoder load_model_dir(const std::string& dir);
// Copies the tensors of a weights file into `model` (every parameter, strictly: a missing, extra or
// misshapen tensor throws phasekv::Error naming the file). load_model_dir uses it; so do analyses
// of training checkpoints (checkpoint/model.safetensors has no config.json of its own).
void load_weights(Decoder& model, const std::string& safetensors_path);
// load_weights on a file already read; `label` names it in errors.
void copy_weights(Decoder& model, const SafetensorsFile& file, const std::string& label);
// A short stable identifier of a config (hex of a hash of its canonical JSON).
std::string config_hash(const ModelConfig& cfg);

}  // namespace phasekv
