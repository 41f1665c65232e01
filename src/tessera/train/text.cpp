#include "tessera/train/text.h"

#include <cstdint>

namespace tessera {

bool is_utf8_text(std::string_view s, size_t* bad) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  auto fail = [&](size_t at) {
    if (bad) *bad = at;
    return false;
  };
  while (i < n) {
    const unsigned char c = p[i];
    if (c == 0) return fail(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte: the sequence length and the allowed range of the second byte (which rules out overlong
    // forms, surrogates and code points above U+10FFFF).
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return fail(i);
    if (i + len > n) return fail(i);
    if (p[i + 1] < lo || p[i + 1] > hi) return fail(i);
    for (int k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return fail(i);
    i += len;
  }
  return true;
}

std::string not_text_at(std::string_view s, size_t bad) {
  return (bad < s.size() && s[bad] == '\0' ? "a NUL byte at byte " : "invalid UTF-8 at byte ") + std::to_string(bad);
}

}  // namespace tessera
