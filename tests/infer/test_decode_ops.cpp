// The engine's small ops (decode_ops.h) on the CPU: each against the definition or the op it stands in for.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tessera/infer/decode_ops.h"
#include "tessera/ops/embedding/embedding.h"
#include "test_util.h"

namespace tessera {
namespace {

// Row b at its own position equals the embedding op's T = 1 forward at pos_offset pos[b].
TEST(DecodeOps, EmbeddingAtDevicePositionsEqualsTheEmbeddingOp) {
  std::mt19937_64 rng(test::test_seed());
  const int B = 5, C = 7, V = 11, max_seq = 9;
  const auto wte = test::randn<float>(size_t{V} * C, rng), wpe = test::randn<float>(size_t{max_seq} * C, rng);
  const std::vector<int32_t> tokens{3, 0, 10, 4, 3}, pos{0, 8, 2, 5, 1};
  for (bool with_pos : {true, false}) {
    auto out = test::poisoned<float>(size_t{B} * C);
    decode_embedding_ref<float>({.B = B, .C = C, .V = V, .max_seq = max_seq, .scale = 1.25f, .padding_id = 4},
                                out.data(), tokens.data(), pos.data(), wte.data(), with_pos ? wpe.data() : nullptr);
    for (int b = 0; b < B; ++b) {
      std::vector<float> ref(C);
      embedding_forward_ref<float>(
          {.B = 1, .T = 1, .C = C, .V = V, .max_seq = max_seq, .pos_offset = pos[b], .scale = 1.25f, .padding_id = 4},
          ref.data(), &tokens[b], wte.data(), with_pos ? wpe.data() : nullptr);
      for (int c = 0; c < C; ++c) EXPECT_EQ(out[static_cast<size_t>(b) * C + c], ref[c]) << b << "," << c;
    }
  }
}

TEST(DecodeOps, GreedyArgmaxTakesTheLowestIdOnTiesAndNeverNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int V = 5, ld = 7;
  std::vector<float> logits = {1,    3,    3,    2,    0,     99, 99,   // tie: 1
                               nan,  -1,   4,    nan,  4,     99, 99,   // NaN skipped, tie of 4: 2
                               -inf, -inf, -inf, -inf, -inf,  99, 99,   // all -inf: 0
                               nan,  nan,  nan,  nan,  nan,   99, 99,   // all NaN: 0
                               -2,   -3,   -1,   -5,   -1.5f, 99, 99};  // 2 (the padding columns are not read)
  std::vector<int32_t> out(5, -7);
  greedy_argmax_ref<float>(5, V, ld, logits.data(), out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 0, 0, 2}));
}

TEST(DecodeOps, SlotReorderRewritesRowsAsTheirParents) {
  const int S = 3, M = 4;
  const std::vector<int32_t> slots_in = {0, 0, 0, 0,  //
                                         1, 1, 1, 1,  //
                                         0, 2, 2, 2};
  const std::vector<int32_t> pos_in = {2, 3, 2}, parents = {2, 2, 1};
  std::vector<int32_t> pos_out(S, -1), slots_out(size_t{S} * M, -1);
  slot_reorder_ref(S, M, parents.data(), pos_in.data(), slots_in.data(), pos_out.data(), slots_out.data());
  EXPECT_EQ(pos_out, (std::vector<int32_t>{2, 2, 3}));
  EXPECT_EQ(slots_out, (std::vector<int32_t>{0, 2, 0, 0,     // row 0: row 2's first 2, then its own
                                             0, 2, 1, 1,     // row 1: row 2's first 2, then its own
                                             1, 1, 1, 2}));  // row 2: row 1's first 3, then its own
  const std::vector<int32_t> bad = {0, 3, 0};
  EXPECT_NE(test::error_of([&] {
              slot_reorder_ref(S, M, bad.data(), pos_in.data(), slots_in.data(), pos_out.data(), slots_out.data());
            }).find("parent 3"),
            std::string::npos);
}

TEST(DecodeOps, PositionsAdvanceByOne) {
  std::vector<int32_t> pos = {0, 5, 9};
  positions_advance_ref(3, pos.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{1, 6, 10}));
}

}  // namespace
}  // namespace tessera
