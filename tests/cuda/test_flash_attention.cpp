// FlashAttention-2 (tensor-core) kernels against the f64 reference and against naive attention in the same
// precision, through the Tensor-level entries. FlashAttention's own acceptance rule: the flash error (against
// f64) is at most 2x the error of naive attention that materializes S and P in the same 16-bit dtype.
#include <array>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_naive.h"
#include "tessera/ops/attention/flash_hopper.h"

namespace tessera::test {
namespace {

// Column block `part` (0 = q, 1 = k, 2 = v) of a (N, 3C) buffer, as a (N, C) vector.
std::vector<double> part_of(const std::vector<double>& qkv, int part, size_t N, int C) {
  std::vector<double> r(N * C);
  for (size_t n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) r[n * C + c] = qkv[n * 3 * C + part * C + c];
  return r;
}

// ‖got − ref‖ / max(‖ref‖, floor), with NaN (an unwritten element) reported as infinity.
double rel_error(const std::vector<double>& got, const std::vector<double>& ref, double floor) {
  std::vector<double> diff(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    diff[i] = got[i] - ref[i];
  }
  return norm2(diff) / std::max({norm2(ref), floor, 1e-30});
}

std::string label(const AttentionParams& p, DType dt) {
  return std::string(dtype_label(dt)) + (p.causal ? " causal" : " full") + " B=" + std::to_string(p.B) +
         " T=" + std::to_string(p.T) + " H=" + std::to_string(p.H) + " Dh=" + std::to_string(p.Dh);
}

// The 2x rule, with a slack of 2% of the dtype's tolerance for results that both paths get almost exactly
// (out at T = 1 is V itself; dQ and dK at T = 1 are 0 up to f32 rounding).
// A naive error that is not finite (an unwritten, NaN element of the naive output: rel_error reports it as
// infinity) would make the bound infinite and the rule pass whatever flash computed, so it fails here instead.
void expect_within_2x(double flash, double naive, DType dt, const std::string& what) {
  ASSERT_TRUE(std::isfinite(naive)) << what << ": the naive yardstick is not finite (" << naive << "), seed "
                                    << test_seed();
  const double bound = 2.0 * naive + 0.02 * cuda_tolerance(dt);
  EXPECT_LE(flash, bound) << what << ": flash error " << flash << " > 2 x naive error " << naive << " (+ slack), seed "
                          << test_seed();
}

// Sets TESSERA_FLASH_PATH for one scope and restores what was there (the lead's runs set it for a whole binary).
class ScopedFlashPath {
 public:
  explicit ScopedFlashPath(const char* path) {
    if (const char* old = std::getenv(kName)) old_ = old;
    ::setenv(kName, path, 1);
  }
  ~ScopedFlashPath() {
    if (old_) ::setenv(kName, old_->c_str(), 1);
    else ::unsetenv(kName);
  }
  ScopedFlashPath(const ScopedFlashPath&) = delete;
  ScopedFlashPath& operator=(const ScopedFlashPath&) = delete;

 private:
  static constexpr const char* kName = "TESSERA_FLASH_PATH";
  std::optional<std::string> old_;
};

// Random inputs of an attention case, rounded to dt, and the f64 reference's forward and backward on them (the
// backward reading out rounded to dt, as a GPU backward reads its own out).
// With RoPE (p.rope_theta > 0) qkv stays as drawn and `rotated` is it after rope_forward, which the reference
// attends over; d_qkv is then with respect to qkv before the rotation (rope_backward of the plain gradient).
struct ReferenceCase {
  std::vector<double> qkv, d_out, out, lse, d_qkv, rotated;
};
ReferenceCase reference_case(const AttentionParams& p, DType dt, std::mt19937_64& rng) {
  const size_t NC = static_cast<size_t>(p.B) * p.T * p.H * p.Dh;
  ReferenceCase r;
  // Scores S ~ N(0, 1.5²) after the 1/sqrt(Dh) scale: peaked enough that the running max moves between tiles.
  r.qkv = rounded(dt, randn<double>(3 * NC, rng, 1.5));
  r.d_out = rounded(dt, randn<double>(NC, rng, 1.0));
  r.out.resize(NC);
  r.lse.resize(NC / p.Dh);
  r.d_qkv.resize(3 * NC);
  r.rotated = r.qkv;
  AttentionParams plain = p;
  plain.rope_theta = 0.0f;
  if (p.rope_theta > 0.0f) rope_forward_ref<double>(attention_rope(p), r.rotated.data());
  // The GPU attends over q and k rotated and rounded to the dtype in place.
  const std::vector<double> attended = p.rope_theta > 0.0f ? rounded(dt, r.rotated) : r.qkv;
  attention_forward_ref<double>(plain, r.out.data(), r.lse.data(), attended.data());
  attention_backward_ref<double>(plain, r.d_qkv.data(), r.d_out.data(), attended.data(), rounded(dt, r.out).data(),
                                 r.lse.data());
  if (p.rope_theta > 0.0f) rope_backward_ref<double>(attention_rope(p), r.d_qkv.data());
  return r;
}

// out, lse and d_qkv of the Tensor-level entries on ctx's device: every output poisoned first, the backward reading
// the forward's own out and lse.
struct EntryOutputs {
  std::vector<double> out, lse, d_qkv;
};
EntryOutputs run_entries(const AttentionParams& p, DType dt, const Tensor& qkv, const Tensor& d_out, DeviceArena& dev,
                         Context& ctx) {
  const size_t NC = static_cast<size_t>(p.B) * p.T * p.H * p.Dh;
  const Tensor out = dev.poisoned(dt, NC), lse = dev.poisoned(DType::F32, NC / p.Dh);
  const Tensor d_qkv = dev.poisoned(dt, 3 * NC);
  attention_forward(p, out, lse, qkv, ctx);
  attention_backward(p, d_qkv, d_out, qkv, out, lse, ctx);
  return {dev.download(out), dev.download(lse), dev.download(d_qkv)};
}

// `path` names the forward the case must run ("hopper" or "mma"); nullptr leaves the routing to the environment.
void run_flash_case(const AttentionParams& p, DType dt, Context& ctx, std::mt19937_64& rng,
                    const char* path = nullptr) {
  std::optional<ScopedFlashPath> scoped;
  if (path) scoped.emplace(path);
  const std::string what = label(p, dt) + (path ? std::string(" fwd ") + path : std::string());
  // The flash family either way; the label names the Hopper kernels where they run.
  const bool fwd_hopper = flash_forward_uses_hopper(p, dt, ctx), bwd_hopper = flash_backward_uses_hopper(p, dt, ctx);
  ASSERT_EQ(std::string(attention_cuda_kernel(p, dt, ctx)), fwd_hopper && bwd_hopper ? "flash-hopper"
                                                            : fwd_hopper ? "flash-hopper forward, flash-mma backward"
                                                            : bwd_hopper ? "flash-mma forward, flash-hopper backward"
                                                                         : "flash-mma")
      << what;
  if (path) {
    ASSERT_EQ(fwd_hopper, std::string(path) == "hopper") << what;
    ASSERT_EQ(bwd_hopper, std::string(path) == "hopper") << what;
  }
  const int C = p.H * p.Dh;
  const size_t N = static_cast<size_t>(p.B) * p.T, NC = N * C, n_lse = N * p.H;
  const ReferenceCase r = reference_case(p, dt, rng);
  const auto& out = r.out;
  const auto& lse = r.lse;
  const auto& d_qkv = r.d_qkv;

  DeviceArena dev(ctx);
  const Tensor tqkv = dev.upload(dt, r.qkv), tdo = dev.upload(dt, r.d_out);
  const EntryOutputs f = run_entries(p, dt, tqkv, tdo, dev, ctx);  // flash
  // Naive in the same dtype.
  const Tensor n_out = dev.poisoned(dt, NC), n_lse_t = dev.poisoned(DType::F32, n_lse);
  const Tensor n_dqkv = dev.poisoned(dt, 3 * NC);
  AttentionNaiveSaved saved;
  attention_naive_forward(p, n_out, n_lse_t, tqkv, saved, ctx);
  attention_naive_backward(p, n_dqkv, tdo, saved, ctx);

  const auto& fo = f.out;
  const auto no = dev.download(n_out);
  expect_close(fo, out, dt, what + " flash out");
  expect_close(f.lse, lse, DType::F32, what + " flash lse", 10.0);
  expect_close(dev.download(n_lse_t), lse, dt, what + " naive lse");  // from scores rounded to the dtype
  expect_within_2x(rel_error(fo, out, 0.0), rel_error(no, out, 0.0), dt, what + " out");

  const auto& fg = f.d_qkv;
  const auto ng = dev.download(n_dqkv);
  // dQ and dK vanish at T = 1 (P = 1, so dS = 0): measure them against ‖dV‖ ≈ ‖dO‖, not rounding noise.
  const double floor = 0.1 * norm2(part_of(d_qkv, 2, N, C));
  static constexpr std::array<const char*, 3> kPart = {" dQ", " dK", " dV"};
  for (int part = 0; part < 3; ++part) {
    const auto ref = part_of(d_qkv, part, N, C), fp = part_of(fg, part, N, C), n = part_of(ng, part, N, C);
    expect_close(fp, ref, dt, what + " flash" + kPart[part], 3.0, floor);
    expect_within_2x(rel_error(fp, ref, floor), rel_error(n, ref, floor), dt, what + kPart[part]);
  }
}

TEST(CudaFlashAttention, MatchesReferenceAndNaiveRule) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  // The mma.sync kernels, on every device (on sm_90a auto routes every head width to the Hopper kernels, which
  // CudaFlashAttentionHopper checks the same way). T: one row, a partial tile, one full tile, one short of two
  // tiles (odd), several tiles with a partial last one. Dh: every compiled width (32, 64, 80, 128), and 16
  // (zero-padded in the 32 instance), 96 (in 128).
  for (DType dt : {DType::BF16, DType::F16})
    for (bool causal : {true, false})
      for (int Dh : {16, 32, 64, 80, 96, 128})
        for (int T : {1, 17, 64, 127, 200})
          run_flash_case({.B = 2, .T = T, .H = 3, .Dh = Dh, .causal = causal}, dt, ctx, rng, "mma");
}

TEST(CudaFlashAttention, LongSequenceMatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  // Many key tiles per query tile: the online softmax's rescaling and the double buffering over 17 tiles.
  for (int Dh : {64, 128}) run_flash_case({.B = 1, .T = 1057, .H = 2, .Dh = Dh, .causal = true}, DType::BF16, ctx, rng);
  run_flash_case({.B = 1, .T = 1057, .H = 2, .Dh = 80, .causal = false}, DType::F16, ctx, rng);
}

TEST(CudaFlashAttention, ForwardAndBackwardAreDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (int Dh : {64, 80, 128}) {
    const AttentionParams p{.B = 2, .T = 777, .H = 3, .Dh = Dh, .causal = true};
    ASSERT_EQ(std::string(attention_cuda_kernel(p, DType::BF16, ctx)).rfind("flash-", 0), 0u);
    const size_t NC = static_cast<size_t>(p.B) * p.T * p.H * p.Dh;
    DeviceArena dev(ctx);
    const Tensor tqkv = dev.upload(DType::BF16, randn<double>(3 * NC, rng));
    const Tensor tdo = dev.upload(DType::BF16, randn<double>(NC, rng));
    std::vector<double> first_out, first_grad;
    for (int run = 0; run < 3; ++run) {
      const Tensor tout = dev.poisoned(DType::BF16, NC), tlse = dev.poisoned(DType::F32, NC / p.Dh);
      const Tensor tdqkv = dev.poisoned(DType::BF16, 3 * NC);
      attention_forward(p, tout, tlse, tqkv, ctx);
      attention_backward(p, tdqkv, tdo, tqkv, tout, tlse, ctx);
      const auto out = dev.download(tout), grad = dev.download(tdqkv);
      if (run == 0) {
        first_out = out;
        first_grad = grad;
      } else {
        ASSERT_EQ(out, first_out) << "Dh=" << Dh << ": out differs between identical runs";
        ASSERT_EQ(grad, first_grad) << "Dh=" << Dh << ": d_qkv differs between identical runs";
      }
    }
  }
}

TEST(CudaFlashAttention, UnalignedViewsFallBackToTiledKernels) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  // qkv one element past a 16-byte boundary: the cp.async loads cannot take it, the tiled kernels must.
  const AttentionParams p{.B = 1, .T = 70, .H = 2, .Dh = 64, .causal = true};
  const int C = p.H * p.Dh;
  const size_t N = static_cast<size_t>(p.T), NC = N * C;
  const DType dt = DType::BF16;
  const auto qkv = rounded(dt, randn<double>(3 * NC, rng, 1.5));
  std::vector<double> out(NC), lse(N * p.H);
  attention_forward_ref<double>(p, out.data(), lse.data(), qkv.data());
  DeviceArena dev(ctx);
  const Tensor tqkv = upload_at(dev, dt, qkv, /*misalign=*/true);
  const Tensor tout = dev.poisoned(dt, NC), tlse = dev.poisoned(DType::F32, N * p.H);
  attention_forward(p, tout, tlse, tqkv, ctx);
  expect_close(dev.download(tout), out, dt, "unaligned qkv out");
}

// The kernel family a dropout case must run under TESSERA_FLASH_PATH `path` ("mma" or "hopper").
std::string expected_kernel(const AttentionParams& p, DType dt, const char* path) {
  if (dt == DType::F32) return "tiled-fma";
  // The Hopper kernels take every flash head width (64 and 128, the others zero-padded in them).
  return std::string(path) == "hopper" && flash_hopper_head_pad(p.Dh) != 0 ? "flash-hopper" : "flash-mma";
}

// The flash paths this device runs: mma.sync, and the Hopper kernels where this device and build have them.
std::vector<const char*> flash_paths(const Context& ctx) {
  std::vector<const char*> paths = {"mma"};
  if (flash_hopper_available(ctx)) paths.push_back("hopper");
  return paths;
}

// Attention dropout on the GPU against the f64 reference under the same (seed, stream): the flash kernels in bf16
// and f16 (mma.sync, and on sm_90a the wgmma kernels, Dh 16 and 80 zero-padded) and the tiled kernels in f32; out,
// lse and the three gradients, every output poisoned first. (The naive yardstick has no dropout, so the 2x rule of
// run_flash_case does not apply; the dtype's tolerance of f64 does.)
void run_dropout_case(const AttentionParams& p, DType dt, Context& ctx, std::mt19937_64& rng, const char* path) {
  ScopedFlashPath scoped(path);
  const std::string what = label(p, dt) + " dropout " + std::to_string(p.dropout) + " path " + path;
  ASSERT_EQ(std::string(attention_cuda_kernel(p, dt, ctx)), expected_kernel(p, dt, path)) << what;
  const int C = p.H * p.Dh;
  const size_t N = static_cast<size_t>(p.B) * p.T;
  const ReferenceCase r = reference_case(p, dt, rng);
  DeviceArena dev(ctx);
  const EntryOutputs got = run_entries(p, dt, dev.upload(dt, r.qkv), dev.upload(dt, r.d_out), dev, ctx);
  const double scale = dt == DType::F32 ? 10.0 : 1.0;
  expect_close(got.out, r.out, dt, what + " out", scale);
  expect_close(got.lse, r.lse, DType::F32, what + " lse", 10.0);
  const auto& g = got.d_qkv;
  // dQ and dK vanish at T = 1 (dS = P (Z dP - D) = 0 in exact arithmetic), so there they are rounding noise: with
  // dropout out = Z V is rounded to the dtype (without it, out = V is exact), and D = dO · out carries that rounding
  // into dS. Measured against ‖dO‖ there (the Hopper path's noise read 0.0057 ‖dO‖, above 3 x bf16's tolerance of
  // the 0.1 ‖dO‖ floor used for T > 1); a missing write (NaN) or a wrong gradient is still far past it. (‖dV‖, the
  // floor of run_flash_case, shrinks with every dropped element: at T = 1 a dropped row has dV = 0.)
  const double floor = (p.T == 1 ? 1.0 : 0.1) * norm2(r.d_out);
  static constexpr std::array<const char*, 3> kPart = {" dQ", " dK", " dV"};
  for (int part = 0; part < 3; ++part)
    expect_close(part_of(g, part, N, C), part_of(r.d_qkv, part, N, C), dt, what + kPart[part], 3.0 * scale, floor);
}

TEST(CudaFlashAttention, DropoutMatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  uint64_t stream = 0;
  for (const char* path : flash_paths(ctx))
    for (DType dt : {DType::BF16, DType::F16, DType::F32})
      for (bool causal : {true, false})
        for (int Dh : {16, 64, 80, 128})
          for (int T : {1, 17, 64, 127, 129, 200}) {
            if (dt == DType::F16 && Dh != 64) continue;  // f16 shares bf16's kernels but for the rounding
            if (std::string(path) == "hopper" && dt == DType::F32) continue;  // the tiled kernels, as mma's
            run_dropout_case(
                {.B = 2, .T = T, .H = 3, .Dh = Dh, .causal = causal, .dropout = 0.2f, .seed = 42, .stream = ++stream},
                dt, ctx, rng, path);
          }
  // Many key tiles, a high rate, the seed's upper word and a stream past 2^32.
  for (const char* path : flash_paths(ctx))
    for (int Dh : {64, 128})
      run_dropout_case({.B = 1,
                        .T = 1057,
                        .H = 2,
                        .Dh = Dh,
                        .causal = true,
                        .dropout = 0.6f,
                        .seed = 0x1234567890ull,
                        .stream = (1ull << 33) + 5},
                       DType::BF16, ctx, rng, path);
}

// RoPE through the Tensor-level entries against the f64 reference: the forward rotates q and k of qkv in place (the
// GPU's qkv afterwards must be the reference's rotation, v as it was) and the backward returns d_qkv with respect to
// q and k before it. The flash passes rotate dQ and dK back in registers where Dh is a compiled width (32, 64, 80,
// 128 on mma.sync; 64, 128 on the Hopper path); a head run zero-padded (48 on mma.sync; 32, 48, 80 on the Hopper
// path) and f32 (the tiled kernels) take the pass over d_qkv after the backward. Positions start at rope_pos_offset.
void run_rope_case(const AttentionParams& p, DType dt, Context& ctx, std::mt19937_64& rng, const char* path) {
  ScopedFlashPath scoped(path);
  const std::string what = label(p, dt) + " rope theta " + std::to_string(p.rope_theta) + " from " +
                           std::to_string(p.rope_pos_offset) + " dropout " + std::to_string(p.dropout) + " path " +
                           path;
  ASSERT_EQ(std::string(attention_cuda_kernel(p, dt, ctx)), expected_kernel(p, dt, path)) << what;
  const int C = p.H * p.Dh;
  const size_t N = static_cast<size_t>(p.B) * p.T;
  const ReferenceCase r = reference_case(p, dt, rng);
  DeviceArena dev(ctx);
  const Tensor qkv = dev.upload(dt, r.qkv);
  const EntryOutputs got = run_entries(p, dt, qkv, dev.upload(dt, r.d_out), dev, ctx);
  const auto rotated = dev.download(qkv);
  for (int part = 0; part < 2; ++part)
    expect_close(part_of(rotated, part, N, C), part_of(r.rotated, part, N, C), dt, what + " rotated q / k");
  EXPECT_EQ(part_of(rotated, 2, N, C), part_of(r.qkv, 2, N, C)) << what << ": v changed";
  const double scale = dt == DType::F32 ? 10.0 : 1.0;
  expect_close(got.out, r.out, dt, what + " out", scale);
  expect_close(got.lse, r.lse, DType::F32, what + " lse", 10.0);
  // T = 1: dQ and dK are rounding noise (dS = 0 in exact arithmetic), measured against ‖dO‖ as in the dropout case.
  const double floor = (p.T == 1 ? 1.0 : 0.1) * norm2(r.d_out);
  static constexpr std::array<const char*, 3> kPart = {" dQ", " dK", " dV"};
  for (int part = 0; part < 3; ++part) {
    expect_close(part_of(got.d_qkv, part, N, C), part_of(r.d_qkv, part, N, C), dt, what + kPart[part], 3.0 * scale,
                 floor);
  }
}

TEST(CudaFlashAttention, RopeMatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (const char* path : flash_paths(ctx))
    for (DType dt : {DType::BF16, DType::F16, DType::F32})
      for (bool causal : {true, false})
        for (int Dh : {32, 48, 64, 80, 128})
          for (int T : {1, 17, 200}) {
            if (dt == DType::F16 && Dh != 64) continue;  // f16 shares bf16's kernels but for the rounding
            if (std::string(path) == "hopper" && dt == DType::F32) continue;
            run_rope_case({.B = 2,
                           .T = T,
                           .H = 3,
                           .Dh = Dh,
                           .causal = causal,
                           .rope_theta = causal ? 10000.0f : 500000.0f,
                           .rope_pos_offset = T == 17 ? 37 : 0},
                          dt, ctx, rng, path);
          }
  // Many tiles, with attention dropout too, and positions into the thousands (the f64 table's reason).
  for (const char* path : flash_paths(ctx))
    for (int Dh : {64, 128})
      run_rope_case({.B = 1,
                     .T = 1057,
                     .H = 2,
                     .Dh = Dh,
                     .causal = true,
                     .dropout = 0.2f,
                     .seed = 5,
                     .stream = 9,
                     .rope_theta = 10000.0f,
                     .rope_pos_offset = 3000},
                    DType::BF16, ctx, rng, path);
}

// The exact elements: with Q = 0 every score is 0, so P_ij = 1 / (keys row i sees). For a window of Dh positions
// [w, w + Dh), V_j = e_(j - w) and dO_i = e_(i - w) inside it and 0 outside, so out_i[d] = P_i,w+d Z_i,w+d and
// dV_j[d] = P_w+d,j Z_w+d,j: each 0 exactly where that score is dropped (or masked, or past T). So the zeros of the
// GPU's out must be the reference's (the forward's draws, rows = queries), and the zeros of its dV too (the dK / dV
// pass's, rows = keys), element for element; the windows together cover every score. T 128 at Dh 64 takes the
// Hopper dK / dV pass's 128-query tiles whole.
TEST(CudaFlashAttention, DropoutDropsTheReferencesElements) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  struct Shape {
    int T, Dh;
  };
  for (const char* path : flash_paths(ctx))
    for (DType dt : {DType::BF16, DType::F32})
      for (bool causal : {true, false})
        for (Shape s : {Shape{30, 32}, Shape{64, 64}, Shape{80, 80}, Shape{127, 128}, Shape{128, 64}, Shape{129, 128}})
          for (int w = 0; w < s.T; w += s.Dh) {
            const AttentionParams p{.B = 2,
                                    .T = s.T,
                                    .H = 3,
                                    .Dh = s.Dh,
                                    .causal = causal,
                                    .dropout = 0.5f,
                                    .seed = 7,
                                    .stream = static_cast<uint64_t>(s.T)};
            ScopedFlashPath scoped(path);
            const std::string what = label(p, dt) + " path " + path + " window " + std::to_string(w);
            ASSERT_EQ(std::string(attention_cuda_kernel(p, dt, ctx)), expected_kernel(p, dt, path)) << what;
            const int C = p.H * p.Dh;
            const size_t N = static_cast<size_t>(p.B) * p.T, NC = N * C;
            std::vector<double> qkv(3 * NC, 0.0), d_out(NC, 0.0);
            for (size_t n = 0; n < N; ++n)
              for (int h = 0; h < p.H; ++h) {
                const int t = static_cast<int>(n % p.T);
                qkv[n * 3 * C + C + h * p.Dh + (t * 7) % p.Dh] = 1.0;  // K: anything (Q = 0)
                if (t < w || t >= w + p.Dh) continue;
                qkv[n * 3 * C + 2 * C + h * p.Dh + t - w] = 1.0;  // V_t = e_(t - w)
                d_out[n * C + h * p.Dh + t - w] = 1.0;            // dO_t = e_(t - w)
              }
            std::vector<double> out(NC), lse(N * p.H), d_qkv(3 * NC);
            attention_forward_ref<double>(p, out.data(), lse.data(), qkv.data());
            attention_backward_ref<double>(p, d_qkv.data(), d_out.data(), qkv.data(), out.data(), lse.data());
            DeviceArena dev(ctx);
            const EntryOutputs got = run_entries(p, dt, dev.upload(dt, qkv), dev.upload(dt, d_out), dev, ctx);
            const auto& o = got.out;
            const auto& g = got.d_qkv;
            const auto dv = part_of(g, 2, N, C), dv_ref = part_of(d_qkv, 2, N, C);
            long seen = 0, dropped = 0, wrong_out = 0, wrong_dv = 0;
            for (size_t e = 0; e < NC; ++e) {
              const int t = static_cast<int>((e / C) % p.T), j = w + static_cast<int>(e % C % p.Dh);
              if (j < p.T && (!causal || j <= t)) {  // a score the row sees: zero only where dropped
                ++seen;
                dropped += out[e] == 0.0;
              }
              wrong_out += (o[e] == 0.0) != (out[e] == 0.0);
              wrong_dv += (dv[e] == 0.0) != (dv_ref[e] == 0.0);
            }
            if (seen >= 200) {  // the reference drops at the rate (a window of one key has too few)
              EXPECT_NEAR(static_cast<double>(dropped) / seen, 0.5, 0.1) << what;
            }
            EXPECT_EQ(wrong_out, 0) << what << ": out elements whose dropping differs from the reference's";
            EXPECT_EQ(wrong_dv, 0) << what << ": dV elements whose dropping differs from the reference's";
            expect_close(o, out, dt, what + " out", dt == DType::F32 ? 10.0 : 1.0);
          }
}

// The Hopper (wgmma + TMA) forward and backward, on a device and build that have them: against f64 and the
// 2x-naive rule over the same awkward shapes (T = 1, partial 64- and 128-row tiles, one past a tile, several
// tiles), the backward reading the Hopper forward's out and lse; and each against its mma.sync counterpart on the
// same inputs.
TEST(CudaFlashAttentionHopper, ForwardMatchesReferenceAndNaiveRule) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  if (!flash_hopper_available(ctx)) GTEST_SKIP() << "no sm_90a Hopper kernels for this device";
  std::mt19937_64 rng(test_seed());
  // Dh: both compiled widths, and heads zero-padded in them (8: one 8-column tile; 16, 40, 96, 120: not multiples
  // of 64, 40 not of 16; 72 and 80: 8 and 16 columns into the second 64-column box) between neighbours whose
  // columns must not leak in (H = 3).
  for (DType dt : {DType::BF16, DType::F16})
    for (bool causal : {true, false})
      for (int Dh : {8, 16, 40, 64, 72, 80, 96, 120, 128})
        for (int T : {1, 17, 64, 127, 128, 129, 200, 257})
          run_flash_case({.B = 2, .T = T, .H = 3, .Dh = Dh, .causal = causal}, dt, ctx, rng, "hopper");
  for (int Dh : {64, 128})
    run_flash_case({.B = 1, .T = 1057, .H = 2, .Dh = Dh, .causal = true}, DType::BF16, ctx, rng, "hopper");
  run_flash_case({.B = 1, .T = 1057, .H = 2, .Dh = 128, .causal = false}, DType::F16, ctx, rng, "hopper");
}

TEST(CudaFlashAttentionHopper, ForwardMatchesMmaForward) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  if (!flash_hopper_available(ctx)) GTEST_SKIP() << "no sm_90a Hopper kernels for this device";
  std::mt19937_64 rng(test_seed());
  // Each is within the dtype's tolerance of f64 (above), so by the triangle inequality they agree with each
  // other to twice that on the same inputs (different tile shapes reorder the f32 sums and round P at other
  // points); lse to f32 accuracy; and the Hopper forward must repeat bit for bit.
  for (DType dt : {DType::BF16, DType::F16})
    for (bool causal : {true, false})
      for (int Dh : {32, 64, 80, 128})
        for (int T : {1, 127, 129, 600}) {
          const AttentionParams p{.B = 2, .T = T, .H = 2, .Dh = Dh, .causal = causal};
          const std::string what = label(p, dt);
          const size_t NC = static_cast<size_t>(p.B) * p.T * p.H * p.Dh, n_lse = NC / p.Dh;
          DeviceArena dev(ctx);
          const Tensor tqkv = dev.upload(dt, rounded(dt, randn<double>(3 * NC, rng, 1.5)));
          auto forward = [&](const char* path) {
            ScopedFlashPath scoped(path);
            EXPECT_EQ(flash_forward_uses_hopper(p, dt, ctx), std::string(path) == "hopper") << what;
            const Tensor out = dev.poisoned(dt, NC), lse = dev.poisoned(DType::F32, n_lse);
            attention_forward(p, out, lse, tqkv, ctx);
            return std::make_pair(dev.download(out), dev.download(lse));
          };
          const auto [h_out, h_lse] = forward("hopper");
          const auto [m_out, m_lse] = forward("mma");
          expect_close(h_out, m_out, dt, what + " hopper out vs mma out", 2.0);
          expect_close(h_lse, m_lse, DType::F32, what + " hopper lse vs mma lse", 20.0);
          const auto [h_out2, h_lse2] = forward("hopper");
          ASSERT_EQ(h_out2, h_out) << what << ": the Hopper forward's out differs between identical runs";
          ASSERT_EQ(h_lse2, h_lse) << what << ": the Hopper forward's lse differs between identical runs";
        }
}

// The Hopper backward against the mma.sync backward on the same forward results (both within the dtype's
// tolerance of f64, so within twice it of each other; dQ and dK measured against ‖dV‖ where they vanish, as in
// run_flash_case), and bit for bit against itself. T: one row, one short of / one past a 64-row tile and a
// 128-row block, several blocks.
TEST(CudaFlashAttentionHopper, BackwardMatchesMmaBackward) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  if (!flash_hopper_available(ctx)) GTEST_SKIP() << "no sm_90a Hopper kernels for this device";
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::BF16, DType::F16})
    for (bool causal : {true, false})
      for (int Dh : {8, 16, 40, 64, 72, 80, 120, 128})
        for (int T : {1, 63, 65, 127, 129, 600}) {
          const AttentionParams p{.B = 2, .T = T, .H = 2, .Dh = Dh, .causal = causal};
          const std::string what = label(p, dt);
          const int C = p.H * p.Dh;
          const size_t N = static_cast<size_t>(p.B) * p.T, NC = N * C, n_lse = NC / p.Dh;
          DeviceArena dev(ctx);
          const Tensor tqkv = dev.upload(dt, rounded(dt, randn<double>(3 * NC, rng, 1.5)));
          const Tensor tdo = dev.upload(dt, rounded(dt, randn<double>(NC, rng, 1.0)));
          const Tensor out = dev.poisoned(dt, NC), lse = dev.poisoned(DType::F32, n_lse);
          {
            ScopedFlashPath scoped("mma");
            attention_forward(p, out, lse, tqkv, ctx);
          }
          // A copy of out one element past a 16-byte boundary: the Hopper dQ pass cannot read it in 16-byte
          // vectors, so it takes D from the row-dot kernel instead of computing it (attention_backward_cuda).
          const Tensor out_misaligned = upload_at(dev, dt, dev.download(out), /*misalign=*/true);
          auto backward = [&](const char* path, const Tensor& o) {
            ScopedFlashPath scoped(path);
            EXPECT_EQ(flash_backward_uses_hopper(p, dt, ctx), std::string(path) == "hopper") << what;
            const Tensor d_qkv = dev.poisoned(dt, 3 * NC);
            // D lives in the Context's scratch: poison it, so that a path that fails to compute D cannot pass on
            // the D an earlier call left there.
            const int64_t n_d = static_cast<int64_t>(n_lse);
            fill_bytes(Tensor(ctx.scratch(n_lse * sizeof(float)), DType::F32, {n_d}, ctx.device()), 0xff, ctx);
            attention_backward(p, d_qkv, tdo, tqkv, o, lse, ctx);
            return dev.download(d_qkv);
          };
          const auto h = backward("hopper", out), m = backward("mma", out);
          const auto h_misaligned = backward("hopper", out_misaligned);
          const double floor = 0.1 * norm2(part_of(m, 2, N, C));
          static constexpr std::array<const char*, 3> kPart = {" dQ", " dK", " dV"};
          for (int part = 0; part < 3; ++part) {
            expect_close(part_of(h, part, N, C), part_of(m, part, N, C), dt, what + " hopper" + kPart[part] + " vs mma",
                         2.0, floor);
            expect_close(part_of(h_misaligned, part, N, C), part_of(m, part, N, C), dt,
                         what + " hopper (out misaligned)" + kPart[part] + " vs mma", 2.0, floor);
          }
          ASSERT_EQ(backward("hopper", out), h) << what << ": the Hopper backward differs between identical runs";
        }
}

// Stores that run past a padded head's Dh columns: into a neighbouring head they race with its own stores (or are
// rewritten after), so the cases above may miss them; past the end of out and d_qkv nothing rewrites them. One
// head, one batch, T a whole number of tiles (the last row a live one): out and d_qkv are allocated with a poisoned
// tail of 64 elements, which must stay poisoned.
TEST(CudaFlashAttentionHopper, PaddedHeadsWriteNothingPastTheirColumns) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  if (!flash_hopper_available(ctx)) GTEST_SKIP() << "no sm_90a Hopper kernels for this device";
  std::mt19937_64 rng(test_seed());
  ScopedFlashPath scoped("hopper");
  constexpr size_t kTail = 64;
  for (int Dh : {8, 16, 40, 72, 120}) {
    const AttentionParams p{.B = 1, .T = 128, .H = 1, .Dh = Dh, .causal = true};
    const std::string what = label(p, DType::BF16);
    ASSERT_EQ(std::string(attention_cuda_kernel(p, DType::BF16, ctx)), "flash-hopper") << what;
    const size_t NC = static_cast<size_t>(p.T) * p.Dh;
    DeviceArena dev(ctx);
    const Tensor tqkv = dev.upload(DType::BF16, randn<double>(3 * NC, rng));
    const Tensor tdo = dev.upload(DType::BF16, randn<double>(NC, rng));
    const Tensor out_all = dev.poisoned(DType::BF16, NC + kTail), d_all = dev.poisoned(DType::BF16, 3 * NC + kTail);
    const Tensor lse = dev.poisoned(DType::F32, p.T);
    const auto n64 = [](size_t n) { return static_cast<int64_t>(n); };
    const Tensor out(out_all.data(), DType::BF16, {n64(NC)}, ctx.device());
    const Tensor d_qkv(d_all.data(), DType::BF16, {n64(3 * NC)}, ctx.device());
    attention_forward(p, out, lse, tqkv, ctx);
    attention_backward(p, d_qkv, tdo, tqkv, out, lse, ctx);
    const auto o = dev.download(out_all), g = dev.download(d_all);
    for (size_t i = 0; i < NC; ++i) ASSERT_TRUE(std::isfinite(o[i])) << what << ": out[" << i << "] unwritten";
    for (size_t i = 0; i < 3 * NC; ++i) ASSERT_TRUE(std::isfinite(g[i])) << what << ": d_qkv[" << i << "] unwritten";
    for (size_t i = 0; i < kTail; ++i) {
      EXPECT_TRUE(std::isnan(o[NC + i])) << what << ": written past out's end at +" << i;
      EXPECT_TRUE(std::isnan(g[3 * NC + i])) << what << ": written past d_qkv's end at +" << i;
    }
  }
}

TEST(CudaFlashAttentionHopper, PathChoiceIsExplicit) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const AttentionParams p64{.B = 1, .T = 5, .H = 1, .Dh = 64, .causal = true};
  const AttentionParams p80{.B = 1, .T = 5, .H = 1, .Dh = 80, .causal = true};
  {
    ScopedFlashPath scoped("mma");
    EXPECT_FALSE(flash_forward_uses_hopper(p64, DType::BF16, ctx));
    EXPECT_FALSE(flash_backward_uses_hopper(p64, DType::BF16, ctx));
  }
  if (flash_hopper_available(ctx)) {
    ScopedFlashPath scoped("auto");
    const AttentionParams p128{.B = 1, .T = 5, .H = 1, .Dh = 128, .causal = true};
    EXPECT_TRUE(flash_forward_uses_hopper(p64, DType::BF16, ctx));  // measured faster at Dh 64 and 128
    EXPECT_TRUE(flash_forward_uses_hopper(p128, DType::BF16, ctx));
    EXPECT_TRUE(flash_backward_uses_hopper(p64, DType::BF16, ctx));
    EXPECT_TRUE(flash_backward_uses_hopper(p128, DType::F16, ctx));
    EXPECT_TRUE(flash_forward_uses_hopper(p80, DType::BF16, ctx));  // zero-padded in the 128 kernels
    EXPECT_TRUE(flash_backward_uses_hopper(p80, DType::F16, ctx));
    EXPECT_FALSE(flash_forward_uses_hopper(p64, DType::F32, ctx));
  }
  {
    ScopedFlashPath scoped("bogus");
    EXPECT_THROW(flash_forward_uses_hopper(p64, DType::BF16, ctx), Error);
  }
  ScopedFlashPath scoped("hopper");
  if (!flash_hopper_available(ctx)) {
    EXPECT_THROW(flash_forward_uses_hopper(p64, DType::BF16, ctx), Error);  // asked for, cannot run: an Error
    EXPECT_THROW(flash_backward_uses_hopper(p64, DType::BF16, ctx), Error);
    return;
  }
  EXPECT_TRUE(flash_forward_uses_hopper(p64, DType::BF16, ctx));
  EXPECT_TRUE(flash_backward_uses_hopper(p64, DType::F16, ctx));
  EXPECT_TRUE(flash_backward_uses_hopper(p80, DType::F16, ctx));
  EXPECT_TRUE(flash_forward_uses_hopper(p64, DType::F16, ctx));
  EXPECT_TRUE(flash_forward_uses_hopper(p80, DType::BF16, ctx));
  const AttentionParams wide_grid{.B = 70000, .T = 5, .H = 1, .Dh = 64, .causal = true};
  EXPECT_FALSE(flash_forward_uses_hopper(wide_grid, DType::BF16, ctx));  // grid z: B <= 65535
  EXPECT_FALSE(flash_forward_uses_hopper(p64, DType::F32, ctx));
  // Head widths: every multiple of 8 up to 128, padded to 64 or 128; nothing else.
  for (int Dh : {8, 24, 120}) {
    const AttentionParams p{.B = 1, .T = 5, .H = 1, .Dh = Dh, .causal = true};
    EXPECT_TRUE(flash_forward_uses_hopper(p, DType::BF16, ctx)) << Dh;
  }
  for (int Dh : {4, 20, 136}) {
    const AttentionParams p{.B = 1, .T = 5, .H = 1, .Dh = Dh, .causal = true};
    EXPECT_FALSE(flash_forward_uses_hopper(p, DType::BF16, ctx)) << Dh;
    EXPECT_FALSE(flash_backward_uses_hopper(p, DType::BF16, ctx)) << Dh;
  }
}

TEST(CudaNaiveAttention, F32MatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  // The naive GPU attention in f32 (exact f32 GEMMs): the f32 yardstick, against f64.
  for (bool causal : {true, false})
    for (int T : {1, 33, 130}) {
      const AttentionParams p{.B = 2, .T = T, .H = 3, .Dh = 40, .causal = causal};
      const int C = p.H * p.Dh;
      const size_t N = static_cast<size_t>(p.B) * p.T, NC = N * C;
      const auto qkv = randn<double>(3 * NC, rng, 1.5), d_out = randn<double>(NC, rng, 1.0);
      std::vector<double> out(NC), lse(N * p.H), d_qkv(3 * NC);
      attention_forward_ref<double>(p, out.data(), lse.data(), qkv.data());
      attention_backward_ref<double>(p, d_qkv.data(), d_out.data(), qkv.data(), out.data(), lse.data());
      DeviceArena dev(ctx);
      const Tensor tqkv = dev.upload(DType::F32, qkv), tdo = dev.upload(DType::F32, d_out);
      const Tensor tout = dev.poisoned(DType::F32, NC), tlse = dev.poisoned(DType::F32, N * p.H);
      const Tensor tdqkv = dev.poisoned(DType::F32, 3 * NC);
      AttentionNaiveSaved saved;
      attention_naive_forward(p, tout, tlse, tqkv, saved, ctx);
      attention_naive_backward(p, tdqkv, tdo, saved, ctx);
      const std::string what = label(p, DType::F32) + " naive";
      expect_close(dev.download(tout), out, DType::F32, what + " out", 10.0);
      expect_close(dev.download(tlse), lse, DType::F32, what + " lse", 10.0);
      expect_close(dev.download(tdqkv), d_qkv, DType::F32, what + " d_qkv", 10.0, 0.1 * norm2(d_out));
    }
}

}  // namespace
}  // namespace tessera::test
