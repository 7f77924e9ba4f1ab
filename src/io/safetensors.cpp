#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

// Tensor bytes are copied verbatim between memory and file, and the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

using nlohmann::json;

constexpr uint64_t kLengthPrefix = 8;
const char* const kMetadataKey = "__metadata__";

const std::vector<std::pair<std::string, torch::ScalarType>> kDtypes = {
    {"F32", torch::kFloat},  {"BF16", torch::kBFloat16}, {"F16", torch::kHalf},
    {"F64", torch::kDouble}, {"I64", torch::kLong},      {"I32", torch::kInt}};

std::string allowed_dtypes() {
  std::string out;
  for (const auto& [name, type] : kDtypes) out += (out.empty() ? "" : ", ") + name;
  return out;
}

std::optional<std::string> dtype_name(torch::ScalarType type) {
  for (const auto& [name, t] : kDtypes)
    if (t == type) return name;
  return std::nullopt;
}

std::optional<torch::ScalarType> dtype_from_name(const std::string& name) {
  for (const auto& [n, t] : kDtypes)
    if (n == name) return t;
  return std::nullopt;
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

std::string range_str(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

struct Entry {
  std::string name;
  torch::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

Entry parse_entry(const std::string& path, const std::string& name, const json& info,
                  uint64_t data_start, uint64_t file_size) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!info.is_object())
    throw Error(where + ": header entry must be a JSON object, got " + info.dump());
  static const std::set<std::string> kFields = {"dtype", "shape", "data_offsets"};
  for (auto it = info.begin(); it != info.end(); ++it) {
    if (!kFields.count(it.key()))
      throw Error(where + ": unknown header field '" + it.key() +
                  "' (allowed: dtype, shape, data_offsets)");
  }
  for (const auto& field : kFields) {
    if (!info.contains(field)) throw Error(where + ": header entry lacks '" + field + "'");
  }

  Entry e;
  e.name = name;
  const json& dtype = info.at("dtype");
  std::optional<torch::ScalarType> type;
  if (dtype.is_string()) type = dtype_from_name(dtype.get<std::string>());
  if (!type)
    throw Error(where + ": unsupported dtype " + dtype.dump() + " (allowed: " + allowed_dtypes() +
                ")");
  e.type = *type;

  const json& shape = info.at("shape");
  if (!shape.is_array())
    throw Error(where + ": shape must be an array of non-negative integers, got " + shape.dump());
  uint64_t numel = 1;
  for (const json& d : shape) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      throw Error(where + ": shape must be an array of non-negative integers, got " + shape.dump());
    uint64_t dim = d.get<uint64_t>();
    if (__builtin_mul_overflow(numel, dim, &numel))
      throw Error(where + ": shape " + shape.dump() + " is too large");
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, uint64_t(c10::elementSize(e.type)), &nbytes))
    throw Error(where + ": shape " + shape.dump() + " is too large");

  const json& offsets = info.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned() || offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>())
    throw Error(where + ": data_offsets must be [begin, end] with 0 <= begin <= end, got " +
                offsets.dump());
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();

  const uint64_t data_size = file_size - data_start;
  if (e.end > data_size)
    throw Error(where + ": data_offsets " + range_str(e.begin, e.end) + " are file bytes " +
                range_str(data_start + e.begin, data_start + e.end) + " but the file has only " +
                std::to_string(file_size) + " bytes (truncated file?)");
  if (e.end - e.begin != nbytes)
    throw Error(where + ": shape " + shape_str(e.shape) + " with dtype " + display_dtype(e.type) +
                " needs " + std::to_string(nbytes) + " bytes but data_offsets " +
                range_str(e.begin, e.end) + " span " + std::to_string(e.end - e.begin));
  return e;
}

// Like the reference implementation, the data section must be covered exactly once, so stray,
// shared or missing bytes are reported rather than silently tolerated.
void check_layout(const std::string& path, std::vector<Entry>& entries, uint64_t data_start,
                  uint64_t file_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < expected)
      throw Error(path + ": tensor '" + e.name + "' data_offsets " + range_str(e.begin, e.end) +
                  " overlap tensor '" + prev->name + "' " + range_str(prev->begin, prev->end));
    if (e.begin > expected)
      throw Error(path + ": tensor '" + e.name + "' data_offsets " + range_str(e.begin, e.end) +
                  " leave a gap of " + std::to_string(e.begin - expected) + " bytes after " +
                  (prev ? "tensor '" + prev->name + "'" : std::string("the header")));
    expected = e.end;
    prev = &e;
  }
  const uint64_t data_size = file_size - data_start;
  if (expected != data_size)
    throw Error(path + ": " + std::to_string(data_size - expected) +
                " unclaimed bytes after the last tensor (file bytes " +
                range_str(data_start + expected, file_size) + ")");
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
                  " (allowed: " + allowed_dtypes() + ")");
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
  const uint64_t file_size = buf.size();
  if (file_size < kLengthPrefix)
    throw Error(path + ": file is " + std::to_string(file_size) +
                " bytes, shorter than the 8-byte header length (not a safetensors file?)");
  uint64_t n = 0;
  for (uint64_t i = 0; i < kLengthPrefix; ++i)
    n |= uint64_t(static_cast<unsigned char>(buf[i])) << (8 * i);
  if (n > file_size - kLengthPrefix)
    throw Error(path + ": header length " + std::to_string(n) + " at byte 0 exceeds file size " +
                std::to_string(file_size) + " (not a safetensors file, or truncated?)");
  const uint64_t data_start = kLengthPrefix + n;

  json header;
  try {
    header = json::parse(buf.begin() + kLengthPrefix,
                         buf.begin() + static_cast<std::ptrdiff_t>(data_start));
  } catch (const json::parse_error& e) {
    // e.byte counts from 1 within the header; report the offset within the file.
    const uint64_t at = kLengthPrefix + (e.byte > 0 ? e.byte - 1 : 0);
    throw Error(path + ": header is not valid JSON at file byte " + std::to_string(at) + ": " +
                e.what());
  } catch (const json::exception& e) {  // a number beyond a double is out_of_range
    throw Error(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(path + ": header must be a JSON object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it->is_object()) throw Error(path + ": __metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          throw Error(path + ": __metadata__ value for '" + m.key() + "' must be a string, got " +
                      m->dump());
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, it.key(), *it, data_start, file_size));
  }
  check_layout(path, entries, data_start, file_size);

  // Copying rather than from_blob gives each tensor its own aligned storage, independent of buf.
  for (const Entry& e : entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.type));
    if (e.end > e.begin)
      std::memcpy(t.data_ptr(), buf.data() + data_start + e.begin, e.end - e.begin);
    out.tensors.emplace(e.name, std::move(t));
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
