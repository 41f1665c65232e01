#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tessera/core/parallel.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_dropout.h"

namespace tessera {

namespace {
// Z_ij of attention.h: 1 / (1 - dropout) where (query i, key j) of head (b, h) is kept, 0 where it is dropped, 1
// without dropout (the draw of attention_dropout.h).
double dropout_factor(const AttentionParams& p, int b, int h, int i, int j) {
  if (p.dropout <= 0.0f) return 1.0;
  const AttentionDropoutDraw d = attention_dropout_draw(p.dropout, p.seed, p.stream);
  return attention_dropout_keep(d, static_cast<uint64_t>(b) * p.H + h, p.T, i, j)
             ? 1.0 / (1.0 - static_cast<double>(p.dropout))
             : 0.0;
}
}  // namespace

template <typename T>
void attention_forward_ref(const AttentionParams& p, T* out, T* lse, const T* qkv) {
  TS_CHECK(p.rope_theta == 0.0f, "internal: attention_forward_ref takes q and k rotated (attention_forward ",
           "applies RoPE)");
  const int C = p.H * p.Dh;
  const long row3 = 3L * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.Dh));
  // Each (batch, head) pair is independent: one per OpenMP iteration.
#pragma omp parallel for schedule(static) if (static_cast<long>(p.B) * p.H * p.T * p.T * p.Dh >= kParallelMinWork)
  for (int bh = 0; bh < p.B * p.H; ++bh) {
    std::vector<double> s(p.T), acc(p.Dh);
    const int b = bh / p.H, h = bh % p.H;
    {
      const T* q_base = qkv + static_cast<long>(b) * p.T * row3 + static_cast<long>(h) * p.Dh;
      const T* k_base = q_base + C;
      const T* v_base = q_base + 2 * C;
      for (int i = 0; i < p.T; ++i) {
        const T* q = q_base + i * row3;
        const int j_end = p.causal ? i + 1 : p.T;
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < j_end; ++j) {
          const T* k = k_base + j * row3;
          double dot = 0;
          for (int d = 0; d < p.Dh; ++d) dot += static_cast<double>(q[d]) * k[d];
          s[j] = dot * scale;
          if (s[j] > mx) mx = s[j];
        }
        double sum = 0;
        for (int j = 0; j < j_end; ++j) sum += std::exp(s[j] - mx);
        const double l = mx + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j < j_end; ++j) {
          const double pij = std::exp(s[j] - l) * dropout_factor(p, b, h, i, j);
          const T* v = v_base + j * row3;
          for (int d = 0; d < p.Dh; ++d) acc[d] += pij * v[d];
        }
        T* o = out + (static_cast<long>(b) * p.T + i) * C + static_cast<long>(h) * p.Dh;
        for (int d = 0; d < p.Dh; ++d) o[d] = static_cast<T>(acc[d]);
        lse[(static_cast<long>(b) * p.H + h) * p.T + i] = static_cast<T>(l);
      }
    }
  }
}

template <typename T>
void attention_backward_ref(const AttentionParams& p, T* d_qkv, const T* d_out, const T* qkv, const T* out,
                            const T* lse) {
  TS_CHECK(p.rope_theta == 0.0f, "internal: attention_backward_ref returns the d_qkv of rotated q and k ",
           "(attention_backward applies RoPE's backward)");
  const int C = p.H * p.Dh;
  const long row3 = 3L * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.Dh));
  // Each (batch, head) pair reads and writes only its own slices of qkv and d_qkv: one per OpenMP iteration.
#pragma omp parallel for schedule(static) if (static_cast<long>(p.B) * p.H * p.T * p.T * p.Dh >= kParallelMinWork)
  for (int bh = 0; bh < p.B * p.H; ++bh) {
    std::vector<double> dq(p.Dh);
    const int b = bh / p.H, h = bh % p.H;
    {
      const long base = static_cast<long>(b) * p.T * row3 + static_cast<long>(h) * p.Dh;
      for (int t = 0; t < p.T; ++t)
        for (int part = 0; part < 3; ++part)
          for (int d = 0; d < p.Dh; ++d) d_qkv[base + t * row3 + part * C + d] = T(0);
      for (int i = 0; i < p.T; ++i) {
        const T* q = qkv + base + i * row3;
        const long o_off = (static_cast<long>(b) * p.T + i) * C + static_cast<long>(h) * p.Dh;
        const T* d_o = d_out + o_off;
        const T* o = out + o_off;
        const double l = lse[(static_cast<long>(b) * p.H + h) * p.T + i];
        double D = 0;
        for (int d = 0; d < p.Dh; ++d) D += static_cast<double>(d_o[d]) * o[d];
        std::fill(dq.begin(), dq.end(), 0.0);
        const int j_end = p.causal ? i + 1 : p.T;
        for (int j = 0; j < j_end; ++j) {
          const T* k = qkv + base + j * row3 + C;
          const T* v = k + C;
          double dot = 0, dp = 0;
          for (int d = 0; d < p.Dh; ++d) {
            dot += static_cast<double>(q[d]) * k[d];
            dp += static_cast<double>(d_o[d]) * v[d];
          }
          const double pij = std::exp(dot * scale - l), z = dropout_factor(p, b, h, i, j);
          const double ds = pij * (z * dp - D);
          T* dk = d_qkv + base + j * row3 + C;
          T* dv = dk + C;
          for (int d = 0; d < p.Dh; ++d) {
            dq[d] += ds * k[d];
            dk[d] += static_cast<T>(ds * scale * q[d]);
            dv[d] += static_cast<T>(pij * z * d_o[d]);
          }
        }
        T* dqi = d_qkv + base + i * row3;
        for (int d = 0; d < p.Dh; ++d) dqi[d] += static_cast<T>(dq[d] * scale);
      }
    }
  }
}

namespace {
// Rotates pairs (i, i + Dh/2) of every q and k head by angle pos * theta^(-2i/Dh); sign = -1 rotates back.
template <typename T>
void rope_rotate(const RopeParams& p, T* qkv, double sign) {
  const int C = p.H * p.Dh, half = p.Dh / 2;
  for (int b = 0; b < p.B; ++b) {
    for (int t = 0; t < p.T; ++t) {
      const double pos = p.pos_offset + t;
      T* row = qkv + (static_cast<long>(b) * p.T + t) * 3L * C;
      for (int i = 0; i < half; ++i) {
        const double inv_freq = std::pow(static_cast<double>(p.theta), -2.0 * i / p.Dh);
        const double a = pos * inv_freq;
        const double cs = std::cos(a), sn = sign * std::sin(a);
        for (int part = 0; part < 2; ++part) {  // q then k
          for (int h = 0; h < p.H; ++h) {
            T* x = row + part * C + h * p.Dh;
            const double x1 = x[i], x2 = x[i + half];
            x[i] = static_cast<T>(x1 * cs - x2 * sn);
            x[i + half] = static_cast<T>(x2 * cs + x1 * sn);
          }
        }
      }
    }
  }
}
}  // namespace

template <typename T>
void rope_forward_ref(const RopeParams& p, T* qkv) {
  rope_rotate(p, qkv, 1.0);
}
template <typename T>
void rope_backward_ref(const RopeParams& p, T* d_qkv) {
  rope_rotate(p, d_qkv, -1.0);
}

#define TS_INSTANTIATE_ATTN(T)                                                                                  \
  template void attention_forward_ref<T>(const AttentionParams&, T*, T*, const T*);                             \
  template void attention_backward_ref<T>(const AttentionParams&, T*, const T*, const T*, const T*, const T*); \
  template void rope_forward_ref<T>(const RopeParams&, T*);                                                     \
  template void rope_backward_ref<T>(const RopeParams&, T*);
TS_INSTANTIATE_ATTN(float)
TS_INSTANTIATE_ATTN(double)
#undef TS_INSTANTIATE_ATTN

}  // namespace tessera
