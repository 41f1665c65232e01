#include "tessera/train/synthetic_task.h"

#include <algorithm>

#include "tessera/core/error.h"
#include "tessera/core/splitmix.h"

namespace tessera {

namespace {
constexpr const char* kOnes[20] = {"zero",     "one",     "two",     "three",     "four",     "five",    "six",
                                   "seven",    "eight",   "nine",    "ten",       "eleven",   "twelve",  "thirteen",
                                   "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
constexpr const char* kTens[10] = {"",      "",      "twenty",  "thirty", "forty",
                                   "fifty", "sixty", "seventy", "eighty", "ninety"};
constexpr const char* kScales[6] = {"", "thousand", "million", "billion", "trillion", "quadrillion"};
constexpr int kAlphabet = 26;

void append_word(std::string& out, const char* word) {
  if (!out.empty()) out += ' ';
  out += word;
}

// The words of 1 <= g <= 999.
void append_group(std::string& out, unsigned g) {
  if (g >= 100) {
    append_word(out, kOnes[g / 100]);
    append_word(out, "hundred");
    g %= 100;
  }
  if (g >= 20) {
    append_word(out, kTens[g / 10]);
    g %= 10;
    if (g) append_word(out, kOnes[g]);
  } else if (g) {
    append_word(out, kOnes[g]);
  }
}

uint64_t pow10(int k) {
  uint64_t p = 1;
  for (int i = 0; i < k; ++i) p *= 10;
  return p;
}

// Pair i of the task: its own stream (seed, i), so that it does not depend on the pairs before it.
std::pair<std::string, std::string> make_pair_at(const SyntheticTaskParams& p, int min_len, int max_len, uint64_t i) {
  SplitMix64 rng = splitmix_stream(p.seed, i);
  const int len = static_cast<int>(rng.between(static_cast<uint64_t>(min_len), static_cast<uint64_t>(max_len)));
  if (p.task == SyntheticTask::DigitsToWords) {
    // A number of exactly `len` digits: no leading zero, except the one-digit numbers, which include 0.
    const uint64_t lo = len == 1 ? 0 : pow10(len - 1);
    const uint64_t n = rng.between(lo, pow10(len) - 1);
    return {std::to_string(n), number_words(n)};
  }
  std::string symbols(static_cast<size_t>(len), 'a');
  for (char& c : symbols) c = static_cast<char>('a' + rng.below(kAlphabet));
  std::string target = symbols;
  if (p.task == SyntheticTask::Reverse) std::reverse(target.begin(), target.end());
  if (p.task == SyntheticTask::Sort) std::sort(target.begin(), target.end());
  const auto spaced = [](const std::string& s) {
    std::string out;
    out.reserve(s.size() * 2);
    for (const char c : s) {
      if (!out.empty()) out += ' ';
      out += c;
    }
    return out;
  };
  return {spaced(symbols), spaced(target)};
}
}  // namespace

const char* synthetic_task_name(SyntheticTask task) {
  switch (task) {
    case SyntheticTask::Copy: return "copy";
    case SyntheticTask::Reverse: return "reverse";
    case SyntheticTask::Sort: return "sort";
    case SyntheticTask::DigitsToWords: return "digits-to-words";
  }
  return "?";
}

SyntheticTask parse_synthetic_task(std::string_view name) {
  for (const SyntheticTask t :
       {SyntheticTask::Copy, SyntheticTask::Reverse, SyntheticTask::Sort, SyntheticTask::DigitsToWords})
    if (name == synthetic_task_name(t)) return t;
  TS_THROW("unknown task '", name, "' (expected copy, reverse, sort or digits-to-words)");
}

std::pair<int, int> synthetic_task_default_lengths(SyntheticTask task) {
  return task == SyntheticTask::DigitsToWords ? std::pair{1, 6} : std::pair{3, 12};
}

std::string number_words(uint64_t n) {
  TS_CHECK(n < pow10(kMaxNumberDigits), "number_words: ", n, " has more than ", kMaxNumberDigits, " digits");
  if (n == 0) return kOnes[0];
  unsigned groups[6] = {};
  for (int k = 0; k < 6; ++k, n /= 1000) groups[k] = static_cast<unsigned>(n % 1000);
  std::string out;
  for (int k = 5; k >= 0; --k) {
    if (groups[k] == 0) continue;
    append_group(out, groups[k]);
    if (k > 0) append_word(out, kScales[k]);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> make_synthetic_pairs(const SyntheticTaskParams& p) {
  const auto [dmin, dmax] = synthetic_task_default_lengths(p.task);
  // One bound given alone moves the other default out of its way: --max-len 2 alone is 2-2, not 3-2.
  const int min_len = p.min_len > 0 ? p.min_len : (p.max_len > 0 ? std::min(dmin, p.max_len) : dmin);
  const int max_len = p.max_len > 0 ? p.max_len : std::max(dmax, min_len);
  const bool digits = p.task == SyntheticTask::DigitsToWords;
  TS_CHECK(p.min_len >= 0 && p.max_len >= 0, "--min-len and --max-len must be at least 1");
  TS_CHECK(min_len <= max_len, "--min-len ", min_len, " is more than --max-len ", max_len);
  TS_CHECK(!digits || max_len <= kMaxNumberDigits, "--max-len ", max_len,
           " is more digits than digits-to-words has words for (at most ", kMaxNumberDigits, ")");
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(p.pairs);
  for (uint64_t i = 0; i < p.pairs; ++i) pairs.push_back(make_pair_at(p, min_len, max_len, i));
  return pairs;
}

}  // namespace tessera
