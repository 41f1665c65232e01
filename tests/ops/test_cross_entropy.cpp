// The fused cross-entropy (forward + backward in one op) on the CPU: the Tensor-level entry against the separate
// entries, which the finite-difference tests (test_ops_fd.cpp) and the PyTorch oracle already hold to account.
#include <gtest/gtest.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/ops/loss/cross_entropy.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr double kSentinel = 1234.5;  // in the padding columns: never read (it would dominate lse), never written

// Logits with row offsets, rows ld apart (padding = kSentinel), and targets with every third row ignored.
template <typename T>
std::vector<T> padded_logits(int N, int V, int64_t ld, std::mt19937_64& rng) {
  const auto z = test::randn<double>(static_cast<size_t>(N) * V, rng, 3.0);
  std::vector<T> out(static_cast<size_t>(N) * ld, static_cast<T>(kSentinel));
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < V; ++j) out[n * ld + j] = static_cast<T>(z[static_cast<size_t>(n) * V + j] + 5.0 * (n % 3));
  return out;
}

template <typename T>
void expect_fused_equals_separate(const CrossEntropyParams& p, std::vector<int32_t> y, std::mt19937_64& rng) {
  Context ctx(Device::cpu());
  const DType dt = std::is_same_v<T, float> ? DType::F32 : DType::F64;
  const int64_t ld = p.row_stride();
  const auto z = padded_logits<T>(p.N, p.V, ld, rng);
  const Tensor ty(y.data(), DType::I32, {p.N});
  const double loss_scale = 3.0;

  // The separate ops, as the model ran them: forward, loss sum (for the count), backward in place.
  std::vector<T> z1 = z, loss1(p.N), lse1(p.N), sm1(2);
  int32_t count1 = -1;
  const Tensor tz1(z1.data(), dt, {static_cast<int64_t>(z1.size())});
  cross_entropy_forward(p, Tensor(loss1.data(), dt, {p.N}), Tensor(lse1.data(), dt, {p.N}), tz1, ty, ctx);
  cross_entropy_loss_sum(p, Tensor(sm1.data(), dt, {2}), Tensor(&count1, DType::I32, {1}),
                         Tensor(loss1.data(), dt, {p.N}), ty, ctx);
  cross_entropy_backward(p, tz1, tz1, Tensor(lse1.data(), dt, {p.N}), ty, loss_scale, Tensor(&count1, DType::I32, {1}),
                         ctx);

  std::vector<T> z2 = z, loss2(p.N, T(-7)), lse2(p.N, T(-7)), sm2(2);
  int32_t count2 = -1;
  cross_entropy_forward_backward(p, Tensor(loss2.data(), dt, {p.N}), Tensor(lse2.data(), dt, {p.N}),
                                 Tensor(z2.data(), dt, {static_cast<int64_t>(z2.size())}), ty, loss_scale,
                                 Tensor(&count2, DType::I32, {1}), ctx);
  // The loss sum still works from the fused op's losses.
  cross_entropy_loss_sum(p, Tensor(sm2.data(), dt, {2}), Tensor(), Tensor(loss2.data(), dt, {p.N}), ty, ctx);

  EXPECT_EQ(count2, count1);
  EXPECT_EQ(loss2, loss1);
  EXPECT_EQ(lse2, lse1);
  EXPECT_EQ(sm2, sm1);
  EXPECT_EQ(z2, z1);  // the gradient, bit for bit, and the padding kept
  for (int n = 0; n < p.N; ++n) {
    for (int64_t j = p.V; j < ld; ++j) ASSERT_EQ(z2[n * ld + j], static_cast<T>(kSentinel)) << n << "," << j;
    if (y[n] != p.ignore_index) continue;
    EXPECT_EQ(loss2[n], T(0)) << "ignored row " << n;
    for (int j = 0; j < p.V; ++j) ASSERT_EQ(z2[n * ld + j], T(0)) << "ignored row " << n << ", column " << j;
  }
  // A counted row's gradient sums to 0 (softmax and the smoothed target both sum to 1) and is not all zero. Its
  // size, 2 (1 - p_label) / count without smoothing, is small for a row whose label the logits already favour
  // (5.6e-4 at one seed), so "not zero" is any size far above the float noise of a zeroed row (exactly 0).
  for (int n = 0; n < p.N; ++n) {
    if (y[n] == p.ignore_index) continue;
    double s = 0, a = 0;
    for (int j = 0; j < p.V; ++j) {
      s += z2[n * ld + j];
      a += std::abs(z2[n * ld + j]);
    }
    EXPECT_NEAR(s, 0.0, 1e-5) << n;
    EXPECT_GT(a, 1e-7) << n;
  }
}

TEST(CrossEntropyFused, CpuEntryEqualsTheSeparateOps) {
  std::mt19937_64 rng(test::test_seed());
  const std::vector<int32_t> y = {0, 10, 3, -1, 7, 5, 10};
  for (float eps : {0.0f, 0.1f})
    for (int64_t ld : {0, 16}) {
      const CrossEntropyParams p{.N = 7, .V = 11, .label_smoothing = eps, .ignore_index = -1, .ld = ld};
      expect_fused_equals_separate<float>(p, y, rng);
      expect_fused_equals_separate<double>(p, y, rng);
      // ignore_index inside the vocab (a padding token id)
      const std::vector<int32_t> y_pad = {0, 10, 3, 4, 7, 5, 10};
      expect_fused_equals_separate<double>({.N = 7, .V = 11, .label_smoothing = eps, .ignore_index = 10, .ld = ld},
                                           y_pad, rng);
    }
}

// Every row ignored: the count is 0 and the scale d_loss / max(count, 1) stays finite: zero gradients, no NaN.
TEST(CrossEntropyFused, AllRowsIgnoredGiveZeroGradients) {
  std::mt19937_64 rng(test::test_seed());
  const CrossEntropyParams p{.N = 3, .V = 5, .label_smoothing = 0.1f, .ignore_index = -1};
  auto z = padded_logits<double>(p.N, p.V, p.V, rng);
  std::vector<int32_t> y(3, -1);
  std::vector<double> loss(3), lse(3);
  int32_t count = -1;
  Context ctx(Device::cpu());
  cross_entropy_forward_backward(p, Tensor(loss.data(), DType::F64, {3}), Tensor(lse.data(), DType::F64, {3}),
                                 Tensor(z.data(), DType::F64, {15}), Tensor(y.data(), DType::I32, {3}), 1.0,
                                 Tensor(&count, DType::I32, {1}), ctx);
  EXPECT_EQ(count, 0);
  for (double v : z) EXPECT_EQ(v, 0.0);
  for (double v : loss) EXPECT_EQ(v, 0.0);
  for (double v : lse) EXPECT_TRUE(std::isfinite(v));
}

TEST(CrossEntropyFused, EntryRequiresTheCount) {
  Context ctx(Device::cpu());
  std::vector<float> z(6), loss(2), lse(2);
  std::vector<int32_t> y = {0, 1};
  EXPECT_THROW(cross_entropy_forward_backward({.N = 2, .V = 3}, Tensor(loss.data(), DType::F32, {2}),
                                              Tensor(lse.data(), DType::F32, {2}), Tensor(z.data(), DType::F32, {6}),
                                              Tensor(y.data(), DType::I32, {2}), 1.0, Tensor(), ctx),
               Error);
}

}  // namespace
}  // namespace tessera
