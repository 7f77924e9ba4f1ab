#include "io/safetensors.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "io/safetensors_header.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

// Tensor bytes are copied verbatim between memory and file, and the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

constexpr uint64_t kLengthPrefix = 8;
const char* const kMetadataKey = "__metadata__";

// The torch type of each safetensors_dtypes() name (load_safetensors fails loudly on a name
// missing here; Safetensors.RoundTripIsBitwiseExactWithMetadata saves and loads every one).
const std::vector<std::pair<std::string, torch::ScalarType>> kTorchTypes = {
    {"F32", torch::kFloat},
    {"BF16", torch::kBFloat16},
    {"F16", torch::kHalf},
    {"F64", torch::kDouble},
    {"I64", torch::kLong},
    {"I32", torch::kInt},
    {"I8", torch::kChar},
    {"U8", torch::kByte},
    // libtorch 1.13 has no float8 types: FP8 weights and E8M0 scales load as their raw bytes
    // (uint8). A uint8 tensor is saved as U8, the first match.
    {"F8_E4M3", torch::kByte},
    {"F8_E8M0", torch::kByte}};

std::optional<std::string> dtype_name(torch::ScalarType type) {
  for (const auto& [name, t] : kTorchTypes)
    if (t == type) return name;
  return std::nullopt;
}

torch::ScalarType torch_type(const std::string& name) {
  for (const auto& [n, t] : kTorchTypes)
    if (n == name) return t;
  throw Error("internal: safetensors dtype " + name + " has no torch type");
}

// Stored dtypes outside the safetensors set still need a readable name in error messages.
std::string display_dtype(torch::ScalarType type) {
  auto name = dtype_name(type);
  return name ? *name : std::string(c10::toString(type));
}

std::string shape_str(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in the caller's order, matching the data section.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::vector<torch::Tensor> data;
  data.reserve(tensors.size());
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string where = path + ": tensor '" + name + "'";
    if (name == kMetadataKey)
      throw Error(where + ": the name is reserved by the safetensors format");
    if (!seen.insert(name).second) throw Error(where + ": duplicate tensor name");
    if (!tensor.defined()) throw Error(where + ": tensor is undefined");
    if (tensor.layout() != torch::kStrided)
      throw Error(where + ": only dense tensors can be saved");
    auto dtype = dtype_name(tensor.scalar_type());
    if (!dtype)
      throw Error(where + ": unsupported dtype " +
                  std::string(c10::toString(tensor.scalar_type())) +
                  " (allowed: " + safetensors_allowed_dtypes() + ")");
    torch::Tensor t = tensor.to(torch::kCPU).contiguous();
    const uint64_t nbytes = t.nbytes();
    header[name] = {{"dtype", *dtype},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", nlohmann::ordered_json::array({offset, offset + nbytes})}};
    offset += nbytes;
    data.push_back(std::move(t));
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": tensor names and metadata must be valid UTF-8 (" + e.what() + ")");
  }
  // The spec allows trailing spaces; padding keeps the data section 8-byte aligned in the file.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  std::string content;
  content.reserve(kLengthPrefix + header_text.size() + offset);
  const uint64_t n = header_text.size();
  for (uint64_t i = 0; i < kLengthPrefix; ++i)
    content.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  content += header_text;
  for (const torch::Tensor& t : data) {
    if (t.nbytes() > 0) content.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  write_file_atomic(path, content);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string buf = read_file(path);
  const SafetensorsHeader header = parse_safetensors_header(path, buf);
  SafetensorsFile out;
  out.metadata = header.metadata;
  // Copying rather than from_blob gives each tensor its own aligned storage, independent of buf.
  for (const SafetensorsEntry& e : header.entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(torch_type(e.dtype)));
    if (e.end > e.begin)
      std::memcpy(t.data_ptr(), buf.data() + header.data_start + e.begin, e.end - e.begin);
    out.tensors.emplace(e.name, std::move(t));
    out.dtypes.emplace(e.name, e.dtype);
  }
  return out;
}

torch::Tensor take_tensor(const SafetensorsFile& f, const std::string& file_label,
                          const std::string& name, at::IntArrayRef expected_shape) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) throw Error("missing tensor '" + name + "' in " + file_label);
  const torch::Tensor& t = it->second;
  const std::string where = file_label + ": tensor '" + name + "'";
  if (t.scalar_type() != torch::kFloat && t.scalar_type() != torch::kBFloat16)
    throw Error(where + " has dtype " + display_dtype(t.scalar_type()) + " (allowed: F32, BF16)");
  if (!t.sizes().equals(expected_shape))
    throw Error(where + " has shape " + shape_str(t.sizes()) + ", expected " +
                shape_str(expected_shape));
  return t.to(torch::kFloat);
}

}  // namespace phasekv
