// The AdamW object on the CPU: the step without norm tracking (the one-launch step the AdamW bench row times)
// updates exactly as the one that tracks the norm. tests/cuda/test_optim_cuda.cpp checks the same on a GPU, but
// that binary exists only in CUDA builds, so without this file the CPU case never ran in CI.
#include <random>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/error.h"
#include "tessera/models/gpt.h"
#include "tessera/train/optimizer.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(AdamW, UntrackedNormStepsTheSameOnCpu) {
  Context ctx;
  Gpt a(model_preset("tiny"), ctx, DType::F32), b(model_preset("tiny"), ctx, DType::F32);
  a.init_weights(5);
  b.init_weights(5);
  const std::vector<float> init = a.params().read_f32(ctx);
  const size_t n = a.params().size();
  std::mt19937_64 rng(test::test_seed());
  const std::vector<float> g = test::randn<float>(n, rng, 1e-2);
  for (Gpt* m : {&a, &b}) std::copy(g.begin(), g.end(), m->params().host_grad<float>());
  AdamW tracked(a.params(), {.grad_clip = 0.0f}, ctx);
  AdamW plain(b.params(), {.grad_clip = 0.0f, .track_grad_norm = false}, ctx);
  for (int s = 0; s < 2; ++s) {
    tracked.step(a.params(), 1e-3f);
    plain.step(b.params(), 1e-3f);
  }
  const std::vector<float> pa = a.params().read_f32(ctx), pb = b.params().read_f32(ctx);
  EXPECT_EQ(pa, pb);
  EXPECT_NE(pb, init) << "the untracked steps must change the parameters";
  EXPECT_NE(pa, init) << "the tracked steps must change the parameters";
  // The tracked norm is the gradient's (clipping off: the gradients are read, not changed).
  double sq = 0;
  for (float x : g) sq += static_cast<double>(x) * x;
  EXPECT_NEAR(tracked.read_grad_norm(), std::sqrt(sq), 1e-4 * std::sqrt(sq));
  EXPECT_THROW(plain.read_grad_norm(), Error);
}

}  // namespace
}  // namespace tessera
