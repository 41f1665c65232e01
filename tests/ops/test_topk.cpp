// The beam top-k on the CPU: the full-sort reference and HARS's retrieve + re-rank run on the host, each equal to
// the plain full sort of tests/ops/test_topk_cases.h over the row kinds, V and k of issue 48, in f32 and bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/ops/topk/topk.h"
#include "test_topk_cases.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::RowKind;

// lse of each row in f64 written plainly (NaN skipped): the reference's must agree to f32 rounding.
void expect_lse_close(const test::TopkInput& in, const std::vector<float>& lse) {
  const BeamTopkParams& p = in.p;
  for (int64_t r = 0; r < static_cast<int64_t>(p.B) * p.K; ++r) {
    double m = -INFINITY, s = 0;
    for (int j = 0; j < p.V; ++j)
      if (!std::isnan(in.x[r * p.row_stride() + j])) m = std::max(m, double(in.x[r * p.row_stride() + j]));
    for (int j = 0; j < p.V && m > -INFINITY; ++j)
      if (!std::isnan(in.x[r * p.row_stride() + j])) s += std::exp(in.x[r * p.row_stride() + j] - m);
    if (m == -INFINITY) {
      ASSERT_EQ(lse[r], -INFINITY) << "row " << r;
    } else {
      ASSERT_NEAR(lse[r], m + std::log(s), 1e-6 * std::max(1.0, std::fabs(m))) << "row " << r;
    }
  }
}

template <typename F>
void for_each_case(F&& f) {
  std::mt19937_64 rng(test::test_seed());
  for (int ki = 0; ki < static_cast<int>(std::size(test::kTopkKs)); ++ki) {
    const int k = test::kTopkKs[ki];
    std::vector<int> vs(std::begin(test::kTopkVs), std::end(test::kTopkVs));
    if (k > 1) vs.insert(vs.begin(), k - 1);
    for (int vi = 0; vi < static_cast<int>(vs.size()); ++vi)
      for (int kind = 0; kind < static_cast<int>(std::size(test::kRowKinds)); ++kind) {
        const int v_index = k > 1 ? std::max(vi - 1, 0) : vi;
        if (!test::topk_case_sampled(v_index, kind, ki)) continue;
        for (DType dt : {DType::F32, DType::BF16}) {
          const int V = vs[vi];
          const BeamTopkParams p{.B = 2, .K = 3, .V = V, .k = k, .ld = (V % 2) ? V + 3 : 0};
          const auto in = test::make_topk_input(p, test::kRowKinds[kind], dt, rng);
          const std::string what = std::string(test::row_kind_name(test::kRowKinds[kind])) + " V " + std::to_string(V) +
                                   " k " + std::to_string(k) + " " + std::string(dtype_name(dt)) + " seed " +
                                   std::to_string(test::test_seed());
          f(in, what);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
  }
}

TEST(BeamTopk, ReferenceEqualsFullSort) {
  for_each_case([](const test::TopkInput& in, const std::string& what) {
    const BeamTopkParams& p = in.p;
    auto lse = test::poisoned<float>(p.B * p.K);
    auto scores = test::poisoned<float>(p.B * p.k);
    std::vector<int32_t> indices(p.B * p.k, 12345);
    beam_topk_lse_ref(p, in.dtype, lse.data(), in.data());
    expect_lse_close(in, lse);
    beam_topk_sort_ref(p, in.dtype, scores.data(), indices.data(), in.data(), in.beam.data(), lse.data());
    SCOPED_TRACE(what);
    test::expect_full_sort(in, lse, scores, indices, what);
  });
}

TEST(BeamTopk, HarsOnTheHostEqualsFullSort) {
  for_each_case([](const test::TopkInput& in, const std::string& what) {
    const BeamTopkParams& p = in.p;
    std::vector<float> lse(p.B * p.K);
    beam_topk_lse_ref(p, in.dtype, lse.data(), in.data());
    // The kernels' grouping, and one group per thread of a block.
    for (int groups : {beam_topk_groups(p.k), kTopkThreads}) {
      auto scores = test::poisoned<float>(p.B * p.k);
      std::vector<int32_t> indices(p.B * p.k, 12345), counts(p.B * p.K, -1);
      beam_topk_hars_cpu(p, groups, in.dtype, scores.data(), indices.data(), counts.data(), in.data(), in.beam.data(),
                         lse.data());
      const std::string w = what + " groups " + std::to_string(groups);
      test::expect_full_sort(in, lse, scores, indices, w);
      for (int r = 0; r < p.B * p.K; ++r) ASSERT_TRUE(counts[r] >= 0 && counts[r] <= p.V) << w << " row " << r;
    }
  });
}

// The bound filters: on random rows of a vocab far larger than the groups, the candidates are a small part of it.
TEST(BeamTopk, RetrieveKeepsFewCandidatesOnRandomRows) {
  std::mt19937_64 rng(test::test_seed());
  const BeamTopkParams p{.B = 4, .K = 4, .V = 50257, .k = 8};
  const auto in = test::make_topk_input(p, RowKind::AllNegative, DType::F32, rng);
  std::vector<float> lse(16), scores(32);
  std::vector<int32_t> indices(32), counts(16);
  beam_topk_lse_ref(p, in.dtype, lse.data(), in.data());
  beam_topk_hars_cpu(p, beam_topk_groups(p.k), in.dtype, scores.data(), indices.data(), counts.data(), in.data(),
                     in.beam.data(), lse.data());
  for (int r = 0; r < 16; ++r) {
    EXPECT_GE(counts[r], p.k);
    EXPECT_LT(counts[r], p.V / 100) << "row " << r;
  }
}

TEST(BeamTopk, TensorEntryOnTheCpu) {
  std::mt19937_64 rng(test::test_seed());
  Context ctx(Device::cpu());
  const BeamTopkParams p{.B = 3, .K = 2, .V = 1025, .k = 4};
  const auto in = test::make_topk_input(p, RowKind::Random, DType::F32, rng);
  auto lse = test::poisoned<float>(6), scores = test::poisoned<float>(12);
  std::vector<int32_t> indices(12, 7);
  std::vector<float> x = in.x, beam = in.beam;
  const Tensor tx(x.data(), DType::F32, {6, 1025}), tb(beam.data(), DType::F32, {6});
  const Tensor ts(scores.data(), DType::F32, {3, 4}), ti(indices.data(), DType::I32, {3, 4});
  const Tensor tl(lse.data(), DType::F32, {6});
  beam_topk(p, ts, ti, tl, Tensor(), tx, tb, ctx);
  test::expect_full_sort(in, lse, scores, indices, "tensor entry");
  const BeamTopkParams bad_k{.B = 3, .K = 2, .V = 1025, .k = 65};
  EXPECT_THROW(beam_topk(bad_k, ts, ti, tl, Tensor(), tx, tb, ctx), Error);
  const Tensor short_scores(scores.data(), DType::F32, {3, 3});
  EXPECT_THROW(beam_topk(p, short_scores, ti, tl, Tensor(), tx, tb, ctx), Error);
}

}  // namespace
}  // namespace tessera
