// Naive (materialized) attention: the Tensor-level entries and the CPU loops. See attention_naive.h.
#include "tessera/ops/attention/attention_naive.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessera/ops/dispatch.h"
#include "tessera/ops/gemm/gemm.h"

namespace tessera {

namespace {

int64_t bh(const AttentionParams& p) { return static_cast<int64_t>(p.B) * p.H; }
int64_t head_elems(const AttentionParams& p) { return bh(p) * p.T * p.Dh; }
int64_t score_elems(const AttentionParams& p) { return bh(p) * p.T * p.T; }

template <typename T>
void heads_split_ref(const AttentionParams& p, T* dst, const T* src, int64_t ld, int64_t col) {
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int t = 0; t < p.T; ++t) {
        const T* s = src + (static_cast<int64_t>(b) * p.T + t) * ld + col + static_cast<int64_t>(h) * p.Dh;
        T* d = dst + ((static_cast<int64_t>(b) * p.H + h) * p.T + t) * p.Dh;
        std::copy(s, s + p.Dh, d);
      }
}

template <typename T>
void heads_merge_ref(const AttentionParams& p, T* dst, int64_t ld, int64_t col, const T* src) {
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int t = 0; t < p.T; ++t) {
        const T* s = src + ((static_cast<int64_t>(b) * p.H + h) * p.T + t) * p.Dh;
        T* d = dst + (static_cast<int64_t>(b) * p.T + t) * ld + col + static_cast<int64_t>(h) * p.Dh;
        std::copy(s, s + p.Dh, d);
      }
}

template <typename T>
void softmax_rows_ref(const AttentionParams& p, T* s, T* lse) {
  const int64_t rows = bh(p) * p.T;
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * p.T;
    const int i = static_cast<int>(r % p.T), n = p.causal ? i + 1 : p.T;
    T mx = -std::numeric_limits<T>::infinity();
    for (int j = 0; j < n; ++j) mx = std::max(mx, row[j]);
    T sum = 0;
    for (int j = 0; j < n; ++j) sum += std::exp(row[j] - mx);
    for (int j = 0; j < p.T; ++j) row[j] = j < n ? std::exp(row[j] - mx) / sum : T(0);
    lse[r] = mx + std::log(sum);
  }
}

template <typename T>
void softmax_backward_rows_ref(const AttentionParams& p, T* dp, const T* prob) {
  const int64_t rows = bh(p) * p.T;
  for (int64_t r = 0; r < rows; ++r) {
    T* d = dp + r * p.T;
    const T* pr = prob + r * p.T;
    T dot = 0;
    for (int j = 0; j < p.T; ++j) dot += pr[j] * d[j];
    for (int j = 0; j < p.T; ++j) d[j] = pr[j] * (d[j] - dot);
  }
}

Tensor flat(const Buffer& b, DType dt, int64_t n) { return b.view(dt, {n}); }

GemmParams batched(const AttentionParams& p, int M, int N, int K, bool ta, bool tb, float alpha, int64_t sa, int64_t sb,
                   int64_t sc) {
  return {.M = M,
          .N = N,
          .K = K,
          .trans_a = ta,
          .trans_b = tb,
          .alpha = alpha,
          .beta = 0.0f,
          .allow_tf32 = false,
          .batch = static_cast<int>(bh(p)),
          .stride_a = sa,
          .stride_b = sb,
          .stride_c = sc};
}

}  // namespace

bool attention_naive_supports(const AttentionParams& p, DType dtype, Device device, std::string* why) {
  if (!attention_supports(p, dtype, device, why)) return false;
  if (p.dropout != 0.0f) {
    if (why) *why = "the naive path has no attention dropout";
    return false;
  }
  if (!attention_is_plain(p)) {
    if (why) *why = "the naive path takes H == n_kv_heads, Tq = Tk = T, no q_offset and no key_lens";
    return false;
  }
  if (p.rope_theta != 0.0f) {
    if (why) *why = "the naive path has no RoPE (rotate q and k with rope_forward first)";
    return false;
  }
  if (bh(p) > 65535) {
    if (why) *why = "the naive path batches its GEMMs over B*H <= 65535, got " + std::to_string(bh(p));
    return false;
  }
  return true;
}

size_t attention_naive_backward_bytes(const AttentionParams& p, DType dtype) {
  // dO, dQ, dK, dV (B*H, T, Dh) and dP (B*H, T, T).
  return (4 * static_cast<size_t>(head_elems(p)) + static_cast<size_t>(score_elems(p))) * dtype_size(dtype);
}

void attention_naive_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                             AttentionNaiveSaved& saved, Context& ctx, Tracer* tracer) {
  constexpr const char* op = "attention_naive_forward";
  std::string why;
  require_supported(attention_naive_supports(p, qkv.dtype(), ctx.device(), &why), op, why);
  const DType dt = qkv.dtype();
  const int64_t C = static_cast<int64_t>(p.H) * p.Dh, N = static_cast<int64_t>(p.B) * p.T;
  expect(qkv, op, "qkv", dt, N * 3 * C, ctx);
  expect(out, op, "out", dt, N * C, ctx);
  expect(lse, op, "lse", stat_dtype(dt), N * p.H, ctx);
  if (N == 0) return;
  const size_t es = dtype_size(dt);
  saved = {};
  saved.dtype = dt;
  saved.q = Buffer(head_elems(p) * es, ctx.device(), "naive attention Q");
  saved.k = Buffer(head_elems(p) * es, ctx.device(), "naive attention K");
  saved.v = Buffer(head_elems(p) * es, ctx.device(), "naive attention V");
  saved.p = Buffer(score_elems(p) * es, ctx.device(), "naive attention scores (B*H, T, T)");
  Buffer o(head_elems(p) * es, ctx.device(), "naive attention O");
  Buffer* parts[3] = {&saved.q, &saved.k, &saved.v};
  for (int part = 0; part < 3; ++part) {
    dispatch(
        ctx, dt, op, [&] { attention_heads_split_cuda(p, dt, parts[part]->data(), qkv.data(), 3 * C, part * C, ctx); },
        [&](auto t) {
          using T = decltype(t);
          heads_split_ref<T>(p, parts[part]->as<T>(), qkv.as<T>(), 3 * C, part * C);
        });
  }
  const int64_t hd = static_cast<int64_t>(p.T) * p.Dh, tt = static_cast<int64_t>(p.T) * p.T;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh)));
  {
    const TraceScope range(tracer, "ATTN_QK");
    gemm(batched(p, p.T, p.T, p.Dh, false, true, scale, hd, hd, tt), flat(saved.p, dt, score_elems(p)),
         flat(saved.q, dt, head_elems(p)), flat(saved.k, dt, head_elems(p)), Tensor(), ctx);
  }
  {
    const TraceScope range(tracer, "ATTN_SOFTMAX");
    dispatch(
        ctx, dt, op, [&] { attention_softmax_rows_cuda(p, dt, saved.p.data(), lse.as<float>(), ctx); },
        [&](auto t) {
          using T = decltype(t);
          softmax_rows_ref<T>(p, saved.p.as<T>(), lse.as<T>());
        });
  }
  {
    const TraceScope range(tracer, "ATTN_AV");
    gemm(batched(p, p.T, p.Dh, p.T, false, false, 1.0f, tt, hd, hd), flat(o, dt, head_elems(p)),
         flat(saved.p, dt, score_elems(p)), flat(saved.v, dt, head_elems(p)), Tensor(), ctx);
  }
  dispatch(
      ctx, dt, op, [&] { attention_heads_merge_cuda(p, dt, out.data(), C, 0, o.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        heads_merge_ref<T>(p, out.as<T>(), C, 0, o.as<T>());
      });
  ctx.synchronize();  // `o` is freed on return
}

void attention_naive_backward(const AttentionParams& p, const Tensor& d_qkv, const Tensor& d_out,
                              const AttentionNaiveSaved& saved, Context& ctx, Tracer* tracer) {
  constexpr const char* op = "attention_naive_backward";
  std::string why;
  const DType dt = d_out.dtype();
  require_supported(attention_naive_supports(p, dt, ctx.device(), &why), op, why);
  const int64_t C = static_cast<int64_t>(p.H) * p.Dh, N = static_cast<int64_t>(p.B) * p.T;
  expect(d_qkv, op, "d_qkv", dt, N * 3 * C, ctx);
  expect(d_out, op, "d_out", dt, N * C, ctx);
  if (N == 0) return;
  TS_CHECK(saved.dtype == dt && saved.p.bytes() == static_cast<size_t>(score_elems(p)) * dtype_size(dt), op,
           ": `saved` does not come from a forward of this shape and dtype");
  const size_t es = dtype_size(dt);
  Buffer d_o(head_elems(p) * es, ctx.device(), "naive attention dO");
  Buffer d_p(score_elems(p) * es, ctx.device(), "naive attention dP (B*H, T, T)");
  Buffer grads[3] = {Buffer(head_elems(p) * es, ctx.device(), "naive attention dQ"),
                     Buffer(head_elems(p) * es, ctx.device(), "naive attention dK"),
                     Buffer(head_elems(p) * es, ctx.device(), "naive attention dV")};
  dispatch(
      ctx, dt, op, [&] { attention_heads_split_cuda(p, dt, d_o.data(), d_out.data(), C, 0, ctx); },
      [&](auto t) {
        using T = decltype(t);
        heads_split_ref<T>(p, d_o.as<T>(), d_out.as<T>(), C, 0);
      });
  const int64_t hd = static_cast<int64_t>(p.T) * p.Dh, tt = static_cast<int64_t>(p.T) * p.T;
  const int64_t nh = head_elems(p), ns = score_elems(p);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh)));
  {
    const TraceScope range(tracer, "ATTN_AV_BWD");
    // dV = Pᵀ dO: (T keys, Dh) = (T, T)ᵀ (T, Dh).
    gemm(batched(p, p.T, p.Dh, p.T, true, false, 1.0f, tt, hd, hd), flat(grads[2], dt, nh), flat(saved.p, dt, ns),
         flat(d_o, dt, nh), Tensor(), ctx);
    // dP = dO Vᵀ: (T, T) = (T, Dh) (T, Dh)ᵀ.
    gemm(batched(p, p.T, p.T, p.Dh, false, true, 1.0f, hd, hd, tt), flat(d_p, dt, ns), flat(d_o, dt, nh),
         flat(saved.v, dt, nh), Tensor(), ctx);
  }
  {
    const TraceScope range(tracer, "ATTN_SOFTMAX_BWD");
    dispatch(
        ctx, dt, op, [&] { attention_softmax_backward_rows_cuda(p, dt, d_p.data(), saved.p.data(), ctx); },
        [&](auto t) {
          using T = decltype(t);
          softmax_backward_rows_ref<T>(p, d_p.as<T>(), saved.p.as<T>());
        });
  }
  {
    const TraceScope range(tracer, "ATTN_QK_BWD");
    // dQ = dS K / sqrt(Dh); dK = dSᵀ Q / sqrt(Dh).
    gemm(batched(p, p.T, p.Dh, p.T, false, false, scale, tt, hd, hd), flat(grads[0], dt, nh), flat(d_p, dt, ns),
         flat(saved.k, dt, nh), Tensor(), ctx);
    gemm(batched(p, p.T, p.Dh, p.T, true, false, scale, tt, hd, hd), flat(grads[1], dt, nh), flat(d_p, dt, ns),
         flat(saved.q, dt, nh), Tensor(), ctx);
  }
  for (int part = 0; part < 3; ++part) {
    dispatch(
        ctx, dt, op, [&] { attention_heads_merge_cuda(p, dt, d_qkv.data(), 3 * C, part * C, grads[part].data(), ctx); },
        [&](auto t) {
          using T = decltype(t);
          heads_merge_ref<T>(p, d_qkv.as<T>(), 3 * C, part * C, grads[part].as<T>());
        });
  }
  ctx.synchronize();  // the temporaries are freed on return
}

}  // namespace tessera
