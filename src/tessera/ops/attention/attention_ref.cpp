#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tessera/core/parallel.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_dropout.h"

namespace tessera {

namespace {
// Z of attention.h: 1 / (1 - dropout) where (query i, key j) of query head (b, h) is kept, 0 where it is dropped,
// 1 without dropout (the draw of attention_dropout.h).
double dropout_factor(const AttentionParams& p, int b, int h, int i, int j) {
  if (p.dropout <= 0.0f) return 1.0;
  const AttentionDropoutDraw d = attention_dropout_draw(p.dropout, p.seed, p.stream);
  return attention_dropout_keep(d, static_cast<uint64_t>(b) * p.H + h, attention_tq(p), attention_tk(p), i, j)
             ? 1.0 / (1.0 - static_cast<double>(p.dropout))
             : 0.0;
}

// The keys [0, end) that query i of sequence b sees (attention.h's masks); end <= 0: none.
int visible_end(const AttentionParams& p, int b, int i) {
  int end = p.key_lens.defined() ? p.key_lens.as<int32_t>()[b] : attention_tk(p);
  if (p.causal) end = std::min(end, i + p.q_offset + 1);
  return end;
}

double dot(const auto* a, const auto* b, int n) {
  double s = 0;
  for (int d = 0; d < n; ++d) s += static_cast<double>(a[d]) * b[d];
  return s;
}
}  // namespace

template <typename T>
void attention_forward_ref(const AttentionParams& p, AttentionView<T> out, T* lse, AttentionView<const T> q,
                           AttentionView<const T> k, AttentionView<const T> v) {
  TS_CHECK(p.rope_theta == 0.0f, "internal: attention_forward_ref takes q and k rotated (attention_forward ",
           "applies RoPE)");
  const int Tq = attention_tq(p), Tk = attention_tk(p), group = p.H / attention_kv_heads(p);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.Dh));
  // Each (batch, head) pair is independent: one per OpenMP iteration.
#pragma omp parallel for schedule(static) if (static_cast <long>(p.B) * p.H * Tq * Tk * p.Dh >= kParallelMinWork)
  for (int bh = 0; bh < p.B * p.H; ++bh) {
    std::vector<double> s(Tk), acc(p.Dh);
    const int b = bh / p.H, h = bh % p.H, g = h / group;
    for (int i = 0; i < Tq; ++i) {
      const int j_end = visible_end(p, b, i);
      double mx = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < j_end; ++j) {
        s[j] = dot(q.at(b, i, h), k.at(b, j, g), p.Dh) * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = 0; j < j_end; ++j) sum += std::exp(s[j] - mx);
      // No visible key: out = 0 and lse = +inf (attention.h).
      const double l = j_end > 0 ? mx + std::log(sum) : std::numeric_limits<double>::infinity();
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j < j_end; ++j) {
        const double pij = std::exp(s[j] - l) * dropout_factor(p, b, h, i, j);
        const T* vj = v.at(b, j, g);
        for (int d = 0; d < p.Dh; ++d) acc[d] += pij * vj[d];
      }
      T* o = out.at(b, i, h);
      for (int d = 0; d < p.Dh; ++d) o[d] = static_cast<T>(acc[d]);
      lse[(static_cast<long>(b) * p.H + h) * Tq + i] = static_cast<T>(l);
    }
  }
}

template <typename T>
void attention_backward_ref(const AttentionParams& p, AttentionView<T> dq, AttentionView<T> dk, AttentionView<T> dv,
                            AttentionView<const T> d_out, AttentionView<const T> q, AttentionView<const T> k,
                            AttentionView<const T> v, AttentionView<const T> out, const T* lse) {
  TS_CHECK(p.rope_theta == 0.0f, "internal: attention_backward_ref returns the gradients of rotated q and k ",
           "(attention_backward applies RoPE's backward)");
  const int Tq = attention_tq(p), Tk = attention_tk(p), Hkv = attention_kv_heads(p), group = p.H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.Dh));
  // Each (batch, KV head) pair writes only its own dK, dV and the dQ of its group's query heads, which it visits
  // in head order: one pair per OpenMP iteration, the same sums in the same order at any thread count.
#pragma omp parallel for schedule(static) if (static_cast <long>(p.B) * p.H * Tq * Tk * p.Dh >= kParallelMinWork)
  for (int bg = 0; bg < p.B * Hkv; ++bg) {
    const int b = bg / Hkv, g = bg % Hkv;
    std::vector<double> dqi(p.Dh);
    for (int j = 0; j < Tk; ++j) std::fill_n(dk.at(b, j, g), p.Dh, T(0)), std::fill_n(dv.at(b, j, g), p.Dh, T(0));
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int i = 0; i < Tq; ++i) {
        const T* qi = q.at(b, i, h);
        const T* d_o = d_out.at(b, i, h);
        const double l = lse[(static_cast<long>(b) * p.H + h) * Tq + i];
        const double D = dot(d_o, out.at(b, i, h), p.Dh);
        std::fill(dqi.begin(), dqi.end(), 0.0);
        const int j_end = visible_end(p, b, i);
        for (int j = 0; j < j_end; ++j) {
          const T* kj = k.at(b, j, g);
          const double pij = std::exp(dot(qi, kj, p.Dh) * scale - l), z = dropout_factor(p, b, h, i, j);
          const double ds = pij * (z * dot(d_o, v.at(b, j, g), p.Dh) - D);
          // dK and dV add up in T, one rounding per term, in (head, query) order.
          T* dk_row = dk.at(b, j, g);
          T* dv_row = dv.at(b, j, g);
          for (int d = 0; d < p.Dh; ++d) {
            dqi[d] += ds * kj[d];
            dk_row[d] += static_cast<T>(ds * scale * qi[d]);
            dv_row[d] += static_cast<T>(pij * z * d_o[d]);
          }
        }
        T* dq_row = dq.at(b, i, h);
        for (int d = 0; d < p.Dh; ++d) dq_row[d] = static_cast<T>(dqi[d] * scale);
      }
    }
  }
}

namespace {
// The packed call's views: q, k and v inside qkv (B*T, W); out and d_out (B*T, C).
template <typename T>
struct QkvViews {
  AttentionView<T> q, k, v;
};
template <typename T>
QkvViews<T> qkv_views(const AttentionParams& p, T* qkv) {
  const int64_t W = attention_qkv_width(p), C = static_cast<int64_t>(p.H) * p.Dh;
  const int64_t kv = static_cast<int64_t>(attention_kv_heads(p)) * p.Dh;
  return {.q = {qkv, p.T * W, W, p.Dh}, .k = {qkv + C, p.T * W, W, p.Dh}, .v = {qkv + C + kv, p.T * W, W, p.Dh}};
}
template <typename T>
AttentionView<T> rows_view(const AttentionParams& p, T* x) {
  const int64_t C = static_cast<int64_t>(p.H) * p.Dh;
  return {x, p.T * C, C, p.Dh};
}
}  // namespace

template <typename T>
void attention_forward_ref(const AttentionParams& p, T* out, T* lse, const T* qkv) {
  const QkvViews<const T> in = qkv_views(p, qkv);
  attention_forward_ref<T>(p, rows_view(p, out), lse, in.q, in.k, in.v);
}

template <typename T>
void attention_backward_ref(const AttentionParams& p, T* d_qkv, const T* d_out, const T* qkv, const T* out,
                            const T* lse) {
  const QkvViews<const T> in = qkv_views(p, qkv);
  const QkvViews<T> d = qkv_views(p, d_qkv);
  attention_backward_ref<T>(p, d.q, d.k, d.v, rows_view(p, d_out), in.q, in.k, in.v, rows_view(p, out), lse);
}

namespace {
// Rotates pairs (i, i + Dh/2) of every q and k head by angle pos * theta^(-2i/Dh); sign = -1 rotates back.
// x (b, t, h): element i is x[i], its pair x[i + Dh/2]; position pos_offset + t.
template <typename T>
void rope_rotate(const RopeParams& p, int heads, AttentionView<T> x, double sign) {
  const int half = p.Dh / 2;
  for (int b = 0; b < p.B; ++b) {
    for (int t = 0; t < p.T; ++t) {
      const double pos = p.pos_offset + t;
      for (int i = 0; i < half; ++i) {
        const double inv_freq = std::pow(static_cast<double>(p.theta), -2.0 * i / p.Dh);
        const double a = pos * inv_freq;
        const double cs = std::cos(a), sn = sign * std::sin(a);
        for (int h = 0; h < heads; ++h) {
          T* e = x.at(b, t, h);
          const double x1 = e[i], x2 = e[i + half];
          e[i] = static_cast<T>(x1 * cs - x2 * sn);
          e[i + half] = static_cast<T>(x2 * cs + x1 * sn);
        }
      }
    }
  }
}

// The q and k heads of a packed row are its first H + Hkv heads of Dh columns.
template <typename T>
void rope_rotate_packed(const RopeParams& p, T* qkv, double sign) {
  const int Hkv = p.n_kv_heads > 0 ? p.n_kv_heads : p.H;
  const int64_t W = (static_cast<int64_t>(p.H) + 2 * Hkv) * p.Dh;
  rope_rotate<T>(p, p.H + Hkv, {qkv, p.T * W, W, p.Dh}, sign);
}
}  // namespace

template <typename T>
void rope_forward_ref(const RopeParams& p, T* qkv) {
  rope_rotate_packed(p, qkv, 1.0);
}
template <typename T>
void rope_backward_ref(const RopeParams& p, T* d_qkv) {
  rope_rotate_packed(p, d_qkv, -1.0);
}
template <typename T>
void rope_rotate_view_ref(const RopeParams& p, int heads, AttentionView<T> x, double sign) {
  rope_rotate<T>(p, heads, x, sign);
}

#define TS_INSTANTIATE_ATTN(T) \
  template void attention_forward_ref<T>(const AttentionParams&, AttentionView<T>, T*, AttentionView<const T>, \
                                         AttentionView<const T>, AttentionView<const T>); \
  template void attention_backward_ref<T>(const AttentionParams&, AttentionView<T>, AttentionView<T>, \
                                          AttentionView<T>, AttentionView<const T>, AttentionView<const T>, \
                                          AttentionView<const T>, AttentionView<const T>, AttentionView<const T>, \
                                          const T*); \
  template void rope_rotate_view_ref<T>(const RopeParams&, int, AttentionView<T>, double); \
  template void attention_forward_ref<T>(const AttentionParams&, T*, T*, const T*); \
  template void attention_backward_ref<T>(const AttentionParams&, T*, const T*, const T*, const T*, const T*); \
  template void rope_forward_ref<T>(const RopeParams&, T*); \
  template void rope_backward_ref<T>(const RopeParams&, T*);
TS_INSTANTIATE_ATTN(float)
TS_INSTANTIATE_ATTN(double)
#undef TS_INSTANTIATE_ATTN

}  // namespace tessera
