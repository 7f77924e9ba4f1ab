// A DeepSeek-V4 checkpoint directory as Hugging Face lays it out: config.json with
// DeepseekV4ForCausalLM's keys and the weights in one or more *.safetensors files under the
// official tensor names (f32 or bf16; the hash-routing tables int32 or int64). Loading checks every
// tensor of tensor_specs against the files: a missing, misshapen, duplicated or unknown tensor
// throws phasekv::Error naming the directory and the tensor.
#pragma once
#include <string>

#include "v4/model.h"

namespace phasekv::v4 {

// Whether dir/config.json exists and names DeepseekV4ForCausalLM (or model_type deepseek_v4).
bool is_v4_model_dir(const std::string& dir);
V4Model load_v4_dir(const std::string& dir);
// Writes dir/config.json and dir/model.safetensors; floating tensors in `dtype` (f32 or bf16),
// the hash tables as int32 (their dtype in DeepSeek's release).
void save_v4_dir(const std::string& dir, const V4Model& model,
                 torch::ScalarType dtype = torch::kFloat32);

}  // namespace phasekv::v4
