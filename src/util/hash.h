// FNV-1a 64: a small, dependency-free hash that is stable across platforms and runs (std::hash is
// not). Used for config hashes and checkpoint checksums; it catches corruption, not tampering.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace phasekv {

inline uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : bytes) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

// 16 lower-case hex digits.
inline std::string fnv1a64_hex(std::string_view bytes) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a64(bytes)));
  return buf;
}

// FNV-1a 64 of a prompt's token ids (little-endian int32), hex: the same ids hash the same
// (results records carry it so that a rendered chat prompt can be compared across runs).
inline std::string prompt_ids_hash(const std::vector<int32_t>& ids) {
  std::string bytes;
  for (int32_t id : ids)
    for (int b = 0; b < 4; ++b)
      bytes.push_back(static_cast<char>((static_cast<uint32_t>(id) >> (8 * b)) & 0xFF));
  return fnv1a64_hex(bytes);
}

}  // namespace phasekv
