// The torch-free half of the safetensors reader (io/safetensors.h): the 8-byte header length,
// the JSON header (dtypes, shapes, data offsets, __metadata__) and every bounds and layout check.
// It needs no tensors, so it is part of phasekv_base and fuzzed under the sanitizers
// (fuzz/fuzz_safetensors.cpp); load_safetensors copies the bytes it locates into tensors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace phasekv {

// The dtypes phasekv reads and writes, by their safetensors names, with their element sizes.
const std::vector<std::pair<std::string, size_t>>& safetensors_dtypes();
std::string safetensors_allowed_dtypes();  // "F32, BF16, ..." for error messages

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // one of safetensors_dtypes()
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets: bytes [begin, end) after the header
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                // file offset of the data section
  std::vector<SafetensorsEntry> entries;  // ordered by data offset, covering the data exactly
  std::map<std::string, std::string> metadata;
};

// Parses and checks the header of `bytes`, the whole file read from `path`. Throws
// phasekv::Error naming the file, the tensor and the byte offsets for any malformed or truncated
// file: a length prefix beyond the file, invalid JSON, an unknown field or dtype, a shape whose
// size overflows or disagrees with its offsets, offsets beyond the file, and overlapping, gapped
// or unclaimed data bytes.
SafetensorsHeader parse_safetensors_header(const std::string& path, const std::string& bytes);

}  // namespace phasekv
