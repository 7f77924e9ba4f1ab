#include "io/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace phasekv {
namespace {

using nlohmann::json;

constexpr uint64_t kLengthPrefix = 8;
const char* const kMetadataKey = "__metadata__";

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string range_str(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& info,
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

  SafetensorsEntry e;
  e.name = name;
  const json& dtype = info.at("dtype");
  size_t element_size = 0;
  if (dtype.is_string())
    for (const auto& [n, size] : safetensors_dtypes())
      if (n == dtype.get<std::string>()) {
        e.dtype = n;
        element_size = size;
      }
  if (element_size == 0)
    throw Error(where + ": unsupported dtype " + dtype.dump() +
                " (allowed: " + safetensors_allowed_dtypes() + ")");

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
  if (__builtin_mul_overflow(numel, uint64_t(element_size), &nbytes))
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
    throw Error(where + ": shape " + shape_str(e.shape) + " with dtype " + e.dtype + " needs " +
                std::to_string(nbytes) + " bytes but data_offsets " + range_str(e.begin, e.end) +
                " span " + std::to_string(e.end - e.begin));
  return e;
}

// Like the reference implementation, the data section must be covered exactly once, so stray,
// shared or missing bytes are reported rather than silently tolerated.
void check_layout(const std::string& path, std::vector<SafetensorsEntry>& entries,
                  uint64_t data_start, uint64_t file_size) {
  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t expected = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : entries) {
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

const std::vector<std::pair<std::string, size_t>>& safetensors_dtypes() {
  // The byte-wide ones are DeepSeek-V4's quantized layout (io/quantized.h): FP8 weights
  // (F8_E4M3), their power-of-two scales (F8_E8M0) and MXFP4 experts (I8, or U8 as
  // compressed-tensors writes them). Their names are kept apart so a loader can tell an FP8 weight
  // from packed MXFP4 codes.
  static const std::vector<std::pair<std::string, size_t>> kDtypes = {
      {"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F64", 8},     {"I64", 8},
      {"I32", 4}, {"I8", 1},   {"U8", 1},  {"F8_E4M3", 1}, {"F8_E8M0", 1}};
  return kDtypes;
}

std::string safetensors_allowed_dtypes() {
  std::string out;
  for (const auto& [name, size] : safetensors_dtypes()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

SafetensorsHeader parse_safetensors_header(const std::string& path, const std::string& buf) {
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
  SafetensorsHeader out;
  out.data_start = kLengthPrefix + n;

  json header;
  try {
    header = json::parse(buf.begin() + kLengthPrefix,
                         buf.begin() + static_cast<std::ptrdiff_t>(out.data_start));
  } catch (const json::parse_error& e) {
    // e.byte counts from 1 within the header; report the offset within the file.
    const uint64_t at = kLengthPrefix + (e.byte > 0 ? e.byte - 1 : 0);
    throw Error(path + ": header is not valid JSON at file byte " + std::to_string(at) + ": " +
                e.what());
  } catch (const json::exception& e) {  // a number beyond a double is out_of_range
    throw Error(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(path + ": header must be a JSON object");

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
    out.entries.push_back(parse_entry(path, it.key(), *it, out.data_start, file_size));
  }
  check_layout(path, out.entries, out.data_start, file_size);
  return out;
}

}  // namespace phasekv
