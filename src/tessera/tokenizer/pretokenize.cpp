// GPT-2's pattern as a hand-written splitter over the generated class table (unicode_classes.h). The alternatives
// are tried in the pattern's order, as a backtracking regex engine tries them:
//   1. 's|'t|'re|'ve|'m|'ll|'d      an ASCII apostrophe and a lower-case suffix, case-sensitive;
//   2-4. ` ?X+` for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]: an optional leading space (U+0020 only) and a maximal run of
//        one class; the class of the first code point (after the space) picks the alternative;
//   5. \s+(?!\S): a whitespace run that reaches the end of the text whole; else the run less its last code point,
//      which leaves that one to lead the next pre-token (" word");
//   6. \s+: a single whitespace code point before a non-space.
// A byte that does not start valid UTF-8 is of class Other (as Python's `regex` sees the lone surrogate that
// errors="surrogateescape" makes of it).
#include "tessera/tokenizer/pretokenize.h"

#include <array>

#include "tessera/tokenizer/unicode_classes.h"

namespace tessera {
namespace {

// The classes of ASCII, which is most of the text: a direct table saves the UTF-8 decode and the two-level lookup.
// tests/tokenizer/test_pretokenize.cpp cuts every ASCII byte beside each class, against `regex`.
constexpr std::array<CpClass, 128> make_ascii_classes() {
  std::array<CpClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) t[c] = CpClass::Letter;
    else if (c >= '0' && c <= '9') t[c] = CpClass::Number;
    else if ((c >= '\t' && c <= '\r') || c == ' ') t[c] = CpClass::Space;
    else t[c] = CpClass::Other;
  }
  return t;
}
constexpr std::array<CpClass, 128> kAsciiClasses = make_ascii_classes();

struct CodePoint {
  CpClass cls;
  size_t len;
};

inline CodePoint next_code_point(const uint8_t* p, size_t n) {
  if (p[0] < 0x80) return {kAsciiClasses[p[0]], 1};
  uint32_t cp = 0;
  const size_t len = utf8_decode(p, n, &cp);
  return {cp == kInvalidCodePoint ? CpClass::Other : cp_class(cp), len};
}

inline bool is_contraction(const uint8_t* p, size_t n, size_t* len) {
  if (n < 2 || p[0] != '\'') return false;
  const uint8_t a = p[1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') {
    *len = 2;
    return true;
  }
  if (n >= 3) {
    const uint8_t b = p[2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
      *len = 3;
      return true;
    }
  }
  return false;
}

}  // namespace

size_t gpt2_pretoken_length(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  if (n == 0) return 0;
  size_t len = 0;
  if (is_contraction(p, n, &len)) return len;

  // Alternatives 2-4: a run of one class, after an optional space.
  size_t start = 0;
  CodePoint first = next_code_point(p, n);
  if (p[0] == ' ' && n >= 2) {
    const CodePoint second = next_code_point(p + 1, n - 1);
    if (second.cls != CpClass::Space) {
      start = 1;
      first = second;
    }
  }
  if (first.cls != CpClass::Space) {
    size_t i = start + first.len;
    while (i < n) {
      const CodePoint c = next_code_point(p + i, n - i);
      if (c.cls != first.cls) break;
      i += c.len;
    }
    return i;
  }

  // Alternatives 5 and 6: a whitespace run [0, end); `last` is where its last code point starts.
  size_t end = 0, last = 0;
  while (end < n) {
    const CodePoint c = next_code_point(p + end, n - end);
    if (c.cls != CpClass::Space) break;
    last = end;
    end += c.len;
  }
  if (end == n) return n;     // 5: (?!\S) holds at the end of the text
  if (last > 0) return last;  // 5: backs off one code point, which is whitespace, so (?!\S) holds
  return end;                 // 6: one whitespace code point before a non-space
}

}  // namespace tessera
