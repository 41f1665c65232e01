// The naive (materialized) attention on the CPU in f64: the same output, lse and gradients as the reference
// attention on fresh random inputs (outputs poisoned), and its profiler ranges: ATTN_QK, ATTN_SOFTMAX, ATTN_AV in
// the forward and ATTN_AV_BWD, ATTN_SOFTMAX_BWD, ATTN_QK_BWD in the backward, once each, in order, as slices of a
// Tracer (the same calls open the NVTX ranges in a CUDA build).
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/core/context.h"
#include "tessera/core/trace.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_naive.h"
#include "test_util.h"

namespace tessera {
namespace {

Tensor view(std::vector<double>& v) {
  return Tensor::from_shape(v.data(), DType::F64, std::vector<int64_t>{static_cast<int64_t>(v.size())});
}

TEST(AttentionNaive, MatchesTheReferenceAndOpensItsRanges) {
  std::mt19937_64 rng(test::test_seed());
  SCOPED_TRACE("seed " + std::to_string(test::test_seed()));
  for (bool causal : {false, true}) {
    const AttentionParams p{.B = 2, .T = 5, .H = 3, .Dh = 4, .causal = causal};
    const size_t N = static_cast<size_t>(p.B) * p.T, C = static_cast<size_t>(p.H) * p.Dh;
    std::vector<double> qkv = test::randn<double>(N * 3 * C, rng), d_out = test::randn<double>(N * C, rng);
    std::vector<double> out = test::poisoned<double>(N * C), lse = test::poisoned<double>(N * p.H);
    std::vector<double> d_qkv = test::poisoned<double>(N * 3 * C);
    std::vector<double> ref_out = test::poisoned<double>(N * C), ref_lse = test::poisoned<double>(N * p.H);
    std::vector<double> ref_d_qkv = test::poisoned<double>(N * 3 * C);
    Context ctx;
    attention_forward(p, view(ref_out), view(ref_lse), view(qkv), ctx);
    attention_backward(p, view(ref_d_qkv), view(d_out), view(qkv), view(ref_out), view(ref_lse), ctx);

    Tracer tracer(ctx);
    AttentionNaiveSaved saved;
    attention_naive_forward(p, view(out), view(lse), view(qkv), saved, ctx, &tracer);
    attention_naive_backward(p, view(d_qkv), view(d_out), saved, ctx, &tracer);
    EXPECT_LT(test::rel_error(out, ref_out), 1e-12) << "causal " << causal;
    EXPECT_LT(test::rel_error(lse, ref_lse), 1e-12) << "causal " << causal;
    EXPECT_LT(test::rel_error(d_qkv, ref_d_qkv), 1e-12) << "causal " << causal;

    std::vector<std::string> names;
    double last_end = 0;
    for (const Tracer::Slice& s : tracer.slices()) {
      names.push_back(s.name);
      EXPECT_EQ(s.depth, 0) << s.name;
      EXPECT_GE(s.start_us, last_end) << s.name << " overlaps the range before it";
      last_end = s.start_us + s.dur_us;
    }
    EXPECT_EQ(names, (std::vector<std::string>{"ATTN_QK", "ATTN_SOFTMAX", "ATTN_AV", "ATTN_AV_BWD", "ATTN_SOFTMAX_BWD",
                                               "ATTN_QK_BWD"}));
  }
}

}  // namespace
}  // namespace tessera
