// BPE training's counting stage: streamed in blocks and counted by threads, against the whole text cut plainly.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe_train.h"
#include "tessera/tokenizer/pretokenize.h"
#include "test_util.h"

namespace tessera {
namespace {

// The whole text cut at the specials (leftmost, longest first) and each piece into pre-tokens, counted.
void reference_count(std::string_view text, const std::vector<std::string>& specials,
                     std::map<std::string, int64_t>& counts) {
  auto count_piece = [&](std::string_view rest) {
    while (!rest.empty()) {
      const size_t n = gpt2_pretoken_length(rest);
      counts[std::string(rest.substr(0, n))] += 1;
      rest.remove_prefix(n);
    }
  };
  size_t at = 0, piece = 0;
  while (at < text.size()) {
    size_t len = 0;
    for (const std::string& s : specials)
      if (text.substr(at, s.size()) == s) len = std::max(len, s.size());
    if (len == 0) {
      ++at;
      continue;
    }
    count_piece(text.substr(piece, at - piece));
    at += len;
    piece = at;
  }
  count_piece(text.substr(piece));
}

std::map<std::string, int64_t> as_map(const std::vector<WordCount>& v) {
  std::map<std::string, int64_t> m;
  for (const WordCount& w : v) {
    EXPECT_EQ(m.count(w.bytes), 0u) << "a pre-token listed twice";
    m[w.bytes] += w.count;
  }
  return m;
}

// Text made to meet every cut: words, runs of spaces, newlines and tabs, letters of two and three UTF-8 bytes,
// whitespace beyond ASCII (U+00A0, U+3000), invalid bytes, contractions, and the special tokens (one holds a
// space and a newline; "<s>" is a prefix of "<s>>", so the longest must win).
std::string random_text(std::mt19937_64& rng, size_t n_parts) {
  const std::vector<std::string> parts = {"the",
                                          " cat",
                                          "'s",
                                          "'re",
                                          " ",
                                          "  ",
                                          "\n",
                                          "\n\n",
                                          "\t",
                                          " \n ",
                                          "42",
                                          " 7",
                                          "!",
                                          "...",
                                          "\xc3\xa9t\xc3\xa9",
                                          "\xe3\x80\x82",
                                          "\xc2\xa0",
                                          "\xe3\x80\x80",
                                          "\xff",
                                          "\x80\x80",
                                          "\xe2\x82",
                                          "<|endoftext|>",
                                          "<|end of\ntext|>",
                                          "<s>",
                                          "<s>>",
                                          "<",
                                          "s>",
                                          "x"};
  std::uniform_int_distribution<size_t> pick(0, parts.size() - 1);
  std::string text;
  for (size_t i = 0; i < n_parts; ++i) text += parts[pick(rng)];
  return text;
}

BpeTrainParams count_params(std::vector<std::string> specials, int threads, size_t block) {
  BpeTrainParams p;
  p.vocab_size = 256 + static_cast<int>(specials.size());
  p.special_tokens = std::move(specials);
  p.threads = threads;
  p.block_bytes = block;
  return p;
}

TEST(BpeTrainCount, BlocksAndThreadsCountAsTheWholeText) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("TESSERA_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::vector<std::string>> special_sets = {{},
                                                              {"<|endoftext|>"},
                                                              {"<|endoftext|>", "<|end of\ntext|>", "<s>", "<s>>"}};
  for (int trial = 0; trial < 12; ++trial) {
    const std::string text = random_text(rng, 50 + 100 * trial);
    for (const auto& specials : special_sets) {
      std::map<std::string, int64_t> want;
      reference_count(text, specials, want);
      for (size_t block : {size_t{1}, size_t{5}, size_t{16}, size_t{100}, size_t{4096}, size_t{32} << 20}) {
        for (int threads : {1, 3}) {
          SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(specials.size()) + " specials, block " +
                       std::to_string(block) + ", threads " + std::to_string(threads));
          const auto got = bpe_count_text(text, count_params(specials, threads, block));
          ASSERT_EQ(as_map(got), want);
          ASSERT_TRUE(std::is_sorted(got.begin(), got.end(),
                                     [](const WordCount& u, const WordCount& v) { return u.bytes < v.bytes; }));
        }
      }
    }
  }
}

// Long stretches with no cut at all: the block grows until one comes, and counts the same.
TEST(BpeTrainCount, BlocksWithoutACutGrow) {
  std::string text = std::string(5000, 'a') + " " + std::string(3000, ' ') + "b" + std::string(4000, '\n');
  for (int threads : {1, 2}) {
    std::map<std::string, int64_t> want;
    reference_count(text, {}, want);
    EXPECT_EQ(as_map(bpe_count_text(text, count_params({}, threads, 7))), want);
  }
}

TEST(BpeTrainCount, FilesAreTextsOfTheirOwn) {
  std::mt19937_64 rng(test::test_seed());
  const auto dir = std::filesystem::temp_directory_path() / ("bpe_count_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string a = random_text(rng, 400) + "ab", b = "cd" + random_text(rng, 400);
  write_file_atomic((dir / "a.txt").string(), a);
  write_file_atomic((dir / "b.txt").string(), b);
  const std::vector<std::string> specials = {"<|endoftext|>"};
  std::map<std::string, int64_t> want;
  reference_count(a, specials, want);
  reference_count(b, specials, want);  // "ab" and "cd" stay apart: no pre-token spans two files
  uint64_t last_done = 0, total = 0;
  BpeTrainParams p = count_params(specials, 2, 64);
  p.progress = [&](const BpeTrainProgress& r) {
    EXPECT_EQ(r.stage, BpeTrainProgress::Stage::Counting);
    EXPECT_GE(r.done, last_done);
    last_done = r.done;
    total = r.total;
  };
  EXPECT_EQ(as_map(bpe_count_files({(dir / "a.txt").string(), (dir / "b.txt").string()}, p)), want);
  EXPECT_EQ(total, a.size() + b.size());
  EXPECT_EQ(last_done, total);
  try {
    bpe_count_files({(dir / "missing.txt").string()}, p);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read " + (dir / "missing.txt").string()), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The whole trainer: the same model whatever the threads and blocks; no merged token crosses a pre-token (each
// is inside one of the reference's pre-tokens) or holds a special token's bytes.
TEST(BpeTrainCount, TrainingIsDeterministicAndStaysInsidePretokens) {
  std::mt19937_64 rng(test::test_seed());
  const std::string text = random_text(rng, 3000);
  const std::vector<std::string> specials = {"<|endoftext|>", "<s>"};
  std::map<std::string, int64_t> pretokens;
  reference_count(text, specials, pretokens);
  BpeTrainParams p = count_params(specials, 1, size_t{32} << 20);
  p.vocab_size = 400;
  const BpeModel base = bpe_train_text(text, p);
  ASSERT_GT(base.merges.size(), 20u);
  for (const auto& [threads, block] : std::vector<std::pair<int, size_t>>{{2, 13}, {4, 1}, {3, 257}, {0, 4096}}) {
    p.threads = threads;
    p.block_bytes = block;
    const BpeModel m = bpe_train_text(text, p);
    EXPECT_EQ(m.tokens, base.tokens) << "threads " << threads << ", block " << block;
    EXPECT_EQ(m.merges, base.merges) << "threads " << threads << ", block " << block;
  }
  for (size_t id = 258; id < base.tokens.size(); ++id) {
    const std::string& t = base.tokens[id];
    bool inside = false;
    for (const auto& [w, c] : pretokens) inside = inside || w.find(t) != std::string::npos;
    EXPECT_TRUE(inside) << "token " << id << " '" << t << "' crosses a pre-token";
    for (const std::string& s : specials) EXPECT_EQ(t.find(s), std::string::npos) << t;
  }
}

}  // namespace
}  // namespace tessera
