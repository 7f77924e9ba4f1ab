// DeepSeek-V4's quantized checkpoint layouts, read exactly into f32 (issue 40, section 2).
//
// The official checkpoint stores most linear weights in FP8 and the routed experts in MXFP4;
// these pure functions (no tensors, phasekv_base) turn the stored bytes into the f32 values
// they encode, so a user's real shard loads into phasekv's model:
//
//   FP8    "X.weight"  F8_E4M3 [rows, cols]                       one byte per value
//          "X.scale"   F8_E8M0 [ceil(rows/128), ceil(cols/128)]   one power of two per block
//          value(i, j) = e4m3(weight[i][j]) * scale[i/128][j/128]. The last block row/column is
//          partial when a side is not a multiple of 128. DeepSeek-V3's F32 `weight_scale_inv`
//          blocks multiply the same way (llama.cpp's conversion/deepseek.py dequant_fp8_weight).
//   MXFP4  "X.weight"  I8 [rows, cols/2]   two e2m1 codes per byte: element 2k in the low nibble,
//                                          element 2k+1 in the high nibble
//          "X.scale"   F8_E8M0 [rows, cols/32]   one power of two per 32 values of a row
//          value(i, j) = e2m1(code(i, j)) * scale[i][j/32] (conversion/base.py's
//          repack_mxfp4_blocks describes the same source layout).
//
// Formats: e4m3 is float8_e4m3fn (bias 7, 3 mantissa bits, subnormals, no infinities; 0x7f and
// 0xff are NaN); E8M0 is a biased exponent 2^(b-127), 0xff NaN; e2m1 has the values 0, 0.5, 1,
// 1.5, 2, 3, 4, 6 and their negatives (bit 3 is the sign). Every shape is checked and a mismatch
// throws phasekv::Error naming the tensor, the shapes and the expected ones.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace phasekv {

float e4m3_to_float(uint8_t byte);   // float8_e4m3fn
float e8m0_to_float(uint8_t byte);   // 2^(byte - 127); 0xff is NaN
float e2m1_to_float(uint8_t code);   // the low 4 bits: MXFP4's element
float bf16_to_float(uint16_t bits);  // the top half of an f32

// Block scales as f32, from their stored bytes: dtype "F8_E8M0" (1 byte each), "F32" or
// "BF16" (little-endian). `count` scales are expected; `name` is for errors.
std::vector<float> scales_to_float(std::span<const uint8_t> bytes, const std::string& dtype,
                                   int64_t count, const std::string& name);

// FP8 e4m3 [rows, cols] with f32 block scales [ceil(rows/block), ceil(cols/block)] -> f32
// [rows, cols] row-major, written to `out` (rows*cols floats).
void dequant_fp8_blocks_into(std::span<const uint8_t> weight, std::span<const float> scales,
                             int64_t rows, int64_t cols, int64_t block, const std::string& name,
                             float* out);
std::vector<float> dequant_fp8_blocks(std::span<const uint8_t> weight,
                                      std::span<const float> scales, int64_t rows, int64_t cols,
                                      const std::string& name, int64_t block = 128);

// MXFP4 packed [rows, cols/2] with E8M0 scale bytes [rows, cols/32] -> f32 [rows, cols].
// `cols` is the logical width (a multiple of 32).
void dequant_mxfp4_into(std::span<const uint8_t> packed, std::span<const uint8_t> scales_e8m0,
                        int64_t rows, int64_t cols, const std::string& name, float* out);
std::vector<float> dequant_mxfp4(std::span<const uint8_t> packed,
                                 std::span<const uint8_t> scales_e8m0, int64_t rows, int64_t cols,
                                 const std::string& name);

}  // namespace phasekv
