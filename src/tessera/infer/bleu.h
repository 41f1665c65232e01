// tessera/infer/bleu.h — corpus BLEU exactly as the sacrebleu package computes it by default (its BLEU class:
// n = 4, exp smoothing, effective order off), and exact match, for `tessera eval --bleu` and `tessera translate`.
//
// This is a C++ port of sacrebleu 2.4.3 (kSacreBleuVersion), not a call of it: the package does not run. Its
// behaviour, reproduced step by step:
// - A segment is lowercased (with lowercase: Python's str.lower()), stripped of trailing whitespace (str.rstrip())
//   and tokenized: `13a` (mteval-v13a: unescape &quot; &amp; &lt; &gt;, split off ASCII punctuation, and `.` `,`
//   unless between digits, `-` after a digit), `intl` (mteval-v14: Unicode punctuation unless between digits, and
//   symbols) or `none`. Tokens are then what str.split() gives: cut on Python's whitespace.
// - For each segment: the hypothesis' 1..4-gram counts, clipped by the largest count of each n-gram in any one
//   reference; the reference length is the reference's closest to the hypothesis' length (ties: the shorter).
// - Over the corpus, with counts c_n of total t_n: p_n = 100 c_n / t_n; where c_n = 0, p_n = 100 / (2^k t_n), k
//   counting the zero orders so far (exp smoothing); the first order with t_n = 0 and those after it give p_n = 0.
//   BP = exp(1 - r/h) when h < r (0 when h = 0), else 1. BLEU = BP exp(sum_n log(p_n) / 4), with log(0) taken as
//   -9999999999, and BLEU = 0 where no n-gram of any order matched.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::bleu {

// The sacrebleu release whose BLEU this file reproduces; it goes in the signature's `version` field, as the
// package writes its own version there.
inline constexpr const char* kSacreBleuVersion = "2.4.3";
inline constexpr int kMaxOrder = 4;

enum class Tokenize { k13a, kIntl, kNone };

struct Options {
  Tokenize tokenize = Tokenize::k13a;
  bool lowercase = false;
};

// "13a", "intl" or "none"; parse_tokenize throws an Error naming the choices for any other name.
const char* tokenize_name(Tokenize t);
Tokenize parse_tokenize(const std::string& name);

struct Score {
  double score = 0;                            // 0..100
  std::array<int64_t, kMaxOrder> counts{};     // matched n-grams, n = 1..4
  std::array<int64_t, kMaxOrder> totals{};     // hypothesis n-grams
  std::array<double, kMaxOrder> precisions{};  // percent, smoothed
  double bp = 0;                               // brevity penalty
  double ratio = 0;                            // hyp_len / ref_len, 0 where ref_len = 0
  int64_t hyp_len = 0, ref_len = 0;
  int nrefs = 0;
};

// Where `line` stops being valid UTF-8 (strict, as Python's codec reads a file): the 1-based offset of the first bad
// byte, or 0 where the whole line is valid.
size_t invalid_utf8_at(std::string_view line);

// One segment as BLEU sees it: lowercased where asked, right-stripped, tokenized, tokens joined by one space.
// Throws an Error where `line` is not valid UTF-8.
std::string preprocess(std::string_view line, const Options& opt);

// Corpus BLEU of hyps against refs: refs[k][i] is reference k of segment i; every refs[k] has hyps.size() lines
// (else an Error). Throws an Error for a line that is not valid UTF-8, naming it.
Score corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs,
                  const Options& opt = {});

// sacrebleu's signature: "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3".
std::string signature(const Options& opt, int nrefs);
// sacrebleu's score line, `BLEU|<signature> = 30.18 100.0/66.7/50.0/50.0 (BP = 0.472 ratio = 0.571 hyp_len = 4
// ref_len = 7)`; without a signature, `BLEU = 30.18 ...`.
std::string format_score(const Score& s, const std::string& signature = "");
// The part after the score: `100.0/66.7/50.0/50.0 (BP = ... ref_len = 7)` (sacrebleu's verbose_score).
std::string verbose_score(const Score& s);

struct ExactMatch {
  int64_t matched = 0;  // lines equal, byte for byte, to at least one of their references
  int64_t lines = 0;
  double share() const { return lines ? double(matched) / double(lines) : 0.0; }
};
// Lines are compared as given: no stripping, no tokenizing, case kept.
ExactMatch exact_match(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs);

}  // namespace tessera::bleu
