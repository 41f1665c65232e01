// Token-based batching (train/pair_batch.h): every pair once an epoch, no batch past max_tokens, far less padding
// than unsorted batching, the same plan for a seed, a too-long pair refused, and the padded rows as the decoder
// reads them.
#include <gtest/gtest.h>

#include <algorithm>

#include "tessera/core/splitmix.h"
#include "tessera/train/pair_batch.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::error_of;

// Lengths of a translation-like set: sources of 1-100 tokens, each target its source's length within ±5.
struct Lengths {
  std::vector<uint32_t> src, tgt;
};
Lengths random_lengths(size_t n, uint64_t seed) {
  SplitMix64 r{seed};
  Lengths l;
  for (size_t i = 0; i < n; ++i) {
    const auto s = static_cast<int64_t>(r.between(1, 100));
    l.src.push_back(static_cast<uint32_t>(s));
    l.tgt.push_back(static_cast<uint32_t>(std::max<int64_t>(1, s + static_cast<int64_t>(r.between(0, 10)) - 5)));
  }
  return l;
}

// 1 - real / padded tokens over the epoch: real are each pair's source + target + 1, padded each batch's
// B · (S + T), the tensors the model runs on.
double padding_waste(const Lengths& l, const std::vector<std::vector<uint32_t>>& plan) {
  double real = 0, padded = 0;
  for (const auto& b : plan) {
    uint32_t S = 0, T = 0;
    for (const uint32_t i : b) {
      S = std::max(S, l.src[i]);
      T = std::max(T, l.tgt[i] + 1);
      real += l.src[i] + l.tgt[i] + 1;
    }
    padded += static_cast<double>(b.size()) * (S + T);
  }
  return 1 - real / padded;
}

TEST(PairBatch, EveryPairOnceAndNoBatchPastMaxTokens) {
  const Lengths l = random_lengths(3001, 5);
  for (const size_t window : {size_t{0}, size_t{1}, size_t{500}, kPairSortWindow}) {
    for (const uint64_t epoch : {0, 1, 7}) {
      const PairBatchParams p{.max_tokens = 1000, .sort_window = window, .seed = 9};
      const auto plan = plan_pair_batches(l.src, l.tgt, p, epoch);
      std::vector<int> seen(l.src.size(), 0);
      for (const auto& b : plan) {
        ASSERT_FALSE(b.empty());
        uint32_t longest = 0;
        for (const uint32_t i : b) {
          ++seen[i];
          longest = std::max({longest, l.src[i], l.tgt[i] + 1});
        }
        ASSERT_LE(static_cast<int64_t>(b.size()) * longest, p.max_tokens) << "window " << window;
      }
      for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "pair " << i << ", window " << window;
    }
  }
}

TEST(PairBatch, SortingByLengthWastesFarLessThanUnsortedBatches) {
  const Lengths l = random_lengths(20000, 11);
  const auto sorted = plan_pair_batches(l.src, l.tgt, {.max_tokens = 4096, .sort_window = 4096, .seed = 1}, 0);
  const auto unsorted = plan_pair_batches(l.src, l.tgt, {.max_tokens = 4096, .sort_window = 1, .seed = 1}, 0);
  const double ws = padding_waste(l, sorted), wu = padding_waste(l, unsorted);
  // Unsorted batches of about 40 pairs pad each to the longest of ~U(1, 100): about half is padding. Sorted within
  // windows of 4096 pairs, a batch's lengths differ by a token or two, plus the ±5 between source and target.
  EXPECT_GT(wu, 0.4) << wu;
  EXPECT_LT(ws, 0.1) << ws;
  EXPECT_LT(ws, wu / 4) << ws << " vs " << wu;
}

TEST(PairBatch, SameSeedSamePlanAndEpochsDiffer) {
  const Lengths l = random_lengths(2000, 3);
  const PairBatchParams p{.max_tokens = 800, .sort_window = 256, .seed = 4};
  const auto a = plan_pair_batches(l.src, l.tgt, p, 2);
  EXPECT_EQ(a, plan_pair_batches(l.src, l.tgt, p, 2));
  EXPECT_NE(a, plan_pair_batches(l.src, l.tgt, p, 3));
  PairBatchParams q = p;
  q.seed = 5;
  EXPECT_NE(a, plan_pair_batches(l.src, l.tgt, q, 2));
}

TEST(PairBatch, APairLongerThanMaxTokensIsOneError) {
  const std::vector<uint32_t> src{3, 40, 2}, tgt{3, 2, 2};
  EXPECT_EQ(error_of([&] { plan_pair_batches(src, tgt, {.max_tokens = 39}, 0); }),
            "pair 1 (source 40 tokens, target 2 + 1) is longer than --max-tokens 39 alone: raise --max-tokens, or "
            "drop the pair");
  const std::vector<uint32_t> long_tgt{3, 2, 39};  // 39 + 1: the decoder's sequence is one longer than the target
  EXPECT_NE(error_of([&] {
              plan_pair_batches(tgt, long_tgt, {.max_tokens = 39}, 0);
            }).find("pair 2 (source 2 tokens, target 39"),
            std::string::npos);
}

TEST(PairBatch, RowsArePaddedAsTheDecoderReadsThem) {
  const fs::path d = test::temp_dir("pair_batch");
  PairTokens p;
  p.add(std::vector<int32_t>{10, 11, 12}, std::vector<int32_t>{20});
  p.add(std::vector<int32_t>{13}, std::vector<int32_t>{21, 22, 23});
  const std::string path = (d / "x.pairs").string();
  write_pair_shard(path, p, 256);
  const PairShard shard(path);
  const PairBatchParams params{.max_tokens = 100, .pad_id = 0, .bos_id = 1, .eos_id = 2};
  const std::vector<uint32_t> rows{1, 0};
  const PairBatch b = make_pair_batch(shard, rows, params);
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.S, 3);
  EXPECT_EQ(b.T, 4);
  EXPECT_EQ(b.padded_tokens(), 8);
  EXPECT_EQ(b.source, (std::vector<int32_t>{13, 0, 0, 10, 11, 12}));
  EXPECT_EQ(b.source_len, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(b.dec_in, (std::vector<int32_t>{1, 21, 22, 23, 1, 20, 0, 0}));
  EXPECT_EQ(b.dec_out, (std::vector<int32_t>{21, 22, 23, 2, 20, 2, 0, 0}));
  EXPECT_EQ(b.target_len, (std::vector<int32_t>{4, 2}));

  // The batcher: one epoch holds every pair once, then the next epoch starts; a position resumes the same batch.
  PairBatcher batcher(shard, {.max_tokens = 4, .seed = 3});
  EXPECT_EQ(batcher.batches_in_epoch(), 2u);  // each pair costs 3 or 4 alone: one a batch
  std::vector<uint32_t> first;
  for (int k = 0; k < 2; ++k) first.push_back(batcher.next().pairs[0]);
  std::sort(first.begin(), first.end());
  EXPECT_EQ(first, (std::vector<uint32_t>{0, 1}));
  const PairBatch e1 = batcher.next();
  EXPECT_EQ(batcher.epoch(), 1u);
  PairBatcher resumed(shard, {.max_tokens = 4, .seed = 3});
  resumed.set_position(1, 0);
  EXPECT_EQ(resumed.next().pairs, e1.pairs);
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
