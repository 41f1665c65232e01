// Fused embedding kernels: forward in one pass, backward by a device sort of rows by token id (see embedding.h).
#include <cub/cub.cuh>

#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "tessera/ops/embedding/embedding.h"
#include "tessera/ops/residual/elementwise_cuda.cuh"

namespace tessera {
namespace {

using cuda::ceil_div;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct EmbedArgs {
  int T, C, V, pos_offset, padding_id;
  float scale, dropout, keep_scale;
  uint64_t seed, stream;
  const uint64_t* stream_base;  // Context::philox_stream_base (CUDA graphs): the stream drawn is *stream_base + stream
};

// The Philox stream the kernel draws: a's own, plus the graph's base when one is set.
__device__ __forceinline__ void apply_stream_base(EmbedArgs& a) {
  if (a.stream_base && a.dropout > 0.0f) a.stream += *a.stream_base;
}

// out[r, c] = 0                                              if tokens[r] == padding_id
//           = NaN                                            if tokens[r] is outside [0, V) (see embedding.h)
//           = f_{r*C+c} * (scale * wte[tok, c] + wpe[pos_offset + r % T, c])   otherwise (no wpe term when null)
// tokens: (B*T) i32; wte: (V, C); wpe: (max_seq, C) or null; out: (B*T, C). f is the dropout factor of element
// r*C + c (1 without dropout). One thread per W-element unit (W = 16-byte pack or 1), grid-stride; C % W == 0,
// so a unit never straddles two rows.
template <typename T, int W>
__global__ void embedding_forward_pack(T* __restrict__ out, const int32_t* __restrict__ tokens,
                                       const T* __restrict__ wte, const T* __restrict__ wpe, int64_t units,
                                       EmbedArgs a) {
  apply_stream_base(a);
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e0 = u * W;
    // 32-bit division when the index fits (64-bit division is a long software sequence).
    const int64_t row =
        e0 <= 0xffffffffLL ? static_cast<int64_t>(static_cast<uint32_t>(e0) / static_cast<uint32_t>(a.C)) : e0 / a.C;
    const int c0 = static_cast<int>(e0 - row * a.C);
    const int32_t tok = tokens[row];
    float v[W];
    if (tok < 0 || tok >= a.V) {
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = __int_as_float(0x7fc00000);  // quiet NaN
    } else if (tok == a.padding_id) {
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = 0.0f;
    } else {
      cuda::load_f32<T, W>(wte + static_cast<int64_t>(tok) * a.C + c0, v);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] *= a.scale;
      if (wpe) {
        const int t = static_cast<int>(row % a.T);
        float pos[W];
        cuda::load_f32<T, W>(wpe + static_cast<int64_t>(a.pos_offset + t) * a.C + c0, pos);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] += pos[k];
      }
      if (a.dropout > 0.0f) {
        float f[W];
        cuda::dropout_factors_w<W>(a.seed, a.stream, static_cast<uint64_t>(e0), a.dropout, a.keep_scale, f);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] *= f[k];
      }
    }
    cuda::store_f32<T, W>(out + e0, v);
  }
}

// Sort input: keys[r] = tokens[r], or V (after every real id) for padded and out-of-range rows; rows[r] = r.
__global__ void embedding_backward_keys(int32_t* __restrict__ keys, int32_t* __restrict__ rows,
                                        const int32_t* __restrict__ tokens, int n, int V, int padding_id) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const int32_t tok = tokens[r];
  keys[r] = (tok < 0 || tok >= V || tok == padding_id) ? V : tok;
  rows[r] = r;
}

// d_wte[tok, c] += scale * Σ_{rows r of tok, ascending} f_{r*C+c} * d_out[r, c].
// sorted_keys, sorted_rows: (n) from the stable radix sort, so the rows of one token are contiguous and ascending.
// Grid (ceil(n / 8), ceil(C / W / 32)), 8 warps per block: warp i of the grid looks at sorted position i and, when
// i starts a run of a real token, walks the run; lane l owns columns (blockIdx.y*32 + l)*W .. +W-1. Each d_wte
// element is written by exactly one lane (one run per token), and its sum has a fixed order: deterministic.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_wte_sorted_runs(T* __restrict__ d_wte, const T* __restrict__ d_out,
                                       const int32_t* __restrict__ sorted_keys,
                                       const int32_t* __restrict__ sorted_rows, int n, EmbedArgs a) {
  apply_stream_base(a);
  const int i = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= n) return;
  const int32_t tok = sorted_keys[i];
  if (tok == a.V || (i > 0 && sorted_keys[i - 1] == tok)) return;
  const int c0 = (blockIdx.y * 32 + lane) * W;
  if (c0 >= a.C) return;
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.0f;
  // The run is walked kGroup rows at a time: the group's keys and row ids, then its d_out rows, are loaded together
  // (kGroup loads in flight, where a row-by-row walk had one: text's frequent ids make runs of hundreds of rows),
  // and added in the run's order, so the sum is the row-by-row sum, bit for bit. The keys are sorted, so the rows of
  // the run in a group are a prefix of it.
  constexpr int kGroup = 4;
  for (int j = i;; j += kGroup) {
    int64_t e[kGroup];
    bool in[kGroup];
#pragma unroll
    for (int q = 0; q < kGroup; ++q) {
      in[q] = j + q < n && sorted_keys[j + q] == tok;
      e[q] = in[q] ? static_cast<int64_t>(sorted_rows[j + q]) * a.C + c0 : 0;
    }
    float g[kGroup][W];
#pragma unroll
    for (int q = 0; q < kGroup; ++q)
      if (in[q]) cuda::load_f32<T, W>(d_out + e[q], g[q]);
#pragma unroll
    for (int q = 0; q < kGroup; ++q) {
      if (!in[q]) break;
      if (a.dropout > 0.0f) {
        float f[W];
        cuda::dropout_factors_w<W>(a.seed, a.stream, static_cast<uint64_t>(e[q]), a.dropout, a.keep_scale, f);
#pragma unroll
        for (int k = 0; k < W; ++k) g[q][k] *= f[k];
      }
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] += g[q][k];
    }
    if (!in[kGroup - 1]) break;
  }
  T* dw = d_wte + static_cast<int64_t>(tok) * a.C + c0;
  float cur[W];
  cuda::load_f32<T, W>(dw, cur);
#pragma unroll
  for (int k = 0; k < W; ++k) cur[k] += a.scale * acc[k];
  cuda::store_f32<T, W>(dw, cur);
}

// d_wpe[pos_offset + t, c] += Σ_{b = 0..B-1, in order, row r = b*T + t not padded / invalid} f_{r*C+c} d_out[r, c].
// One thread per (t, W-element unit): units = T * C / W; coalesced along c. Each element written by one thread.
template <typename T, int W>
__global__ void embedding_backward_wpe_columns(T* __restrict__ d_wpe, const T* __restrict__ d_out,
                                               const int32_t* __restrict__ tokens, int B, int64_t units,
                                               EmbedArgs a) {
  apply_stream_base(a);
  const int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (u >= units) return;
  const int64_t e = u * W;  // offset within one (T, C) slab
  const int t = static_cast<int>(e / a.C);
  const int c0 = static_cast<int>(e - static_cast<int64_t>(t) * a.C);
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.0f;
#pragma unroll 4
  for (int b = 0; b < B; ++b) {
    const int64_t row = static_cast<int64_t>(b) * a.T + t;
    const int32_t tok = tokens[row];
    if (tok < 0 || tok >= a.V || tok == a.padding_id) continue;
    const int64_t e0 = row * a.C + c0;
    float g[W];
    cuda::load_f32<T, W>(d_out + e0, g);
    if (a.dropout > 0.0f) {
      float f[W];
      cuda::dropout_factors_w<W>(a.seed, a.stream, static_cast<uint64_t>(e0), a.dropout, a.keep_scale, f);
#pragma unroll
      for (int k = 0; k < W; ++k) g[k] *= f[k];
    }
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] += g[k];
  }
  T* dp = d_wpe + static_cast<int64_t>(a.pos_offset + t) * a.C + c0;
  float cur[W];
  cuda::load_f32<T, W>(dp, cur);
#pragma unroll
  for (int k = 0; k < W; ++k) cur[k] += acc[k];
  cuda::store_f32<T, W>(dp, cur);
}

EmbedArgs embed_args(const EmbeddingParams& p, const Context& ctx) {
  return {.T = p.T, .C = p.C, .V = p.V, .pos_offset = p.pos_offset, .padding_id = p.padding_id, .scale = p.scale,
          .dropout = p.dropout, .keep_scale = cuda::dropout_keep_scale(p.dropout), .seed = p.seed, .stream = p.stream,
          .stream_base = ctx.philox_stream_base()};
}

bool vector_ok(int C, int vec, std::initializer_list<const void*> ptrs) {
  if (C % vec != 0) return false;
  for (const void* p : ptrs)
    if (p && !cuda::aligned16(p)) return false;
  return true;
}

// Bits the radix sort needs for keys in [0, V]: the sentinel V included.
int key_bits(int V) {
  int bits = 1;
  while (bits < 31 && (1LL << bits) <= V) ++bits;
  return bits;
}

size_t align256(size_t b) { return (b + 255) & ~static_cast<size_t>(255); }

size_t cub_sort_bytes(int rows, int V) {
  size_t bytes = 0;
  TS_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), rows, 0, key_bits(V)));
  return bytes;
}

}  // namespace

size_t embedding_backward_scratch_bytes(int rows, int V) {
  return 4 * align256(static_cast<size_t>(rows) * sizeof(int32_t)) + align256(cub_sort_bytes(rows, V));
}

void embedding_forward_cuda(const EmbeddingParams& p, DType dtype, void* out, const int32_t* tokens,
                            const void* wte, const void* wpe, Context& ctx) {
  const int64_t BT = static_cast<int64_t>(p.B) * p.T;
  if (BT == 0) return;
  const EmbedArgs a = embed_args(p, ctx);
  cuda::dispatch_float(dtype, "embedding_forward", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::Pack<T>::kVec;
    const auto launch = [&](auto w) {
      constexpr int W = decltype(w)::value;
      const int64_t units = BT * p.C / W;
      const unsigned grid = std::min<int64_t>(ceil_div(units, kThreads), 2147483647LL);
      embedding_forward_pack<T, W><<<grid, kThreads, 0, ctx.stream()>>>(
          static_cast<T*>(out), tokens, static_cast<const T*>(wte), static_cast<const T*>(wpe), units, a);
      TS_CHECK_LAUNCH();
    };
    if (vector_ok(p.C, V, {out, wte, wpe})) launch(std::integral_constant<int, V>{});
    else launch(std::integral_constant<int, 1>{});
  });
}

void embedding_backward_cuda(const EmbeddingParams& p, DType dtype, void* d_wte, void* d_wpe, const void* d_out,
                             const int32_t* tokens, Context& ctx) {
  const int n = p.B * p.T;
  if (n == 0) return;
  const EmbedArgs a = embed_args(p, ctx);

  // Scratch: keys, rows, sorted keys, sorted rows, then cub's temporary storage.
  const size_t arr = align256(static_cast<size_t>(n) * sizeof(int32_t));
  size_t sort_bytes = cub_sort_bytes(n, p.V);
  char* base = static_cast<char*>(ctx.scratch(4 * arr + align256(sort_bytes)));
  int32_t* keys = reinterpret_cast<int32_t*>(base);
  int32_t* rows = reinterpret_cast<int32_t*>(base + arr);
  int32_t* sorted_keys = reinterpret_cast<int32_t*>(base + 2 * arr);
  int32_t* sorted_rows = reinterpret_cast<int32_t*>(base + 3 * arr);
  void* sort_temp = base + 4 * arr;

  embedding_backward_keys<<<ceil_div(n, kThreads), kThreads, 0, ctx.stream()>>>(keys, rows, tokens, n, p.V,
                                                                                   p.padding_id);
  TS_CHECK_LAUNCH();
  TS_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys, sorted_keys, rows, sorted_rows, n, 0,
                                                key_bits(p.V), ctx.stream()));
  TS_CHECK_LAUNCH();

  cuda::dispatch_float(dtype, "embedding_backward", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::Pack<T>::kVec;
    const auto launch = [&](auto w) {
      constexpr int W = decltype(w)::value;
      const dim3 grid(ceil_div(n, kWarps), ceil_div(p.C / W, 32));
      embedding_backward_wte_sorted_runs<T, W><<<grid, kThreads, 0, ctx.stream()>>>(
          static_cast<T*>(d_wte), static_cast<const T*>(d_out), sorted_keys, sorted_rows, n, a);
      TS_CHECK_LAUNCH();
      if (d_wpe) {
        const int64_t units = static_cast<int64_t>(p.T) * p.C / W;
        embedding_backward_wpe_columns<T, W><<<ceil_div(units, kThreads), kThreads, 0, ctx.stream()>>>(
            static_cast<T*>(d_wpe), static_cast<const T*>(d_out), tokens, p.B, units, a);
        TS_CHECK_LAUNCH();
      }
    };
    if (vector_ok(p.C, V, {d_wte, d_wpe, d_out})) launch(std::integral_constant<int, V>{});
    else launch(std::integral_constant<int, 1>{});
  });
}

}  // namespace tessera
