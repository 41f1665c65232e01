// The few-row product (ops/gemm/gemv.h): the CUDA kernel against the f64 reference, through the Tensor entry.
#include <cmath>
#include <optional>

#include "cuda_test_util.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/gemm/gemv.h"

namespace tessera::test {
namespace {

struct GemvShape {
  int M, N, K;
  int64_t ldc;  // 0: N
};
// One pack; rows 1, 3, 5, 8, 13 and 16 (each padding of the kernel, full and not); N odd, below a block's columns,
// and GPT-2's qkv / proj / fc / fc2 / head widths; K one pack, a few packs, not a multiple of a warp's 32 packs,
// and long; the head's padded row stride.
constexpr GemvShape kShapes[] = {{1, 1, 8, 0},       {1, 2304, 768, 0}, {3, 7, 24, 0},    {5, 769, 776, 0},
                                 {16, 768, 3072, 0}, {8, 3072, 768, 0}, {2, 33, 4104, 0}, {13, 50257, 64, 50304},
                                 {16, 5, 8, 9},      {4, 130, 264, 131}};
constexpr std::optional<Activation> kActs[] = {std::nullopt, Activation::Gelu, Activation::GeluErf, Activation::Relu};

const char* act_label(std::optional<Activation> a) {
  return !a ? "none" : *a == Activation::Gelu ? "gelu" : *a == Activation::GeluErf ? "gelu_erf" : "relu";
}

// Element by element: |got - ref| <= 2e-5 |a| |W| + |bias| terms (fp32 accumulation, the activation's slope at most
// ~1.13), + the output's rounding (bf16 2^-8, f16 2^-11 of |ref|), + tanh.approx's 2^-11 error in the tanh GELU
// (0.5 |u| of it), + the smallest normal (for exact zeros).
void run_gemv_shape(DType dt, GemvShape s, std::optional<Activation> act, bool with_bias, Context& ctx,
                    std::mt19937_64& rng) {
  const int M = s.M, N = s.N, K = s.K;
  const int64_t ldc = s.ldc ? s.ldc : N, size_c = (M - 1) * ldc + N;
  const auto a = rounded(dt, randn<double>(static_cast<size_t>(M) * K, rng));
  const auto w = rounded(dt, randn<double>(static_cast<size_t>(N) * K, rng));
  const auto bias = rounded(dt, randn<double>(N, rng));
  const GemvParams p{.M = M, .N = N, .K = K, .ldc = s.ldc, .act = act};
  std::vector<double> ref(size_c, std::nan("")), pre(size_c, 0.0), mag(static_cast<size_t>(M) * N);
  gemv_ref<double>(p, ref.data(), a.data(), w.data(), with_bias ? bias.data() : nullptr);
  gemv_ref<double>({.M = M, .N = N, .K = K, .ldc = s.ldc}, pre.data(), a.data(), w.data(),
                   with_bias ? bias.data() : nullptr);
  std::vector<double> abs_a(a.size()), abs_w(w.size());
  for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(a[i]);
  for (size_t i = 0; i < w.size(); ++i) abs_w[i] = std::fabs(w[i]);
  gemm_loop_ref<double>({.M = M, .N = N, .K = K, .trans_b = true}, mag.data(), abs_a.data(), abs_w.data(), nullptr);

  DeviceArena dev(ctx);
  const Tensor ta = dev.upload(dt, a), tw = dev.upload(dt, w), tb = dev.upload(dt, bias);
  const Tensor tc = dev.poisoned(dt, size_c);
  gemv(p, tc, ta, tw, with_bias ? tb : Tensor(), ctx);
  const auto got = dev.download(tc);
  const double out_round = dt == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const std::string what = std::string("gemv ") + dtype_label(dt) + " " + std::to_string(M) + "x" + std::to_string(N) +
                           "x" + std::to_string(K) + " ldc " + std::to_string(ldc) + " act " + act_label(act) +
                           (with_bias ? " +bias" : "") + " seed " + std::to_string(test_seed());
  int bad = 0;
  for (int m = 0; m < M; ++m) {
    for (int64_t n = 0; n < ldc && m * ldc + n < size_c; ++n) {
      const int64_t i = m * ldc + n;
      if (n >= N) {  // a row's padding is left as it was
        EXPECT_TRUE(std::isnan(got[i])) << what << ": padding element (" << m << ", " << n << ") written";
        continue;
      }
      const double terms = mag[static_cast<size_t>(m) * N + n] + (with_bias ? std::fabs(bias[n]) : 0.0);
      const double tanh_err = act && *act == Activation::Gelu ? 0.5 * std::fabs(pre[i]) * std::ldexp(1.0, -11) : 0.0;
      const double tol = 2e-5 * terms + out_round * std::fabs(ref[i]) + tanh_err + 1e-30;
      if (!(std::fabs(got[i] - ref[i]) <= tol) && ++bad <= 5)
        ADD_FAILURE() << what << ": (" << m << ", " << n << ") got " << got[i] << " want " << ref[i] << " (tol " << tol
                      << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(CudaGemv, MatchesReferenceForEveryShapeActivationBiasAndDtype) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::BF16, DType::F16})
    for (const GemvShape& s : kShapes)
      for (const auto& act : kActs)
        for (bool with_bias : {false, true}) run_gemv_shape(dt, s, act, with_bias, ctx, rng);
}

TEST(CudaGemv, SaysWhatItDoesNotTake) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  DeviceArena dev(ctx);
  const Tensor buf = dev.poisoned(DType::BF16, 64);
  const void* al = buf.data();
  const void* mis = buf.slice1d(1, 8).data();
  const Device d = ctx.device();
  std::string why;
  EXPECT_TRUE(gemv_supports({.M = 16, .N = 3, .K = 8}, DType::BF16, d, al, al, &why)) << why;
  EXPECT_FALSE(gemv_supports({.M = 17, .N = 3, .K = 8}, DType::BF16, d, al, al, &why));
  EXPECT_FALSE(gemv_supports({.M = 0, .N = 3, .K = 8}, DType::BF16, d, al, al, &why));
  EXPECT_FALSE(gemv_supports({.M = 1, .N = 3, .K = 12}, DType::BF16, d, al, al, &why));
  EXPECT_FALSE(gemv_supports({.M = 1, .N = 3, .K = 8}, DType::BF16, d, mis, al, &why));
  EXPECT_FALSE(gemv_supports({.M = 1, .N = 3, .K = 8}, DType::BF16, d, al, mis, &why));
  EXPECT_FALSE(gemv_supports({.M = 1, .N = 3, .K = 8}, DType::F32, d, al, al, &why));
  EXPECT_FALSE(gemv_supports({.M = 1, .N = 3, .K = 8, .act = Activation::Swiglu}, DType::BF16, d, al, al, &why));
  EXPECT_NE(why.find("Swiglu"), std::string::npos) << why;
}

}  // namespace
}  // namespace tessera::test
