// BPE training's merge stage against a brute-force trainer that recounts every pair after every merge.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/tokenizer/bpe_train.h"
#include "test_util.h"

namespace tessera {
namespace {

// The merges as byte strings, and the ordinary tokens in id order (specials left out).
struct Trained {
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> tokens;
};

// CS336's rules written plainly: count every pair of every word, take the greatest (count, bytes(left),
// bytes(right)), replace it left to right in every word, again, until `target` ordinary tokens exist or no pair is
// left. A merge whose bytes are a token already reuses it.
Trained reference_train(const std::map<std::string, int64_t>& counts, size_t target) {
  Trained r;
  std::map<std::string, int> id_of;
  for (int b = 0; b < 256; ++b) {
    r.tokens.emplace_back(1, static_cast<char>(b));
    id_of[r.tokens.back()] = b;
  }
  std::vector<std::pair<std::vector<int>, int64_t>> words;
  for (const auto& [w, c] : counts) {
    std::vector<int> s;
    for (unsigned char ch : w) s.push_back(ch);
    words.emplace_back(s, c);
  }
  while (r.tokens.size() < target) {
    std::map<std::pair<int, int>, int64_t> pairs;
    for (const auto& [s, c] : words)
      for (size_t i = 0; i + 1 < s.size(); ++i) pairs[{s[i], s[i + 1]}] += c;
    if (pairs.empty()) break;
    std::pair<int, int> best{};
    int64_t best_count = -1;
    for (const auto& [p, c] : pairs) {
      const auto key = std::make_pair(r.tokens[p.first], r.tokens[p.second]);
      if (c > best_count || (c == best_count && key > std::make_pair(r.tokens[best.first], r.tokens[best.second]))) {
        best = p;
        best_count = c;
      }
    }
    const std::string bytes = r.tokens[best.first] + r.tokens[best.second];
    if (!id_of.count(bytes)) {
      id_of[bytes] = static_cast<int>(r.tokens.size());
      r.tokens.push_back(bytes);
    }
    const int c = id_of[bytes];
    r.merges.emplace_back(r.tokens[best.first], r.tokens[best.second]);
    for (auto& [s, n] : words) {
      std::vector<int> out;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == best.first && s[i + 1] == best.second) {
          out.push_back(c);
          i += 2;
        } else {
          out.push_back(s[i++]);
        }
      }
      s = out;
    }
  }
  return r;
}

Trained as_bytes(const BpeModel& m) {
  Trained t;
  for (const auto& [a, b] : m.merges) t.merges.emplace_back(m.tokens[a], m.tokens[b]);
  std::vector<bool> special(m.tokens.size(), false);
  for (int32_t id : m.special_ids) special[id] = true;
  for (size_t i = 0; i < m.tokens.size(); ++i)
    if (!special[i]) t.tokens.push_back(m.tokens[i]);
  return t;
}

BpeTrainParams params(int vocab, std::vector<std::string> specials = {}, bool special_first = false) {
  BpeTrainParams p;
  p.vocab_size = vocab;
  p.special_tokens = std::move(specials);
  p.special_first = special_first;
  return p;
}

std::vector<WordCount> as_words(const std::map<std::string, int64_t>& counts) {
  std::vector<WordCount> w;
  for (const auto& [s, c] : counts) w.push_back({s, c});
  return w;
}

// Words of 1..max_len symbols from a tiny alphabet with small counts: most pair counts tie. The alphabet has bytes
// above 0x7f, which Python's bytes order puts above the letters (a signed char compare would not).
std::map<std::string, int64_t> random_counts(std::mt19937_64& rng, int n_words, int max_len,
                                             const std::string& alphabet, int max_count) {
  std::map<std::string, int64_t> counts;
  std::uniform_int_distribution<int> len(1, max_len), sym(0, static_cast<int>(alphabet.size()) - 1), cnt(1, max_count);
  for (int i = 0; i < n_words; ++i) {
    std::string w;
    for (int j = len(rng); j > 0; --j) w += alphabet[sym(rng)];
    counts[w] += cnt(rng);
  }
  return counts;
}

TEST(BpeTrain, MatchesBruteForceOnRandomCorporaWithTies) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("TESSERA_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::string> alphabets = {"ab", "abc", std::string("a\xff") + "b", std::string("\x80z\x01 ", 4)};
  for (int trial = 0; trial < 60; ++trial) {
    const std::string& alphabet = alphabets[trial % alphabets.size()];
    const auto counts = random_counts(rng, 5 + trial % 40, 1 + trial % 12, alphabet, 1 + trial % 3);
    const int vocab = 256 + 1 + trial % 60;
    SCOPED_TRACE("trial " + std::to_string(trial) + ", vocab " + std::to_string(vocab));
    const Trained want = reference_train(counts, static_cast<size_t>(vocab));
    const BpeModel got = bpe_train_counts(as_words(counts), params(vocab));
    const Trained g = as_bytes(got);
    ASSERT_EQ(g.merges, want.merges);
    ASSERT_EQ(g.tokens, want.tokens);
  }
}

// The worked example of CS336's assignment 1 handout (§2.4), pre-tokenized on whitespace: its six merges.
TEST(BpeTrain, HandoutExample) {
  const std::map<std::string, int64_t> counts = {{"low", 5}, {"lower", 2}, {"widest", 3}, {"newest", 6}};
  const BpeModel m = bpe_train_counts(as_words(counts), params(256 + 1 + 6, {"<|endoftext|>"}));
  const std::vector<std::pair<std::string, std::string>> want = {{"s", "t"},  {"e", "st"},  {"o", "w"},
                                                                 {"l", "ow"}, {"w", "est"}, {"n", "e"}};
  EXPECT_EQ(as_bytes(m).merges, want);
}

TEST(BpeTrain, SpecialIdsAndVocabSize) {
  std::mt19937_64 rng(test::test_seed());
  const auto counts = random_counts(rng, 200, 10, "abcdef", 5);
  const std::vector<std::string> specials = {"<|endoftext|>", "<pad>"};
  for (bool first : {false, true}) {
    const BpeModel m = bpe_train_counts(as_words(counts), params(300, specials, first));
    ASSERT_EQ(m.tokens.size(), 300u);
    const std::vector<int32_t> want_ids = first ? std::vector<int32_t>{0, 1} : std::vector<int32_t>{256, 257};
    EXPECT_EQ(m.special_ids, want_ids);
    for (size_t i = 0; i < specials.size(); ++i) EXPECT_EQ(m.tokens[m.special_ids[i]], specials[i]);
    const int32_t byte0 = first ? 2 : 0;
    for (int b = 0; b < 256; ++b) EXPECT_EQ(m.tokens[byte0 + b], std::string(1, static_cast<char>(b)));
    for (const auto& [x, y] : m.merges) {
      for (int32_t s : m.special_ids) {
        EXPECT_NE(x, s);
        EXPECT_NE(y, s);
      }
    }
    // The same merges as bytes, wherever the ids are.
    EXPECT_EQ(as_bytes(m).merges, reference_train(counts, 298).merges);
  }
}

TEST(BpeTrain, StopsWhenNoPairIsLeft) {
  const BpeModel m = bpe_train_counts({{"ab", 3}, {"c", 9}}, params(1000));
  EXPECT_EQ(m.tokens.size(), 257u);
  ASSERT_EQ(m.merges.size(), 1u);
  EXPECT_EQ(m.tokens[256], "ab");
}

TEST(BpeTrain, InputOrderAndRepeatsDoNotMatter) {
  std::mt19937_64 rng(test::test_seed());
  const auto counts = random_counts(rng, 100, 8, "abc", 3);
  std::vector<WordCount> split;  // each count given as ones, shuffled
  for (const auto& [w, c] : counts)
    for (int64_t i = 0; i < c; ++i) split.push_back({w, 1});
  std::shuffle(split.begin(), split.end(), rng);
  EXPECT_EQ(as_bytes(bpe_train_counts(split, params(320))).merges,
            as_bytes(bpe_train_counts(as_words(counts), params(320))).merges);
}

TEST(BpeTrain, BadParams) {
  auto message = [](const BpeTrainParams& p) {
    try {
      bpe_train_counts({{"ab", 1}}, p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(params(255)).find("vocab size 255 is below the 256 bytes"), std::string::npos);
  EXPECT_NE(message(params(257, {"a", "b"})).find("at least 258"), std::string::npos);
  EXPECT_NE(message(params(300, {"x", "x"})).find("given twice"), std::string::npos);
  EXPECT_NE(message(params(300, {""})).find("empty"), std::string::npos);
  BpeTrainParams negative = params(300);
  negative.threads = -1;
  EXPECT_NE(message(negative).find("threads"), std::string::npos);
}

}  // namespace
}  // namespace tessera
