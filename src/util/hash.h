// FNV-1a 64: a small, dependency-free hash that is stable across platforms and runs (std::hash is
// not). Used for config hashes and checkpoint checksums; it catches corruption, not tampering.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

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

}  // namespace phasekv
