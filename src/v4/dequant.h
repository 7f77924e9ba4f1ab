// DeepSeek-V4's quantized checkpoint layout, read into f32 at load (issue 40, section 2).
//
// The release stores the projections as FP8 and the routed experts as MXFP4 (io/quantized.h):
//   FP8    "X.weight" F8_E4M3 [out, in]      "X.scale" F8_E8M0 [ceil(out/128), ceil(in/128)]
//   MXFP4  "X.weight" I8 (or U8) [out, in/2] "X.scale" F8_E8M0 [out, in/32]   (routed experts)
// Both are decoded exactly (an e4m3 or e2m1 value times a power of two is an f32), so a quantized
// checkpoint and its dequantized f32 twin give bitwise the same model. The activations are not
// quantized: phasekv computes in f32, as llama.cpp does with these weights.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>

#include "v4/config.h"
#include "v4/weights.h"

namespace phasekv::v4 {

// A tensor as a shard stores it: libtorch 1.13 has no float8 types, so F8_E4M3, F8_E8M0 and U8
// all arrive as uint8 and `dtype` (the safetensors name) tells them apart.
struct StoredTensor {
  torch::Tensor data;
  std::string dtype;
};
using StoredTensors = std::map<std::string, StoredTensor>;

// Whether the stored tensor of spec `s` is in a quantized layout (F8_E4M3, or I8/U8 for a routed
// expert).
bool is_quantized(const TensorSpec& s, const StoredTensor& t);

// The f32 value of the quantized weight `s` stored in `found`, read with its "X.scale" (which is
// erased from `found`). Throws Error naming `dir`, the tensor and what is allowed for a missing
// scale, a wrong dtype or shape, NaN codes, or a checkpoint whose config.json (`cfg`) does not
// declare the layout (quantization_config; expert_dtype "fp4" for MXFP4 experts).
torch::Tensor dequant_v4_weight(const std::string& dir, const V4Config& cfg, const TensorSpec& s,
                                StoredTensors& found);

}  // namespace phasekv::v4
