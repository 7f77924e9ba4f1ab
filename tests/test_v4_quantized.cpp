// DeepSeek-V4's quantized checkpoint layout (FP8 e4m3 projections with 128x128 E8M0 block scales,
// MXFP4 routed experts), written here byte by byte from the safetensors spec and read by
// load_v4_dir. The expected values come from an independent decoder below (bit fields, not
// io/quantized.cpp's table), and a quantized checkpoint must give bitwise the logits of its f32
// twin.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "test_util.h"
#include "test_v4_util.h"
#include "util/error.h"
#include "v4/model_dir.h"

using namespace phasekv;
using nlohmann::json;

namespace {

// One tensor of a hand-written safetensors file: the dtype name and the raw little-endian bytes.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

void write_safetensors(const std::filesystem::path& path, const std::vector<RawTensor>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  const std::string text = header.dump();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xff));
  out += text;
  for (const RawTensor& t : tensors) out += t.bytes;
  std::ofstream(path, std::ios::binary) << out;
}

std::string f32_bytes(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kFloat32).contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// float8_e4m3fn by its bit fields: sign, 4 exponent bits (bias 7), 3 mantissa bits.
float e4m3(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(8.0f + m, e - 10);
  return (b & 0x80) ? -mag : mag;
}
float e2m1(uint8_t code) {
  const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

// Random codes (never NaN) with scales 2^-8 .. 2^-4, and their exact f32 values.
struct Quantized {
  RawTensor weight, scale;
  torch::Tensor value;
};

Quantized random_fp8(const std::string& name, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
  Quantized q{
      {name, "F8_E4M3", {rows, cols}, std::string(rows * cols, '\0')},
      {name.substr(0, name.size() - 7) + ".scale", "F8_E8M0", {br, bc}, std::string(br * bc, '\0')},
      torch::empty({rows, cols})};
  for (char& s : q.scale.bytes) s = static_cast<char>(127 - 8 + rng() % 5);
  auto v = q.value.accessor<float, 2>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      uint8_t b = static_cast<uint8_t>(rng());
      if ((b & 0x7f) == 0x7f) b ^= 1;  // NaN -> 448
      q.weight.bytes[i * cols + j] = static_cast<char>(b);
      const int e = static_cast<uint8_t>(q.scale.bytes[(i / 128) * bc + j / 128]) - 127;
      v[i][j] = std::ldexp(e4m3(b), e);
    }
  return q;
}

Quantized random_mxfp4(const std::string& name, int64_t rows, int64_t cols, std::mt19937& rng) {
  Quantized q{{name, "I8", {rows, cols / 2}, std::string(rows * cols / 2, '\0')},
              {name.substr(0, name.size() - 7) + ".scale",
               "F8_E8M0",
               {rows, cols / 32},
               std::string(rows * cols / 32, '\0')},
              torch::empty({rows, cols})};
  for (char& s : q.scale.bytes) s = static_cast<char>(127 - 5 + rng() % 4);
  auto v = q.value.accessor<float, 2>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; j += 2) {
      const uint8_t b = static_cast<uint8_t>(rng());
      q.weight.bytes[i * cols / 2 + j / 2] = static_cast<char>(b);
      const int e = static_cast<uint8_t>(q.scale.bytes[i * (cols / 32) + j / 32]) - 127;
      v[i][j] = std::ldexp(e2m1(b & 0xF), e);  // element 2k: the low nibble
      v[i][j + 1] = std::ldexp(e2m1(b >> 4), e);
    }
  return q;
}

const json kQuantizationConfig = {{"quant_method", "fp8"},
                                  {"fmt", "e4m3"},
                                  {"scale_fmt", "ue8m0"},
                                  {"activation_scheme", "dynamic"},
                                  {"weight_block_size", {128, 128}}};

// Widths above 128 so that FP8 blocks are partial in both directions; experts 32 wide for MXFP4.
v4::V4Config quantizable_config() {
  v4::V4Config c = test::v4_small_config();
  c.hidden_size = 160;
  c.moe_intermediate_size = 32;
  return c;
}

// The projections DeepSeek's release stores in FP8, as deepseek4_random.py --quantize writes them.
bool fp8_in_release(const std::string& name) {
  static const std::regex re(
      R"(layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|compressor\.wkv|compressor\.wgate|)"
      R"(indexer\.wq_b|indexer\.compressor\.wkv|indexer\.compressor\.wgate)|)"
      R"(ffn\.shared_experts\.w[123])\.weight)");
  return std::regex_match(name, re);
}
bool routed_expert(const std::string& name) {
  static const std::regex re(R"(layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight)");
  return std::regex_match(name, re);
}

// A quantized checkpoint of `twin`'s config in `dir`: the release's projections and experts get
// random codes, and `twin`'s tensors become their exact values (the rest of `twin` is kept).
std::vector<RawTensor> quantize_into(v4::V4Model& twin, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<RawTensor> out;
  for (const v4::TensorSpec& s : v4::tensor_specs(twin.cfg)) {
    torch::Tensor& t = twin.tensors.at(s.name);
    if (fp8_in_release(s.name) || routed_expert(s.name)) {
      Quantized q = fp8_in_release(s.name) ? random_fp8(s.name, s.shape[0], s.shape[1], rng)
                                           : random_mxfp4(s.name, s.shape[0], s.shape[1], rng);
      t = q.value;
      out.push_back(std::move(q.weight));
      out.push_back(std::move(q.scale));
    } else if (s.init == v4::Init::kHashTable) {
      torch::Tensor i32 = t.to(torch::kInt32).contiguous();
      out.push_back({s.name, "I32", s.shape,
                     std::string(static_cast<const char*>(i32.data_ptr()), i32.nbytes())});
    } else {
      out.push_back({s.name, "F32", s.shape, f32_bytes(t)});
    }
  }
  return out;
}

void write_quantized_dir(const std::filesystem::path& dir, const v4::V4Config& cfg,
                         const std::vector<RawTensor>& tensors,
                         json quantization = kQuantizationConfig) {
  json j = v4::config_to_json(cfg);
  j["quantization_config"] = std::move(quantization);
  j["expert_dtype"] = "fp4";
  test::write_text(dir / "config.json", j.dump(2));
  write_safetensors(dir / "model.safetensors", tensors);
}

}  // namespace

// One attention layer's FP8 projections and one expert's MXFP4 weights, synthesised: each loads to
// its exact values, block by block and nibble by nibble.
TEST(V4Quantized, SynthesisedLayerLoadsExactly) {
  v4::V4Model twin(quantizable_config());
  twin.init_random(3);
  std::vector<RawTensor> tensors = quantize_into(twin, 4);
  // A few codes whose values are known by heart, at a partial block's corner: wq_a is [8, 160],
  // so column 150 is in the second scale block.
  for (RawTensor& t : tensors)
    if (t.name == "layers.2.attn.wq_a.weight") {
      t.bytes[150] = '\x38';  // 1.0
      t.bytes[151] = '\xc0';  // -2.0
      t.bytes[152] = '\x7e';  // 448
      t.bytes[153] = '\x01';  // 2^-9, the smallest subnormal
    } else if (t.name == "layers.2.attn.wq_a.scale") {
      t.bytes[1] = static_cast<char>(127 + 3);  // 8
    }
  const auto dir = test::temp_dir("v4q_layer");
  write_quantized_dir(dir, twin.cfg, tensors);
  v4::V4Model m = v4::load_v4_dir(dir.string());
  const torch::Tensor wq_a = m.tensors.at("layers.2.attn.wq_a.weight");
  EXPECT_EQ(wq_a[0][150].item<float>(), 8.0f);
  EXPECT_EQ(wq_a[0][151].item<float>(), -16.0f);
  EXPECT_EQ(wq_a[0][152].item<float>(), 3584.0f);
  EXPECT_EQ(wq_a[0][153].item<float>(), std::ldexp(1.0f, -6));
  for (const auto& name :
       {"layers.2.attn.wkv.weight", "layers.1.attn.wo_b.weight",
        "layers.1.attn.indexer.compressor.wgate.weight", "layers.0.ffn.shared_experts.w2.weight",
        "layers.1.ffn.experts.2.w1.weight", "layers.2.ffn.experts.0.w2.weight"})
    EXPECT_TRUE(torch::equal(m.tensors.at(name), twin.tensors.at(name))) << name;
  for (const auto& [name, t] : twin.tensors) {
    if (name != "layers.2.attn.wq_a.weight") {
      EXPECT_TRUE(torch::equal(m.tensors.at(name), t)) << name;
    }
  }
}

// A whole quantized checkpoint and its f32 twin (written by save_v4_dir) give the same logits,
// bitwise: the dequantized weights are the twin's exactly and the forward is the same code.
TEST(V4Quantized, LogitsEqualF32Twin) {
  v4::V4Model twin(quantizable_config());
  twin.init_random(5);
  const std::vector<RawTensor> tensors = quantize_into(twin, 6);
  const auto qdir = test::temp_dir("v4q"), fdir = test::temp_dir("v4q_twin");
  write_quantized_dir(qdir, twin.cfg, tensors);
  v4::save_v4_dir(fdir.string(), twin);
  torch::NoGradGuard g;
  const torch::Tensor tokens = test::random_tokens(24, twin.cfg.vocab_size, 7).squeeze(0);
  const torch::Tensor want = v4::load_v4_dir(fdir.string()).forward(tokens);
  v4::V4Model q = v4::load_v4_dir(qdir.string());
  const torch::Tensor got = q.forward(tokens);
  ASSERT_TRUE(torch::isfinite(got).all().item<bool>());
  EXPECT_GT(got.abs().max().item<float>(), 1e-3);
  EXPECT_TRUE(torch::equal(got, want)) << test::max_abs_diff(got, want);
  // Saved again, the model is plain f32: the quantized layout's keys are dropped.
  const auto again = test::temp_dir("v4q_again");
  v4::save_v4_dir(again.string(), q);
  const json cfg = json::parse(test::slurp(again / "config.json"));
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_FALSE(cfg.contains("expert_dtype"));
  EXPECT_TRUE(torch::equal(v4::load_v4_dir(again.string()).forward(tokens), want));
}

TEST(V4Quantized, NamedErrors) {
  v4::V4Model twin(quantizable_config());
  twin.init_random(8);
  const std::vector<RawTensor> good = quantize_into(twin, 9);
  const auto dir = test::temp_dir("v4q_bad");
  auto with = [&](auto edit, json quantization = kQuantizationConfig) {
    std::vector<RawTensor> t = good;
    edit(t);
    write_quantized_dir(dir, twin.cfg, t, std::move(quantization));
    return test::v4_load_error(dir);
  };
  auto find = [](std::vector<RawTensor>& t, const std::string& name) -> RawTensor& {
    for (RawTensor& r : t)
      if (r.name == name) return r;
    throw std::logic_error(name);
  };
  EXPECT_EQ(with([](auto&) {}), "");

  std::string msg =
      with([&](auto& t) { t.erase(t.begin() + (&find(t, "layers.1.attn.wkv.scale") - t.data())); });
  EXPECT_CONTAINS(msg, dir.string());
  EXPECT_CONTAINS(msg,
                  "'layers.1.attn.wkv.weight' is FP8 (128x128 blocks) but its scale "
                  "'layers.1.attn.wkv.scale' is missing (expected F8_E8M0 [1, 2])");

  msg = with([&](auto& t) {
    RawTensor& s = find(t, "layers.1.attn.wkv.scale");  // [1, 2] -> [2, 1]: same bytes
    s.shape = {2, 1};
  });
  EXPECT_CONTAINS(msg, "'layers.1.attn.wkv.scale' has shape [2, 1] (expected [1, 2]");

  msg = with([&](auto& t) {
    RawTensor& s = find(t, "layers.0.ffn.experts.1.w2.scale");  // [160, 1] -> [160, 1, 1]
    s.shape = {160, 1, 1};
  });
  EXPECT_CONTAINS(msg,
                  "'layers.0.ffn.experts.1.w2.scale' has shape [160, 1, 1] (expected [160, 1]");

  msg = with([&](auto& t) {
    RawTensor& w = find(t, "layers.0.ffn.experts.1.w1.weight");  // [32, 80] codes read as [32, 160]
    w.shape = {16, 160};
  });
  EXPECT_CONTAINS(msg, "'layers.0.ffn.experts.1.w1.weight' has shape [16, 160] (expected [32, 80]");

  msg = with([&](auto& t) { find(t, "layers.2.attn.wq_b.scale").dtype = "I8"; });
  EXPECT_CONTAINS(msg, "'layers.2.attn.wq_b.scale' has dtype I8 (allowed: F8_E8M0");

  msg = with([&](auto& t) { find(t, "layers.2.attn.wq_b.scale").bytes[0] = '\xff'; });
  EXPECT_CONTAINS(msg, "'layers.2.attn.wq_b.weight' decodes to NaN");

  // A scale left without its quantized weight is an unexpected tensor.
  msg = with([&](auto& t) {
    RawTensor& w = find(t, "layers.2.attn.wkv.weight");
    w = {w.name, "F32", w.shape, f32_bytes(twin.tensors.at(w.name))};
  });
  EXPECT_CONTAINS(msg, "unexpected tensor 'layers.2.attn.wkv.scale'");

  // Quantization configs other than DeepSeek-V4's name the file, the key and what is allowed.
  json other = kQuantizationConfig;
  other["weight_block_size"] = {64, 64};
  msg = with([](auto&) {}, other);
  EXPECT_CONTAINS(msg, (dir / "config.json").string());
  EXPECT_CONTAINS(msg,
                  "key 'quantization_config.weight_block_size' is [64,64] (allowed: [128,128]");
  msg = with([](auto&) {}, json{{"quant_method", "gptq"}, {"bits", 4}});
  EXPECT_CONTAINS(msg, "key 'quantization_config.bits' is not read (allowed: DeepSeek-V4's");
  other = kQuantizationConfig;
  other.erase("scale_fmt");
  msg = with([](auto&) {}, other);
  EXPECT_CONTAINS(msg, "key 'quantization_config.scale_fmt' is missing");

  // Quantized tensors need the config to say so.
  std::vector<RawTensor> t = good;
  write_quantized_dir(dir, twin.cfg, t);
  json cfg = json::parse(test::slurp(dir / "config.json"));
  cfg.erase("quantization_config");
  test::write_text(dir / "config.json", cfg.dump());
  EXPECT_CONTAINS(test::v4_load_error(dir),
                  "is F8_E4M3 but config.json has no quantization_config");
  cfg["quantization_config"] = kQuantizationConfig;
  cfg["expert_dtype"] = "fp8";
  test::write_text(dir / "config.json", cfg.dump());
  EXPECT_CONTAINS(test::v4_load_error(dir),
                  "is I8 MXFP4 codes but config.json's expert_dtype is 'fp8'");
}
