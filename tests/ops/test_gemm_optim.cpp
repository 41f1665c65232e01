#include <algorithm>
#include <cstring>

#include <omp.h>

#include "tessera/core/error.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/optim/adamw.h"
#include "test_util.h"

namespace tessera {
namespace {

// Error of c against the fp64 definition, relative to the size of the terms (the same GEMM over absolute
// values): a plain relative error is ill-conditioned where the terms cancel, e.g. a single 1x1x1 product.
template <typename T>
double gemm_error(const GemmParams& p, const std::vector<T>& c, const std::vector<T>& a, const std::vector<T>& b,
                  const std::vector<T>& bias, const std::vector<T>& c0) {
  double num = 0, den = 0;
  for (int m = 0; m < p.M; ++m) {
    for (int n = 0; n < p.N; ++n) {
      double e = 0, scale = 0;
      for (int k = 0; k < p.K; ++k) {
        const double av = p.trans_a ? a[k * p.M + m] : a[m * p.K + k];
        const double bv = p.trans_b ? b[n * p.K + k] : b[k * p.N + n];
        e += av * bv;
        scale += std::fabs(av * bv);
      }
      const double prev = p.beta == 0 ? 0.0 : static_cast<double>(c0[m * p.N + n]);
      e = p.alpha * e + p.beta * prev + bias[n];
      scale = std::fabs(p.alpha) * scale + std::fabs(p.beta * prev) + std::fabs(bias[n]);
      const double d = static_cast<double>(c[m * p.N + n]) - e;
      num += d * d;
      den += scale * scale;
    }
  }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

struct GemmShape {
  int M, N, K;
};
// 1000 x 129 and 300 x 50 are large enough for gemm_ref to split C's rows over several BLAS calls (M not a multiple
// of the block); the others are one call each.
const GemmShape kAwkwardShapes[] = {{1, 1, 1},       {7, 13, 5},     {33, 17, 65},  {3, 129, 2},
                                    {1000, 129, 77}, {300, 50, 512}, {150, 700, 64}};

// gemm_ref (OpenBLAS where built) and gemm_loop_ref against the definition, every transpose, with beta = 0 on a
// NaN-filled C (it must be overwritten, not read) and beta != 0 on a random C (it must be accumulated).
template <typename T>
void check_gemm_against_definition(double tol) {
  std::mt19937_64 rng(test::test_seed());
  for (GemmShape s : kAwkwardShapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 0.5f, 1.0f}) {
          const GemmParams p{
              .M = s.M, .N = s.N, .K = s.K, .trans_a = ta == 1, .trans_b = tb == 1, .alpha = 0.7f, .beta = beta};
          const auto a = test::randn<T>(s.M * s.K, rng), b = test::randn<T>(s.K * s.N, rng);
          const auto bias = test::randn<T>(s.N, rng);
          const auto c0 = beta == 0 ? test::poisoned<T>(s.M * s.N) : test::prefilled<T>(s.M * s.N, rng);
          auto c_ref = c0, c_loop = c0;
          gemm_ref(p, c_ref.data(), a.data(), b.data(), bias.data());
          gemm_loop_ref(p, c_loop.data(), a.data(), b.data(), bias.data());
          EXPECT_LT(gemm_error(p, c_ref, a, b, bias, c0), tol) << s.M << "x" << s.N << "x" << s.K << " beta " << beta;
          EXPECT_LT(gemm_error(p, c_loop, a, b, bias, c0), tol) << s.M << "x" << s.N << "x" << s.K << " beta " << beta;
        }
      }
    }
  }
}

TEST(Gemm, MatchesDefinitionOnAwkwardShapesF32) { check_gemm_against_definition<float>(test::kRefTolF32); }
TEST(Gemm, MatchesDefinitionOnAwkwardShapesF64) { check_gemm_against_definition<double>(1e-13); }

TEST(Gemm, BlasMatchesLoopOnAwkwardShapes) {
  // Without OpenBLAS, gemm_ref is gemm_loop_ref, so this would compare a function with itself.
  if (!gemm_uses_blas()) GTEST_SKIP() << "built without OpenBLAS: gemm_ref is gemm_loop_ref, nothing to compare";
  std::mt19937_64 rng(test::test_seed());
  for (GemmShape s : kAwkwardShapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const GemmParams p{
            .M = s.M, .N = s.N, .K = s.K, .trans_a = ta == 1, .trans_b = tb == 1, .alpha = 0.7f, .beta = 0.5f};
        const auto a = test::randn<float>(s.M * s.K, rng), b = test::randn<float>(s.K * s.N, rng);
        const auto bias = test::randn<float>(s.N, rng);
        const auto c0 = test::randn<float>(s.M * s.N, rng);
        auto c_fast = c0, c_loop = c0;
        gemm_ref(p, c_fast.data(), a.data(), b.data(), bias.data());
        gemm_loop_ref(p, c_loop.data(), a.data(), b.data(), bias.data());
        // Difference relative to the size of the terms (the same GEMM over absolute values), see gemm_error.
        auto abs_of = [](std::vector<float> v) {
          for (auto& x : v) x = std::fabs(x);
          return v;
        };
        const auto a_abs = abs_of(a), b_abs = abs_of(b), bias_abs = abs_of(bias);
        auto scale = abs_of(c0);
        gemm_loop_ref(p, scale.data(), a_abs.data(), b_abs.data(), bias_abs.data());
        double num = 0, den = 0;
        for (size_t i = 0; i < scale.size(); ++i) {
          num += (static_cast<double>(c_fast[i]) - c_loop[i]) * (static_cast<double>(c_fast[i]) - c_loop[i]);
          den += static_cast<double>(scale[i]) * scale[i];
        }
        EXPECT_LT(std::sqrt(num / den), test::kRefTolF32) << s.M << "x" << s.N << "x" << s.K;
      }
    }
  }
}

// The CPU reference's results must not depend on OMP_NUM_THREADS. gemm_ref split C's rows into one OpenBLAS call
// per thread, and OpenBLAS rounds an element differently with the rows a call has: 1 and 2 threads then differed
// in about 4% of the elements of these shapes, and a training run's losses from step 16 on.
TEST(Gemm, ResultsDoNotDependOnTheThreadCount) {
  if (!gemm_uses_blas()) GTEST_SKIP() << "built without OpenBLAS: the loops are one thread's anyway";
  std::mt19937_64 rng(test::test_seed());
  const int threads_before = omp_get_max_threads();
  for (GemmShape s : {GemmShape{512, 384, 128}, GemmShape{1000, 129, 77}, GemmShape{150, 700, 64}}) {
    for (int ta = 0; ta < 2; ++ta) {
      const GemmParams p{
          .M = s.M, .N = s.N, .K = s.K, .trans_a = ta == 1, .trans_b = ta == 1, .alpha = 1.0f, .beta = 1.0f};
      const auto a = test::randn<float>(s.M * s.K, rng), b = test::randn<float>(s.K * s.N, rng);
      const auto c0 = test::prefilled<float>(s.M * s.N, rng);
      std::vector<float> first;
      for (int threads : {1, 2, 3, 5}) {
        omp_set_num_threads(threads);
        auto c = c0;
        gemm_ref<float>(p, c.data(), a.data(), b.data(), nullptr);
        if (first.empty()) first = c;
        size_t differ = 0;
        for (size_t i = 0; i < c.size(); ++i) differ += std::memcmp(&c[i], &first[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << s.M << "x" << s.N << "x" << s.K << (ta ? " (A transposed)" : "") << ", " << threads
                              << " threads against 1";
      }
    }
  }
  omp_set_num_threads(threads_before);
}

TEST(Gemm, BiasGradAccumulates) {
  std::mt19937_64 rng(test::test_seed());
  const int M = 6, N = 4;
  const auto d = test::randn<double>(M * N, rng), db_pre = test::prefilled<double>(N, rng);
  auto db = db_pre;
  bias_grad_ref(M, N, db.data(), d.data());
  for (int n = 0; n < N; ++n) {
    double col = 0;
    for (int m = 0; m < M; ++m) col += d[m * N + n];
    EXPECT_NEAR(db[n] - db_pre[n], col, 1e-12);
  }
}

TEST(AdamW, FirstStepIsSignedLrAndDecayIsPerSegment) {
  // Step 1: m_hat = g, v_hat = g², so the step is lr * g / (|g| + eps) ≈ lr * sign(g).
  std::vector<ParamSegment> segs{{"w", 0, 3, true}, {"b", 3, 2, false}};
  std::vector<float> w{1.0f, -2.0f, 0.5f, 1.0f, 1.0f}, g{0.3f, -0.1f, 2.0f, 0.7f, -0.2f};
  std::vector<float> m(5, 0.0f), v(5, 0.0f);
  const AdamWParams p{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f, .step = 1};
  adamw_update_ref(p, segs, w.data(), g.data(), m.data(), v.data());
  EXPECT_NEAR(w[0], 1.0f * (1 - 0.005f) - 0.01f, 1e-6);
  EXPECT_NEAR(w[1], -2.0f * (1 - 0.005f) + 0.01f, 1e-6);
  EXPECT_NEAR(w[3], 1.0f - 0.01f, 1e-6);  // no decay on this segment
  EXPECT_NEAR(w[4], 1.0f + 0.01f, 1e-6);
  EXPECT_NEAR(m[2], 0.2f, 1e-7);
  EXPECT_NEAR(v[2], 0.2f, 1e-6);
  // Step 2 with the same gradient: m_hat and v_hat are still g and g² after bias correction.
  adamw_update_ref({.lr = 0.01f, .weight_decay = 0.0f, .step = 2}, segs, w.data(), g.data(), m.data(), v.data());
  EXPECT_NEAR(w[3], 1.0f - 0.02f, 1e-5);
  EXPECT_THROW(adamw_update_ref({.step = 0}, segs, w.data(), g.data(), m.data(), v.data()), Error);
}

// eps is added to sqrt(v_hat), not under the root: with |g| = 1e-6 the first step is lr * 1e-6 / (1e-6 + 1e-8)
// (0.99 lr), where lr * 1e-6 / sqrt(1e-12 + 1e-8) would be 0.01 lr. Gradients of order 1 cannot tell the two apart.
TEST(AdamW, EpsIsAddedOutsideTheSquareRoot) {
  std::vector<ParamSegment> segs{{"w", 0, 2, false}};
  std::vector<float> w{0.0f, 0.0f}, g{1e-6f, -1e-6f}, m(2, 0.0f), v(2, 0.0f);
  adamw_update_ref({.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f, .step = 1}, segs,
                   w.data(), g.data(), m.data(), v.data());
  const double expect = 0.01 * 1e-6 / (1e-6 + 1e-8);
  EXPECT_NEAR(w[0], -expect, 1e-3 * expect);
  EXPECT_NEAR(w[1], expect, 1e-3 * expect);
}

TEST(AdamW, ClipGradNorm) {
  std::vector<float> g{3.0f, 4.0f};
  EXPECT_NEAR(clip_grad_norm_ref(g.data(), 2, 1.0), 5.0, 1e-12);
  EXPECT_NEAR(grad_norm_ref(g.data(), 2), 1.0, 1e-6);
  std::vector<float> small{0.3f, 0.4f};
  clip_grad_norm_ref(small.data(), 2, 1.0);
  EXPECT_EQ(small[0], 0.3f);  // below the threshold: untouched
}

// The CUDA kernels' per-tile index (adamw.cu reads it in place of a search): against a search per tile, over
// segments smaller than a tile (several start in one), a gap that spans whole tiles, and ends on and off a boundary.
TEST(AdamW, TileIndexIsTheFirstSegmentEndingAfterEachTileStart) {
  const size_t T = static_cast<size_t>(kAdamWTileElems);
  const std::vector<std::pair<size_t, size_t>> spans = {
      // (offset, numel), sorted
      {0, 1}, {8, 5}, {16, T}, {T + 16, 3}, {3 * T + 5, T - 5}, {4 * T, 2 * T + 7}, {6 * T + 16, 1}};
  std::vector<ParamSegment> segs;
  for (auto [off, n] : spans) segs.push_back({.name = "s", .offset = off, .numel = n});
  const std::vector<int32_t> first = adamw_tile_first_segments(segs);
  const size_t end = segs.back().offset + segs.back().numel;
  ASSERT_EQ(first.size(), (end + T - 1) / T);
  // Expected by a binary search over the segment ends, as the kernels searched before the index.
  std::vector<size_t> ends;
  for (const ParamSegment& sg : segs) ends.push_back(sg.offset + sg.numel);
  for (size_t t = 0; t < first.size(); ++t) {
    const auto want = std::upper_bound(ends.begin(), ends.end(), t * T) - ends.begin();
    EXPECT_EQ(first[t], static_cast<int32_t>(want)) << "tile " << t;
  }
  EXPECT_EQ(first[2], 4);  // tile 2 starts in the gap before segment 4: its index, not 3's
  EXPECT_TRUE(adamw_tile_first_segments({}).empty());
}

}  // namespace
}  // namespace tessera
