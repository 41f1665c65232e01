// Bias + GELU / ReLU / SwiGLU: the CUDA kernels against the f64 reference, through the Tensor-level entries.
#include "cuda_test_util.h"
#include "tessera/models/gpt.h"
#include "tessera/ops/activation/activation.h"

namespace tessera::test {
namespace {

struct ActShape {
  int N, F;
};
// One element, widths that are not multiples of the 8-wide vector, GPT-2's d_ff, and many short rows.
constexpr ActShape kShapes[] = {{1, 1}, {7, 33}, {3, 100}, {64, 768}, {13, 3072}, {999, 8}};
constexpr Activation kKinds[] = {Activation::Gelu, Activation::Relu, Activation::Swiglu, Activation::GeluErf};

void run_activation_case(DType dt, Activation kind, ActShape s, bool bias, bool misalign, Context& ctx,
                         std::mt19937_64& rng, float dropout = 0.0f) {
  const ActivationParams p{.N = s.N, .d_ff = s.F, .kind = kind, .dropout = dropout, .seed = 11, .stream = 3};
  const size_t W = kind == Activation::Swiglu ? 2 * static_cast<size_t>(s.F) : s.F;
  const size_t NW = s.N * W, NF = static_cast<size_t>(s.N) * s.F;
  const auto in = rounded(dt, randn<double>(NW, rng, 2.0));
  const auto b = rounded(dt, randn<double>(W, rng, 0.5));
  const auto d_out = rounded(dt, randn<double>(NF, rng));
  const auto d_b0 = rounded(dt, randn<double>(W, rng));  // accumulated into: prefilled

  std::vector<double> out(NF), d_in(NW), d_b = d_b0;
  activation_forward_ref<double>(p, out.data(), in.data(), bias ? b.data() : nullptr);
  activation_backward_ref<double>(p, d_in.data(), bias ? d_b.data() : nullptr, d_out.data(), in.data(),
                                  bias ? b.data() : nullptr);

  DeviceArena dev(ctx);
  const Tensor tin = upload_at(dev, dt, in, misalign), tdo = upload_at(dev, dt, d_out, misalign);
  const Tensor tb = bias ? upload_at(dev, dt, b, misalign) : Tensor();
  const Tensor tout = poisoned_at(dev, dt, NF, misalign), tdin = poisoned_at(dev, dt, NW, misalign);
  const Tensor tdb = bias ? dev.upload(dt, d_b0) : Tensor();
  activation_forward(p, tout, tin, tb, ctx);
  activation_backward(p, tdin, tdb, tdo, tin, tb, ctx);

  const std::string what = std::string(activation_name(kind)) + " N=" + std::to_string(s.N) +
                           " d_ff=" + std::to_string(s.F) + (bias ? " +bias" : "") + (misalign ? " misaligned" : "");
  // Measured against the size of the terms where GELU cancels: GELU(x) for x << 0 is x (1 + tanh(..)) with
  // 1 + tanh near 0, so a one-element tensor's relative error is cancellation (seen on the H200: 1e-4 in f32,
  // and f16 rounding a 1e-9 result to 0), not a kernel fault.
  expect_close(dev.download(tout), out, dt, what + " out", 1.0, 0.1 * norm2(in));
  expect_close(dev.download(tdin), d_in, dt, what + " d_in", 1.0, 0.1 * norm2(d_out));
  // d_bias is accumulated into d_b0: where d_b0 and the column sum nearly cancel (one row, one column), measure
  // against the size of the prefilled value (seen on the H200: f16, N = 1, d_ff = 1, 0.44% of a small result).
  if (bias) expect_close(dev.download(tdb), d_b, dt, what + " d_bias", 2.0, 0.1 * norm2(d_b0));
}

// Output dropout (an encoder-decoder's activation dropout): the kernels draw the reference's mask, packed and scalar.
TEST(CudaActivation, DropoutMatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (Activation kind : kKinds)
      for (ActShape s : {ActShape{7, 33}, ActShape{13, 3072}, ActShape{999, 8}})
        run_activation_case(dt, kind, s, /*bias=*/true, /*misalign=*/false, ctx, rng, /*dropout=*/0.25f);
}

TEST(CudaActivation, MatchesReferenceOnAwkwardShapes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (Activation kind : kKinds)
      for (ActShape s : kShapes) {
        run_activation_case(dt, kind, s, /*bias=*/true, /*misalign=*/false, ctx, rng);
        run_activation_case(dt, kind, s, /*bias=*/false, /*misalign=*/false, ctx, rng);
      }
}

TEST(CudaActivation, ScalarPathOnMisalignedViews) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (Activation kind : kKinds) run_activation_case(dt, kind, {21, 256}, /*bias=*/true, /*misalign=*/true, ctx, rng);
}

// GELU may run in place (out == in, d_in == d_out).
TEST(CudaActivation, GeluInPlace) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const ActivationParams p{.N = 17, .d_ff = 3072, .kind = Activation::Gelu};
  const size_t NF = static_cast<size_t>(p.N) * p.d_ff;
  const auto in = rounded(DType::BF16, randn<double>(NF, rng, 2.0));
  std::vector<double> out(NF);
  activation_forward_ref<double>(p, out.data(), in.data(), nullptr);
  DeviceArena dev(ctx);
  const Tensor t = dev.upload(DType::BF16, in);
  activation_forward(p, t, t, Tensor(), ctx);
  expect_close(dev.download(t), out, DType::BF16, "gelu in place");
}

// The model's GELU backward (Gpt::backward, with the bias already in fc_pre): in place (d_in is d_out), no bias,
// and d_bias accumulated. The op test above pairs bias with d_bias and never aliases d_in with d_out, so a kernel
// that summed d_bias only when given a bias, or read d_out after writing d_in, passed it.
TEST(CudaActivation, InPlaceBackwardWithABiasGradientAndNoBias) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (Activation kind : {Activation::Gelu, Activation::Relu})
      for (ActShape s : {ActShape{7, 33}, ActShape{64, 768}, ActShape{13, 3072}}) {
        const ActivationParams p{.N = s.N, .d_ff = s.F, .kind = kind};
        const size_t NF = static_cast<size_t>(s.N) * s.F;
        const auto in = rounded(dt, randn<double>(NF, rng, 2.0));
        const auto d_out = rounded(dt, randn<double>(NF, rng));
        const auto d_b0 = rounded(dt, randn<double>(s.F, rng));
        std::vector<double> d_in(NF), d_b = d_b0;
        activation_backward_ref<double>(p, d_in.data(), d_b.data(), d_out.data(), in.data(), nullptr);
        DeviceArena dev(ctx);
        const Tensor tin = dev.upload(dt, in), tg = dev.upload(dt, d_out), tdb = dev.upload(dt, d_b0);
        activation_backward(p, tg, tdb, tg, tin, Tensor(), ctx);
        const std::string what = std::string(activation_name(kind)) + " in place N=" + std::to_string(s.N) +
                                 " d_ff=" + std::to_string(s.F);
        expect_close(dev.download(tg), d_in, dt, what + " d_in", 1.0, 0.1 * norm2(d_out));
        expect_close(dev.download(tdb), d_b, dt, what + " d_bias", 2.0, 0.1 * norm2(d_b0));
      }
}

TEST(CudaActivation, BiasGradientIsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const ActivationParams p{.N = 8192, .d_ff = 3072, .kind = Activation::Swiglu};
  const size_t NW = static_cast<size_t>(p.N) * 2 * p.d_ff, NF = static_cast<size_t>(p.N) * p.d_ff;
  DeviceArena dev(ctx);
  const Tensor tin = dev.upload(DType::BF16, randn<double>(NW, rng));
  const Tensor tdo = dev.upload(DType::BF16, randn<double>(NF, rng));
  const Tensor tdin = dev.alloc(DType::BF16, NW);
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    const Tensor tdb = dev.alloc(DType::BF16, 2 * p.d_ff);
    fill_bytes(tdb, 0, ctx);
    activation_backward(p, tdin, tdb, tdo, tin, Tensor(), ctx);
    const auto got = dev.download(tdb);
    if (run == 0) first = got;
    else ASSERT_EQ(got, first) << "d_bias differs between identical runs";
  }
}

TEST(CudaActivation, SupportsAnswersWithoutAGpu) {
  std::string why;
  EXPECT_FALSE(activation_supports({.N = 1, .d_ff = 8}, DType::F16, Device::cpu(), &why));
  EXPECT_TRUE(activation_supports({.N = 1, .d_ff = 8, .kind = Activation::Swiglu}, DType::F64, Device::cpu(), &why));
  EXPECT_FALSE(activation_supports({.N = 1, .d_ff = 0}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("d_ff"), std::string::npos) << why;
}

}  // namespace
}  // namespace tessera::test
