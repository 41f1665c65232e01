// The decode step's products (infer/decode_linear.h): which kernel takes a call, and both paths (gemv for a few
// 16-bit rows, the GEMM otherwise) on the GPU against the f64 reference, with and without the activation epilogue.
#include <optional>
#include <random>
#include <string>

#include "cuda_test_util.h"
#include "tessera/infer/decode_linear.h"

namespace tessera::test {
namespace {

TEST(DecodeLinearCuda, GemvTakesAFewSixteenBitRows) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  DeviceArena dev(ctx);
  const Tensor a = dev.alloc(DType::BF16, 8 * 64), w = dev.alloc(DType::BF16, 96 * 64);
  const Tensor af = dev.alloc(DType::F32, 8 * 64), wf = dev.alloc(DType::F32, 96 * 64);
  EXPECT_TRUE(decode_linear_uses_gemv({.M = 1, .N = 96, .K = 64}, a, w, ctx));
  EXPECT_TRUE(decode_linear_uses_gemv({.M = 4, .N = 96, .K = 64, .act = Activation::Relu}, a, w, ctx));
  EXPECT_FALSE(decode_linear_uses_gemv({.M = 5, .N = 96, .K = 64}, a, w, ctx)) << "past kDecodeGemvRows";
  EXPECT_FALSE(decode_linear_uses_gemv({.M = 1, .N = 96, .K = 60}, a, w, ctx)) << "K not a whole number of packs";
  EXPECT_FALSE(decode_linear_uses_gemv({.M = 1, .N = 96, .K = 64}, af, wf, ctx)) << "f32 keeps the exact GEMM";
  EXPECT_FALSE(decode_linear_uses_gemv({.M = 1, .N = 96, .K = 64, .act = Activation::Swiglu}, a, w, ctx));
  Context cpu(Device::cpu());
  EXPECT_FALSE(decode_linear_uses_gemv({.M = 1, .N = 96, .K = 64}, a, w, cpu)) << "the CPU keeps the GEMM";
}

// c = act(a Wᵀ + bias) for 1 and 4 rows (gemv in bf16 / f16) and 5 (the GEMM, then activation_forward), f32 always
// the GEMM; against gemv_ref in f64 on the inputs rounded to the dtype.
TEST(DecodeLinearCuda, BothPathsMatchTheReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  constexpr int N = 96, K = 64;
  for (DType dt : kCudaFloatTypes) {
    for (int M : {1, 4, 5}) {
      for (std::optional<Activation> act : {std::optional<Activation>(), std::optional<Activation>(Activation::Relu),
                                            std::optional<Activation>(Activation::GeluErf)}) {
        const GemvParams p{.M = M, .N = N, .K = K, .act = act};
        const auto a = rounded(dt, randn<double>(static_cast<size_t>(M) * K, rng));
        const auto w = rounded(dt, randn<double>(static_cast<size_t>(N) * K, rng));
        const auto bias = rounded(dt, randn<double>(N, rng));
        std::vector<double> ref(static_cast<size_t>(M) * N);
        gemv_ref<double>(p, ref.data(), a.data(), w.data(), bias.data());
        DeviceArena dev(ctx);
        const Tensor ta = dev.upload(dt, a), tw = dev.upload(dt, w), tb = dev.upload(dt, bias);
        const Tensor tc = dev.poisoned(dt, int64_t{M} * N), pre = dev.poisoned(dt, int64_t{M} * N);
        if (act) decode_linear_act(p, tc, pre, ta, tw, tb, ctx);
        else decode_linear(p, tc, ta, tw, tb, ctx);
        const std::string what = std::string("decode_linear M ") + std::to_string(M) + (act ? " with act" : "");
        expect_close(dev.download(tc), ref, dt, what);
      }
    }
  }
}

}  // namespace
}  // namespace tessera::test
