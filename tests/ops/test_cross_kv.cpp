// The layer-batched K/V projection (ops/cross_kv): its one GEMM and layout step give what L separate Linear
// projections give, forward and backward, and what the loop reference gives; the reference's backward matches
// fp64 finite differences. Shapes are awkward (one source token, odd widths, one layer, a plan's slice stride
// longer than a slice); every overwritten output is NaN before the call, the gaps between kv slices must stay NaN
// (never written) and NaN gaps in d_kv must not be read; accumulated outputs start from random values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/ops/cross_kv/cross_kv.h"
#include "tessera/ops/gemm/gemm.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::added;
using test::kFdTolF64;
using test::poisoned;
using test::prefilled;
using test::randn;
using test::rel_error;

Tensor t64(std::vector<double>& v) {
  return Tensor::from_shape(v.data(), DType::F64, std::vector<int64_t>{static_cast<int64_t>(v.size())}, Device::cpu());
}

constexpr double kTol = 1e-12;  // the same sums in fp64, in other orders

const CrossKvParams kShapes[] = {
    {.Nk = 1, .C = 3, .L = 1, .KV = 2},
    {.Nk = 7, .C = 5, .L = 3, .KV = 6},
    {.Nk = 5, .C = 4, .L = 2, .KV = 3, .slice_stride = 23},  // a plan made for more tokens: gaps between slices
    {.Nk = 11, .C = 9, .L = 4, .KV = 1},
};

struct Inputs {
  std::vector<double> m, w, b;
  Inputs(const CrossKvParams& p, std::mt19937_64& rng)
      : m(randn<double>(size_t(p.Nk) * p.C, rng)), w(randn<double>(size_t(p.width()) * p.C, rng)),
        b(randn<double>(size_t(p.width()), rng)) {}
};

size_t kv_size(const CrossKvParams& p) { return size_t((2 * p.L - 1) * p.stride() + int64_t{p.Nk} * p.KV); }

// Slice i, row n, column j of a kv buffer.
double& kv_at(std::vector<double>& kv, const CrossKvParams& p, int i, int n, int j) {
  return kv[size_t(i * p.stride() + int64_t{n} * p.KV + j)];
}

// Layer l's K (s = 0) or V (s = 1) by its own Linear: m W_iᵀ + b_i with W_i the rows [i KV, (i + 1) KV) of W.
std::vector<double> separate_projection(const CrossKvParams& p, Inputs& in, int i, Context& ctx) {
  std::vector<double> y = poisoned<double>(size_t(p.Nk) * p.KV);
  std::vector<double> wi(in.w.begin() + i * p.KV * p.C, in.w.begin() + (i + 1) * p.KV * p.C);
  std::vector<double> bi(in.b.begin() + i * p.KV, in.b.begin() + (i + 1) * p.KV);
  gemm({.M = p.Nk, .N = p.KV, .K = p.C, .trans_b = true}, t64(y), t64(in.m), t64(wi), t64(bi), ctx);
  return y;
}

class CrossKv : public ::testing::Test {
 protected:
  std::mt19937_64 rng{test::test_seed()};
  Context ctx{Device::cpu()};
  void SetUp() override { RecordProperty("seed", std::to_string(test::test_seed())); }
};

TEST_F(CrossKv, ForwardEqualsSeparateProjectionsAndReference) {
  for (const CrossKvParams& p : kShapes) {
    SCOPED_TRACE("Nk " + std::to_string(p.Nk) + " L " + std::to_string(p.L) + " KV " + std::to_string(p.KV));
    Inputs in(p, rng);
    std::vector<double> kv = poisoned<double>(kv_size(p)), proj = poisoned<double>(size_t(p.Nk) * p.width());
    cross_kv_forward(p, t64(kv), t64(proj), t64(in.m), t64(in.w), t64(in.b), ctx);
    std::vector<double> ref = poisoned<double>(kv_size(p));
    cross_kv_forward_ref(p, ref.data(), in.m.data(), in.w.data(), in.b.data());
    for (int i = 0; i < 2 * p.L; ++i) {
      const std::vector<double> sep = separate_projection(p, in, i, ctx);
      std::vector<double> got, want;
      for (int n = 0; n < p.Nk; ++n)
        for (int j = 0; j < p.KV; ++j) {
          got.push_back(kv_at(kv, p, i, n, j));
          want.push_back(sep[size_t(n) * p.KV + j]);
        }
      EXPECT_LT(rel_error(got, want), kTol) << "slice " << i;
    }
    // The gaps between slices are never written; the reference writes the same elements.
    for (size_t e = 0; e < kv.size(); ++e) {
      const bool in_slice = int64_t(e) % p.stride() < int64_t{p.Nk} * p.KV;
      EXPECT_EQ(std::isnan(kv[e]), !in_slice) << e;
      EXPECT_EQ(std::isnan(ref[e]), !in_slice) << e;
    }
    for (double& v : kv) v = std::isnan(v) ? 0 : v;
    for (double& v : ref) v = std::isnan(v) ? 0 : v;
    EXPECT_LT(rel_error(kv, ref), kTol);
  }
}

TEST_F(CrossKv, BackwardEqualsSeparateProjectionsAndReference) {
  for (const CrossKvParams& p : kShapes) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE("Nk " + std::to_string(p.Nk) + " L " + std::to_string(p.L) + (accumulate ? " +=" : " ="));
      Inputs in(p, rng);
      std::vector<double> d_kv = poisoned<double>(kv_size(p));  // NaN gaps: reading one would show
      for (int i = 0; i < 2 * p.L; ++i)
        for (int n = 0; n < p.Nk; ++n)
          for (int j = 0; j < p.KV; ++j) kv_at(d_kv, p, i, n, j) = randn<double>(1, rng)[0];
      const std::vector<double> w0 = prefilled<double>(in.w.size(), rng), b0 = prefilled<double>(in.b.size(), rng);
      const std::vector<double> m0 = accumulate ? prefilled<double>(in.m.size(), rng) : poisoned<double>(in.m.size());
      std::vector<double> d_w = w0, d_b = b0, d_m = m0, d_proj = poisoned<double>(size_t(p.Nk) * p.width());
      cross_kv_backward(p, t64(d_w), t64(d_b), t64(d_m), t64(d_proj), t64(d_kv), t64(in.m), t64(in.w), accumulate, ctx);
      // L separate Linear backwards, each of its own rows of W and b; the memory's gradient summed over all.
      std::vector<double> sw(in.w.size(), 0.0), sb(in.b.size(), 0.0), sm(in.m.size(), 0.0);
      for (int i = 0; i < 2 * p.L; ++i) {
        std::vector<double> dy(size_t(p.Nk) * p.KV),
            wi(in.w.begin() + i * p.KV * p.C, in.w.begin() + (i + 1) * p.KV * p.C);
        for (int n = 0; n < p.Nk; ++n)
          for (int j = 0; j < p.KV; ++j) dy[size_t(n) * p.KV + j] = kv_at(d_kv, p, i, n, j);
        std::vector<double> dwi(wi.size(), 0.0), dbi(size_t(p.KV), 0.0);
        gemm({.M = p.KV, .N = p.C, .K = p.Nk, .trans_a = true}, t64(dwi), t64(dy), t64(in.m), Tensor(), ctx);
        bias_grad({.M = p.Nk, .N = p.KV}, t64(dbi), t64(dy), ctx);
        gemm({.M = p.Nk, .N = p.C, .K = p.KV, .beta = 1.0f}, t64(sm), t64(dy), t64(wi), Tensor(), ctx);
        std::copy(dwi.begin(), dwi.end(), sw.begin() + i * p.KV * p.C);
        std::copy(dbi.begin(), dbi.end(), sb.begin() + i * p.KV);
      }
      EXPECT_LT(rel_error(added(d_w, w0), sw), kTol);
      EXPECT_LT(rel_error(added(d_b, b0), sb), kTol);
      EXPECT_LT(rel_error(accumulate ? added(d_m, m0) : d_m, sm), kTol);
      // The loop reference agrees.
      std::vector<double> rw = w0, rb = b0, rm = m0;
      cross_kv_backward_ref(p, rw.data(), rb.data(), rm.data(), d_kv.data(), in.m.data(), in.w.data(), accumulate);
      EXPECT_LT(rel_error(d_w, rw), kTol);
      EXPECT_LT(rel_error(d_b, rb), kTol);
      EXPECT_LT(rel_error(d_m, rm), kTol);
    }
  }
}

TEST_F(CrossKv, ReferenceBackwardMatchesFiniteDifferences) {
  const CrossKvParams p{.Nk = 4, .C = 3, .L = 2, .KV = 5, .slice_stride = 22};
  Inputs in(p, rng);
  std::vector<double> r = randn<double>(kv_size(p), rng);  // loss = Σ r ⊙ kv over the slices
  auto loss = [&] {
    std::vector<double> kv(kv_size(p), 0.0);
    cross_kv_forward_ref(p, kv.data(), in.m.data(), in.w.data(), in.b.data());
    double s = 0;
    for (size_t e = 0; e < kv.size(); ++e) s += r[e] * kv[e];
    return s;
  };
  std::vector<double> d_w(in.w.size(), 0.0), d_b(in.b.size(), 0.0), d_m(in.m.size()), d_proj(size_t(p.Nk) * p.width());
  cross_kv_backward(p, t64(d_w), t64(d_b), t64(d_m), t64(d_proj), t64(r), t64(in.m), t64(in.w), false, ctx);
  EXPECT_LT(test::fd_rel_error(loss, in.w, d_w), kFdTolF64);
  EXPECT_LT(test::fd_rel_error(loss, in.b, d_b), kFdTolF64);
  EXPECT_LT(test::fd_rel_error(loss, in.m, d_m), kFdTolF64);
}

TEST_F(CrossKv, RefusesImpossibleShapesInOneLine) {
  std::string why;
  EXPECT_FALSE(cross_kv_supports({.Nk = 3, .C = 4, .L = 0, .KV = 2}, DType::F32, Device::cpu(), &why));
  EXPECT_EQ(why, "needs Nk >= 0 and C, L, KV > 0");
  EXPECT_FALSE(
      cross_kv_supports({.Nk = 3, .C = 4, .L = 1, .KV = 2, .slice_stride = 5}, DType::F32, Device::cpu(), &why));
  EXPECT_EQ(why, "slice_stride 5 is shorter than a slice (Nk KV)");
  const CrossKvParams p{.Nk = 2, .C = 2, .L = 1, .KV = 2};
  std::vector<double> small(3), m(4), w(8), proj(8);
  EXPECT_EQ(test::error_of([&] { cross_kv_forward(p, t64(small), t64(proj), t64(m), t64(w), Tensor(), ctx); }),
            "cross_kv_forward: kv has 3 elements, the slices need 8");
}

}  // namespace
}  // namespace tessera
