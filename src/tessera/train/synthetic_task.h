// tessera/train/synthetic_task.h — deterministic synthetic translation sets, for `tessera make-task`: tests and the
// default run of an encoder-decoder preset.
//
// Tasks (a "symbol" is one lowercase letter a-z; a sequence is symbols joined by single spaces, so that a byte-level
// model and a BPE tokenizer both see one unit a symbol):
//   copy             "q b q x" -> "q b q x"
//   reverse          "q b q x" -> "x q b q"
//   sort             "q b q x" -> "b q q x" (by letter)
//   digits-to-words  "907" -> "nine hundred seven" (number_words below)
// Lengths are drawn uniformly in [min_len, max_len]: symbols for the first three, digits for digits-to-words.
//
// Determinism: every draw comes from SplitMix64 (core/splitmix.h), never a std:: distribution, so a seed gives
// the same pairs, byte for byte, on every platform. Pair i does not depend on how many pairs are asked for: the
// first n pairs of --pairs 2n are the pairs of --pairs n.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera {

enum class SyntheticTask { Copy, Reverse, Sort, DigitsToWords };

// "copy", "reverse", "sort", "digits-to-words"; parse_synthetic_task throws Error for another name, listing these.
const char* synthetic_task_name(SyntheticTask task);
SyntheticTask parse_synthetic_task(std::string_view name);

// The most digits digits-to-words writes: every number below 10^18 has words (up to "quadrillion").
constexpr int kMaxNumberDigits = 18;

struct SyntheticTaskParams {
  SyntheticTask task = SyntheticTask::Copy;
  uint64_t pairs = 0;
  uint64_t seed = 0;
  int min_len = 0, max_len = 0;  // 0: the task's default (synthetic_task_default_lengths)
};
// {min, max} when not given: 3-12 symbols, 1-6 digits.
std::pair<int, int> synthetic_task_default_lengths(SyntheticTask task);

// The pairs {source, target}. Throws Error for lengths out of range (min < 1, max < min, more digits than
// kMaxNumberDigits).
std::vector<std::pair<std::string, std::string>> make_synthetic_pairs(const SyntheticTaskParams& params);

// The English words of n, American short scale: groups of three digits from the highest, each "<hundreds> hundred
// <tens> <units>" followed by its scale (thousand, million, billion, trillion, quadrillion); a zero group is left
// out, as is "and"; the tens and the units are separate words ("twenty one", not "twenty-one"), so that every word
// is one space-separated unit. 0 is "zero"; 907 "nine hundred seven"; 1000007 "one million seven"; 12 "twelve".
// Defined below 10^18.
std::string number_words(uint64_t n);

}  // namespace tessera
