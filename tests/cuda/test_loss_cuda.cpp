// Cross-entropy: the CUDA kernels against the f64 reference, through the Tensor-level entries.
#include "cuda_test_util.h"
#include "tessera/ops/loss/cross_entropy.h"

namespace tessera::test {
namespace {

struct CeCase {
  int N, V;
  float eps;
  int ignore_index;
};

// Logits with a per-row offset (the online max must rescale) and targets with some rows ignored.
void make_inputs(const CeCase& c, DType dt, std::mt19937_64& rng, std::vector<double>& logits,
                 std::vector<int32_t>& targets) {
  logits = randn<double>(static_cast<size_t>(c.N) * c.V, rng, 3.0);
  for (int n = 0; n < c.N; ++n)
    for (int j = 0; j < c.V; ++j) logits[static_cast<size_t>(n) * c.V + j] += 10.0 * ((n % 5) - 2) + 0.0002 * j;
  logits = rounded(dt, logits);
  targets = randint(c.N, c.V, rng);
  for (int n = 0; n < c.N; ++n)
    if (n % 3 == 1) targets[n] = c.ignore_index;
}

void run_ce_case(const CeCase& c, DType dt, Context& ctx, std::mt19937_64& rng) {
  const CrossEntropyParams p{.N = c.N, .V = c.V, .label_smoothing = c.eps, .ignore_index = c.ignore_index};
  const size_t NV = static_cast<size_t>(c.N) * c.V;
  std::vector<double> logits;
  std::vector<int32_t> targets;
  make_inputs(c, dt, rng, logits, targets);

  std::vector<double> losses(c.N), lse(c.N), d_logits(NV);
  const long count = cross_entropy_forward_ref<double>(p, losses.data(), lse.data(), logits.data(), targets.data());
  double sum = 0;
  for (double l : losses) sum += l;
  const double loss_scale = 0.75;  // the gradient of loss_scale * mean loss
  cross_entropy_backward_ref<double>(p, d_logits.data(), logits.data(), lse.data(), targets.data(),
                                     loss_scale / std::max<long>(count, 1));

  DeviceArena dev(ctx);
  const Tensor tz = dev.upload(dt, logits), ty = dev.upload_i32(targets);
  const Tensor tloss = dev.poisoned(DType::F32, c.N), tlse = dev.poisoned(DType::F32, c.N);
  const Tensor tsum = dev.poisoned(DType::F32, 2), tcount = dev.poisoned(DType::I32, 1);
  cross_entropy_forward(p, tloss, tlse, tz, ty, ctx);
  cross_entropy_loss_sum(p, tsum, tcount, tloss, ty, ctx);
  // Out of place into a buffer one element off the logits' 16-byte phase (the scalar path) ...
  const Tensor d_far = dev.alloc(dt, static_cast<int64_t>(NV) + 1);
  fill_bytes(d_far, 0xff, ctx);
  const Tensor td_off = d_far.slice1d(1, static_cast<int64_t>(NV));
  cross_entropy_backward(p, td_off, tz, tlse, ty, loss_scale, tcount, ctx);
  // ... then in place over the logits (the model's case), which consumes them.
  cross_entropy_backward(p, tz, tz, tlse, ty, loss_scale, tcount, ctx);

  const std::string what = std::string("cross_entropy N=") + std::to_string(c.N) + " V=" + std::to_string(c.V) +
                           " eps=" + std::to_string(c.eps) + " ignore=" + std::to_string(c.ignore_index) + " " +
                           dtype_label(dt);
  // Losses and lse are f32 sums of exact 16-bit inputs: f32 tolerances whatever the dtype.
  const double rows = std::sqrt(static_cast<double>(c.N));
  // lse and the losses are f32 whatever the logits: f32 tolerances. The floor covers V = 1, where the loss and
  // its gradient are 0 by cancellation and the kernel reproduces them only to rounding.
  expect_close(dev.download(tlse), lse, DType::F32, what + " lse", 1.0, rows);
  expect_close(dev.download(tloss), losses, DType::F32, what + " losses", 10.0, rows);
  const auto got_sum = dev.download(tsum), got_count = dev.download(tcount);
  EXPECT_EQ(got_count[0], count) << what << " count";
  EXPECT_NEAR(got_sum[0], sum, 1e-4 * std::max(1.0, std::abs(sum)) + 1e-4 * rows) << what << " sum";
  const double mean = count ? sum / count : 0.0;
  EXPECT_NEAR(got_sum[1], mean, 1e-4 * std::max(1.0, std::abs(mean)) + 1e-4) << what << " mean";
  // A gradient row sums to ~0; the floor stands for a magnitude of loss_scale / count per row.
  const double gfloor = 1e-2 * loss_scale / std::max<long>(count, 1) * rows;
  expect_close(dev.download(td_off), d_logits, dt, what + " d_logits (scalar)", 2.0, gfloor);
  expect_close(dev.download(tz), d_logits, dt, what + " d_logits (in place)", 2.0, gfloor);
}

TEST(CudaCrossEntropy, MatchesReferenceOnAwkwardShapes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (int N : {1, 7, 64})
      for (int V : {1, 257, 50257})
        for (float eps : {0.0f, 0.1f}) {
          // ignore_index outside the vocab (-100, torch's default) and inside it (a padding token id).
          run_ce_case({.N = N, .V = V, .eps = eps, .ignore_index = -100}, dt, ctx, rng);
          if (V > 1) run_ce_case({.N = N, .V = V, .eps = eps, .ignore_index = V - 1}, dt, ctx, rng);
        }
}

// The model's layout: logits rows of V = 50257 stored 50304 apart (bf16 and f16 models pad the stride). Forward
// and in-place backward match the packed reference; the padding is neither read (it holds NaN) nor written.
TEST(CudaCrossEntropy, PaddedRowStride) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const CeCase c{37, 50257, 0.1f, -100};
  const int64_t ld = 50304;
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    std::vector<double> logits;
    std::vector<int32_t> targets;
    make_inputs(c, dt, rng, logits, targets);
    CrossEntropyParams p{.N = c.N, .V = c.V, .label_smoothing = c.eps, .ignore_index = c.ignore_index};
    std::vector<double> losses(c.N), lse(c.N), d_logits(static_cast<size_t>(c.N) * c.V);
    const long count = cross_entropy_forward_ref<double>(p, losses.data(), lse.data(), logits.data(), targets.data());
    cross_entropy_backward_ref<double>(p, d_logits.data(), logits.data(), lse.data(), targets.data(),
                                       1.0 / std::max<long>(count, 1));
    std::vector<double> padded(static_cast<size_t>(c.N * ld), std::nan(""));
    for (int n = 0; n < c.N; ++n)
      for (int j = 0; j < c.V; ++j) padded[n * ld + j] = logits[static_cast<size_t>(n) * c.V + j];
    p.ld = ld;
    DeviceArena dev(ctx);
    const Tensor tz = dev.upload(dt, padded), ty = dev.upload_i32(targets);
    const Tensor tloss = dev.poisoned(DType::F32, c.N), tlse = dev.poisoned(DType::F32, c.N);
    const Tensor tsum = dev.poisoned(DType::F32, 2), tcount = dev.poisoned(DType::I32, 1);
    cross_entropy_forward(p, tloss, tlse, tz, ty, ctx);
    cross_entropy_loss_sum(p, tsum, tcount, tloss, ty, ctx);
    cross_entropy_backward(p, tz, tz, tlse, ty, 1.0, tcount, ctx);
    const std::string what = std::string("cross_entropy ld ") + dtype_label(dt);
    const double rows = std::sqrt(static_cast<double>(c.N));
    expect_close(dev.download(tlse), lse, DType::F32, what + " lse", 1.0, rows);
    expect_close(dev.download(tloss), losses, DType::F32, what + " losses", 10.0, rows);
    const auto got = dev.download(tz);
    std::vector<double> body(d_logits.size());
    bool padding_kept = true;
    for (int n = 0; n < c.N; ++n) {
      for (int j = 0; j < c.V; ++j) body[static_cast<size_t>(n) * c.V + j] = got[n * ld + j];
      for (int64_t j = c.V; j < ld; ++j) padding_kept = padding_kept && std::isnan(got[n * ld + j]);
    }
    expect_close(body, d_logits, dt, what + " d_logits", 2.0, 1e-2 / std::max<long>(count, 1) * rows);
    EXPECT_TRUE(padding_kept) << what << ": the padding was written";
  }
}

TEST(CudaCrossEntropy, ForwardAndSumAreDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const CeCase c{.N = 3000, .V = 50257, .eps = 0.1f, .ignore_index = -100};
  const CrossEntropyParams p{.N = c.N, .V = c.V, .label_smoothing = c.eps, .ignore_index = c.ignore_index};
  std::vector<double> logits;
  std::vector<int32_t> targets;
  make_inputs(c, DType::BF16, rng, logits, targets);
  DeviceArena dev(ctx);
  const Tensor tz = dev.upload(DType::BF16, logits), ty = dev.upload_i32(targets);
  std::vector<double> first_loss, first_sum;
  for (int run = 0; run < 3; ++run) {
    const Tensor tloss = dev.alloc(DType::F32, c.N), tlse = dev.alloc(DType::F32, c.N), tsum = dev.alloc(DType::F32, 2);
    cross_entropy_forward(p, tloss, tlse, tz, ty, ctx);
    cross_entropy_loss_sum(p, tsum, Tensor(), tloss, ty, ctx);
    const auto loss = dev.download(tloss), sum = dev.download(tsum);
    if (run == 0) {
      first_loss = loss;
      first_sum = sum;
    } else {
      ASSERT_EQ(loss, first_loss) << "losses differ between identical runs";
      ASSERT_EQ(sum, first_sum) << "the loss sum differs between identical runs";
    }
  }
}

// ---- cross_entropy_forward_backward: the fused op (one read of the logits, one write of the gradient). ----

struct FusedLayout {
  int64_t ld = 0;                 // row stride; 0: packed
  double padding = std::nan("");  // what the padding columns [V, ld) hold
  bool misalign = false;          // the logits start one element past a 16-byte boundary
};

// The fused op against the f64 reference (forward, then backward with loss_scale / count), through the Tensor-level
// entry: losses, lse, count, the gradient over the logits, the padding untouched, and the loss sum formed from the
// fused op's losses. NaN padding shows a read of the padding (the lse turns NaN); a finite one shows a write (the
// gradient of 64 is not 64).
void run_fused_case(const CeCase& c, DType dt, FusedLayout lay, Context& ctx, std::mt19937_64& rng,
                    const std::vector<int32_t>* forced_targets = nullptr) {
  CrossEntropyParams p{.N = c.N, .V = c.V, .label_smoothing = c.eps, .ignore_index = c.ignore_index};
  std::vector<double> logits;
  std::vector<int32_t> targets;
  make_inputs(c, dt, rng, logits, targets);
  if (forced_targets) targets = *forced_targets;
  std::vector<double> losses(c.N), lse(c.N), d_logits(logits.size());
  const long count = cross_entropy_forward_ref<double>(p, losses.data(), lse.data(), logits.data(), targets.data());
  double sum = 0;
  for (double l : losses) sum += l;
  const double loss_scale = 0.75;
  cross_entropy_backward_ref<double>(p, d_logits.data(), logits.data(), lse.data(), targets.data(),
                                     loss_scale / std::max<long>(count, 1));

  const int64_t ld = lay.ld ? lay.ld : c.V;
  std::vector<double> stored(static_cast<size_t>(c.N) * ld, lay.padding);
  for (int n = 0; n < c.N; ++n)
    for (int j = 0; j < c.V; ++j) stored[n * ld + j] = logits[static_cast<size_t>(n) * c.V + j];
  p.ld = lay.ld;
  DeviceArena dev(ctx);
  const Tensor tz = upload_at(dev, dt, stored, lay.misalign), ty = dev.upload_i32(targets);
  const Tensor tloss = dev.poisoned(DType::F32, c.N), tlse = dev.poisoned(DType::F32, c.N);
  const Tensor tcount = dev.poisoned(DType::I32, 1), tsum = dev.poisoned(DType::F32, 2);
  cross_entropy_forward_backward(p, tloss, tlse, tz, ty, loss_scale, tcount, ctx);
  cross_entropy_loss_sum(p, tsum, Tensor(), tloss, ty, ctx);

  const std::string what = std::string("cross_entropy_forward_backward N=") + std::to_string(c.N) +
                           " V=" + std::to_string(c.V) + " ld=" + std::to_string(lay.ld) +
                           " eps=" + std::to_string(c.eps) + " ignore=" + std::to_string(c.ignore_index) +
                           (lay.misalign ? " misaligned " : " ") + dtype_label(dt);
  const double rows = std::sqrt(static_cast<double>(c.N));
  expect_close(dev.download(tlse), lse, DType::F32, what + " lse", 1.0, rows);
  expect_close(dev.download(tloss), losses, DType::F32, what + " losses", 10.0, rows);
  EXPECT_EQ(dev.download(tcount)[0], count) << what << " count";
  const auto got_sum = dev.download(tsum);
  EXPECT_NEAR(got_sum[0], sum, 1e-4 * std::max(1.0, std::abs(sum)) + 1e-4 * rows) << what << " sum";
  const double mean = count ? sum / count : 0.0;
  EXPECT_NEAR(got_sum[1], mean, 1e-4 * std::max(1.0, std::abs(mean)) + 1e-4) << what << " mean";
  const auto got = dev.download(tz);
  std::vector<double> body(d_logits.size());
  bool padding_kept = true, ignored_zero = true;
  for (int n = 0; n < c.N; ++n) {
    for (int j = 0; j < c.V; ++j) {
      body[static_cast<size_t>(n) * c.V + j] = got[n * ld + j];
      if (targets[n] == c.ignore_index) ignored_zero = ignored_zero && got[n * ld + j] == 0.0;
    }
    for (int64_t j = c.V; j < ld; ++j) {
      const double v = got[n * ld + j];
      padding_kept = padding_kept && (std::isnan(lay.padding) ? std::isnan(v) : v == lay.padding);
    }
  }
  const double gfloor = 1e-2 * loss_scale / std::max<long>(count, 1) * rows;
  expect_close(body, d_logits, dt, what + " d_logits", 2.0, gfloor);
  EXPECT_TRUE(padding_kept) << what << ": the padding was written";
  EXPECT_TRUE(ignored_zero) << what << ": an ignored row has a non-zero gradient";
}

// Packed rows of odd V start at every 2-byte offset (the scalar head and tail of each row vary); V = 1 and 7 are
// below one 16-byte pack and one warp; 257 is below the block's 512 threads × 8; 50257 is GPT-2's vocab.
TEST(CudaCrossEntropyFused, MatchesReferenceOnAwkwardShapes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (int N : {1, 7, 64})
      for (int V : {1, 7, 257, 50257})
        for (float eps : {0.0f, 0.1f}) {
          const bool misalign = (N + V) % 2 == 0;
          run_fused_case({.N = N, .V = V, .eps = eps, .ignore_index = -100}, dt, {.misalign = misalign}, ctx, rng);
          if (V > 1)
            run_fused_case({.N = N, .V = V, .eps = eps, .ignore_index = V - 1}, dt, {.misalign = !misalign}, ctx, rng);
        }
}

// The model's layout: rows of V = 50257 stored 50304 apart. NaN padding catches a read of it, a finite sentinel a
// write; a misaligned start makes every padded row begin off a 16-byte boundary too.
TEST(CudaCrossEntropyFused, PaddedRowStride) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (double padding : {std::nan(""), 64.0}) {
      run_fused_case({.N = 37, .V = 50257, .eps = 0.1f, .ignore_index = -100}, dt, {.ld = 50304, .padding = padding},
                     ctx, rng);
      run_fused_case({.N = 5, .V = 1000, .eps = 0.0f, .ignore_index = 3}, dt,
                     {.ld = 1003, .padding = padding, .misalign = true}, ctx, rng);
    }
}

// Every row ignored: count 0, zero losses and gradients (the scale divides by max(count, 1), never by 0).
TEST(CudaCrossEntropyFused, AllRowsIgnored) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const std::vector<int32_t> ignored(9, -100);
  for (DType dt : kCudaFloatTypes)
    run_fused_case({.N = 9, .V = 300, .eps = 0.1f, .ignore_index = -100}, dt, {}, ctx, rng, &ignored);
  // N = 0 still writes the count.
  DeviceArena dev(ctx);
  const Tensor tcount = dev.poisoned(DType::I32, 1);
  cross_entropy_forward_backward({.N = 0, .V = 5}, dev.alloc(DType::F32, 0), dev.alloc(DType::F32, 0),
                                 dev.alloc(DType::BF16, 0), dev.alloc(DType::I32, 0), 1.0, tcount, ctx);
  EXPECT_EQ(dev.download(tcount)[0], 0.0);
}

// A row too large for one block's shared memory (f32, V = 60000: 240 KB) takes the separate kernels; a bf16 row of
// the same V (120 KB) and one of V = 100003 (200 KB, one block per SM) still run fused. Both against the reference.
TEST(CudaCrossEntropyFused, RowsBeyondSharedMemoryFallBack) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  EXPECT_FALSE(cross_entropy_fused_row_fits({.N = 3, .V = 60000}, DType::F32, ctx));
  EXPECT_TRUE(cross_entropy_fused_row_fits({.N = 3, .V = 60000}, DType::BF16, ctx));
  EXPECT_TRUE(cross_entropy_fused_row_fits({.N = 3, .V = 100003}, DType::F16, ctx));
  EXPECT_TRUE(cross_entropy_fused_row_fits({.N = 3, .V = 50257}, DType::F32, ctx));
  run_fused_case({.N = 5, .V = 60000, .eps = 0.1f, .ignore_index = -100}, DType::F32, {.ld = 60001}, ctx, rng);
  run_fused_case({.N = 5, .V = 60000, .eps = 0.1f, .ignore_index = -100}, DType::BF16, {}, ctx, rng);
  run_fused_case({.N = 5, .V = 100003, .eps = 0.0f, .ignore_index = 0}, DType::F16, {.misalign = true}, ctx, rng);
}

// Identical runs give bit-identical losses, lse and gradients (the block merge has a fixed order).
TEST(CudaCrossEntropyFused, IsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const CeCase c{.N = 3000, .V = 50257, .eps = 0.1f, .ignore_index = -100};
  const CrossEntropyParams p{.N = c.N, .V = c.V, .label_smoothing = c.eps, .ignore_index = c.ignore_index};
  std::vector<double> logits;
  std::vector<int32_t> targets;
  make_inputs(c, DType::BF16, rng, logits, targets);
  DeviceArena dev(ctx);
  const Tensor ty = dev.upload_i32(targets);
  std::vector<double> first_loss, first_lse, first_grad;
  for (int run = 0; run < 3; ++run) {
    const Tensor tz = dev.upload(DType::BF16, logits);  // fresh logits: the op overwrites them
    const Tensor tloss = dev.alloc(DType::F32, c.N), tlse = dev.alloc(DType::F32, c.N);
    const Tensor tcount = dev.alloc(DType::I32, 1);
    cross_entropy_forward_backward(p, tloss, tlse, tz, ty, 1.0, tcount, ctx);
    const auto loss = dev.download(tloss), lse = dev.download(tlse), grad = dev.download(tz);
    if (run == 0) {
      first_loss = loss;
      first_lse = lse;
      first_grad = grad;
    } else {
      ASSERT_EQ(loss, first_loss) << "losses differ between identical runs";
      ASSERT_EQ(lse, first_lse) << "lse differs between identical runs";
      ASSERT_EQ(grad, first_grad) << "the gradient differs between identical runs";
    }
  }
}

// The CPU route of the Tensor-level entries (runs without a GPU): the reference, with the count on the "device".
TEST(CudaCrossEntropy, CpuEntriesRouteToReference) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(test_seed());
  const CeCase c{.N = 9, .V = 33, .eps = 0.1f, .ignore_index = 32};
  const CrossEntropyParams p{.N = c.N, .V = c.V, .label_smoothing = c.eps, .ignore_index = c.ignore_index};
  std::vector<double> logits;
  std::vector<int32_t> targets;
  make_inputs(c, DType::F32, rng, logits, targets);
  std::vector<double> losses(c.N), lse(c.N), d(logits.size());
  const long count = cross_entropy_forward_ref<double>(p, losses.data(), lse.data(), logits.data(), targets.data());
  cross_entropy_backward_ref<double>(p, d.data(), logits.data(), lse.data(), targets.data(), 2.0 / count);

  std::vector<float> z(logits.begin(), logits.end()), tl(c.N), tlse(c.N), sm(2);
  int32_t tcount = -1;
  const Tensor tz(z.data(), DType::F32, {c.N, c.V}), ty(targets.data(), DType::I32, {c.N});
  const Tensor tloss(tl.data(), DType::F32, {c.N}), tl2(tlse.data(), DType::F32, {c.N});
  const Tensor tsum(sm.data(), DType::F32, {2}), tc(&tcount, DType::I32, {1});
  cross_entropy_forward(p, tloss, tl2, tz, ty, ctx);
  cross_entropy_loss_sum(p, tsum, tc, tloss, ty, ctx);
  cross_entropy_backward(p, tz, tz, tl2, ty, 2.0, tc, ctx);
  EXPECT_EQ(tcount, count);
  double sum = 0;
  for (double l : losses) sum += l;
  EXPECT_NEAR(sm[0], sum, 1e-4);
  EXPECT_NEAR(sm[1], sum / count, 1e-5);
  EXPECT_LE(rel_error(tl, losses), 1e-6);
  EXPECT_LE(rel_error(z, d), 1e-5);
}

TEST(CudaCrossEntropy, SupportsAnswersWithoutGpu) {
  std::string why;
  EXPECT_TRUE(cross_entropy_supports({.N = 4, .V = 50257}, DType::F64, Device::cpu(), &why)) << why;
  EXPECT_FALSE(cross_entropy_supports({.N = 4, .V = 50257}, DType::BF16, Device::cpu(), &why));
  EXPECT_FALSE(cross_entropy_supports({.N = 4, .V = 0}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("V > 0"), std::string::npos) << why;
  EXPECT_FALSE(cross_entropy_supports({.N = 4, .V = 8, .label_smoothing = 1.5f}, DType::F32, Device::cpu(), &why));
  EXPECT_TRUE(cross_entropy_supports({.N = 4, .V = 50257}, DType::BF16, Device::cuda(0), &why)) << why;
}

}  // namespace
}  // namespace tessera::test
