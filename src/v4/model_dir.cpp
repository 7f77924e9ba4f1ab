#include "v4/model_dir.h"

#include <fmt/format.h>

#include <filesystem>

#include "io/safetensors.h"
#include "util/error.h"
#include "util/fs.h"
#include "v4/dequant.h"

namespace phasekv::v4 {

namespace fs = std::filesystem;

bool is_v4_model_dir(const std::string& dir) {
  return is_v4_config_file((fs::path(dir) / "config.json").string());
}

namespace {

// Every *.safetensors of the directory (HF shards model-0000k-of-0000n too), merged by name, with
// each tensor's stored dtype (the quantized layout needs the names: F8_E4M3 and U8 load alike).
StoredTensors read_shards(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw Error(dir + ": no *.safetensors file (expected model.safetensors)");
  StoredTensors all;
  for (const fs::path& f : files) {
    SafetensorsFile file = load_safetensors(f.string());
    for (auto& [name, t] : file.tensors)
      if (!all.emplace(name, StoredTensor{t, file.dtypes.at(name)}).second)
        throw Error(dir + ": tensor '" + name +
                    "' appears in two files (the second: " + f.filename().string() + ")");
  }
  return all;
}

std::string shape_str(at::IntArrayRef s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// Tensors a checkpoint may hold that phasekv does not run: the MTP layers, the vision routing
// bias, and the selection bias of hash layers (llama.cpp's converter drops it too: hash layers
// route by the table).
bool skipped(const V4Config& c, const std::string& name) {
  if (name.rfind("mtp.", 0) == 0) return true;
  const std::string vl = ".ffn.gate.bias_vl";
  if (name.size() > vl.size() && name.compare(name.size() - vl.size(), vl.size(), vl) == 0)
    return true;
  for (int64_t i = 0; i < c.num_hash_layers; ++i)
    if (name == layer_name(i, "ffn.gate.bias")) return true;
  return false;
}

torch::Tensor checked_table(const std::string& dir, const std::string& name, const torch::Tensor& t,
                            int64_t n_experts) {
  if (t.scalar_type() != torch::kInt32 && t.scalar_type() != torch::kInt64)
    throw Error(dir + ": tensor '" + name + "' must be I32 or I64 (a token -> experts table)");
  auto table = t.to(torch::kInt64);
  if (table.numel() > 0 &&
      (table.min().item<int64_t>() < 0 || table.max().item<int64_t>() >= n_experts))
    throw Error(dir + ": tensor '" + name + "' holds expert ids outside [0, " +
                std::to_string(n_experts) + ")");
  return table;
}

}  // namespace

V4Model load_v4_dir(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw Error(config_path + " does not exist");
  V4Model model(read_config(config_path));
  auto found = read_shards(dir);
  for (const TensorSpec& s : tensor_specs(model.cfg)) {
    auto it = found.find(s.name);
    if (it == found.end())
      throw Error(fmt::format("{}: missing tensor '{}' (expected shape {})", dir, s.name,
                              shape_str(s.shape)));
    if (is_quantized(s, it->second)) {
      model.tensors[s.name] = dequant_v4_weight(dir, model.cfg, s, found);
      continue;
    }
    const torch::Tensor& t = it->second.data;
    if (t.sizes() != at::IntArrayRef(s.shape))
      throw Error(fmt::format("{}: tensor '{}' has shape {} (expected {} from config.json)", dir,
                              s.name, shape_str(t.sizes()), shape_str(s.shape)));
    if (s.init == Init::kHashTable)
      model.tensors[s.name] = checked_table(dir, s.name, t, model.cfg.n_routed_experts);
    else if (t.is_floating_point())
      model.tensors[s.name] = t.to(torch::kFloat32).contiguous();
    else
      throw Error(
          fmt::format("{}: tensor '{}' has dtype {} (allowed: F32 or BF16; F8_E4M3 with "
                      "a '.scale' for a projection, I8 or U8 MXFP4 codes for a routed "
                      "expert)",
                      dir, s.name, it->second.dtype));
    found.erase(it);
  }
  for (const auto& [name, t] : found)
    if (!skipped(model.cfg, name))
      throw Error(dir + ": unexpected tensor '" + name +
                  "' (not a DeepSeek-V4 tensor for this config.json)");
  return model;
}

void save_v4_dir(const std::string& dir, const V4Model& model, torch::ScalarType dtype) {
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16)
    throw Error("save_v4_dir: dtype must be f32 or bf16");
  ensure_directory(dir);
  NamedTensors out;
  for (const TensorSpec& s : tensor_specs(model.cfg)) {
    const torch::Tensor& t = model.tensors.at(s.name);
    out.emplace_back(s.name, s.init == Init::kHashTable ? t.to(torch::kInt32)
                                                        : t.detach().to(dtype).contiguous());
  }
  save_safetensors((fs::path(dir) / "model.safetensors").string(), out, {{"format", "pt"}});
  // The weights are written dequantized, so the quantized layout's keys no longer describe them.
  V4Config cfg = model.cfg;
  cfg.passthrough.erase("quantization_config");
  cfg.passthrough.erase("expert_dtype");
  write_config((fs::path(dir) / "config.json").string(), cfg);
}

}  // namespace phasekv::v4
