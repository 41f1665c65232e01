// CPU references of kv_append and attention_decode (attention_decode.h): loops over the definitions, in f64
// arithmetic for T = float or double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/parallel.h"
#include "tessera/ops/attention/attention_decode.h"

namespace tessera {

namespace {
// The cache slot that position t of sequence b lives in (slot b without a table).
int slot_of(const DecodeAttentionParams& p, const int32_t* slots, int b, int t) {
  return slots ? slots[static_cast<int64_t>(b) * p.max_seq + t] : b;
}

// Element 0 of (slot s, KV head g, position t) in a (S, Hkv, max_seq, Dh) cache.
int64_t cache_offset(const DecodeAttentionParams& p, int s, int g, int t) {
  return ((static_cast<int64_t>(s) * p.Hkv + g) * p.max_seq + t) * p.Dh;
}

// RoPE of `heads` rows of Dh at position t, rows `stride` apart (attention.h's rotate-half form).
template <typename T>
void rope_at(const DecodeAttentionParams& p, T* x, int heads, int64_t stride, int t) {
  if (p.rope_theta <= 0.0f) return;
  const RopeParams r{.B = 1, .T = 1, .H = heads, .Dh = p.Dh, .theta = p.rope_theta, .pos_offset = t};
  rope_rotate_view_ref<T>(r, heads, AttentionView<T>{x, 0, 0, stride}, 1.0);
}

// Checked before anything is written (and outside the OpenMP loops, which cannot throw): every pos[b] >= 0 and
// every slot-table entry the call reads, positions [t_begin(b), t_end(b)), in [0, S).
template <typename Begin, typename End>
void check_inputs(const DecodeAttentionParams& p, const int32_t* pos, const int32_t* slots, const char* op,
                  Begin t_begin, End t_end) {
  for (int b = 0; b < p.B; ++b) {
    TS_CHECK(pos[b] >= 0, op, ": pos[", b, "] = ", pos[b], " is negative");
    if (!slots) continue;
    for (int t = t_begin(b); t < t_end(b); ++t) {
      const int s = slot_of(p, slots, b, t);
      TS_CHECK(s >= 0 && s < p.S, op, ": slots[", b, ", ", t, "] = ", s, " is outside [0, ", p.S, ")");
    }
  }
}
}  // namespace

template <typename T>
void kv_append_ref(const DecodeAttentionParams& p, T* cache_k, T* cache_v, AttentionView<T> q,
                   AttentionView<const T> k_new, AttentionView<const T> v_new, const int32_t* pos,
                   const int32_t* slots) {
  for (int b = 0; b < p.B; ++b) {
    TS_CHECK(int64_t{pos[b]} + p.Tq <= p.max_seq, "kv_append: sequence ", b, " at pos ", pos[b], " with ", p.Tq,
             " new tokens passes the cache's max_seq ", p.max_seq);
  }
  check_inputs(
      p, pos, slots, "kv_append", [&](int b) { return pos[b]; }, [&](int b) { return pos[b] + p.Tq; });
  for (int b = 0; b < p.B; ++b) {
    for (int i = 0; i < p.Tq; ++i) {
      const int t = pos[b] + i, s = slot_of(p, slots, b, t);
      for (int g = 0; g < p.Hkv; ++g) {
        T* kc = cache_k + cache_offset(p, s, g, t);
        T* vc = cache_v + cache_offset(p, s, g, t);
        std::copy_n(k_new.at(b, i, g), p.Dh, kc);
        std::copy_n(v_new.at(b, i, g), p.Dh, vc);
        rope_at(p, kc, 1, 0, t);
      }
      rope_at(p, q.at(b, i, 0), p.H, q.sh, t);
    }
  }
}

template <typename T>
void attention_decode_ref(const DecodeAttentionParams& p, AttentionView<T> out, AttentionView<const T> q,
                          const T* cache_k, const T* cache_v, const int32_t* pos, const int32_t* slots) {
  // Sequence b reads positions up to pos[b] + Tq - 1, at most max_seq of them.
  auto n_keys = [&](int b, int i) { return static_cast<int>(std::min<int64_t>(int64_t{pos[b]} + i + 1, p.max_seq)); };
  check_inputs(
      p, pos, slots, "attention_decode", [](int) { return 0; }, [&](int b) { return n_keys(b, p.Tq - 1); });
  const int group = p.H / p.Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.Dh));
  const int64_t work = static_cast<int64_t>(p.B) * p.H * p.Tq * p.max_seq * p.Dh;
  // Each (sequence, query head) pair is independent: one per OpenMP iteration.
#pragma omp parallel for schedule(static) if (work >= kParallelMinWork)
  for (int bh = 0; bh < p.B * p.H; ++bh) {
    const int b = bh / p.H, h = bh % p.H, g = h / group;
    std::vector<double> s(p.max_seq), acc(p.Dh);
    std::vector<int> slot(p.max_seq);
    for (int i = 0; i < p.Tq; ++i) {
      // Keys t < pos[b] + i + 1 (causal among the new queries), at most the cache's max_seq.
      const int n = n_keys(b, i);
      const T* qi = q.at(b, i, h);
      double mx = -std::numeric_limits<double>::infinity();
      for (int t = 0; t < n; ++t) {
        slot[t] = slot_of(p, slots, b, t);
        const T* kt = cache_k + cache_offset(p, slot[t], g, t);
        double dot = 0;
        for (int d = 0; d < p.Dh; ++d) dot += static_cast<double>(qi[d]) * kt[d];
        s[t] = dot * scale;
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (int t = 0; t < n; ++t) sum += std::exp(s[t] - mx);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t < n; ++t) {
        const double w = std::exp(s[t] - mx) / sum;
        const T* vt = cache_v + cache_offset(p, slot[t], g, t);
        for (int d = 0; d < p.Dh; ++d) acc[d] += w * vt[d];
      }
      T* o = out.at(b, i, h);
      for (int d = 0; d < p.Dh; ++d) o[d] = static_cast<T>(acc[d]);
    }
  }
}

#define TS_INSTANTIATE_DECODE(T) \
  template void kv_append_ref<T>(const DecodeAttentionParams&, T*, T*, AttentionView<T>, AttentionView<const T>, \
                                 AttentionView<const T>, const int32_t*, const int32_t*); \
  template void attention_decode_ref<T>(const DecodeAttentionParams&, AttentionView<T>, AttentionView<const T>, \
                                        const T*, const T*, const int32_t*, const int32_t*);
TS_INSTANTIATE_DECODE(float)
TS_INSTANTIATE_DECODE(double)
#undef TS_INSTANTIATE_DECODE

}  // namespace tessera
