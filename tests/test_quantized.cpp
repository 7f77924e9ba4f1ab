// DeepSeek-V4's FP8 (e4m3, 128x128 E8M0 block scales) and MXFP4 (e2m1, 32-value E8M0 scales)
// layouts read into f32 (io/quantized.h): hand-picked bytes with known values, every e4m3 code
// against an independent bit-level decoding, and block edges of shapes that are not multiples
// of the block.

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "io/quantized.h"
#include "util/error.h"
#include "test_util.h"

namespace phasekv {
namespace {

// float8_e4m3fn decoded by building the f32 bit pattern (normal numbers) or by scaling the
// mantissa (subnormals): a second derivation, independent of quantized.cpp's ldexp table.
float e4m3_by_bits(uint8_t b) {
  const uint32_t sign = (b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 0x7u;
  if (e == 0xF && m == 0x7) return NAN;
  if (e == 0) return (b & 0x80 ? -1.0f : 1.0f) * static_cast<float>(m) / 512.0f;
  const uint32_t bits = sign | ((e - 7 + 127) << 23) | (m << 20);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(Quantized, E4m3HandPickedBytes) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));  // -0
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);            // e = 7, m = 0
  EXPECT_EQ(e4m3_to_float(0x3C), 1.5f);
  EXPECT_EQ(e4m3_to_float(0x40), 2.0f);
  EXPECT_EQ(e4m3_to_float(0xC0), -2.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);  // the largest finite value
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x08), 0.015625f);         // 2^-6, the smallest normal
  EXPECT_EQ(e4m3_to_float(0x01), 0.001953125f);      // 2^-9, the smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0.001953125f);  // the largest subnormal
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(Quantized, E4m3EveryCodeMatchesTheBitLevelDecodingAndIsMonotonic) {
  int nans = 0;
  for (int b = 0; b < 256; ++b) {
    const float v = e4m3_to_float(static_cast<uint8_t>(b)), want = e4m3_by_bits(b);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(v)) << b;
      ++nans;
      continue;
    }
    EXPECT_EQ(v, want) << "byte " << b;
    EXPECT_EQ(std::signbit(v), b >= 0x80) << b;
  }
  EXPECT_EQ(nans, 2);  // no infinities in the fn variant: only 0x7f and 0xff are special
  for (int b = 1; b < 0x7F; ++b)
    EXPECT_LT(e4m3_to_float(static_cast<uint8_t>(b - 1)), e4m3_to_float(static_cast<uint8_t>(b)))
        << b;
}

TEST(Quantized, E8m0AndE2m1Values) {
  // Comparing 2^-127 needs denormals on: an earlier training test may have flushed them.
  at::globalContext().setFlushDenormal(false);
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(128), 2.0f);
  EXPECT_EQ(e8m0_to_float(120), 1.0f / 128);
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));  // an f32 subnormal, not 0
  EXPECT_GT(e8m0_to_float(0), 0.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(c)), want[c]) << c;
  EXPECT_TRUE(std::signbit(e2m1_to_float(8)));
}

TEST(Quantized, ScalesFromEveryStoredDtype) {
  const std::vector<uint8_t> e8m0 = {127, 130};
  EXPECT_EQ(scales_to_float(e8m0, "F8_E8M0", 2, "s"), (std::vector<float>{1.0f, 8.0f}));
  const float f32[2] = {0.25f, -3.0f};
  std::vector<uint8_t> raw(8);
  std::memcpy(raw.data(), f32, 8);
  EXPECT_EQ(scales_to_float(raw, "F32", 2, "s"), (std::vector<float>{0.25f, -3.0f}));
  const std::vector<uint8_t> bf16 = {0x80, 0x3E, 0x40, 0xC0};  // 0x3E80 = 0.25, 0xC040 = -3
  EXPECT_EQ(scales_to_float(bf16, "BF16", 2, "s"), (std::vector<float>{0.25f, -3.0f}));
  EXPECT_THROW(scales_to_float(e8m0, "F8_E8M0", 3, "s"), Error);
  try {
    scales_to_float(e8m0, "I32", 2, "layers.0.attn.wq_a.scale");
    FAIL();
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "layers.0.attn.wq_a.scale");
    EXPECT_CONTAINS(e.what(), "F8_E8M0");
  }
}

// A 130 x 200 weight in 128 x 128 blocks: 2 x 2 scales, the last row and column of blocks
// partial. Every value 1.0 (0x38), so each output is its block's scale.
TEST(Quantized, Fp8BlockEdgesWhenShapesAreNotMultiplesOf128) {
  const int64_t rows = 130, cols = 200;
  const std::vector<uint8_t> w(rows * cols, 0x38);
  const std::vector<float> s = {1.0f, 2.0f, 4.0f, 8.0f};
  const auto out = dequant_fp8_blocks(w, s, rows, cols, "layers.0.attn.wq_a");
  ASSERT_EQ(out.size(), static_cast<size_t>(rows * cols));
  auto at = [&](int64_t i, int64_t j) { return out[i * cols + j]; };
  EXPECT_EQ(at(0, 0), 1.0f);
  EXPECT_EQ(at(127, 127), 1.0f);
  EXPECT_EQ(at(0, 128), 2.0f);
  EXPECT_EQ(at(127, 199), 2.0f);
  EXPECT_EQ(at(128, 0), 4.0f);
  EXPECT_EQ(at(129, 127), 4.0f);
  EXPECT_EQ(at(128, 128), 8.0f);
  EXPECT_EQ(at(129, 199), 8.0f);
}

TEST(Quantized, Fp8HandPickedValuesTimesScales) {
  // 2 x 3 in blocks of 2: one block row of scales [0.5, 4] over columns 0-1 and column 2.
  const std::vector<uint8_t> w = {0x38, 0xC0, 0x7E, 0x01, 0x3C, 0x80};
  const std::vector<float> s = {0.5f, 4.0f};
  const auto out = dequant_fp8_blocks(w, s, 2, 3, "t", 2);
  EXPECT_EQ(out, (std::vector<float>{0.5f, -1.0f, 1792.0f, 0.0009765625f, 0.75f, -0.0f}));
}

TEST(Quantized, Fp8ShapeErrorsNameTheTensorAndTheExpectedShape) {
  const std::vector<uint8_t> w(130 * 200, 0x38);
  const std::vector<float> s(2, 1.0f);  // [1, 2]: the partial block row is missing
  try {
    dequant_fp8_blocks(w, s, 130, 200, "layers.3.attn.wkv");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_CONTAINS(m, "layers.3.attn.wkv");
    EXPECT_CONTAINS(m, "[2, 2]");
  }
  EXPECT_THROW(dequant_fp8_blocks(w, std::vector<float>(4, 1.0f), 130, 199, "t"), Error);
}

// Two rows of 64 values: element 2k in the low nibble, 2k+1 in the high one, one scale per 32.
TEST(Quantized, Mxfp4NibbleOrderAndPerBlockScales) {
  const int64_t rows = 2, cols = 64;
  std::vector<uint8_t> packed(rows * cols / 2, 0x00);
  packed[0] = 0x21;        // row 0: e0 = 0.5 (code 1), e1 = 1 (code 2)
  packed[15] = 0xF9;       // row 0: e30 = -0.5 (code 9), e31 = -6 (code 15)
  packed[16] = 0x07;       // row 0: e32 = 6, e33 = 0 (second block)
  packed[32 + 31] = 0x5C;  // row 1: e62 = -2 (code 12), e63 = 3 (code 5)
  const std::vector<uint8_t> scales = {128, 126, 127, 130};  // 2, 0.5 | 1, 8
  const auto out = dequant_mxfp4(packed, scales, rows, cols, "layers.0.ffn.experts.0.w1");
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[30], -1.0f);
  EXPECT_EQ(out[31], -12.0f);
  EXPECT_EQ(out[32], 3.0f);
  EXPECT_EQ(out[33], 0.0f);
  EXPECT_EQ(out[64 + 62], -16.0f);
  EXPECT_EQ(out[64 + 63], 24.0f);
}

TEST(Quantized, Mxfp4ShapeErrors) {
  const std::vector<uint8_t> packed(16), scales(1);
  EXPECT_NO_THROW(dequant_mxfp4(packed, scales, 1, 32, "t"));
  EXPECT_THROW(dequant_mxfp4(packed, scales, 1, 48, "t"), Error);  // not a multiple of 32
  EXPECT_THROW(dequant_mxfp4(packed, scales, 2, 32, "t"), Error);  // too few bytes
  try {
    dequant_mxfp4(packed, std::vector<uint8_t>(2), 1, 32, "layers.1.ffn.experts.7.w2");
    FAIL();
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "layers.1.ffn.experts.7.w2");
    EXPECT_CONTAINS(e.what(), "[1, 1]");
  }
}

// A synthesised FP8 layer: f32 weights rounded to the nearest e4m3 code under power-of-two
// block scales; the reader gives back exactly code value * scale, within e4m3's 2^-4 relative
// step of the original.
TEST(Quantized, SynthesisedFp8LayerRoundTrips) {
  const int64_t rows = 300, cols = 260, brows = 3, bcols = 3;
  std::vector<float> orig(rows * cols);
  uint32_t state = 12345;
  for (auto& x : orig) {
    state = state * 1664525u + 1013904223u;
    x = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.2f;
  }
  std::vector<uint8_t> scale_bytes(brows * bcols);
  for (size_t b = 0; b < scale_bytes.size(); ++b) scale_bytes[b] = 120 + static_cast<uint8_t>(b);
  const auto scales = scales_to_float(scale_bytes, "F8_E8M0", brows * bcols, "s");
  std::vector<uint8_t> codes(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float s = scales[(i / 128) * bcols + j / 128], x = orig[i * cols + j] / s;
      int best = 0;
      for (int c = 0; c < 256; ++c)
        if (!std::isnan(e4m3_to_float(c)) &&
            std::fabs(e4m3_to_float(c) - x) < std::fabs(e4m3_to_float(best) - x))
          best = c;
      codes[i * cols + j] = static_cast<uint8_t>(best);
    }
  const auto out = dequant_fp8_blocks(codes, scales, rows, cols, "synth");
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float s = scales[(i / 128) * bcols + j / 128];
      ASSERT_EQ(out[i * cols + j], e4m3_to_float(codes[i * cols + j]) * s);
      const float x = orig[i * cols + j];
      // Round to nearest: half a step (2^-4 of the binade) plus the subnormal floor 2^-10 s.
      ASSERT_LE(std::fabs(out[i * cols + j] - x), std::fabs(x) / 16 + s / 1024) << i << "," << j;
    }
}

}  // namespace
}  // namespace phasekv
