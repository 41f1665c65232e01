// Row strides (leading dimensions) in the GEMM and the cross-entropy: a matrix stored with padded rows gives the
// same result as the packed one, the padding is neither read (it holds NaN, which would spread) nor written.
#include <cmath>

#include "tessera/core/error.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/loss/cross_entropy.h"
#include "test_util.h"

namespace tessera {
namespace {

// x (rows, cols) packed, copied into rows `ld` apart with `fill` in the padding: NaN for inputs (a read would
// spread it), a finite sentinel for outputs (a write would change it, whatever beta is).
constexpr double kSentinel = 7.25;
template <typename T>
std::vector<T> padded(const std::vector<T>& x, int64_t rows, int64_t cols, int64_t ld,
                      T fill = std::numeric_limits<T>::quiet_NaN()) {
  std::vector<T> out(static_cast<size_t>(rows * ld), fill);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * ld + c] = x[r * cols + c];
  return out;
}

// Every transpose and beta, BLAS and loop paths, with all three matrices padded by different amounts: the
// padded product equals the packed one, and C's padding is still NaN.
template <typename T>
void check_ld(double tol) {
  std::mt19937_64 rng(test::test_seed());
  const int M = 13, N = 29, K = 7;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 1.0f}) {
        GemmParams p{.M = M, .N = N, .K = K, .trans_a = ta == 1, .trans_b = tb == 1, .alpha = 0.7f, .beta = beta};
        const auto a = test::randn<T>(M * K, rng), b = test::randn<T>(K * N, rng), bias = test::randn<T>(N, rng);
        const auto c0 = beta == 0 ? test::poisoned<T>(M * N) : test::prefilled<T>(M * N, rng);
        auto want = c0;
        gemm_loop_ref(p, want.data(), a.data(), b.data(), bias.data());
        const int64_t lda = p.a_cols() + 3, ldb = p.b_cols() + 5, ldc = N + 8;
        const auto ap = padded(a, p.a_rows(), p.a_cols(), lda), bp = padded(b, p.b_rows(), p.b_cols(), ldb);
        auto c_blas = padded(c0, M, N, ldc, static_cast<T>(kSentinel)), c_loop = c_blas;
        p.lda = lda;
        p.ldb = ldb;
        p.ldc = ldc;
        gemm_ref(p, c_blas.data(), ap.data(), bp.data(), bias.data());
        gemm_loop_ref(p, c_loop.data(), ap.data(), bp.data(), bias.data());
        for (int m = 0; m < M; ++m) {
          for (int n = 0; n < N; ++n) {
            const double w = want[m * N + n];
            EXPECT_NEAR(c_blas[m * ldc + n], w, tol * (1 + std::fabs(w)))
                << m << "," << n << " ta " << ta << " tb " << tb;
            EXPECT_NEAR(c_loop[m * ldc + n], w, tol * (1 + std::fabs(w)))
                << m << "," << n << " ta " << ta << " tb " << tb;
          }
          for (int64_t n = N; n < ldc; ++n) {
            EXPECT_EQ(c_blas[m * ldc + n], static_cast<T>(kSentinel)) << "padding written at " << m << "," << n;
            EXPECT_EQ(c_loop[m * ldc + n], static_cast<T>(kSentinel)) << "padding written at " << m << "," << n;
          }
        }
      }
}

TEST(GemmLd, PaddedRowsMatchPackedF32) { check_ld<float>(test::kRefTolF32); }
TEST(GemmLd, PaddedRowsMatchPackedF64) { check_ld<double>(1e-13); }

TEST(GemmLd, TensorEntryChecksTheExtentAndTheStride) {
  Context ctx;
  const int M = 4, N = 5, K = 3;
  std::vector<float> a(M * K, 1.0f), b(K * N, 1.0f), c(3 * 8 + N, 0.0f);
  const Tensor ta(a.data(), DType::F32, {M, K}), tb(b.data(), DType::F32, {K, N});
  // C with rows 8 apart: (M - 1) * 8 + N elements suffice.
  gemm({.M = M, .N = N, .K = K, .ldc = 8}, Tensor(c.data(), DType::F32, {static_cast<int64_t>(c.size())}), ta, tb,
       Tensor(), ctx);
  EXPECT_EQ(c[3 * 8 + 4], 3.0f);
  EXPECT_EQ(c[5], 0.0f);  // padding of row 0
  // One element short.
  EXPECT_THROW(gemm({.M = M, .N = N, .K = K, .ldc = 8}, Tensor(c.data(), DType::F32, {3 * 8 + N - 1}), ta, tb, Tensor(),
                    ctx),
               Error);
  // A stride below the row length.
  EXPECT_THROW(gemm({.M = M, .N = N, .K = K, .ldc = N - 1}, Tensor(c.data(), DType::F32, {M * N}), ta, tb, Tensor(),
                    ctx),
               Error);
}

// The reference cross-entropy over rows `ld` apart: the same losses, lse and gradients as packed, bit for bit,
// and the gradient's padding untouched.
TEST(CrossEntropyLd, PaddedRowsMatchPacked) {
  std::mt19937_64 rng(test::test_seed());
  const int N = 6, V = 11;
  const int64_t ld = 16;
  const auto z = test::randn<double>(N * V, rng, 3.0);
  std::vector<int32_t> y = {0, 10, 3, -1, 7, 5};
  CrossEntropyParams p{.N = N, .V = V, .label_smoothing = 0.1f, .ignore_index = -1};
  std::vector<double> loss(N), lse(N), d(N * V);
  cross_entropy_forward_ref<double>(p, loss.data(), lse.data(), z.data(), y.data());
  cross_entropy_backward_ref<double>(p, d.data(), z.data(), lse.data(), y.data(), 0.5);
  p.ld = ld;
  const auto zp = padded(z, N, V, ld);
  auto dp = padded(std::vector<double>(N * V, 0.0), N, V, ld, kSentinel);
  std::vector<double> loss_p(N), lse_p(N);
  cross_entropy_forward_ref<double>(p, loss_p.data(), lse_p.data(), zp.data(), y.data());
  cross_entropy_backward_ref<double>(p, dp.data(), zp.data(), lse_p.data(), y.data(), 0.5);
  for (int n = 0; n < N; ++n) {
    EXPECT_EQ(loss_p[n], loss[n]) << n;
    EXPECT_EQ(lse_p[n], lse[n]) << n;
    for (int j = 0; j < V; ++j) EXPECT_EQ(dp[n * ld + j], d[n * V + j]) << n << "," << j;
    for (int64_t j = V; j < ld; ++j) EXPECT_EQ(dp[n * ld + j], kSentinel) << "padding written at " << n << "," << j;
  }
  std::string why;
  EXPECT_FALSE(cross_entropy_supports({.N = N, .V = V, .ld = V - 1}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("row stride"), std::string::npos) << why;
}

}  // namespace
}  // namespace tessera
