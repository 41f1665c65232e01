// The general attention call (strided q, k, v; Tq != Tk; grouped KV heads; causal q_offset; key lengths) and the
// packed call with grouped KV heads, on the GPU against the f64 reference. Each failure names the kernel family
// that ran (attention_cuda_kernel) and the case; TESSERA_FLASH_PATH (mma, hopper) picks the flash family per run
// and the gtest filter picks a test (CudaAttentionGeneral.* / CudaAttentionPackedGqa.*).
#include <cmath>
#include <limits>
#include <string>

#include "cuda_test_util.h"
#include "tessera/ops/attention/attention.h"

namespace tessera::test {
namespace {

struct GCase {
  const char* name;
  int B, Tq, Tk, H, Hkv, Dh;
  bool causal;
  int q_offset = 0;
  std::vector<int32_t> lens = {};
  float dropout = 0.0f;
};

// A (B, T, heads, Dh) argument inside a padded buffer (rows padded by 8 elements, keeping 16-byte alignment for
// 16-bit types, sequences by 16): the element at (b, t, h, d) is buf[b sb + t st + h Dh + d].
struct Layout {
  int B, T, heads, Dh;
  int64_t st, sb;
  Layout(int B_, int T_, int heads_, int Dh_) : B(B_), T(T_), heads(heads_), Dh(Dh_) {
    st = static_cast<int64_t>(heads) * Dh + 8;
    sb = T * st + 16;
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

void run_general_case(const GCase& c, DType dt, Context& ctx, std::mt19937_64& rng) {
  const Layout lq(c.B, c.Tq, c.H, c.Dh), lk(c.B, c.Tk, c.Hkv, c.Dh);
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

  const std::string what = describe(c, dt, attention_cuda_kernel(p, dt, ctx));
  expect_close(lq.logical(dev.download(tout)), lq.logical(out), dt, what + " out");
  expect_lse_close(dev.download(tlse), lse, what);
  const double floor = 0.1 * norm2(lk.logical(dv));
  expect_close(lq.logical(dev.download(tdq)), lq.logical(dq), dt, what + " dQ", 3.0, floor);
  expect_close(lk.logical(dev.download(tdk)), lk.logical(dk), dt, what + " dK", 3.0, floor);
  expect_close(lk.logical(dev.download(tdv)), lk.logical(dv), dt, what + " dV", 3.0, floor);
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
  };
}

TEST(CudaAttentionGeneral, MatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::BF16, DType::F16})
    for (int Dh : {64, 80, 128})
      for (const GCase& c : general_cases(Dh)) run_general_case(c, dt, ctx, rng);
  for (const GCase& c : general_cases(40)) run_general_case(c, DType::F32, ctx, rng);
}

TEST(CudaAttentionGeneral, DropoutMatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::BF16, DType::F32}) {
    run_general_case({"dropout, cross, GQA", 2, 70, 96, 4, 2, 64, false, 0, {96, 50}, 0.2f}, dt, ctx, rng);
    run_general_case({"dropout, causal offset, MQA", 1, 40, 100, 4, 1, 64, true, 60, {}, 0.3f}, dt, ctx, rng);
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
