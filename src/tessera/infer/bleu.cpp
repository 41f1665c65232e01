// tessera/infer/bleu.cpp — sacrebleu 2.4.3's corpus BLEU (the formulas in bleu.h) and exact match.
#include "tessera/infer/bleu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "tessera/core/error.h"
#include "tessera/infer/bleu_unicode.h"

namespace tessera::bleu {

namespace {

using unicode_detail::CpRange;

bool in_ranges(const CpRange* r, size_t n, uint32_t cp) {
  const CpRange* end = r + n;
  const CpRange* it = std::upper_bound(r, end, cp, [](uint32_t c, const CpRange& x) { return c < x.first; });
  return it != r && cp <= (it - 1)->last;
}

// Strict UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF), as Python's utf-8 codec
// reads a file. Returns false, with the offset of the first bad byte in *bad, for anything else.
bool decode_utf8(std::string_view s, std::u32string& out, size_t* bad) {
  out.clear();
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned b0 = p[i];
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (b0 < 0x80) {
      len = 1, cp = b0;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2, cp = b0 & 0x1F, min = 0x80;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3, cp = b0 & 0x0F, min = 0x800;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
      *bad = i;
      return false;
    }
    if (i + len > n) {
      *bad = i;
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) {
        *bad = i;
        return false;
      }
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      *bad = i;
      return false;
    }
    out.push_back(cp);
    i += len;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::u32string ascii32(const char* s) {
  std::u32string out;
  for (; *s; ++s) out.push_back(static_cast<unsigned char>(*s));
  return out;
}

// Python's str.replace(from, to): every non-overlapping occurrence, scanning left to right.
std::u32string replace_all(const std::u32string& s, const char* from_ascii, const char* to_ascii) {
  const std::u32string from = ascii32(from_ascii), to = ascii32(to_ascii);
  std::u32string out;
  size_t i = 0;
  for (size_t at; (at = s.find(from, i)) != std::u32string::npos; i = at + from.size())
    out.append(s, i, at - i).append(to);
  return out.append(s, i, std::u32string::npos);
}

// Python's re.sub of a pattern that matches exactly two code points, the first satisfying `a` and the second `b`:
// positions are tried left to right and a match resumes the scan after itself, so matches never overlap.
template <class A, class B, class Emit>
std::u32string sub2(const std::u32string& s, A a, B b, Emit emit) {
  std::u32string out;
  out.reserve(s.size() + s.size() / 2);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && a(s[i]) && b(s[i + 1])) {
      emit(out, s[i], s[i + 1]);
      i += 2;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

bool is_digit(char32_t c) { return c >= U'0' && c <= U'9'; }

// sacrebleu's TokenizerRegexp after Tokenizer13a's unescaping; the final whitespace cut is the caller's.
std::u32string tokenize_13a(std::u32string line) {
  line = replace_all(line, "<skipped>", "");
  line = replace_all(line, "-\n", "");
  line = replace_all(line, "\n", " ");
  if (line.find(U'&') != std::u32string::npos) {
    line = replace_all(line, "&quot;", "\"");
    line = replace_all(line, "&amp;", "&");
    line = replace_all(line, "&lt;", "<");
    line = replace_all(line, "&gt;", ">");
  }
  // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 " over " line ": ASCII punctuation but . , - ' and the digits.
  std::u32string s = U" ";
  for (char32_t c : line) {
    const bool split = (c >= 0x7B && c <= 0x7E) || (c >= 0x5B && c <= 0x60) || (c >= 0x20 && c <= 0x26) ||
                       (c >= 0x28 && c <= 0x2B) || (c >= 0x3A && c <= 0x40) || c == 0x2F;
    if (split) {
      s += U' ';
      s += c;
      s += U' ';
    } else {
      s += c;
    }
  }
  s += U' ';
  auto period_comma = [](char32_t c) { return c == U'.' || c == U','; };
  auto not_digit = [](char32_t c) { return !is_digit(c); };
  // ([^0-9])([\.,]) -> "\1 \2 "
  s = sub2(s, not_digit, period_comma,
           [](std::u32string& o, char32_t x, char32_t y) { o += x, o += U' ', o += y, o += U' '; });
  // ([\.,])([^0-9]) -> " \1 \2"
  s = sub2(s, period_comma, not_digit,
           [](std::u32string& o, char32_t x, char32_t y) { o += U' ', o += x, o += U' ', o += y; });
  // ([0-9])(-) -> "\1 \2 "
  s = sub2(
      s, is_digit, [](char32_t c) { return c == U'-'; },
      [](std::u32string& o, char32_t x, char32_t y) { o += x, o += U' ', o += y, o += U' '; });
  return s;
}

// sacrebleu's TokenizerV14International, before its whitespace cut.
std::u32string tokenize_intl(const std::u32string& line) {
  auto punct = [](char32_t c) { return is_punct(c); };
  auto not_number = [](char32_t c) { return !is_number(c); };
  // (\P{N})(\p{P}) -> "\1 \2 "
  std::u32string s = sub2(line, not_number, punct,
                          [](std::u32string& o, char32_t x, char32_t y) { o += x, o += U' ', o += y, o += U' '; });
  // (\p{P})(\P{N}) -> " \1 \2"
  s = sub2(s, punct, not_number,
           [](std::u32string& o, char32_t x, char32_t y) { o += U' ', o += x, o += U' ', o += y; });
  // (\p{S}) -> " \1 "
  std::u32string out;
  for (char32_t c : s) {
    if (is_symbol(c)) {
      out += U' ';
      out += c;
      out += U' ';
    } else {
      out += c;
    }
  }
  return out;
}

// n-gram -> count, an n-gram being its tokens joined by one space (tokens hold no whitespace, so the key is unique).
using NgramCounts = std::unordered_map<std::string, int64_t>;

// The 1..4-grams of a preprocessed segment; returns its token count.
int64_t extract_ngrams(const std::string& seg, NgramCounts& out) {
  out.clear();
  std::vector<size_t> starts, ends;  // byte offsets of each token; tokens are separated by exactly one space
  for (size_t i = 0; i < seg.size();) {
    size_t j = seg.find(' ', i);
    if (j == std::string::npos) j = seg.size();
    starts.push_back(i);
    ends.push_back(j);
    i = j + 1;
  }
  const size_t len = starts.size();
  for (size_t n = 1; n <= size_t(kMaxOrder); ++n)
    for (size_t i = 0; i + n <= len; ++i) ++out[seg.substr(starts[i], ends[i + n - 1] - starts[i])];
  return int64_t(len);
}

// sacrebleu's _get_closest_ref_len: the reference length nearest the hypothesis', the shorter on a tie.
int64_t closest_ref_len(int64_t hyp_len, const std::vector<int64_t>& ref_lens) {
  int64_t best_diff = -1, best = -1;
  for (int64_t r : ref_lens) {
    const int64_t diff = r > hyp_len ? r - hyp_len : hyp_len - r;
    if (best_diff == -1 || diff < best_diff) {
      best_diff = diff;
      best = r;
    } else if (diff == best_diff && r < best) {
      best = r;
    }
  }
  return best;
}

// sacrebleu's my_log: log with log(0) floored.
double my_log(double x) { return x == 0.0 ? -9999999999.0 : std::log(x); }

// sacrebleu's BLEU.compute_bleu with smooth_method "exp", effective order off, in Python's order of operations so
// that the doubles agree bit for bit.
void compute_bleu(Score& s) {
  if (s.hyp_len < s.ref_len) s.bp = s.hyp_len > 0 ? std::exp(1.0 - double(s.ref_len) / double(s.hyp_len)) : 0.0;
  else s.bp = 1.0;
  s.ratio = s.ref_len ? double(s.hyp_len) / double(s.ref_len) : 0.0;
  s.precisions.fill(0.0);
  s.score = 0.0;
  if (std::all_of(s.counts.begin(), s.counts.end(), [](int64_t c) { return c == 0; })) return;
  double smooth = 1.0;
  for (int n = 0; n < kMaxOrder; ++n) {
    if (s.totals[n] == 0) break;
    if (s.counts[n] == 0) {
      smooth *= 2;
      s.precisions[n] = 100.0 / (smooth * double(s.totals[n]));
    } else {
      s.precisions[n] = 100.0 * double(s.counts[n]) / double(s.totals[n]);
    }
  }
  double sum = 0.0;
  for (int n = 0; n < kMaxOrder; ++n) sum += my_log(s.precisions[n]);
  s.score = s.bp * std::exp(sum / kMaxOrder);
}

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace

bool py_isspace(uint32_t cp) {
  const uint32_t* end = unicode_detail::kSpaces + unicode_detail::kSpaceCount;
  return std::binary_search(unicode_detail::kSpaces, end, cp);
}

const char* py_lower(uint32_t cp) {
  const auto* first = unicode_detail::kLower;
  const auto* end = first + unicode_detail::kLowerCount;
  const auto* it =
      std::lower_bound(first, end, cp, [](const unicode_detail::LowerEntry& e, uint32_t c) { return e.cp < c; });
  return it != end && it->cp == cp ? it->lower : nullptr;
}

bool is_number(uint32_t cp) { return in_ranges(unicode_detail::kNumber, unicode_detail::kNumberCount, cp); }
bool is_punct(uint32_t cp) { return in_ranges(unicode_detail::kPunct, unicode_detail::kPunctCount, cp); }
bool is_symbol(uint32_t cp) { return in_ranges(unicode_detail::kSymbol, unicode_detail::kSymbolCount, cp); }

const char* tokenize_name(Tokenize t) {
  switch (t) {
    case Tokenize::k13a: return "13a";
    case Tokenize::kIntl: return "intl";
    case Tokenize::kNone: return "none";
  }
  return "?";
}

Tokenize parse_tokenize(const std::string& name) {
  if (name == "13a") return Tokenize::k13a;
  if (name == "intl") return Tokenize::kIntl;
  if (name == "none") return Tokenize::kNone;
  TS_THROW("unknown tokenizer '", name, "' (choose 13a, intl or none)");
}

size_t invalid_utf8_at(std::string_view line) {
  std::u32string s;
  size_t bad = 0;
  return decode_utf8(line, s, &bad) ? 0 : bad + 1;
}

std::string preprocess(std::string_view line, const Options& opt) {
  std::u32string s;
  size_t bad = 0;
  TS_CHECK(decode_utf8(line, s, &bad), "not valid UTF-8 (byte ", bad + 1, ")");
  if (opt.lowercase) {
    std::u32string low, part;
    for (char32_t c : s) {
      if (const char* l = py_lower(c)) {
        decode_utf8(l, part, &bad);
        low += part;
      } else {
        low += c;
      }
    }
    s = std::move(low);
  }
  while (!s.empty() && py_isspace(s.back())) s.pop_back();
  if (opt.tokenize == Tokenize::k13a) s = tokenize_13a(std::move(s));
  if (opt.tokenize == Tokenize::kIntl) s = tokenize_intl(s);
  // ' '.join(s.split())
  std::string out;
  bool in_token = false;
  for (char32_t c : s) {
    if (py_isspace(c)) {
      in_token = false;
      continue;
    }
    if (!in_token && !out.empty()) out += ' ';
    in_token = true;
    append_utf8(out, c);
  }
  return out;
}

Score corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs,
                  const Options& opt) {
  TS_CHECK(!refs.empty(), "BLEU needs at least one reference stream");
  for (size_t k = 0; k < refs.size(); ++k)
    TS_CHECK(refs[k].size() == hyps.size(), "reference ", k + 1, " has ", refs[k].size(), " lines, the hypotheses ",
             hyps.size());
  Score s;
  s.nrefs = int(refs.size());
  NgramCounts ref_max, one, hyp;
  std::vector<int64_t> ref_lens(refs.size());
  for (size_t i = 0; i < hyps.size(); ++i) {
    ref_max.clear();
    for (size_t k = 0; k < refs.size(); ++k) {
      std::string seg;
      try {
        seg = preprocess(refs[k][i], opt);
      } catch (const Error& e) {
        TS_THROW("reference ", k + 1, " line ", i + 1, ": ", e.what());
      }
      ref_lens[k] = extract_ngrams(seg, one);
      for (const auto& [g, c] : one) {
        int64_t& m = ref_max[g];
        m = std::max(m, c);
      }
    }
    std::string seg;
    try {
      seg = preprocess(hyps[i], opt);
    } catch (const Error& e) {
      TS_THROW("hypothesis line ", i + 1, ": ", e.what());
    }
    const int64_t hyp_len = extract_ngrams(seg, hyp);
    s.hyp_len += hyp_len;
    s.ref_len += closest_ref_len(hyp_len, ref_lens);
    for (const auto& [g, c] : hyp) {
      // The order of an n-gram is one more than its spaces.
      const auto n = size_t(std::count(g.begin(), g.end(), ' '));
      s.totals[n] += c;
      const auto it = ref_max.find(g);
      if (it != ref_max.end()) s.counts[n] += std::min(c, it->second);
    }
  }
  compute_bleu(s);
  return s;
}

// The strings are appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string&& here.
std::string signature(const Options& opt, int nrefs) {
  std::string s = "nrefs:";
  s.append(std::to_string(nrefs)).append("|case:").append(opt.lowercase ? "lc" : "mixed");
  s.append("|eff:no|tok:").append(tokenize_name(opt.tokenize)).append("|smooth:exp|version:").append(kSacreBleuVersion);
  return s;
}

std::string verbose_score(const Score& s) {
  std::string out;
  for (int n = 0; n < kMaxOrder; ++n) out.append(n ? "/" : "").append(fixed(s.precisions[n], 1));
  out.append(" (BP = ").append(fixed(s.bp, 3)).append(" ratio = ").append(fixed(s.ratio, 3));
  out.append(" hyp_len = ").append(std::to_string(s.hyp_len)).append(" ref_len = ").append(std::to_string(s.ref_len));
  return out.append(")");
}

std::string format_score(const Score& s, const std::string& signature) {
  std::string out = "BLEU";
  if (!signature.empty()) out.append("|").append(signature);
  return out.append(" = ").append(fixed(s.score, 2)).append(" ").append(verbose_score(s));
}

ExactMatch exact_match(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs) {
  for (size_t k = 0; k < refs.size(); ++k)
    TS_CHECK(refs[k].size() == hyps.size(), "reference ", k + 1, " has ", refs[k].size(), " lines, the hypotheses ",
             hyps.size());
  ExactMatch m;
  m.lines = int64_t(hyps.size());
  for (size_t i = 0; i < hyps.size(); ++i)
    m.matched += std::any_of(refs.begin(), refs.end(), [&](const auto& r) { return r[i] == hyps[i]; });
  return m;
}

}  // namespace tessera::bleu
