// Reader and writer for the safetensors format (https://github.com/huggingface/safetensors), so
// checkpoints interoperate with the Python ecosystem without pickle. Layout: an 8-byte
// little-endian header length N, N bytes of JSON header, then the raw tensor bytes.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace phasekv {

// Ordered so the caller decides the layout of the data section; names must be unique.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Supported dtypes: F32, BF16, F16, F64, I64, I32, I8, U8 (and F8_E4M3 / F8_E8M0 loaded as bytes).
// Tensors on other devices are copied to the CPU. The file appears atomically (temporary name, then
// rename); throws Error on unsupported dtypes, duplicate or reserved names, or I/O failure.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, torch::Tensor> tensors;  // CPU tensors that own their memory
  std::map<std::string, std::string> metadata;
  // Each tensor's stored dtype name ("F8_E4M3", "U8", ...): the byte-wide ones share a torch type.
  std::map<std::string, std::string> dtypes;
};

// Throws Error naming the file, the tensor and the byte offsets for any malformed or truncated
// file.
SafetensorsFile load_safetensors(const std::string& path);

// Returns tensor `name` as float32, accepting F32 or BF16 storage. An F32 result shares memory
// with `f`. Throws Error naming `file_label`, the tensor, and expected vs found shape or dtype.
torch::Tensor take_tensor(const SafetensorsFile& f, const std::string& file_label,
                          const std::string& name, at::IntArrayRef expected_shape);

}  // namespace phasekv
