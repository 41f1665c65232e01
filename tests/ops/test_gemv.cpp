// The few-row product's reference (ops/gemm/gemv.h) against its formula written out, and the entry's refusals.
#include <cmath>

#include "tessera/core/error.h"
#include "tessera/ops/gemm/gemv.h"
#include "test_util.h"

namespace tessera {
namespace {

// The formula of gemv.h, element by element in f64: act(Σ_k a[m, k] W[n, k] + bias[n]).
double formula(std::optional<Activation> act, const std::vector<double>& a, const std::vector<double>& w,
               const std::vector<double>& bias, int K, int m, int n) {
  double u = bias.empty() ? 0.0 : bias[n];
  for (int k = 0; k < K; ++k) u += a[static_cast<size_t>(m) * K + k] * w[static_cast<size_t>(n) * K + k];
  if (!act) return u;
  switch (*act) {
    case Activation::Relu: return u > 0 ? u : 0.0;
    case Activation::GeluErf: return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
    default: return 0.5 * u * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
  }
}

TEST(Gemv, ReferenceIsTheFormulaAndLeavesTheRowPaddingAlone) {
  std::mt19937_64 rng(test::test_seed());
  const int M = 5, N = 11, K = 13;
  const int64_t ldc = N + 4;
  for (std::optional<Activation> act :
       {std::optional<Activation>{}, std::optional<Activation>{Activation::Gelu},
        std::optional<Activation>{Activation::GeluErf}, std::optional<Activation>{Activation::Relu}})
    for (bool with_bias : {false, true}) {
      const auto a = test::randn<double>(M * K, rng), w = test::randn<double>(N * K, rng);
      const auto bias = with_bias ? test::randn<double>(N, rng) : std::vector<double>{};
      std::vector<double> c = test::poisoned<double>((M - 1) * ldc + N);
      gemv_ref<double>({.M = M, .N = N, .K = K, .ldc = ldc, .act = act}, c.data(), a.data(), w.data(),
                       with_bias ? bias.data() : nullptr);
      for (int m = 0; m < M; ++m)
        for (int64_t n = 0; n < ldc && m * ldc + n < static_cast<int64_t>(c.size()); ++n) {
          const double got = c[m * ldc + n];
          if (n >= N) EXPECT_TRUE(std::isnan(got)) << "padding (" << m << ", " << n << ") written";
          else EXPECT_NEAR(got, formula(act, a, w, bias, K, m, static_cast<int>(n)), 1e-12) << m << ", " << n;
        }
    }
}

TEST(Gemv, EntryRefusesSwigluAndAShortRowStride) {
  Context ctx(Device::cpu());
  std::string why;
  EXPECT_FALSE(gemv_supports({.M = 1, .N = 4, .K = 2, .act = Activation::Swiglu}, DType::F32, ctx.device(), nullptr,
                             nullptr, &why));
  EXPECT_FALSE(gemv_supports({.M = 2, .N = 4, .K = 2, .ldc = 3}, DType::F32, ctx.device(), nullptr, nullptr, &why));
  EXPECT_TRUE(gemv_supports({.M = 40, .N = 4, .K = 3}, DType::F32, ctx.device(), nullptr, nullptr, &why)) << why;
}

}  // namespace
}  // namespace tessera
