// Well-formed UTF-8 (RFC 3629), the one rule the sentencepiece normaliser and decoder
// (io/sentencepiece_bpe.cpp) and the server's request check (server/server_requests.cpp) share.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace phasekv {

// Length of the valid UTF-8 character at s[i..], or 0 when the bytes there are not one (a stray
// continuation byte, a truncated sequence, an overlong form, a surrogate or a code point above
// U+10FFFF): sentencepiece's rule for what its normaliser and decoder replace by U+FFFD.
inline size_t utf8_char_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto trail = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  const size_t left = s.size() - i;
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  uint32_t cp = 0;
  size_t n = 0;
  if ((c & 0xE0) == 0xC0 && left >= 2 && trail(1)) {
    cp = ((c & 0x1Fu) << 6) | (b(1) & 0x3Fu), n = 2;
    if (cp < 0x80) return 0;
  } else if ((c & 0xF0) == 0xE0 && left >= 3 && trail(1) && trail(2)) {
    cp = ((c & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu), n = 3;
    if (cp < 0x800) return 0;
  } else if ((c & 0xF8) == 0xF0 && left >= 4 && trail(1) && trail(2) && trail(3)) {
    cp = ((c & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    n = 4;
    if (cp < 0x10000) return 0;
  } else {
    return 0;
  }
  const bool valid = cp < 0xD800 || (cp >= 0xE000 && cp <= 0x10FFFF);
  return valid ? n : 0;
}

// Offset of the first byte that is not part of well-formed UTF-8; npos when there is none.
inline size_t first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char_len(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace phasekv
