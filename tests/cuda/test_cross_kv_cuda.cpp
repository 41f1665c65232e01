// The layer-batched K/V projection on the GPU (its GEMMs through cuBLASLt, its layout kernel) against the f64
// loop reference, through the Tensor-level entries: forward (kv slices, the gaps between them never written) and
// backward (d_W and d_bias accumulated, d_m overwritten or accumulated), in f32, bf16 and f16, on shapes whose
// widths take the 16-byte pack path and shapes that fall back to single elements (odd KV, a misaligned view).
#include <cmath>

#include "cuda_test_util.h"
#include "tessera/ops/cross_kv/cross_kv.h"

namespace tessera::test {
namespace {

// transformer-base's shape (KV 512, 6 layers) cut to a few tokens, widths that are multiples of the 8-wide pack
// and widths that are not, one token, and a stride left by a plan made for more tokens.
constexpr CrossKvParams kShapes[] = {
    {.Nk = 1, .C = 3, .L = 1, .KV = 2},
    {.Nk = 7, .C = 5, .L = 3, .KV = 6},
    {.Nk = 9, .C = 64, .L = 2, .KV = 32, .slice_stride = 320},
    {.Nk = 33, .C = 512, .L = 6, .KV = 512},
    {.Nk = 5, .C = 24, .L = 4, .KV = 24, .slice_stride = 124},
};

size_t kv_size(const CrossKvParams& p) {
  return static_cast<size_t>((2 * p.L - 1) * p.stride() + int64_t{p.Nk} * p.KV);
}

bool in_slice(const CrossKvParams& p, size_t e) { return static_cast<int64_t>(e) % p.stride() < int64_t{p.Nk} * p.KV; }

// The elements inside the slices (the gaps are checked to be NaN on the way).
std::vector<double> slices_of(const std::vector<double>& kv, const CrossKvParams& p, const std::string& what) {
  std::vector<double> out;
  for (size_t e = 0; e < kv.size(); ++e) {
    if (in_slice(p, e)) out.push_back(kv[e]);
    else EXPECT_TRUE(std::isnan(kv[e])) << what << ": gap element " << e << " was written";
  }
  return out;
}

void run_cross_kv_case(DType dt, CrossKvParams p, bool accumulate, bool misalign, Context& ctx, std::mt19937_64& rng) {
  p.allow_tf32 = false;
  const size_t W = static_cast<size_t>(p.width()), NC = static_cast<size_t>(p.Nk) * p.C;
  const auto m = rounded(dt, randn<double>(NC, rng)), w = rounded(dt, randn<double>(W * p.C, rng, 0.2));
  const auto b = rounded(dt, randn<double>(W, rng)), d_kv = rounded(dt, randn<double>(kv_size(p), rng));
  const auto w0 = rounded(dt, randn<double>(W * p.C, rng)), b0 = rounded(dt, randn<double>(W, rng));
  const auto m0 = rounded(dt, randn<double>(NC, rng));

  std::vector<double> kv(kv_size(p), 0.0), d_w = w0, d_b = b0, d_m = accumulate ? m0 : std::vector<double>(NC);
  cross_kv_forward_ref<double>(p, kv.data(), m.data(), w.data(), b.data());
  cross_kv_backward_ref<double>(p, d_w.data(), d_b.data(), d_m.data(), d_kv.data(), m.data(), w.data(), accumulate);

  DeviceArena dev(ctx);
  const Tensor tm = upload_at(dev, dt, m, misalign), tw = upload_at(dev, dt, w, misalign);
  const Tensor tb = upload_at(dev, dt, b, misalign), tdkv = upload_at(dev, dt, d_kv, misalign);
  const Tensor tkv = poisoned_at(dev, dt, kv_size(p), misalign), tproj = poisoned_at(dev, dt, p.Nk * W, misalign);
  const Tensor tdproj = poisoned_at(dev, dt, p.Nk * W, misalign);
  const Tensor tdw = dev.upload(dt, w0), tdb = dev.upload(dt, b0);
  const Tensor tdm = accumulate ? dev.upload(dt, m0) : poisoned_at(dev, dt, NC, misalign);
  cross_kv_forward(p, tkv, tproj, tm, tw, tb, ctx);
  cross_kv_backward(p, tdw, tdb, tdm, tdproj, tdkv, tm, tw, accumulate, ctx);

  const std::string what = std::string(dtype_label(dt)) + " Nk=" + std::to_string(p.Nk) + " C=" + std::to_string(p.C) +
                           " L=" + std::to_string(p.L) + " KV=" + std::to_string(p.KV) + (accumulate ? " +=" : "") +
                           (misalign ? " misaligned" : "");
  std::vector<double> ref_slices;
  for (size_t e = 0; e < kv.size(); ++e)
    if (in_slice(p, e)) ref_slices.push_back(kv[e]);
  // A sum of C products of O(1) terms: measured against the size of the terms, sqrt(C) times the inputs' norm.
  expect_close(slices_of(dev.download(tkv), p, what), ref_slices, dt, what + " kv", 2.0);
  expect_close(dev.download(tdw), d_w, dt, what + " d_w", 2.0, norm2(w0));
  expect_close(dev.download(tdb), d_b, dt, what + " d_bias", 2.0, norm2(b0));
  expect_close(dev.download(tdm), d_m, dt, what + " d_m", 2.0);
}

TEST(CudaCrossKv, MatchesReferenceOnAwkwardShapes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (const CrossKvParams& p : kShapes)
      for (bool accumulate : {false, true}) run_cross_kv_case(dt, p, accumulate, /*misalign=*/false, ctx, rng);
}

TEST(CudaCrossKv, MisalignedViewsTakeTheScalarPath) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes) run_cross_kv_case(dt, kShapes[2], /*accumulate=*/false, /*misalign=*/true, ctx, rng);
}

}  // namespace
}  // namespace tessera::test
