// The general attention call (strided q, k, v; Tq != Tk; grouped KV heads; causal q_offset; key lengths) and the
// packed call with grouped KV heads, on the GPU against the f64 reference. Each failure names the kernel family
// that ran (attention_cuda_kernel) and the case; TESSERA_FLASH_PATH (mma, hopper) picks the flash family per run
// and the gtest filter picks a test (CudaAttentionGeneral.* / CudaAttentionPackedGqa.*).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/flash_hopper.h"

namespace tessera::test {
namespace {

struct GCase {
  const char* name;
  int B, Tq, Tk, H, Hkv, Dh;
  bool causal;
  int q_offset = 0;
  std::vector<int32_t> lens = {};
  float dropout = 0.0f;
  int kv_cap = 0;   // > Tk: K and V are the first Tk rows of a cache of kv_cap rows a sequence
  int row_pad = 8;  // elements past each (t) row; not a multiple of 8: strides the flash kernels refuse
};

// A (B, T, heads, Dh) argument inside a padded buffer (rows padded by row_pad elements, 8 keeping 16-byte
// alignment for 16-bit types; sequences of cap >= T rows, then 16 more): the element at (b, t, h, d) is
// buf[b sb + t st + h Dh + d].
struct Layout {
  int B, T, heads, Dh;
  int64_t st, sb;
  Layout(int B_, int T_, int heads_, int Dh_, int cap = 0, int row_pad = 8) : B(B_), T(T_), heads(heads_), Dh(Dh_) {
    st = static_cast<int64_t>(heads) * Dh + row_pad;
    sb = std::max(cap, T) * st + 16;
  }
  size_t size() const { return static_cast<size_t>(B) * sb + 1; }
  size_t index(int b, int t, int h, int d) const { return b * sb + t * st + static_cast<int64_t>(h) * Dh + d; }
  Tensor on(const Tensor& buf, DType dt) const {
    return Tensor::strided(buf.data(), dt, {B, T, heads, Dh}, {sb, st, Dh, 1}, buf.device());
  }
  AttentionView<double> host(std::vector<double>& v) const { return {v.data(), sb, st, Dh}; }
  AttentionView<const double> host(const std::vector<double>& v) const { return {v.data(), sb, st, Dh}; }
  // The logical elements of a downloaded padded buffer, in (b, t, h, d) order.
  std::vector<double> logical(const std::vector<double>& v) const {
    std::vector<double> r;
    r.reserve(static_cast<size_t>(B) * T * heads * Dh);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
          for (int d = 0; d < Dh; ++d) r.push_back(v[index(b, t, h, d)]);
    return r;
  }
  // Fails unless every element of a downloaded poisoned output outside the view is still NaN (written nothing
  // past Dh, T, or a sequence's rows).
  void expect_only_view_written(const std::vector<double>& v, const std::string& what) const {
    std::vector<char> in(v.size(), 0);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
          for (int d = 0; d < Dh; ++d) in[index(b, t, h, d)] = 1;
    for (size_t i = 0; i < v.size(); ++i)
      if (!in[i]) {
        ASSERT_TRUE(std::isnan(v[i])) << what << ": element " << i << " outside the view was written";
      }
  }
};

std::string describe(const GCase& c, DType dt, const char* family) {
  std::string s = std::string("[") + family + "] " + c.name + " " + dtype_label(dt) + " B=" + std::to_string(c.B) +
                  " Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) + " H=" + std::to_string(c.H) +
                  " Hkv=" + std::to_string(c.Hkv) + " Dh=" + std::to_string(c.Dh) + (c.causal ? " causal" : " full") +
                  " q_offset=" + std::to_string(c.q_offset) + " dropout=" + std::to_string(c.dropout);
  if (!c.lens.empty()) {
    s += " lens=";
    for (int32_t l : c.lens) s += std::to_string(l) + ",";
  }
  return s;
}

// lse rows with no visible key are +inf in both; the finite ones are compared as numbers.
void expect_lse_close(std::vector<double> got, std::vector<double> ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] > 0) << what << " lse[" << i << "] = " << got[i] << ", expected +inf";
      got[i] = ref[i] = 0.0;
    }
  }
  expect_close(got, ref, DType::F32, what + " lse", 10.0);
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

// The family the general entry runs for c: the flash kernels refuse strides that are not multiples of 8 elements.
const char* general_family(const GCase& c, const AttentionParams& p, DType dt, const Context& ctx) {
  return c.row_pad % 8 != 0 ? "tiled-fma" : attention_cuda_kernel_general(p, dt, ctx);
}

// `path` (TESSERA_FLASH_PATH for the case: "hopper" or "mma") or nullptr, leaving the routing to the environment;
// a 16-bit case given a path must run that family in both directions.
void run_general_case(const GCase& c, DType dt, Context& ctx, std::mt19937_64& rng, const char* path = nullptr) {
  std::optional<ScopedFlashPath> scoped;
  if (path) scoped.emplace(path);
  const Layout lq(c.B, c.Tq, c.H, c.Dh, 0, c.row_pad), lk(c.B, c.Tk, c.Hkv, c.Dh, c.kv_cap, c.row_pad);
  AttentionParams p{.B = c.B,
                    .T = c.Tq,
                    .H = c.H,
                    .Dh = c.Dh,
                    .causal = c.causal,
                    .dropout = c.dropout,
                    .seed = 5,
                    .stream = 9,
                    .n_kv_heads = c.Hkv,
                    .Tq = c.Tq,
                    .Tk = c.Tk,
                    .q_offset = c.q_offset};
  const auto q = rounded(dt, randn<double>(lq.size(), rng, 1.5)), k = rounded(dt, randn<double>(lk.size(), rng, 1.5));
  const auto v = rounded(dt, randn<double>(lk.size(), rng)), d_out = rounded(dt, randn<double>(lq.size(), rng));
  std::vector<int32_t> lens = c.lens;
  AttentionParams host = p;
  if (!lens.empty()) host.key_lens = Tensor(lens.data(), DType::I32, {c.B});

  std::vector<double> out(lq.size(), 0.0), lse(static_cast<size_t>(c.B) * c.H * c.Tq);
  std::vector<double> dq(lq.size(), 0.0), dk(lk.size(), 0.0), dv(lk.size(), 0.0);
  attention_forward_ref<double>(host, lq.host(out), lse.data(), lq.host(q), lk.host(k), lk.host(v));
  const auto out_rounded = rounded(dt, out);
  attention_backward_ref<double>(host, lq.host(dq), lk.host(dk), lk.host(dv), lq.host(d_out), lq.host(q), lk.host(k),
                                 lk.host(v), lq.host(out_rounded), lse.data());

  DeviceArena dev(ctx);
  if (!lens.empty()) p.key_lens = dev.upload_i32(lens);
  const Tensor tq = dev.upload(dt, q), tk = dev.upload(dt, k), tv = dev.upload(dt, v), tdo = dev.upload(dt, d_out);
  const Tensor tout = dev.poisoned(dt, static_cast<int64_t>(lq.size()));
  const Tensor tlse = dev.poisoned(DType::F32, static_cast<int64_t>(lse.size()));
  const Tensor tdq = dev.poisoned(dt, static_cast<int64_t>(lq.size()));
  const Tensor tdk = dev.poisoned(dt, static_cast<int64_t>(lk.size())),
               tdv = dev.poisoned(dt, static_cast<int64_t>(lk.size()));
  attention_forward(p, lq.on(tout, dt), tlse, lq.on(tq, dt), lk.on(tk, dt), lk.on(tv, dt), ctx);
  attention_backward(p, lq.on(tdq, dt), lk.on(tdk, dt), lk.on(tdv, dt), lq.on(tdo, dt), lq.on(tq, dt), lk.on(tk, dt),
                     lk.on(tv, dt), lq.on(tout, dt), tlse, ctx);

  const std::string what = describe(c, dt, general_family(c, p, dt, ctx));
  if (path && dt != DType::F32 && c.row_pad % 8 == 0) {
    ASSERT_STREQ(general_family(c, p, dt, ctx), std::string(path) == "hopper" ? "flash-hopper" : "flash-mma") << what;
  }
  const auto got_out = dev.download(tout), got_dq = dev.download(tdq), got_dk = dev.download(tdk),
             got_dv = dev.download(tdv);
  expect_close(lq.logical(got_out), lq.logical(out), dt, what + " out");
  expect_lse_close(dev.download(tlse), lse, what);
  const double floor = 0.1 * norm2(lk.logical(dv));
  expect_close(lq.logical(got_dq), lq.logical(dq), dt, what + " dQ", 3.0, floor);
  expect_close(lk.logical(got_dk), lk.logical(dk), dt, what + " dK", 3.0, floor);
  expect_close(lk.logical(got_dv), lk.logical(dv), dt, what + " dV", 3.0, floor);
  lq.expect_only_view_written(got_out, what + " out");
  lq.expect_only_view_written(got_dq, what + " dQ");
  lk.expect_only_view_written(got_dk, what + " dK");
  lk.expect_only_view_written(got_dv, what + " dV");
}

// Cross-attention, grouped and multi-query heads, causal offsets (a decode step at the end of a cache, a chunk
// in the middle), key lengths with an empty sequence; lengths that straddle the 64-row tiles.
std::vector<GCase> general_cases(int Dh) {
  return {
      {"cross, GQA", 2, 70, 133, 4, 2, Dh, false},
      {"cross, MQA, key lengths", 3, 33, 129, 3, 1, Dh, false, 0, {129, 64, 1}},
      {"decode step, GQA", 2, 1, 200, 8, 2, Dh, true, 199},
      {"chunk at an offset, GQA, key lengths", 2, 65, 150, 4, 2, Dh, true, 70, {150, 100}},
      {"self, GQA, causal", 1, 130, 130, 6, 3, Dh, true},
      {"an empty sequence", 2, 17, 40, 2, 2, Dh, false, 0, {0, 40}},
      {"long self, GQA of 4, causal, key lengths", 2, 300, 300, 8, 2, Dh, true, 0, {300, 190}},
  };
}

TEST(CudaAttentionGeneral, MatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::BF16, DType::F16})
    for (int Dh : {40, 64, 80, 128})
      for (const GCase& c : general_cases(Dh)) run_general_case(c, dt, ctx, rng);
  for (const GCase& c : general_cases(40)) run_general_case(c, DType::F32, ctx, rng);
}

// Issue 46's awkward shapes: every (Tq, Tk) of {1, 7, 100} x {33, 300, 1000}, cycling through MQA, GQA and
// Hkv = H, causal with the bottom-right offset Tk - Tq or none, key lengths with an empty and a full sequence; K
// and V views into a cache longer than Tk; bf16 and f16 at Dh 64 and 128.
TEST(CudaAttentionGeneral, AwkwardShapesMatchReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int H = 4, kv_heads[3] = {1, 2, H};
  int n = 0;
  for (DType dt : {DType::BF16, DType::F16})
    for (int Dh : {64, 128})
      for (int Tq : {1, 7, 100})
        for (int Tk : {33, 300, 1000}) {
          const bool causal = n % 2 == 0, lens = n % 3 != 2;
          const int Hkv = kv_heads[n % 3], q_offset = causal ? std::max(Tk - Tq, 0) : 0;
          GCase c{"awkward", 2, Tq, Tk, H, Hkv, Dh, causal, q_offset};
          if (lens) c.lens = n % 2 ? std::vector<int32_t>{0, Tk} : std::vector<int32_t>{Tk, Tk / 2 + 1};
          if (n % 4 == 1) c.kv_cap = Tk + 70;
          run_general_case(c, dt, ctx, rng);
          ++n;
        }
}

// Q, K and V as slices of one fused projection (rows [q | k | v] of width (H + 2 Hkv) Dh) through the general
// entry, and dK, dV as slices of one fused gradient: GQA, causal, key lengths.
TEST(CudaAttentionGeneral, FusedProjectionSlicesMatchReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int B = 2, T = 90, H = 6, Hkv = 2, Dh = 64;
  const int64_t W = int64_t{H + 2 * Hkv} * Dh, N = int64_t{B} * T, C = int64_t{H} * Dh;
  const std::vector<int32_t> lens = {90, 41};
  for (DType dt : {DType::BF16, DType::F16}) {
    AttentionParams p{.B = B, .T = T, .H = H, .Dh = Dh, .causal = true, .n_kv_heads = Hkv, .Tq = T, .Tk = T};
    const auto qkv = rounded(dt, randn<double>(N * W, rng, 1.5)), d_out = rounded(dt, randn<double>(N * C, rng));
    AttentionParams host = p;
    std::vector<int32_t> host_lens = lens;
    host.key_lens = Tensor(host_lens.data(), DType::I32, {B});
    auto hv = [&](const std::vector<double>& x, int64_t col) {
      return AttentionView<const double>{x.data() + col, T * W, W, Dh};
    };
    std::vector<double> out(N * C), lse(N * H), dq(N * C), dkv(N * W, 0.0);
    attention_forward_ref<double>(host, {out.data(), T * C, C, Dh}, lse.data(), hv(qkv, 0), hv(qkv, C),
                                  hv(qkv, C + Hkv * Dh));
    const auto out_r = rounded(dt, out);
    attention_backward_ref<double>(host, {dq.data(), T * C, C, Dh}, {dkv.data() + C, T * W, W, Dh},
                                   {dkv.data() + C + Hkv * Dh, T * W, W, Dh}, {d_out.data(), T * C, C, Dh}, hv(qkv, 0),
                                   hv(qkv, C), hv(qkv, C + Hkv * Dh), {out_r.data(), T * C, C, Dh}, lse.data());

    DeviceArena dev(ctx);
    p.key_lens = dev.upload_i32(lens);
    const Tensor tqkv = dev.upload(dt, qkv), tdo = dev.upload(dt, d_out);
    const Tensor tout = dev.poisoned(dt, N * C), tlse = dev.poisoned(DType::F32, N * H);
    const Tensor tdq = dev.poisoned(dt, N * C), tdkv = dev.poisoned(dt, N * W);
    const size_t es = dtype_size(dt);
    auto dv4 = [&](const Tensor& buf, int64_t col, int heads, int64_t row) {
      return Tensor::strided(static_cast<char*>(buf.data()) + col * es, dt, {B, T, heads, Dh}, {T * row, row, Dh, 1},
                             buf.device());
    };
    const Tensor q = dv4(tqkv, 0, H, W), k = dv4(tqkv, C, Hkv, W), v = dv4(tqkv, C + Hkv * Dh, Hkv, W);
    attention_forward(p, dv4(tout, 0, H, C), tlse, q, k, v, ctx);
    attention_backward(p, dv4(tdq, 0, H, C), dv4(tdkv, C, Hkv, W), dv4(tdkv, C + Hkv * Dh, Hkv, W), dv4(tdo, 0, H, C),
                       q, k, v, dv4(tout, 0, H, C), tlse, ctx);
    const std::string what = std::string("[") + attention_cuda_kernel_general(p, dt, ctx) + "] fused slices " +
                             dtype_label(dt);
    expect_close(dev.download(tout), out, dt, what + " out");
    expect_lse_close(dev.download(tlse), lse, what);
    expect_close(dev.download(tdq), dq, dt, what + " dQ", 3.0);
    auto got = dev.download(tdkv);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_TRUE(std::isnan(got[r * W + c])) << what << ": the q part of the fused dK/dV buffer was written";
        got[r * W + c] = 0.0;
      }
    expect_close(got, dkv, dt, what + " dK, dV", 3.0);
  }
}

// Views whose row stride is not a multiple of 8 elements run the tiled kernels, and match the reference too.
TEST(CudaAttentionGeneral, UnalignedStridesFallBackToTiledKernels) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  GCase c{"row stride % 8 == 4", 2, 40, 90, 4, 2, 64, true, 50, {90, 33}};
  c.row_pad = 4;
  run_general_case(c, DType::BF16, ctx, rng);
}

// Which family takes a call (attention_policy.cu): a policy change fails here on the GPU. The flash kernels take
// every bf16 / f16 call with a flash head width, the general one and the packed one with grouped heads or key
// lengths alike: forward and backward on the Hopper kernels where this device and build have them
// (TESSERA_FLASH_PATH auto or hopper; a Hopper head width: every multiple of 8 up to 128), else mma.sync. f32 and
// other head widths run the tiled kernels.
TEST(CudaAttentionGeneral, RoutesToTheFamilyThePolicySays) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const bool hopper = flash_hopper_available(ctx) && flash_forward_path_requested() != FlashForwardPath::Mma;
  const std::string flash = hopper ? "flash-hopper" : "flash-mma";
  const AttentionParams gqa{.B = 2, .T = 7, .H = 8, .Dh = 64, .n_kv_heads = 2, .Tq = 7, .Tk = 300, .q_offset = 293};
  for (DType dt : {DType::BF16, DType::F16}) {
    for (int Dh : {32, 40, 64, 80, 128}) {
      AttentionParams p = gqa;
      p.Dh = Dh;
      EXPECT_EQ(attention_cuda_kernel_general(p, dt, ctx), flash) << dtype_label(dt) << " Dh=" << Dh;
      EXPECT_EQ(attention_cuda_kernel(p, dt, ctx), flash) << dtype_label(dt) << " Dh=" << Dh;
    }
    const AttentionParams packed_gqa{.B = 2, .T = 100, .H = 8, .Dh = 64, .n_kv_heads = 2};
    EXPECT_EQ(attention_cuda_kernel(packed_gqa, dt, ctx), flash);
    const AttentionParams plain{.B = 2, .T = 100, .H = 8, .Dh = 64};
    EXPECT_EQ(attention_cuda_kernel_general(plain, dt, ctx), flash);
    AttentionParams odd = gqa;
    odd.Dh = 36;
    EXPECT_STREQ(attention_cuda_kernel_general(odd, dt, ctx), "tiled-fma");
  }
  EXPECT_STREQ(attention_cuda_kernel_general(gqa, DType::F32, ctx), "tiled-fma");
}

// Dropout cases: the forward's mask and the backward's agree with the reference's draws (attention_dropout.h).
std::vector<GCase> dropout_cases(int Dh) {
  return {
      {"dropout, cross, GQA", 2, 70, 96, 4, 2, Dh, false, 0, {96, 50}, 0.2f},
      {"dropout, causal offset, MQA", 1, 40, 100, 4, 1, Dh, true, 60, {}, 0.3f},
      {"dropout, causal offset, GQA, key lengths", 2, 100, 260, 4, 2, Dh, true, 160, {260, 0}, 0.2f},
  };
}

TEST(CudaAttentionGeneral, DropoutMatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::BF16, DType::F16})
    for (int Dh : {40, 64, 128})
      for (const GCase& c : dropout_cases(Dh)) run_general_case(c, dt, ctx, rng);
  for (const GCase& c : dropout_cases(64)) run_general_case(c, DType::F32, ctx, rng);
}

// Both flash families on the same cases whatever the binary's TESSERA_FLASH_PATH: the Hopper forward and backward
// (where this device and build have them) and mma.sync, each against the reference.
TEST(CudaAttentionGeneral, BothFlashPathsMatchReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  std::vector<const char*> paths = {"mma"};
  if (flash_hopper_available(ctx)) paths.push_back("hopper");
  for (const char* path : paths)
    for (DType dt : {DType::BF16, DType::F16})
      for (int Dh : {40, 64, 128}) {
        for (const GCase& c : general_cases(Dh)) run_general_case(c, dt, ctx, rng, path);
        run_general_case(dropout_cases(Dh)[2], dt, ctx, rng, path);
      }
}

TEST(CudaAttentionGeneral, BackwardIsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int B = 2, Tq = 100, Tk = 150, H = 8, Hkv = 2, Dh = 64;
  const AttentionParams p{.B = B, .T = Tq, .H = H, .Dh = Dh, .causal = false, .n_kv_heads = Hkv, .Tq = Tq, .Tk = Tk};
  const int64_t nq = int64_t{B} * Tq * H * Dh, nk = int64_t{B} * Tk * Hkv * Dh;
  DeviceArena dev(ctx);
  auto as4 = [&](const Tensor& t, int T, int heads) {
    return Tensor::strided(t.data(), DType::BF16, {B, T, heads, Dh}, {int64_t{T} * heads * Dh, heads * Dh, Dh, 1},
                           t.device());
  };
  const Tensor q = dev.upload(DType::BF16, randn<double>(nq, rng)), k = dev.upload(DType::BF16, randn<double>(nk, rng));
  const Tensor v = dev.upload(DType::BF16, randn<double>(nk, rng)),
               d_o = dev.upload(DType::BF16, randn<double>(nq, rng));
  const Tensor out = dev.alloc(DType::BF16, nq), lse = dev.alloc(DType::F32, int64_t{B} * H * Tq);
  attention_forward(p, as4(out, Tq, H), lse, as4(q, Tq, H), as4(k, Tk, Hkv), as4(v, Tk, Hkv), ctx);
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    const Tensor dq = dev.poisoned(DType::BF16, nq), dk = dev.poisoned(DType::BF16, nk);
    const Tensor dv = dev.poisoned(DType::BF16, nk);
    attention_backward(p, as4(dq, Tq, H), as4(dk, Tk, Hkv), as4(dv, Tk, Hkv), as4(d_o, Tq, H), as4(q, Tq, H),
                       as4(k, Tk, Hkv), as4(v, Tk, Hkv), as4(out, Tq, H), lse, ctx);
    std::vector<double> got = dev.download(dq);
    for (const Tensor& t : {dk, dv}) {
      const auto part = dev.download(t);
      got.insert(got.end(), part.begin(), part.end());
    }
    if (run == 0) first = got;
    else EXPECT_EQ(got, first) << "[" << attention_cuda_kernel(p, DType::BF16, ctx) << "] run " << run;
  }
}

// The packed call with grouped KV heads (rows [q | k | v] of width (H + 2 Hkv) Dh), RoPE and dropout included.
void run_packed_gqa_case(const AttentionParams& p, DType dt, Context& ctx, std::mt19937_64& rng) {
  const int64_t N = int64_t{p.B} * p.T, W = attention_qkv_width(p), C = int64_t{p.H} * p.Dh;
  const auto qkv = rounded(dt, randn<double>(N * W, rng, 1.5)), d_out = rounded(dt, randn<double>(N * C, rng));
  AttentionParams plain = p;
  plain.rope_theta = 0.0f;
  std::vector<double> rotated = qkv;
  if (p.rope_theta > 0.0f)
    rotated = rounded(dt, [&] {
      std::vector<double> r = qkv;
      rope_forward_ref(attention_rope(p), r.data());
      return r;
    }());
  std::vector<double> out(N * C), lse(N * p.H), d_qkv(N * W);
  attention_forward_ref<double>(plain, out.data(), lse.data(), rotated.data());
  const auto out_rounded = rounded(dt, out);
  attention_backward_ref<double>(plain, d_qkv.data(), d_out.data(), rotated.data(), out_rounded.data(), lse.data());
  if (p.rope_theta > 0.0f) rope_backward_ref(attention_rope(p), d_qkv.data());

  DeviceArena dev(ctx);
  const Tensor tqkv = dev.upload(dt, qkv), tdo = dev.upload(dt, d_out);
  const Tensor tout = dev.poisoned(dt, N * C), tlse = dev.poisoned(DType::F32, N * p.H);
  const Tensor tdqkv = dev.poisoned(dt, N * W);
  attention_forward(p, tout, tlse, tqkv, ctx);
  attention_backward(p, tdqkv, tdo, tqkv, tout, tlse, ctx);
  const std::string what = std::string("[") + attention_cuda_kernel(plain, dt, ctx) + "] packed GQA " +
                           dtype_label(dt) + " B=" + std::to_string(p.B) + " T=" + std::to_string(p.T) +
                           " H=" + std::to_string(p.H) + " Hkv=" + std::to_string(p.n_kv_heads) +
                           " Dh=" + std::to_string(p.Dh) + " rope=" + std::to_string(p.rope_theta) +
                           " dropout=" + std::to_string(p.dropout);
  expect_close(dev.download(tout), out, dt, what + " out", 2.0);
  expect_close(dev.download(tlse), lse, DType::F32, what + " lse", 10.0);
  expect_close(dev.download(tdqkv), d_qkv, dt, what + " d_qkv", 3.0);
}

TEST(CudaAttentionPackedGqa, MatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (int Dh : {64, 128})
      for (bool causal : {true, false}) {
        run_packed_gqa_case({.B = 2, .T = 130, .H = 8, .Dh = Dh, .causal = causal, .n_kv_heads = 2}, dt, ctx, rng);
        run_packed_gqa_case({.B = 1, .T = 77, .H = 4, .Dh = Dh, .causal = causal, .n_kv_heads = 1}, dt, ctx, rng);
      }
  run_packed_gqa_case({.B = 2,
                       .T = 100,
                       .H = 6,
                       .Dh = 64,
                       .causal = true,
                       .dropout = 0.2f,
                       .seed = 3,
                       .stream = 4,
                       .rope_theta = 10000.0f,
                       .rope_pos_offset = 5,
                       .n_kv_heads = 2},
                      DType::BF16, ctx, rng);
}

// The general call's RoPE on the GPU (q at rope_pos_offset + q_offset + i, k at rope_pos_offset + j) against the
// CPU entry on the same inputs, in f32.
TEST(CudaAttentionGeneral, RopeMatchesTheCpuEntry) {
  TS_CUDA_CONTEXT_OR_SKIP(gpu);
  std::mt19937_64 rng(test_seed());
  const int B = 2, Tq = 20, Tk = 50, H = 4, Hkv = 2, Dh = 32;
  const AttentionParams p{.B = B,
                          .T = Tq,
                          .H = H,
                          .Dh = Dh,
                          .causal = true,
                          .rope_theta = 10000.0f,
                          .rope_pos_offset = 3,
                          .n_kv_heads = Hkv,
                          .Tq = Tq,
                          .Tk = Tk,
                          .q_offset = 30};
  const int64_t nq = int64_t{B} * Tq * H * Dh, nk = int64_t{B} * Tk * Hkv * Dh;
  auto q = randn<double>(nq, rng), k = randn<double>(nk, rng), v = randn<double>(nk, rng), w = randn<double>(nq, rng);
  const auto q0 = q, k0 = k;
  std::vector<double> out(nq), lse(int64_t{B} * H * Tq), dq(nq), dk(nk), dv(nk);
  auto t4 = [&](void* data, DType dt, int T, int heads, Device dev) {
    return Tensor::strided(data, dt, {B, T, heads, Dh}, {int64_t{T} * heads * Dh, heads * Dh, Dh, 1}, dev);
  };
  Context cpu;
  const Tensor lse_h(lse.data(), DType::F64, {static_cast<int64_t>(lse.size())});
  attention_forward(p, t4(out.data(), DType::F64, Tq, H, Device::cpu()), lse_h,
                    t4(q.data(), DType::F64, Tq, H, Device::cpu()), t4(k.data(), DType::F64, Tk, Hkv, Device::cpu()),
                    t4(v.data(), DType::F64, Tk, Hkv, Device::cpu()), cpu);
  attention_backward(p, t4(dq.data(), DType::F64, Tq, H, Device::cpu()),
                     t4(dk.data(), DType::F64, Tk, Hkv, Device::cpu()),
                     t4(dv.data(), DType::F64, Tk, Hkv, Device::cpu()), t4(w.data(), DType::F64, Tq, H, Device::cpu()),
                     t4(q.data(), DType::F64, Tq, H, Device::cpu()), t4(k.data(), DType::F64, Tk, Hkv, Device::cpu()),
                     t4(v.data(), DType::F64, Tk, Hkv, Device::cpu()), t4(out.data(), DType::F64, Tq, H, Device::cpu()),
                     lse_h, cpu);
  DeviceArena dev(gpu);
  const Tensor gq = dev.upload(DType::F32, q0), gk = dev.upload(DType::F32, k0), gv = dev.upload(DType::F32, v);
  const Tensor gw = dev.upload(DType::F32, w), gout = dev.poisoned(DType::F32, nq);
  const Tensor glse = dev.poisoned(DType::F32, static_cast<int64_t>(lse.size()));
  const Tensor gdq = dev.poisoned(DType::F32, nq), gdk = dev.poisoned(DType::F32, nk),
               gdv = dev.poisoned(DType::F32, nk);
  const Device d = gpu.device();
  attention_forward(p, t4(gout.data(), DType::F32, Tq, H, d), glse, t4(gq.data(), DType::F32, Tq, H, d),
                    t4(gk.data(), DType::F32, Tk, Hkv, d), t4(gv.data(), DType::F32, Tk, Hkv, d), gpu);
  attention_backward(p, t4(gdq.data(), DType::F32, Tq, H, d), t4(gdk.data(), DType::F32, Tk, Hkv, d),
                     t4(gdv.data(), DType::F32, Tk, Hkv, d), t4(gw.data(), DType::F32, Tq, H, d),
                     t4(gq.data(), DType::F32, Tq, H, d), t4(gk.data(), DType::F32, Tk, Hkv, d),
                     t4(gv.data(), DType::F32, Tk, Hkv, d), t4(gout.data(), DType::F32, Tq, H, d), glse, gpu);
  const std::string what = std::string("[") + attention_cuda_kernel(p, DType::F32, gpu) + "] general RoPE";
  expect_close(dev.download(gq), q, DType::F32, what + " rotated q");
  expect_close(dev.download(gk), k, DType::F32, what + " rotated k");
  expect_close(dev.download(gout), out, DType::F32, what + " out");
  expect_close(dev.download(gdq), dq, DType::F32, what + " dQ", 3.0);
  expect_close(dev.download(gdk), dk, DType::F32, what + " dK", 3.0);
  expect_close(dev.download(gdv), dv, DType::F32, what + " dV", 3.0);
}

}  // namespace
}  // namespace tessera::test
