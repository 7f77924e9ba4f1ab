#include "model/model_dir.h"

#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "io/safetensors.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/hash.h"

namespace phasekv {

void save_model_dir(const std::string& dir, Decoder& model, torch::ScalarType dtype,
                    const std::map<std::string, std::string>& metadata) {
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16)
    throw Error("save_model_dir: weights are stored as f32 or bf16 only");
  std::filesystem::create_directories(dir);
  NamedTensors tensors;
  for (const auto& item : model->named_parameters())
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kCPU, dtype).contiguous());
  auto meta = metadata;
  meta["format"] = "phasekv";
  save_safetensors(dir + "/model.safetensors", tensors, meta);
  write_file_atomic(dir + "/config.json", model_config_to_json(model->cfg).dump(2) + "\n");
}

Decoder load_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw Error("model directory " + dir + " does not exist");
  const std::string cfg_path = dir + "/config.json", w_path = dir + "/model.safetensors";
  if (!fs::exists(cfg_path)) throw Error("model directory " + dir + " has no config.json");
  if (!fs::exists(w_path)) throw Error("model directory " + dir + " has no model.safetensors");
  auto cfg = model_config_from_file(cfg_path);
  const SafetensorsFile file = load_safetensors(w_path);
  // Before the Decoder allocates: a config far larger than the weights is an error now.
  double held = 0;
  for (const auto& item : file.tensors) held += static_cast<double>(item.second.numel());
  const double implied = min_parameter_count(cfg);
  if (implied > held)
    throw Error(fmt::format(
        "{}: its sizes imply at least {:.0f} parameters but {} holds {:.0f} (the config does not "
        "describe these weights)",
        cfg_path, implied, w_path, held));
  Decoder model(cfg);
  copy_weights(model, file, w_path);
  model->eval();
  return model;
}

void load_weights(Decoder& model, const std::string& w_path) {
  if (!std::filesystem::exists(w_path)) throw Error(w_path + " does not exist");
  copy_weights(model, load_safetensors(w_path), w_path);
}

void copy_weights(Decoder& model, const SafetensorsFile& file, const std::string& w_path) {
  std::set<std::string> expected;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    expected.insert(item.key());
    item.value().copy_(take_tensor(file, w_path, item.key(), item.value().sizes()));
  }
  for (const auto& [name, t] : file.tensors)
    if (!expected.count(name))
      throw Error(w_path + ": unexpected tensor '" + name +
                  "': config.json describes no such parameter");
}

std::string config_hash(const ModelConfig& cfg) {
  return fnv1a64_hex(model_config_to_json(cfg).dump()).substr(0, 12);
}

}  // namespace phasekv
