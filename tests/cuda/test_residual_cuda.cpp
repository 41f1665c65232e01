// Bias + dropout + residual: the CUDA kernels against the f64 reference, through the Tensor-level entries.
#include "cuda_test_util.h"
#include "tessera/ops/residual/residual.h"

namespace tessera::test {
namespace {

struct ResShape {
  int N, C;
};
// One element, widths that are not multiples of the 8-wide vector, GPT-2 widths, and many rows. The last two give
// the backward's bias sums more row groups than its last block has lanes (32), over a column chunk that is only
// part filled (136 = 17 packs of 8) and over a single pack.
constexpr ResShape kShapes[] = {{1, 1},    {7, 33},    {3, 100},    {64, 768}, {37, 1600},
                                {5, 4096}, {1000, 24}, {3000, 136}, {8000, 8}};

// An upload that starts one element past a 16-byte boundary when `misalign`, to force the scalar path.

void run_residual_case(DType dt, ResShape s, bool bias, float dropout, bool misalign, Context& ctx,
                       std::mt19937_64& rng) {
  const size_t NC = static_cast<size_t>(s.N) * s.C;
  const ResidualParams p{.N = s.N, .C = s.C, .dropout = dropout, .seed = rng(), .stream = rng() % 1000};
  const auto res = rounded(dt, randn<double>(NC, rng));
  const auto x = rounded(dt, randn<double>(NC, rng));
  const auto b = rounded(dt, randn<double>(s.C, rng));
  const auto d_out = rounded(dt, randn<double>(NC, rng));
  const auto d_b0 = rounded(dt, randn<double>(s.C, rng));  // accumulated into: prefilled

  std::vector<double> out(NC), d_x(NC);
  residual_forward_ref<double>(p, out.data(), res.data(), x.data(), bias ? b.data() : nullptr);
  residual_backward_ref<double>(p, d_x.data(), /*d_bias=*/nullptr, d_out.data());  // d_bias: from the stored d_x

  DeviceArena dev(ctx);
  const Tensor tres = upload_at(dev, dt, res, misalign), tx = upload_at(dev, dt, x, misalign);
  const Tensor tb = bias ? upload_at(dev, dt, b, misalign) : Tensor();
  const Tensor tdo = upload_at(dev, dt, d_out, misalign);
  const Tensor tout = poisoned_at(dev, dt, NC, misalign), tdx = poisoned_at(dev, dt, NC, misalign);
  const Tensor tdb = bias ? dev.upload(dt, d_b0) : Tensor();
  residual_forward(p, tout, tres, tx, tb, ctx);
  residual_backward(p, tdx, tdb, tdo, ctx);

  const std::string what = "residual N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + (bias ? " +bias" : "") +
                           " dropout=" + std::to_string(dropout) + (misalign ? " misaligned" : "");
  expect_close(dev.download(tout), out, dt, what + " out");
  const std::vector<double> got_dx = dev.download(tdx);
  expect_close(got_dx, d_x, dt, what + " d_x");
  if (bias) {
    // The kernel sums d_x as stored in dt, so its d_bias is checked against d_b0 plus the stored d_x summed in f64:
    // against the f64 d_x, a column where d_b0 nearly cancels the sum (one row, f16, dropout) failed at random on
    // d_x's rounding alone (1.4% against 0.4%, seed 2433719051 on the H200).
    std::vector<double> d_b_stored = d_b0;
    for (int n = 0; n < s.N; ++n)
      for (int c = 0; c < s.C; ++c) d_b_stored[c] += got_dx[static_cast<size_t>(n) * s.C + c];
    expect_close(dev.download(tdb), d_b_stored, dt, what + " d_bias");
  }
}

TEST(CudaResidual, MatchesReferenceOnAwkwardShapes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (ResShape s : kShapes)
      for (float dropout : {0.0f, 0.1f}) {
        run_residual_case(dt, s, /*bias=*/true, dropout, /*misalign=*/false, ctx, rng);
        run_residual_case(dt, s, /*bias=*/false, dropout, /*misalign=*/false, ctx, rng);
      }
}

TEST(CudaResidual, ScalarPathOnMisalignedViews) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  // {3000, 136}: more row groups than the single-element blocks' 8 row lanes, in a part-filled column chunk.
  for (DType dt : kCudaFloatTypes)
    for (ResShape s : {ResShape{19, 768}, ResShape{3000, 136}})
      run_residual_case(dt, s, /*bias=*/true, 0.2f, /*misalign=*/true, ctx, rng);
}

// The GPU drops exactly the elements the reference drops: with x = 1, no bias and residual = 0, out is 0 or
// 1 / (1 - p) element by element.
TEST(CudaResidual, DropsTheSameElementsAsTheReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const ResidualParams p{.N = 61, .C = 96, .dropout = 0.3f, .seed = 1234, .stream = 77};
  const size_t NC = static_cast<size_t>(p.N) * p.C;
  std::vector<double> res(NC, 0.0), x(NC, 1.0), out(NC);
  residual_forward_ref<double>(p, out.data(), res.data(), x.data(), nullptr);
  DeviceArena dev(ctx);
  const Tensor tout = dev.poisoned(DType::F32, NC);
  residual_forward(p, tout, dev.upload(DType::F32, res), dev.upload(DType::F32, x), Tensor(), ctx);
  const auto got = dev.download(tout);
  for (size_t i = 0; i < NC; ++i) ASSERT_EQ(got[i] == 0.0, out[i] == 0.0) << "element " << i;
}

// out may overwrite residual in place (the residual stream).
TEST(CudaResidual, InPlaceOnTheResidualStream) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const ResidualParams p{.N = 33, .C = 768, .dropout = 0.1f, .seed = 5, .stream = 6};
  const size_t NC = static_cast<size_t>(p.N) * p.C;
  const auto res = rounded(DType::BF16, randn<double>(NC, rng)), x = rounded(DType::BF16, randn<double>(NC, rng));
  const auto b = rounded(DType::BF16, randn<double>(p.C, rng));
  std::vector<double> out(NC);
  residual_forward_ref<double>(p, out.data(), res.data(), x.data(), b.data());
  DeviceArena dev(ctx);
  const Tensor tres = dev.upload(DType::BF16, res);
  residual_forward(p, tres, tres, dev.upload(DType::BF16, x), dev.upload(DType::BF16, b), ctx);
  expect_close(dev.download(tres), out, DType::BF16, "residual in place");
}

TEST(CudaResidual, BiasGradientIsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const ResidualParams p{.N = 8192, .C = 768, .dropout = 0.1f, .seed = 3, .stream = 4};
  const size_t NC = static_cast<size_t>(p.N) * p.C;
  DeviceArena dev(ctx);
  const Tensor tdo = dev.upload(DType::BF16, randn<double>(NC, rng)), tdx = dev.alloc(DType::BF16, NC);
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    const Tensor tdb16 = dev.alloc(DType::BF16, p.C);
    fill_bytes(tdb16, 0, ctx);
    residual_backward(p, tdx, tdb16, tdo, ctx);
    const auto got = dev.download(tdb16);
    if (run == 0) first = got;
    else ASSERT_EQ(got, first) << "d_bias differs between identical runs";
  }
}

TEST(CudaResidual, SupportsAnswersWithoutAGpu) {
  std::string why;
  EXPECT_FALSE(residual_supports({.N = 1, .C = 8}, DType::BF16, Device::cpu(), &why));
  EXPECT_TRUE(residual_supports({.N = 1, .C = 8}, DType::F64, Device::cpu(), &why));
  EXPECT_FALSE(residual_supports({.N = 1, .C = 8, .dropout = 1.0f}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("dropout"), std::string::npos) << why;
  EXPECT_FALSE(residual_supports({.N = 1, .C = 0}, DType::F32, Device::cpu(), &why));
}

}  // namespace
}  // namespace tessera::test
