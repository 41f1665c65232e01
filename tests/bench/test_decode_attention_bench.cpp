// The decode-attention bench rows (bench/decode_attention.h) on the CPU at the small size: both batch rows, their
// shapes and the byte count of the header's formula.
#include <gtest/gtest.h>

#include "tessera/bench/decode_attention.h"
#include "tessera/core/context.h"

namespace tessera {
namespace {

TEST(DecodeAttentionBench, SmallRowsOnTheCpu) {
  Context ctx;
  BenchHarness h(ctx);
  BenchConfig cfg;
  cfg.size = BenchSize::Small;
  cfg.timing = {.warmup = 0, .iters = 2};
  std::vector<std::string> started;
  cfg.on_row = [&](const std::string& k) { started.push_back(k); };
  const std::vector<BenchRow> rows = bench_decode_attention(cfg, h);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(started, (std::vector<std::string>{"decode attention B=1", "decode attention B=2"}));
  for (int r = 0; r < 2; ++r) {
    const int B = r + 1;
    EXPECT_EQ(rows[r].shape, "B=" + std::to_string(B) + " H=2 Dh=16 cache=64");
    // f32: K and V of B·2·64 keys of 16, q and out of B·2·16, pos.
    EXPECT_DOUBLE_EQ(rows[r].bytes, 4.0 * (2.0 * B * 2 * 64 * 16 + 2.0 * B * 2 * 16) + 4.0 * B);
    EXPECT_EQ(rows[r].timing.iters, 2);
    EXPECT_GT(rows[r].gbs(), 0.0);
  }
}

}  // namespace
}  // namespace tessera
