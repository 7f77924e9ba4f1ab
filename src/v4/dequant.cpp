#include "v4/dequant.h"

#include <fmt/format.h>

#include <span>

#include "io/quantized.h"
#include "util/error.h"

namespace phasekv::v4 {
namespace {

// quantization_config's weight_block_size: config.cpp accepts [128, 128] only.
constexpr int64_t kBlock = 128;
constexpr int64_t kMxGroup = 32;  // MXFP4: one scale per 32 values of a row

std::string shape_str(at::IntArrayRef s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

bool is_routed_expert(const std::string& name) {
  return name.find(".ffn.experts.") != std::string::npos;
}

bool is_byte_code(const std::string& dtype) {
  return dtype == "I8" || dtype == "U8";
}

std::span<const uint8_t> bytes_of(const torch::Tensor& t) {
  return {static_cast<const uint8_t*>(t.data_ptr()), static_cast<size_t>(t.nbytes())};
}

void expect_shape(const std::string& dir, const std::string& name, const std::string& what,
                  const torch::Tensor& t, at::IntArrayRef want) {
  if (t.sizes() != want)
    throw Error(fmt::format("{}: tensor '{}' has shape {} (expected {}: {})", dir, name,
                            shape_str(t.sizes()), shape_str(want), what));
}

// The scale of weight `name`, checked and taken out of `found` (so that a scale without its
// weight stays behind and is reported as an unexpected tensor).
torch::Tensor take_scale(const std::string& dir, const std::string& name, StoredTensors& found,
                         at::IntArrayRef want, const std::string& layout) {
  const std::string scale = name.substr(0, name.size() - std::string(".weight").size()) + ".scale";
  auto it = found.find(scale);
  if (it == found.end())
    throw Error(
        fmt::format("{}: tensor '{}' is {} but its scale '{}' is missing (expected "
                    "F8_E8M0 {})",
                    dir, name, layout, scale, shape_str(want)));
  // U8 holds the same E8M0 bytes where a writer has no float8_e8m0 type.
  if (it->second.dtype != "F8_E8M0" && it->second.dtype != "U8")
    throw Error(
        fmt::format("{}: tensor '{}' has dtype {} (allowed: F8_E8M0 or U8 E8M0 "
                    "bytes, quantization_config's scale_fmt ue8m0)",
                    dir, scale, it->second.dtype));
  expect_shape(dir, scale, "one scale per " + layout + " block of '" + name + "'", it->second.data,
               want);
  torch::Tensor out = it->second.data.contiguous();
  found.erase(it);
  return out;
}

torch::Tensor dequant_fp8(const std::string& dir, const TensorSpec& s, const torch::Tensor& w,
                          StoredTensors& found) {
  const int64_t rows = s.shape[0], cols = s.shape[1];
  expect_shape(dir, s.name, "F8_E4M3 [out, in] from config.json", w, s.shape);
  const int64_t brows = (rows + kBlock - 1) / kBlock, bcols = (cols + kBlock - 1) / kBlock;
  const torch::Tensor scale =
      take_scale(dir, s.name, found, {brows, bcols}, "FP8 (128x128 blocks)");
  const std::vector<float> scales =
      scales_to_float(bytes_of(scale), "F8_E8M0", brows * bcols, dir + ": " + s.name + " scale");
  torch::Tensor out = torch::empty({rows, cols}, torch::kFloat32);
  dequant_fp8_blocks_into(bytes_of(w.contiguous()), scales, rows, cols, kBlock, dir + ": " + s.name,
                          out.data_ptr<float>());
  return out;
}

torch::Tensor dequant_mx(const std::string& dir, const TensorSpec& s, const torch::Tensor& w,
                         StoredTensors& found) {
  const int64_t rows = s.shape[0], cols = s.shape[1];
  if (cols % kMxGroup != 0)
    throw Error(
        fmt::format("{}: tensor '{}' is MXFP4 but its width {} is not a multiple of 32 "
                    "(one scale per 32 values)",
                    dir, s.name, cols));
  expect_shape(dir, s.name, "MXFP4, two e2m1 codes per byte, [out, in/2] from config.json", w,
               {rows, cols / 2});
  const torch::Tensor scale =
      take_scale(dir, s.name, found, {rows, cols / kMxGroup}, "MXFP4 (32 values)");
  torch::Tensor out = torch::empty({rows, cols}, torch::kFloat32);
  dequant_mxfp4_into(bytes_of(w.contiguous()), bytes_of(scale), rows, cols, dir + ": " + s.name,
                     out.data_ptr<float>());
  return out;
}

bool declared(const V4Config& cfg, const char* key) {
  return cfg.passthrough.contains(key) && !cfg.passthrough.at(key).is_null();
}

}  // namespace

bool is_quantized(const TensorSpec& s, const StoredTensor& t) {
  return t.dtype == "F8_E4M3" || (is_byte_code(t.dtype) && is_routed_expert(s.name));
}

torch::Tensor dequant_v4_weight(const std::string& dir, const V4Config& cfg, const TensorSpec& s,
                                StoredTensors& found) {
  const StoredTensor& t = found.at(s.name);
  const bool fp8 = t.dtype == "F8_E4M3";
  const std::string name = s.name;
  if (s.shape.size() != 2 || name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0)
    throw Error(
        fmt::format("{}: tensor '{}' is {} but only [out, in] '.weight' projections are "
                    "quantized (allowed: F32 or BF16)",
                    dir, name, t.dtype));
  if (!declared(cfg, "quantization_config"))
    throw Error(
        fmt::format("{}: tensor '{}' is {} but config.json has no quantization_config "
                    "(allowed: F32 or BF16 weights, or DeepSeek-V4's quantization_config)",
                    dir, name, t.dtype));
  const std::string expert_dtype =
      declared(cfg, "expert_dtype") ? cfg.passthrough.at("expert_dtype").get<std::string>() : "";
  if (!fp8 && expert_dtype != "fp4")
    throw Error(
        fmt::format("{}: tensor '{}' is {} MXFP4 codes but config.json's expert_dtype is "
                    "'{}' (allowed: \"fp4\" for MXFP4 experts)",
                    dir, name, t.dtype, expert_dtype));
  if (fp8 && is_routed_expert(name) && expert_dtype == "fp4")
    throw Error(
        fmt::format("{}: tensor '{}' is F8_E4M3 but config.json's expert_dtype is \"fp4\" "
                    "(allowed: MXFP4 routed experts, I8 or U8 codes with F8_E8M0 scales)",
                    dir, name));
  torch::Tensor w = t.data;
  torch::Tensor out = fp8 ? dequant_fp8(dir, s, w, found) : dequant_mx(dir, s, w, found);
  // e4m3's 0x7f/0xff and E8M0's 0xff encode NaN: a corrupt shard, not a weight.
  if (torch::isnan(out).any().item<bool>())
    throw Error(
        fmt::format("{}: tensor '{}' decodes to NaN (a NaN e4m3 code or a 0xff scale)", dir, name));
  found.erase(s.name);
  return out;
}

}  // namespace phasekv::v4
