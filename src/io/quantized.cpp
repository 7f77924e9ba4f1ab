#include "io/quantized.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "util/error.h"

namespace phasekv {

namespace {

std::string shape_str(int64_t a, int64_t b) {
  // Appended piece by piece: GCC 12 -O3 misreads "[" + to_string(a) as an overlapping memcpy.
  std::string s = "[";
  s.append(std::to_string(a)).append(", ").append(std::to_string(b)).append("]");
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void check_size(size_t got, int64_t want, const std::string& name, const std::string& what) {
  if (want < 0 || got != static_cast<size_t>(want))
    throw Error(name + ": " + what + " has " + std::to_string(got) + " elements, expected " +
                std::to_string(want));
}

// The 256 e4m3 values, computed once: a table is both the fastest decoder and the easiest to
// check exhaustively.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
      const float sign = (b & 0x80) ? -1.0f : 1.0f;
      const int e = (b >> 3) & 0xF, m = b & 0x7;
      if (e == 0xF && m == 0x7)
        t[b] = std::numeric_limits<float>::quiet_NaN();
      else if (e == 0)
        t[b] = sign * std::ldexp(static_cast<float>(m), -9);  // subnormal: m/8 * 2^-6
      else
        t[b] = sign * std::ldexp(1.0f + m / 8.0f, e - 7);
    }
    return t;
  }();
  return table;
}

}  // namespace

float e4m3_to_float(uint8_t byte) {
  return e4m3_table()[byte];
}

float e8m0_to_float(uint8_t byte) {
  if (byte == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  // Built from bits, not with ldexp: training threads run with denormals flushed
  // (model/precision.h), and 2^-127 (byte 0) is an f32 subnormal that arithmetic would flush.
  const uint32_t bits = byte == 0 ? 0x00400000u : static_cast<uint32_t>(byte) << 23;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

float e2m1_to_float(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMagnitude[code & 0x7];
  return (code & 0x8) ? -v : v;
}

float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::vector<float> scales_to_float(std::span<const uint8_t> bytes, const std::string& dtype,
                                   int64_t count, const std::string& name) {
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(count, 0)));
  if (dtype == "F8_E8M0" || dtype == "U8") {
    check_size(bytes.size(), count, name, "the E8M0 scale");
    for (size_t i = 0; i < out.size(); ++i) out[i] = e8m0_to_float(bytes[i]);
  } else if (dtype == "F32") {
    check_size(bytes.size() / 4, count, name, "the F32 scale");
    std::memcpy(out.data(), bytes.data(), out.size() * 4);  // little-endian, as stored
  } else if (dtype == "BF16") {
    check_size(bytes.size() / 2, count, name, "the BF16 scale");
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = bf16_to_float(static_cast<uint16_t>(bytes[2 * i] | bytes[2 * i + 1] << 8));
  } else {
    throw Error(name + ": scale dtype " + dtype + " (allowed: F8_E8M0, F32, BF16)");
  }
  return out;
}

void dequant_fp8_blocks_into(std::span<const uint8_t> weight, std::span<const float> scales,
                             int64_t rows, int64_t cols, int64_t block, const std::string& name,
                             float* out) {
  if (rows < 0 || cols < 0 || block <= 0)
    throw Error(name + ": FP8 weight " + shape_str(rows, cols) + " in blocks of " +
                std::to_string(block) + " (need non-negative sides and a positive block)");
  check_size(weight.size(), rows * cols, name, "the FP8 weight " + shape_str(rows, cols));
  const int64_t brows = ceil_div(rows, block), bcols = ceil_div(cols, block);
  check_size(scales.size(), brows * bcols, name,
             "the block scale (expected " + shape_str(brows, bcols) + " for a " +
                 shape_str(rows, cols) + " weight in " + std::to_string(block) + "x" +
                 std::to_string(block) + " blocks)");
  const auto& table = e4m3_table();
  for (int64_t i = 0; i < rows; ++i) {
    const float* srow = scales.data() + (i / block) * bcols;
    const uint8_t* w = weight.data() + i * cols;
    float* o = out + i * cols;
    for (int64_t j = 0; j < cols; ++j) o[j] = table[w[j]] * srow[j / block];
  }
}

std::vector<float> dequant_fp8_blocks(std::span<const uint8_t> weight,
                                      std::span<const float> scales, int64_t rows, int64_t cols,
                                      const std::string& name, int64_t block) {
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(rows * cols, 0)));
  dequant_fp8_blocks_into(weight, scales, rows, cols, block, name, out.data());
  return out;
}

void dequant_mxfp4_into(std::span<const uint8_t> packed, std::span<const uint8_t> scales_e8m0,
                        int64_t rows, int64_t cols, const std::string& name, float* out) {
  if (rows < 0 || cols < 0 || cols % 32 != 0)
    throw Error(name + ": MXFP4 weight of logical shape " + shape_str(rows, cols) +
                " (the width must be a multiple of 32: one scale per 32 values)");
  check_size(packed.size(), rows * (cols / 2), name,
             "the packed MXFP4 weight (expected " + shape_str(rows, cols / 2) + ")");
  check_size(scales_e8m0.size(), rows * (cols / 32), name,
             "the E8M0 scale (expected " + shape_str(rows, cols / 32) + ")");
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* p = packed.data() + i * (cols / 2);
    const uint8_t* s = scales_e8m0.data() + i * (cols / 32);
    float* o = out + i * cols;
    for (int64_t j = 0; j < cols; j += 2) {
      const float scale = e8m0_to_float(s[j / 32]);
      const uint8_t byte = p[j / 2];
      o[j] = e2m1_to_float(byte & 0xF) * scale;
      o[j + 1] = e2m1_to_float(byte >> 4) * scale;
    }
  }
}

std::vector<float> dequant_mxfp4(std::span<const uint8_t> packed,
                                 std::span<const uint8_t> scales_e8m0, int64_t rows, int64_t cols,
                                 const std::string& name) {
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(rows * cols, 0)));
  dequant_mxfp4_into(packed, scales_e8m0, rows, cols, name, out.data());
  return out;
}

}  // namespace phasekv
