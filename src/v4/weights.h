// The tensors of a DeepSeek-V4 checkpoint, under the official Hugging Face names that DeepSeek's
// release and llama.cpp's converter (conversion/deepseek.py) use: "embed.weight",
// "layers.{i}.attn.wq_a.weight", "layers.{i}.ffn.experts.{e}.w1.weight", ... One table
// (tensor_specs) gives every name and shape; initialisation, loading and saving all walk it, so a
// checkpoint with a missing, extra or misshapen tensor fails with that tensor's name.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "v4/config.h"

namespace phasekv::v4 {

enum class Init {
  kLinear,     // N(0, 1/fan_in): projections [out, in]
  kEmbed,      // N(0, 0.25)
  kNorm,       // 1 + N(0, 0.01): RMSNorm weights, perturbed so that a skipped norm shows
  kHcScale,    // U(0.5, 1): the hyper-connection mix scales
  kSmall,      // N(0, 0.25): biases, ape, hc bases
  kSink,       // N(0, 1): attention sinks
  kHashTable,  // token -> num_experts_per_tok distinct experts (int64)
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
};

// Tensors by official name.
using TensorMap = std::map<std::string, torch::Tensor>;

std::string layer_name(int64_t layer, const std::string& suffix);
// The tensor `name`; a missing one is a bug of the caller (the loader checked the table).
const torch::Tensor& get(const TensorMap& w, const std::string& name);
std::vector<TensorSpec> tensor_specs(const V4Config& cfg);

}  // namespace phasekv::v4
