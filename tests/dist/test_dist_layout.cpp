// The ranges that DDP buckets and ZeRO-1 shards cut from the flat buffers (no MPI needed: part of tessera_tests).
#include <gtest/gtest.h>

#include "tessera/dist/ddp.h"
#include "tessera/dist/zero.h"
#include "tessera/models/gpt.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(ZeroLayout, RanksOwnContiguousAlignedRangesThatPartitionTheBuffer) {
  for (size_t total :
       {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{63}, size_t{1000}, size_t{834304}, size_t{1000003}}) {
    for (int world : {1, 2, 3, 4, 7, 8}) {
      const ZeroLayout l = zero_layout(total, world);
      EXPECT_EQ(l.chunk % kSegmentAlign, 0u);
      EXPECT_LT(total - l.tail_begin(), kSegmentAlign * world) << total << " over " << world;  // the tail is short
      size_t at = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(l.begin(r), at) << total << " over " << world << ", rank " << r;
        EXPECT_EQ(l.begin(r) % kSegmentAlign, 0u);
        at = l.end(r);
      }
      EXPECT_EQ(at, total);
      // 1/N of the buffer each, to within the tail.
      for (int r = 0; r < world; ++r) EXPECT_LE(l.count(r), total / world + kSegmentAlign * world);
    }
  }
}

// The chunk is rounded down to whole blocks of 16: past one block a rank it is 0 and the last rank holds the whole
// buffer as its tail, sharding nothing. zero_max_world is where that starts; train and info refuse a world past it.
TEST(ZeroLayout, MaxWorldIsOneBlockARank) {
  for (size_t total : {size_t{0}, size_t{15}, size_t{16}, size_t{17}, size_t{1000}, size_t{834304}}) {
    const int max = zero_max_world(total);
    EXPECT_EQ(max, std::max<size_t>(1, total / kSegmentAlign)) << total;
    if (total >= kSegmentAlign) {
      EXPECT_EQ(zero_layout(total, max).chunk, kSegmentAlign) << total;  // one block on every rank
      EXPECT_EQ(zero_layout(total, max + 1).chunk, 0u) << total;         // none: everything is the last rank's tail
    }
  }
}

TEST(ZeroLayout, SegmentsAreCutToTheRangeAndRebased) {
  const std::vector<ParamSegment> segs{{"a", 0, 10, true}, {"b", 16, 20, false}, {"c", 48, 5, true}};
  const auto cut = segments_in_range(segs, 8, 50);
  ASSERT_EQ(cut.size(), 3u);
  EXPECT_EQ(cut[0].offset, 0u);  // a's [8, 10)
  EXPECT_EQ(cut[0].numel, 2u);
  EXPECT_EQ(cut[1].offset, 8u);  // b's [16, 36)
  EXPECT_EQ(cut[1].numel, 20u);
  EXPECT_FALSE(cut[1].decay);
  EXPECT_EQ(cut[2].offset, 40u);  // c's [48, 50)
  EXPECT_EQ(cut[2].numel, 2u);
  EXPECT_TRUE(segments_in_range(segs, 10, 16).empty());  // padding only
}

TEST(DdpBuckets, CoverTheBufferDescendingAndCloseAtTheSizeAsked) {
  Gpt model(test::small_config(/*vocab=*/64, /*d_model=*/16, /*n_layers=*/3, /*n_heads=*/2, /*d_ff=*/32,
                               /*max_seq=*/8));
  const ParamBuffer& p = model.params();
  for (double mb : {1e-9, 0.001, 0.004, 0.01, 25.0}) {
    const size_t bytes = static_cast<size_t>(mb * 1e6);
    const auto buckets = plan_buckets(p, bytes);
    ASSERT_FALSE(buckets.empty());
    size_t hi = p.size();
    for (size_t k = 0; k < buckets.size(); ++k) {
      EXPECT_EQ(buckets[k].end, hi) << "bucket " << k << " at " << mb << " MB";
      EXPECT_LT(buckets[k].begin, buckets[k].end);
      hi = buckets[k].begin;
      // Every bucket but the last (lowest) holds at least the size asked, and is a run of whole segments.
      size_t grads = 0;
      bool starts_at_segment = false;
      for (const ParamSegment& s : p.segments()) {
        if (s.offset >= buckets[k].begin && s.offset < buckets[k].end) grads += s.numel * 4;
        starts_at_segment |= s.offset == buckets[k].begin;
      }
      if (k + 1 < buckets.size()) {
        EXPECT_GE(grads, bytes);
      }
      EXPECT_TRUE(starts_at_segment || buckets[k].begin == 0);
    }
    EXPECT_EQ(hi, 0u);
    if (mb < 1e-6) {
      EXPECT_EQ(buckets.size(), p.segments().size());  // one segment each
    } else if (mb >= 1) {
      EXPECT_EQ(buckets.size(), 1u);
    }
  }
}

// The hook reports every range once, descending, and each range's gradients are final when reported: they
// equal the gradients at the end of backward.
TEST(GradReadyHook, ReportsEveryRangeOnceDescendingWithItsGradientsFinal) {
  for (bool tied : {true, false}) {
    ModelConfig cfg = test::small_config(64, 16, 3, 2, 32, 8);
    cfg.tied = tied;
    Gpt m(cfg);
    m.init_weights(3);
    std::mt19937_64 rng(test::test_seed());
    const auto x = test::randint(2 * 8, 64, rng), y = test::randint(2 * 8, 64, rng);
    m.zero_grad();
    m.forward(x.data(), y.data(), 2, 8, {});
    std::vector<std::pair<size_t, size_t>> ranges;
    std::vector<std::vector<float>> seen;
    m.set_grad_ready_hook([&](size_t b, size_t e) {
      ranges.emplace_back(b, e);
      const float* g = m.params().host_grad<float>();
      seen.emplace_back(g + b, g + e);
    });
    m.backward();
    m.set_grad_ready_hook(nullptr);
    ASSERT_EQ(ranges.size(), static_cast<size_t>(cfg.n_layers) + 2);  // head + final norm, layers, embeddings
    size_t hi = m.params().size();
    const float* g = m.params().host_grad<float>();
    for (size_t k = 0; k < ranges.size(); ++k) {
      EXPECT_EQ(ranges[k].second, hi);
      hi = ranges[k].first;
      EXPECT_EQ(seen[k], std::vector<float>(g + ranges[k].first, g + ranges[k].second))
          << "range " << k << " changed after it was reported final (tied " << tied << ")";
    }
    EXPECT_EQ(hi, 0u);
  }
}

}  // namespace
}  // namespace tessera
