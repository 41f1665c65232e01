// Loss scaling in the Tensor-level AdamW step on the CPU (the reference route, which CI runs): gradients that
// hold S·g update exactly as g does (S a power of 2), and a step whose gradient holds an inf or a NaN changes
// nothing when skipping is asked for, and reports the skip through its non-finite norm.
// tests/cuda/test_optim_cuda.cpp checks the same of the CUDA kernel in f32, bf16 and f16.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/ops/optim/adamw.h"
#include "test_util.h"

namespace tessera {
namespace {

// Three segments, mixed decay, no gaps (a CPU model has none). State as after a few steps: moments nonzero.
struct State {
  std::vector<ParamSegment> segments{{.name = "a", .offset = 0, .numel = 37, .decay = true},
                                     {.name = "b", .offset = 37, .numel = 1, .decay = false},
                                     {.name = "c", .offset = 38, .numel = 203, .decay = true}};
  size_t n = 241;
  std::vector<float> w, g, m, v;
  float norm = -1.0f;
  explicit State(std::mt19937_64& rng) {
    w = test::randn<float>(n, rng, 1.0);
    g = test::randn<float>(n, rng, 0.02);
    m = test::randn<float>(n, rng, 0.01);
    v = test::randn<float>(n, rng, 0.01);
    for (float& x : v) x *= x;
  }
};

// One adamw_step over s's buffers.
void step(const AdamWParams& p, State& s, Context& ctx) {
  const AdamWSegmentTable table(s.segments, ctx);
  const int64_t n = static_cast<int64_t>(s.n);
  adamw_step(p, table, Tensor(s.w.data(), DType::F32, {n}), Tensor(s.g.data(), DType::F32, {n}), Tensor(),
             Tensor(s.m.data(), DType::F32, {n}), Tensor(s.v.data(), DType::F32, {n}), Tensor(&s.norm, DType::F32, {1}),
             ctx);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// S·g with S = 2^k is exact in f32, and so is dividing it out: the update, the moments and the reported norm
// equal those of the unscaled gradient bit for bit, with clipping off, inactive and active (where the clip
// factor comes from the norm, which must be the unscaled one).
TEST(AdamWLossScaling, ScaledGradientsUpdateAsTheUnscaledOnes) {
  Context ctx;
  std::mt19937_64 rng(test::test_seed());
  for (const float S : {1.0f, 1024.0f, 65536.0f})
    for (const float clip : {0.0f, 1e9f, 0.05f}) {
      const State base(rng);
      State plain = base, scaled = base;
      for (float& x : scaled.g) x *= S;
      const AdamWParams p{.lr = 1e-2f, .step = 3, .max_grad_norm = clip};
      AdamWParams ps = p;
      ps.grad_scale = S;
      ps.skip_nonfinite = true;
      step(p, plain, ctx);
      step(ps, scaled, ctx);
      const std::string at = "S " + std::to_string(S) + " clip " + std::to_string(clip) + ", seed " +
                             std::to_string(test::test_seed());
      EXPECT_EQ(scaled.norm, plain.norm) << at;
      EXPECT_TRUE(same_bits(scaled.w, plain.w)) << at;
      EXPECT_TRUE(same_bits(scaled.m, plain.m)) << at;
      EXPECT_TRUE(same_bits(scaled.v, plain.v)) << at;
      EXPECT_FALSE(same_bits(plain.w, base.w)) << at << ": the step must move the parameters";
      if (clip == 0.05f) {
        EXPECT_GT(plain.norm, clip) << at << ": clipping must be active in this case";
      }
    }
}

// An inf or NaN anywhere in the gradient: with skip_nonfinite nothing changes (params, m, v and the gradient
// itself, bit for bit) and the norm reports it; without, the same gradient does reach the parameters, so the
// first check is not vacuous.
TEST(AdamWLossScaling, NonFiniteGradientSkipsTheStep) {
  Context ctx;
  std::mt19937_64 rng(test::test_seed());
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const float bad : {inf, -inf, nan})
    for (const size_t at : {size_t{0}, size_t{37}, size_t{240}}) {
      const std::string what = "value " + std::to_string(bad) + " at " + std::to_string(at);
      State s(rng);
      s.g[at] = bad;
      const State before = s;
      step({.lr = 1e-2f, .step = 2, .max_grad_norm = 1.0f, .grad_scale = 512.0f, .skip_nonfinite = true}, s, ctx);
      EXPECT_FALSE(std::isfinite(s.norm)) << what;
      if (std::isnan(bad)) EXPECT_TRUE(std::isnan(s.norm)) << what;
      else EXPECT_EQ(s.norm, inf) << what;
      EXPECT_TRUE(same_bits(s.w, before.w)) << what << ": params changed";
      EXPECT_TRUE(same_bits(s.m, before.m)) << what << ": m changed";
      EXPECT_TRUE(same_bits(s.v, before.v)) << what << ": v changed";
      EXPECT_TRUE(same_bits(s.g, before.g)) << what << ": the gradient changed";

      State applied = before;
      step({.lr = 1e-2f, .step = 2, .max_grad_norm = 0.0f, .grad_scale = 512.0f}, applied, ctx);
      EXPECT_FALSE(std::isfinite(applied.w[at])) << what << ": without skipping the bad gradient must be applied";
    }
}

TEST(AdamWLossScaling, RefusesBadScalesAndASkipItCannotReport) {
  Context ctx;
  std::mt19937_64 rng(test::test_seed());
  State s(rng);
  for (const float S : {0.0f, -2.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    EXPECT_THROW(step({.step = 1, .grad_scale = S}, s, ctx), Error) << S;
  const AdamWSegmentTable table(s.segments, ctx);
  const int64_t n = static_cast<int64_t>(s.n);
  EXPECT_THROW(adamw_step({.step = 1, .skip_nonfinite = true}, table, Tensor(s.w.data(), DType::F32, {n}),
                          Tensor(s.g.data(), DType::F32, {n}), Tensor(), Tensor(s.m.data(), DType::F32, {n}),
                          Tensor(s.v.data(), DType::F32, {n}), /*grad_norm=*/Tensor(), ctx),
               Error);
  EXPECT_THROW(clip_grad_norm_ref(s.g.data(), s.n, 1.0, /*grad_scale=*/0.0), Error);
}

// The reference pieces: the norm is of the unscaled gradient, and the gradient comes out unscaled and clipped.
TEST(AdamWLossScaling, ClipGradNormRefUnscales) {
  std::vector<float> g = {3.0f * 256, 4.0f * 256};
  EXPECT_EQ(clip_grad_norm_ref(g.data(), 2, /*max_norm=*/0.0, /*grad_scale=*/256.0), 5.0);
  EXPECT_EQ(g, (std::vector<float>{3.0f, 4.0f}));
  g = {3.0f * 256, 4.0f * 256};
  EXPECT_EQ(clip_grad_norm_ref(g.data(), 2, /*max_norm=*/1.0, /*grad_scale=*/256.0), 5.0);
  EXPECT_NEAR(g[0], 0.6, 1e-6);
  EXPECT_NEAR(g[1], 0.8, 1e-6);
}

}  // namespace
}  // namespace tessera
