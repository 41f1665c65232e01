#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/optim/adamw.h"
#include "tessera/core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(Gemm, BlasMatchesLoopOnAwkwardShapes) {
  std::mt19937_64 rng(test::test_seed());
  struct S { int M, N, K; };
  for (S s : {S{1, 1, 1}, S{7, 13, 5}, S{33, 17, 65}, S{3, 129, 2}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const GemmParams p{.M = s.M, .N = s.N, .K = s.K, .trans_a = ta == 1, .trans_b = tb == 1, .alpha = 0.7f,
                           .beta = 0.5f};
        auto a = test::randn<float>(s.M * s.K, rng), b = test::randn<float>(s.K * s.N, rng);
        auto bias = test::randn<float>(s.N, rng);
        auto c0 = test::randn<float>(s.M * s.N, rng);
        auto c_fast = c0, c_loop = c0;
        gemm_ref(p, c_fast.data(), a.data(), b.data(), bias.data());
        gemm_loop_ref(p, c_loop.data(), a.data(), b.data(), bias.data());
        // Error relative to the size of the terms (the same GEMM over absolute values): a plain relative error
        // is ill-conditioned where the terms cancel, e.g. the single element of a 1x1x1 product.
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
        // Spot-check one element from the definition.
        double e = 0;
        for (int k = 0; k < s.K; ++k) {
          const double av = ta ? a[k * s.M + 0] : a[0 * s.K + k];
          const double bv = tb ? b[(s.N - 1) * s.K + k] : b[k * s.N + s.N - 1];
          e += av * bv;
        }
        e = 0.7 * e + 0.5 * c0[s.N - 1] + bias[s.N - 1];
        EXPECT_NEAR(c_fast[s.N - 1], e, 1e-4 * (1 + std::fabs(e)));
      }
    }
  }
}

TEST(Gemm, BiasGrad) {
  std::vector<double> d(6 * 4, 0.5), db(4, 1.0);
  bias_grad_ref(6, 4, db.data(), d.data());
  for (double v : db) EXPECT_EQ(v, 4.0);
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

TEST(AdamW, ClipGradNorm) {
  std::vector<float> g{3.0f, 4.0f};
  EXPECT_NEAR(clip_grad_norm_ref(g.data(), 2, 1.0), 5.0, 1e-12);
  EXPECT_NEAR(grad_norm_ref(g.data(), 2), 1.0, 1e-6);
  std::vector<float> small{0.3f, 0.4f};
  clip_grad_norm_ref(small.data(), 2, 1.0);
  EXPECT_EQ(small[0], 0.3f);  // below the threshold: untouched
}

}  // namespace
}  // namespace tessera
