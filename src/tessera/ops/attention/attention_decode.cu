// CUDA kernels of kv_append and attention_decode (attention_decode.h for the layout and the math).
//
// kv_append: one thread per (sequence b, new token i, head, unit), a unit being U elements of the head's first
// half and their RoPE partners Dh/2 further on (U = one 16-byte pack where Dh/2 is a whole number of packs and
// every view is 16-byte aligned, else U = 1). cos / sin come from a table per (theta, Dh, max_seq) in the Context,
// computed in f64 as the reference computes them and rounded to f32.
// attention_decode (FlashDecoding): a grid of (split z, KV head g x row chunk, sequence b). A block holds the query
// rows of one KV head's group (H / Hkv query heads x Tq new tokens: up to kRows of them, more in further row
// chunks) in shared memory, so that each key and value row is read once for the whole group, and streams its
// split's keys in tiles of kKeys rows (16-byte loads through the slot table into shared memory): scores in f32,
// an online softmax per row (running max m and sum l), out accumulated in f32 registers. One split writes out
// directly; more write partial (m, l, unnormalised out) to ctx.scratch, and the last split of a row chunk to
// finish (counted in ctx.arrival_counters()) merges them in the same launch:
//   M = max_z m_z,  out = Σ_z e^(m_z - M) out_z / Σ_z e^(m_z - M) l_z.
// Head dims run on padded widths 32, 64 or 128 (the narrowest that holds Dh); loops over d stop at the real Dh.
// Nothing is read back on the host: pos and slots stay on the device, so a launch can be captured in a graph.
// Both kernels launch through cuda::launch (programmatic dependents under Context::pdl) and wait before any global
// access: under PDL the split kernel's arrival counters are then never touched by two kernels at once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/attention_decode.h"
#include "tessera/ops/residual/elementwise_cuda.cuh"  // last_block_of_chunk

namespace tessera {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::to_f32;

constexpr int kThreads = 128;         // per block, both kernels
constexpr int kRows = 16;             // query rows per decode block
constexpr int kMinKeysPerSplit = 64;  // the automatic split choice gives each split at least this many keys

// A (B, T, heads, Dh) view in device code: element (b, t, h, d) at p[b sb + t st + h sh + d].
template <typename T>
struct Rows {
  T* p;
  long sb, st, sh;
  __device__ __forceinline__ T* at(int b, int t, int h) const { return p + b * sb + t * st + h * sh; }
};
template <typename T, typename View>
Rows<T> rows_of(const View& v) {
  return {static_cast<T*>(v.data), v.sb, v.st, v.sh};
}

// The sizes of a call, by value.
struct Shape {
  int B, Tq, H, Hkv, Dh, S, max_seq;
};
Shape shape_of(const DecodeAttentionParams& p) {
  return {.B = p.B, .Tq = p.Tq, .H = p.H, .Hkv = p.Hkv, .Dh = p.Dh, .S = p.S, .max_seq = p.max_seq};
}

// Element 0 of (slot s, KV head g, position t) in a (S, Hkv, max_seq, Dh) cache.
__device__ __forceinline__ long cache_row(const Shape& g, int s, int kvh, int t) {
  return ((static_cast<long>(s) * g.Hkv + kvh) * g.max_seq + t) * g.Dh;
}
// The table's slot of position t of sequence b (b without a table), unchecked.
__device__ __forceinline__ int table_slot(const Shape& g, const int32_t* slots, int b, int t) {
  return slots ? slots[static_cast<long>(b) * g.max_seq + t] : b;
}

// A key count n in [0, max_seq] (pos is read on the device, where nothing can refuse it).
__device__ __forceinline__ int clamp_keys(long n, int max_seq) {
  return n < 0 ? 0 : n > max_seq ? max_seq : static_cast<int>(n);
}

template <typename T, int U>
__device__ __forceinline__ void load_unit(const T* p, float (&x)[U]) {
  if constexpr (U == 1) {
    x[0] = to_f32(*p);
  } else {
    const cuda::Pack<T> v = cuda::load_pack(p);
#pragma unroll
    for (int e = 0; e < U; ++e) x[e] = to_f32(v.v[e]);
  }
}
template <typename T, int U>
__device__ __forceinline__ void store_unit(T* p, const float (&x)[U]) {
  if constexpr (U == 1) {
    *p = from_f32<T>(x[0]);
  } else {
    cuda::Pack<T> v;
#pragma unroll
    for (int e = 0; e < U; ++e) v.v[e] = from_f32<T>(x[e]);
    cuda::store_pack(p, v);
  }
}

// RoPE's table: {cos a, sin a} at [t][i] for a = t * theta^(-2i/Dh), i < Dh/2, t < n / (Dh/2).
__global__ void decode_rope_table_fill(float2* __restrict__ table, long n, int half, int Dh, double theta) {
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const long t = idx / half;
  const int i = static_cast<int>(idx % half);
  double sn, cs;
  sincos(static_cast<double>(t) * pow(theta, -2.0 * i / Dh), &sn, &cs);
  table[idx] = make_float2(static_cast<float>(cs), static_cast<float>(sn));
}

const float2* decode_rope_table(float theta, int Dh, int max_seq, Context& ctx) {
  const int half = Dh / 2;
  const long n = static_cast<long>(max_seq) * half;
  uint32_t bits = 0;
  std::memcpy(&bits, &theta, sizeof bits);
  const std::string key = "decode rope theta=" + std::to_string(bits) + " Dh=" + std::to_string(Dh) +
                          " positions=" + std::to_string(max_seq);
  return static_cast<const float2*>(ctx.device_table(key, static_cast<size_t>(n) * sizeof(float2), [&](void* at) {
    if (n == 0) return;
    decode_rope_table_fill<<<ceil_div(n, 256), 256, 0, ctx.stream()>>>(static_cast<float2*>(at), n, half, Dh,
                                                                       static_cast<double>(theta));
    TS_CHECK_LAUNCH();
  }));
}

// kv_append: thread (b, i, hh, j) over `heads` = 2 Hkv (+ H with RoPE) heads: hh < Hkv writes key head hh into
// the cache rotated, Hkv <= hh < 2 Hkv writes value head hh - Hkv as it is, 2 Hkv <= hh rotates query head
// hh - 2 Hkv in place (only with RoPE). Unit j holds elements [jU, jU + U) and [Dh/2 + jU, Dh/2 + jU + U); with
// U = 1 and an odd Dh (no RoPE) unit j = Dh/2 is the last element alone. Position t = pos[b] + i; t outside
// [0, max_seq) or a table slot outside [0, S) writes nothing.
template <typename T, int U>
__global__ void __launch_bounds__(kThreads)
    kv_append_rotate_units(Shape g, T* __restrict__ cache_k, T* __restrict__ cache_v, Rows<T> q, Rows<const T> k_new,
                           Rows<const T> v_new, const int32_t* __restrict__ pos, const int32_t* __restrict__ slots,
                           const float2* __restrict__ rope, int heads, int units) {
  cuda::dependent_prologue();
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long>(g.B) * g.Tq * heads * units) return;
  const int j = static_cast<int>(idx % units);
  long rest = idx / units;
  const int hh = static_cast<int>(rest % heads);
  rest /= heads;
  const int i = static_cast<int>(rest % g.Tq), b = static_cast<int>(rest / g.Tq);
  const long t_long = static_cast<long>(pos[b]) + i;
  if (t_long < 0 || t_long >= g.max_seq) return;
  const int t = static_cast<int>(t_long), half = g.Dh / 2;
  const bool lone = U == 1 && j == half;  // unit Dh/2 of an odd Dh: the last element alone
  const int e1 = lone ? g.Dh - 1 : j * U, e2 = half + j * U;
  const T* src;
  T* dst;
  bool rotate = rope != nullptr;
  if (hh < 2 * g.Hkv) {
    const bool is_k = hh < g.Hkv;
    const int kvh = is_k ? hh : hh - g.Hkv;
    const int s = table_slot(g, slots, b, t);
    if (s < 0 || s >= g.S) return;
    src = (is_k ? k_new : v_new).at(b, i, kvh);
    dst = (is_k ? cache_k : cache_v) + cache_row(g, s, kvh, t);
    rotate = rotate && is_k;
  } else {
    dst = q.at(b, i, hh - 2 * g.Hkv);
    src = dst;
  }
  float x1[U], x2[U];
  load_unit<T, U>(src + e1, x1);
  if (lone) {
    store_unit<T, U>(dst + e1, x1);
    return;
  }
  load_unit<T, U>(src + e2, x2);
  if (rotate) {
    const float2* cs = rope + static_cast<long>(t) * half + e1;
#pragma unroll
    for (int e = 0; e < U; ++e) {
      const float2 c = cs[e];
      const float a = x1[e], bb = x2[e];
      x1[e] = a * c.x - bb * c.y;
      x2[e] = bb * c.x + a * c.y;
    }
  }
  store_unit<T, U>(dst + e1, x1);
  store_unit<T, U>(dst + e2, x2);
}

template <typename T>
constexpr int decode_keys() {
  return sizeof(T) == 4 ? 32 : 64;  // key rows per tile: K and V tiles together stay near 33 KB of shared memory
}
// Shared-memory row stride of a K / V tile: an odd number of 4-byte words, so that threads reading one element of
// consecutive rows hit different banks.
template <typename T, int kDp>
constexpr int decode_stride() {
  return kDp + 4 / static_cast<int>(sizeof(T));
}

// Rows [0, nk) of a K and a V tile: keys t0 + k of sequence b, KV head kvh, through the slot table (a slot outside
// [0, S) reads slot 0's row, never memory outside the cache). vec: 16-byte loads (Dh a whole number of packs,
// cache 16-byte aligned).
template <typename T, int kDp>
__device__ __forceinline__ void load_kv_tile(T* __restrict__ ks, T* __restrict__ vs, const T* __restrict__ cache_k,
                                             const T* __restrict__ cache_v, const Shape& g,
                                             const int32_t* __restrict__ slots, int b, int kvh, int t0, int nk,
                                             bool vec) {
  constexpr int kStride = decode_stride<T, kDp>();
  constexpr int kV = cuda::Pack<T>::kVec;
  const int unit = vec ? kV : 1, units = g.Dh / unit;
  for (int idx = threadIdx.x; idx < nk * units; idx += kThreads) {
    const int k = idx / units, d = (idx - k * units) * unit, t = t0 + k;
    int s = table_slot(g, slots, b, t);
    s = (s >= 0 && s < g.S) ? s : 0;
    const long row = cache_row(g, s, kvh, t) + d;
    T* kd = ks + k * kStride + d;
    T* vd = vs + k * kStride + d;
    if (vec) {
      const cuda::Pack<T> a = cuda::load_pack(cache_k + row), c = cuda::load_pack(cache_v + row);
#pragma unroll
      for (int e = 0; e < kV; ++e) kd[e] = a.v[e], vd[e] = c.v[e];
    } else {
      *kd = cache_k[row];
      *vd = cache_v[row];
    }
  }
}

// The decode's split pass. Block (z, g_chunk, b): KV head kvh = g_chunk / n_chunks, rows [r0, r0 + rows) of the
// group's R = (H / Hkv) Tq query rows, r0 = (g_chunk % n_chunks) kRows; row rr is query head
// kvh (H / Hkv) + rr / Tq, new token i = rr % Tq, which sees keys t < n_i = min(pos[b] + i + 1, max_seq).
// The sequence's keys [0, n), n = min(pos[b] + Tq, max_seq), go to splits of `per` keys each:
//   per = max(ceil(n / splits), min_per) rounded up to a multiple of align;  split z: [z per, min(n, (z + 1) per)).
// direct (splits == 1): out = acc / l. Else partial (m, l) at part_ml[row_id splits + z] and acc at
// part_o[(row_id splits + z) Dh + d], row_id = (b H + h) Tq + i.
template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads)
    attention_decode_split_kv(Shape g, Rows<T> out, Rows<const T> q, const T* __restrict__ cache_k,
                              const T* __restrict__ cache_v, const int32_t* __restrict__ pos,
                              const int32_t* __restrict__ slots, int splits, int min_per, int align, int n_chunks,
                              float scale, bool vec, float2* __restrict__ part_ml, float* __restrict__ part_o,
                              uint32_t* __restrict__ counters) {
  cuda::dependent_prologue();
  constexpr int kKeys = decode_keys<T>(), kStride = decode_stride<T, kDp>(), kAcc = kRows * kDp / kThreads;
  static_assert(kRows * kDp % kThreads == 0, "every (row, column) of the block's output has one owner");
  __shared__ float qs[kRows * kDp];
  __shared__ __align__(16) T ks[kKeys * kStride];
  __shared__ __align__(16) T vs[kKeys * kStride];
  __shared__ float ps[kRows * kKeys];
  __shared__ float row_m[kRows], row_l[kRows], row_alpha[kRows];
  __shared__ int row_n[kRows];

  const int z = blockIdx.x, kvh = blockIdx.y / n_chunks, b = blockIdx.z;
  const int group = g.H / g.Hkv, R = group * g.Tq, r0 = (blockIdx.y % n_chunks) * kRows;
  const int rows = min(kRows, R - r0);
  const long P = pos[b];
  const int n = clamp_keys(P + g.Tq, g.max_seq);
  int per = max((n + splits - 1) / splits, min_per);
  per = (per + align - 1) / align * align;
  const int t_begin = static_cast<int>(min(static_cast<long>(z) * per, static_cast<long>(n)));
  const int t_end = min(n, t_begin + per);

  for (int idx = threadIdx.x; idx < rows * kDp; idx += kThreads) {
    const int r = idx / kDp, d = idx - r * kDp, rr = r0 + r;
    qs[idx] = d < g.Dh ? to_f32(q.at(b, rr % g.Tq, kvh * group + rr / g.Tq)[d]) * scale : 0.0f;
  }
  if (threadIdx.x < rows) {
    const int i = (r0 + threadIdx.x) % g.Tq;
    row_n[threadIdx.x] = clamp_keys(P + i + 1, g.max_seq);
    row_m[threadIdx.x] = -INFINITY;
    row_l[threadIdx.x] = 0.0f;
  }
  float acc[kAcc];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) acc[a] = 0.0f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int t0 = t_begin; t0 < t_end; t0 += kKeys) {
    const int nk = min(kKeys, t_end - t0);
    __syncthreads();  // the previous tile's reads of ks, vs, ps are done (the first time: qs and row_* written)
    load_kv_tile<T, kDp>(ks, vs, cache_k, cache_v, g, slots, b, kvh, t0, nk, vec);
    __syncthreads();
    // Scores of (row r, key k); masked (causal, or past the tile) -inf.
    for (int idx = threadIdx.x; idx < rows * kKeys; idx += kThreads) {
      const int r = idx / kKeys, k = idx - r * kKeys;
      float s = -INFINITY;
      if (k < nk && t0 + k < row_n[r]) {
        const float* qr = qs + r * kDp;
        const T* kr = ks + k * kStride;
        s = 0.0f;
        for (int d = 0; d < g.Dh; ++d) s = fmaf(qr[d], to_f32(kr[d]), s);
      }
      ps[idx] = s;
    }
    __syncthreads();
    // Online softmax, one warp per row: m' = max(m, max_k S), P = e^(S - m'), l = l e^(m - m') + Σ P.
    for (int r = warp; r < rows; r += kThreads / 32) {
      float mx = -INFINITY;
      for (int k = lane; k < kKeys; k += 32) mx = fmaxf(mx, ps[r * kKeys + k]);
      mx = cuda::warp_max(mx);
      const float m_old = row_m[r], m_new = fmaxf(m_old, mx);
      const float shift = m_new == -INFINITY ? 0.0f : m_new;  // a row with no visible key yet stays at 0
      float sum = 0.0f;
      for (int k = lane; k < kKeys; k += 32) {
        const float e = expf(ps[r * kKeys + k] - shift);
        ps[r * kKeys + k] = e;
        sum += e;
      }
      sum = cuda::warp_sum(sum);
      // Every lane has read row_m[r] (m_old) before lane 0 overwrites it: a shuffle orders no shared-memory access,
      // a warp barrier does.
      __syncwarp();
      if (lane == 0) {
        const float alpha = expf(m_old - shift);
        row_alpha[r] = alpha;
        row_l[r] = row_l[r] * alpha + sum;
        row_m[r] = m_new;
      }
    }
    __syncthreads();
    // acc(r, d) = acc e^(m - m') + Σ_k P(r, k) V(k, d); element a of this thread is (r, d) = divmod(tid + a kThreads,
    // kDp).
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const int e = threadIdx.x + a * kThreads, r = e / kDp, d = e - r * kDp;
      if (r >= rows || d >= g.Dh) continue;
      float o = acc[a] * row_alpha[r];
      const float* pr = ps + r * kKeys;
      for (int k = 0; k < nk; ++k) o = fmaf(pr[k], to_f32(vs[k * kStride + d]), o);
      acc[a] = o;
    }
  }
  __syncthreads();  // row_m, row_l final (and written at all when this split has no keys)
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    const int e = threadIdx.x + a * kThreads, r = e / kDp, d = e - r * kDp;
    if (r >= rows || d >= g.Dh) continue;
    const int rr = r0 + r, i = rr % g.Tq, h = kvh * group + rr / g.Tq;
    if (splits == 1) {
      const float l = row_l[r];
      out.at(b, i, h)[d] = from_f32<T>(l > 0.0f ? acc[a] / l : 0.0f);
    } else {
      const long part = ((static_cast<long>(b) * g.H + h) * g.Tq + i) * splits + z;
      part_o[part * g.Dh + d] = acc[a];
      if (d == 0) part_ml[part] = make_float2(row_m[r], row_l[r]);
    }
  }
  if (splits == 1) return;
  // The combine, in the last of the row chunk's splits to finish (the others have written their partials):
  //   M = max_z m_z,  out = Σ_z e^(m_z - M) out_z / Σ_z e^(m_z - M) l_z   (an empty split: m = -inf, l = 0, out 0)
  if (!cuda::last_block_of_chunk(counters + static_cast<long>(b) * gridDim.y + blockIdx.y,
                                 static_cast<uint32_t>(splits)))
    return;
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    const int e = threadIdx.x + a * kThreads, r = e / kDp, d = e - r * kDp;
    if (r >= rows || d >= g.Dh) continue;
    const int rr = r0 + r, i = rr % g.Tq, h = kvh * group + rr / g.Tq;
    const long row_id = (static_cast<long>(b) * g.H + h) * g.Tq + i;
    const float2* ml = part_ml + row_id * splits;
    float M = -INFINITY;
    for (int zz = 0; zz < splits; ++zz) M = fmaxf(M, __ldcg(ml + zz).x);
    float L = 0.0f, o = 0.0f;
    for (int zz = 0; zz < splits; ++zz) {
      const float2 sz = __ldcg(ml + zz);
      const float w = sz.x == -INFINITY ? 0.0f : expf(sz.x - M);
      L = fmaf(w, sz.y, L);
      o = fmaf(w, __ldcg(part_o + (row_id * splits + zz) * g.Dh + d), o);
    }
    out.at(b, i, h)[d] = from_f32<T>(L > 0.0f ? o / L : 0.0f);
  }
}

// Calls f(std::integral_constant<int, kDp>{}) for the narrowest compiled head width kDp >= Dh.
template <typename F>
void dispatch_decode_pad(int Dh, F&& f) {
  if (Dh <= 32) f(std::integral_constant<int, 32>{});
  else if (Dh <= 64) f(std::integral_constant<int, 64>{});
  else if (Dh <= kAttentionMaxDh) f(std::integral_constant<int, 128>{});
  else TS_THROW("attention_decode: the CUDA kernels take head dims up to ", kAttentionMaxDh, ", got ", Dh);
}

bool strides_in_packs(const AttentionView<const void>& v, int kV) {
  return cuda::aligned16(v.data) && v.sb % kV == 0 && v.st % kV == 0 && v.sh % kV == 0;
}

// The automatic split count: enough (split, KV head, row chunk, sequence) blocks for two per SM, each split at
// least kMinKeysPerSplit of the max_seq keys a sequence can have (the kernel then spreads the real length).
int decode_auto_splits(const DecodeAttentionParams& p, int n_chunks, int sm_count) {
  const long blocks = static_cast<long>(p.B) * p.Hkv * n_chunks;
  const long want = (2L * std::max(sm_count, 1) + blocks - 1) / std::max(blocks, 1L);
  const long most = (static_cast<long>(p.max_seq) + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return static_cast<int>(std::clamp(want, 1L, std::max(most, 1L)));
}
}  // namespace

void kv_append_cuda(const DecodeAttentionParams& p, DType dtype, void* cache_k, void* cache_v, AttentionView<void> q,
                    AttentionView<const void> k_new, AttentionView<const void> v_new, const int32_t* pos,
                    const int32_t* slots, Context& ctx) {
  if (p.B == 0) return;
  const bool rope_on = p.rope_theta > 0.0f;
  const float2* rope = rope_on ? decode_rope_table(p.rope_theta, p.Dh, p.max_seq, ctx) : nullptr;
  const int heads = 2 * p.Hkv + (rope_on ? p.H : 0), half = p.Dh / 2;
  const Shape g = shape_of(p);
  cuda::dispatch_float(dtype, "kv_append", [&](auto t) {
    using T = decltype(t);
    constexpr int kV = cuda::Pack<T>::kVec;
    const AttentionView<const void> qc{q.data, q.sb, q.st, q.sh};
    const bool vec = half % kV == 0 && half > 0 && cuda::aligned16(cache_k) && cuda::aligned16(cache_v) &&
                     strides_in_packs(qc, kV) && strides_in_packs(k_new, kV) && strides_in_packs(v_new, kV);
    const int units = vec ? half / kV : (p.Dh + 1) / 2;
    const long threads = static_cast<long>(p.B) * p.Tq * heads * units;
    auto launch = [&](auto kernel) {
      cuda::launch(kernel, dim3(ceil_div(threads, kThreads)), dim3(kThreads), 0, ctx, g, static_cast<T*>(cache_k),
                   static_cast<T*>(cache_v), rows_of<T>(q), rows_of<const T>(k_new), rows_of<const T>(v_new), pos,
                   slots, rope, heads, units);
      TS_CHECK_LAUNCH();
    };
    if (vec) launch(kv_append_rotate_units<T, kV>);
    else launch(kv_append_rotate_units<T, 1>);
  });
}

void attention_decode_cuda(const DecodeAttentionParams& p, DType dtype, AttentionView<void> out,
                           AttentionView<const void> q, const void* cache_k, const void* cache_v, const int32_t* pos,
                           const int32_t* slots, Context& ctx) {
  if (p.B == 0) return;
  const int group = p.H / p.Hkv, n_chunks = static_cast<int>(ceil_div(static_cast<long>(group) * p.Tq, kRows));
  TS_CHECK(static_cast<long>(p.Hkv) * n_chunks <= 65535 && p.B <= 65535, "attention_decode: Hkv x ceil(H / Hkv x ",
           "Tq / ", kRows, ") and B must be at most 65535");
  const bool automatic = p.splits == 0;
  const int splits = automatic ? decode_auto_splits(p, n_chunks, ctx.gpu().sm_count) : p.splits;
  const long n_rows = static_cast<long>(p.B) * p.H * p.Tq;
  float2* part_ml = nullptr;
  float* part_o = nullptr;
  if (splits > 1) {
    const size_t parts = static_cast<size_t>(n_rows) * splits;
    part_ml = static_cast<float2*>(ctx.scratch(parts * (sizeof(float2) + sizeof(float) * p.Dh)));
    part_o = reinterpret_cast<float*>(part_ml + parts);
  }
  // One arrival counter per (sequence, KV head, row chunk): the combine runs in the last split of each.
  uint32_t* counters = nullptr;
  if (splits > 1) {
    TS_CHECK(static_cast<long>(p.B) * p.Hkv * n_chunks <= Context::kArrivalCounters, "attention_decode: B x Hkv x ",
             "row chunks must be at most ", Context::kArrivalCounters, " with split KV");
    counters = ctx.arrival_counters();
  }
  const Shape g = shape_of(p);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh)));
  cuda::dispatch_float(dtype, "attention_decode", [&](auto t) {
    using T = decltype(t);
    constexpr int kV = cuda::Pack<T>::kVec;
    const bool vec = p.Dh % kV == 0 && cuda::aligned16(cache_k) && cuda::aligned16(cache_v);
    const int min_per = automatic ? kMinKeysPerSplit : 1, align = automatic ? decode_keys<T>() : 1;
    dispatch_decode_pad(p.Dh, [&](auto pad) {
      constexpr int kDp = decltype(pad)::value;
      cuda::launch(attention_decode_split_kv<T, kDp>, dim3(splits, p.Hkv * n_chunks, p.B), dim3(kThreads), 0, ctx, g,
                   rows_of<T>(out), rows_of<const T>(q), static_cast<const T*>(cache_k), static_cast<const T*>(cache_v),
                   pos, slots, splits, min_per, align, n_chunks, scale, vec, part_ml, part_o, counters);
      TS_CHECK_LAUNCH();
    });
  });
}

}  // namespace tessera
