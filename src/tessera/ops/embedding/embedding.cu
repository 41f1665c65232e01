// Fused embedding kernels: forward in one pass, backward by a device sort of rows by token id (see embedding.h).
#include <cub/cub.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
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
// r*C + c (1 without dropout). One thread per W-element unit (W = 16-byte pack or 1), grid-stride over a grid the
// GPU holds at once; C % W == 0, so a unit never straddles two rows.
// Each unit makes 2 dependent loads (the id, then the row); one unit a thread over a resident grid measured faster
// than the variants tried against it (bench/results/2026-12-01-one-wave-tails-h200.md,
// bench/results/2026-12-02-embedding-forward-variants-h200.md).
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

// A row's sort key: its token id, or V (after every real id) for padded and out-of-range rows.
__device__ __forceinline__ int32_t backward_key(int32_t tok, int V, int padding_id) {
  return (tok < 0 || tok >= V || tok == padding_id) ? V : tok;
}

// The radix sort's input (above kEmbeddingBucketSortMaxRows rows): keys[r] = backward_key(tokens[r]); rows[r] = r.
__global__ void embedding_backward_keys(int32_t* __restrict__ keys, int32_t* __restrict__ rows,
                                        const int32_t* __restrict__ tokens, int n, int V, int padding_id) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  keys[r] = backward_key(tokens[r], V, padding_id);
  rows[r] = r;
}

// The stable sort of the rows by key, as a bucket sort (the same output as a stable radix sort: keys ascending,
// each key's rows ascending). cub's radix sort is bound by latency at these sizes (several passes of few blocks);
// the bucket sort, a few short kernels, measured faster up to the limit below
// (bench/results/2026-12-01-embedding-bucket-sort-h200.md). Its
// ranking grows with the square of the largest bucket (step 3: every row one id costs about n² / 32 shuffles), so
// above kEmbeddingBucketSortMaxRows rows (embedding.h) the backward uses cub's radix sort, which grows linearly.
// Step 1: keys[r] = backward_key(tokens[r]); slot[r] = r's place
// among its key's rows in whatever order the integer atomics ran (counts zeroed before): one atomic per key a warp
// holds, the lanes that share it (text's frequent ids) taking consecutive slots. The float sums never use
// atomics, and step 3 makes the order deterministic.
__global__ void embedding_backward_count(int32_t* __restrict__ keys, int32_t* __restrict__ slot,
                                         int32_t* __restrict__ counts, const int32_t* __restrict__ tokens, int n, int V,
                                         int padding_id) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  const bool valid = r < n;
  const int32_t key = backward_key(valid ? tokens[r] : V, V, padding_id);
  const unsigned in = __ballot_sync(0xffffffffu, valid);
  if (!valid) return;
  const unsigned peers = __match_any_sync(in, key);
  const int lane = threadIdx.x & 31, leader = __ffs(peers) - 1;
  int first = 0;
  if (lane == leader) first = atomicAdd(&counts[key], __popc(peers));
  first = __shfl_sync(peers, first, leader);
  keys[r] = key;
  slot[r] = first + __popc(peers & ((1u << lane) - 1));
}

// Step 2, after offsets = the exclusive prefix sum of counts: bucket[offsets[key] + slot[r]] = r, each key's rows
// together in the atomics' order.
__global__ void embedding_backward_scatter(int32_t* __restrict__ bucket, const int32_t* __restrict__ keys,
                                           const int32_t* __restrict__ slot, const int32_t* __restrict__ offsets,
                                           int n) {
  cuda::allow_dependent_launch();
  cuda::wait_for_primary_grid();  // the prefix sum
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  bucket[offsets[keys[r]] + slot[r]] = r;
}

// Step 3: thread j takes bucket position j (row r, key k) and places it at offsets[k] + the number of k's rows
// below r: the stable order. A bucket of up to kWalk rows each lane walks alone (uniform ids: 1 or 2). A longer
// one (text's frequent ids: about 1400 of 16384 rows for GPT-2's most frequent id) the warp reads together, 32
// entries a coalesced load (kBigLoads of them in flight), each lane counting the entries below its row through
// shuffles, so that the loads overlap (a lone walk waits on one load after another). The rows of key
// V (padded / invalid, never summed) keep the atomics' order.
constexpr int kWalk = 64, kBigLoads = 4;
__global__ void embedding_backward_rank(int32_t* __restrict__ sorted_keys, int32_t* __restrict__ sorted_rows,
                                        const int32_t* __restrict__ bucket, const int32_t* __restrict__ keys,
                                        const int32_t* __restrict__ offsets, const int32_t* __restrict__ counts, int n,
                                        int V) {
  cuda::allow_dependent_launch();
  cuda::wait_for_primary_grid();  // the scatter
  const int j = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31;
  const bool valid = j < n;
  const int32_t r = valid ? bucket[j] : 0, key = valid ? keys[r] : V, base = valid ? offsets[key] : 0;
  const int m = key != V ? counts[key] : 0;
  int rank = j - base;
  const bool big = m > kWalk;
  if (key != V && !big) {
    rank = 0;
#pragma unroll 8
    for (int q = 0; q < m; ++q) rank += bucket[base + q] < r;
  }
  for (unsigned todo = __ballot_sync(0xffffffffu, big); todo;) {
    const int leader = __ffs(todo) - 1;
    const int gbase = __shfl_sync(0xffffffffu, base, leader), gm = __shfl_sync(0xffffffffu, m, leader);
    const bool mine = big && base == gbase;
    int below = 0;
    for (int q0 = 0; q0 < gm; q0 += 32 * kBigLoads) {  // kBigLoads loads in flight, then their entries counted
      int32_t v[kBigLoads];
#pragma unroll
      for (int u = 0; u < kBigLoads; ++u) {
        const int q = q0 + 32 * u + lane;
        v[u] = q < gm ? bucket[gbase + q] : INT32_MAX;
      }
#pragma unroll
      for (int u = 0; u < kBigLoads; ++u)
#pragma unroll
        for (int src = 0; src < 32; ++src) below += __shfl_sync(0xffffffffu, v[u], src) < r;
    }
    if (mine) rank = below;
    todo &= ~__ballot_sync(0xffffffffu, mine);
  }
  if (!valid) return;
  sorted_keys[base + rank] = key;
  sorted_rows[base + rank] = r;
}

// Long runs. Text makes runs of thousands of rows for its frequent ids, and one warp walking such a run alone
// would be the whole cost of the backward. So the sorted positions are cut into chunks
// of kChunk = 32 rows aligned to multiples of 32, and a run is summed piece by piece: its first piece (from its
// start to the end of its chunk) by the run's own warp, every later piece (a chunk that begins inside the run) by
// a warp of its own in an earlier launch, into partial[chunk] (f32). The run's warp then adds the partials in
// chunk order: a fixed order, so the result is deterministic, and no atomics. A run of L rows costs its warp at
// most 32 rows and L / 32 partials. Runs of one or two rows (uniform ids) see only the first piece: the same work
// as a walk, done with one coalesced load of the chunk's keys and rows instead of one load per row.
constexpr int kChunk = 32;  // = the warp: lane l reads the chunk's key and row at position chunk * 32 + l

// acc[k] += Σ_{q = 0..count-1} f · d_out[row_q, c0 + k] for the rows row_q = shfl(my_row, first + q) of this
// warp's chunk, in ascending q (the sorted order): the per-row loads are independent of each other (the row ids
// are already in registers), so the loop can keep several in flight.
template <typename T, int W>
__device__ __forceinline__ void embedding_sum_chunk_rows(float (&acc)[W], const T* __restrict__ d_out, int32_t my_row,
                                                         int first, int count, int c0, const EmbedArgs& a) {
#pragma unroll 4
  for (int q = 0; q < count; ++q) {
    const int32_t r = __shfl_sync(0xffffffffu, my_row, first + q);
    const int64_t e0 = static_cast<int64_t>(r) * a.C + c0;
    float g[W];
    if (c0 < a.C) cuda::load_f32<T, W>(d_out + e0, g);
    else {
#pragma unroll
      for (int k = 0; k < W; ++k) g[k] = 0.0f;
    }
    if (a.dropout > 0.0f) {
      float f[W];
      cuda::dropout_factors_w<W>(a.seed, a.stream, static_cast<uint64_t>(e0), a.dropout, a.keep_scale, f);
#pragma unroll
      for (int k = 0; k < W; ++k) g[k] *= f[k];
    }
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] += g[k];
  }
}

// Pass 1: partial[chunk, c] = Σ_{the rows of the chunk's run that lie in the chunk, ascending} f · d_out[r, c],
// for every chunk whose first position continues a run of a real token (its key equals the previous position's).
// sorted_keys, sorted_rows: (n); partial: (ceil(n / 32), C) f32, only those chunks' rows written. Grid
// (ceil(n / 32 / 8), ceil(C / W / 32)), 8 warps per block, warp i of the grid on chunk i; lane l owns columns
// (blockIdx.y*32 + l)*W .. +W-1. A chunk that starts a run (every chunk, on uniform ids) returns after 2 loads.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_wte_chunk_partials(float* __restrict__ partial, const T* __restrict__ d_out,
                                          const int32_t* __restrict__ sorted_keys,
                                          const int32_t* __restrict__ sorted_rows, int n, EmbedArgs a) {
  cuda::allow_dependent_launch();
  cuda::wait_for_primary_grid();  // the sort
  apply_stream_base(a);
  const int chunk = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int start = chunk * kChunk;
  if (start >= n || chunk == 0) return;
  // One round of loads: the chunk's keys and rows, and (lane 0) the key before the chunk, which with the chunk's
  // first key decides whether the chunk continues a run. (Loading those two first, then the chunk's keys and rows,
  // put two L2 round trips before the first d_out load.)
  const int pos = start + lane;
  const int32_t key = pos < n ? sorted_keys[pos] : a.V;
  const int32_t my_row = pos < n ? sorted_rows[pos] : 0;
  const int32_t before = __shfl_sync(0xffffffffu, lane == 0 ? sorted_keys[start - 1] : 0, 0);
  const int32_t tok = __shfl_sync(0xffffffffu, key, 0);
  if (tok == a.V || before != tok) return;
  // Sorted keys: the positions of tok form a prefix of the chunk.
  const int count = __popc(__ballot_sync(0xffffffffu, key == tok));
  const int c0 = (blockIdx.y * 32 + lane) * W;
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.0f;
  embedding_sum_chunk_rows<T, W>(acc, d_out, my_row, /*first=*/0, count, c0, a);
  if (c0 >= a.C) return;
  float* dst = partial + static_cast<int64_t>(chunk) * a.C + c0;
#pragma unroll
  for (int k = 0; k < W; ++k) dst[k] = acc[k];
}

// Pass 2: d_wte[tok, c] += scale * (first piece + Σ_{later chunks of the run, in order} partial[chunk, c]), where
// the first piece is Σ_{the run's rows in its first chunk, ascending} f_{r*C+c} * d_out[r, c].
// sorted_keys, sorted_rows: (n) from the stable sort, so the rows of one token are contiguous and ascending.
// Blocks (bx, by) of ceil(n / 8) x ceil(C / W / 32) (embedding_backward_wte_runs_and_wpe), 8 warps per block: warp
// i = 8 bx + w looks at sorted position i and, when i starts a run of a real token, sums the run; lane l owns
// columns (by*32 + l)*W .. +W-1. Each d_wte element is written by exactly one lane (one run per token), and its
// sum has a fixed order: deterministic.
template <typename T, int W>
__device__ __forceinline__ void embedding_backward_wte_sorted_runs(T* __restrict__ d_wte, const T* __restrict__ d_out,
                                                                   const int32_t* __restrict__ sorted_keys,
                                                                   const int32_t* __restrict__ sorted_rows,
                                                                   const float* __restrict__ partial, int n,
                                                                   const EmbedArgs& a, int bx, int by) {
  const int i = bx * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= n) return;
  const int chunk = i / kChunk, pos = chunk * kChunk + lane;
  // One round of loads: the chunk's keys and rows, and (lane 0, when i starts the chunk) the key before it; i's
  // key and the one before it come from those by shuffles. Loaded first on their own, those two keys would put a
  // second L2 round trip before the run's d_out loads.
  const int32_t key = pos < n ? sorted_keys[pos] : a.V;
  const int32_t my_row = pos < n ? sorted_rows[pos] : 0;
  const int at = i - chunk * kChunk;
  const int32_t outside = __shfl_sync(0xffffffffu, lane == 0 && at == 0 && i > 0 ? sorted_keys[i - 1] : -1, 0);
  const int32_t tok = __shfl_sync(0xffffffffu, key, at);
  const int32_t prev = __shfl_sync(0xffffffffu, key, at > 0 ? at - 1 : 0);
  if (tok == a.V || (at > 0 ? prev : outside) == tok) return;
  // The run's positions in this chunk: lanes i % 32 .. i % 32 + count - 1 (keys are sorted and the run starts
  // at i, so the lanes holding tok are exactly those).
  const unsigned in_run = __ballot_sync(0xffffffffu, key == tok);
  const int c0 = (by * 32 + lane) * W;
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.0f;
  embedding_sum_chunk_rows<T, W>(acc, d_out, my_row, /*first=*/i - chunk * kChunk, __popc(in_run), c0, a);
  // The run reaches its chunk's last position: the chunks after it that begin with tok continue it. Their first
  // keys are read 32 at a time (lane l: chunk c1 + l); they form a prefix, as the keys are sorted. The partials of
  // one batch are then independent loads, added in chunk order.
  for (int c1 = chunk + 1; in_run >> 31; c1 += 32) {
    const int64_t p1 = static_cast<int64_t>(c1 + lane) * kChunk;
    const int more = __popc(__ballot_sync(0xffffffffu, p1 < n && sorted_keys[p1] == tok));
    if (c0 < a.C) {
#pragma unroll 4
      for (int q = 0; q < more; ++q) {
        const float* src = partial + static_cast<int64_t>(c1 + q) * a.C + c0;
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] += src[k];
      }
    }
    if (more < 32) break;
  }
  if (c0 >= a.C) return;
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
__device__ __forceinline__ void embedding_backward_wpe_columns(T* __restrict__ d_wpe, const T* __restrict__ d_out,
                                                               const int32_t* __restrict__ tokens, int B, int64_t units,
                                                               const EmbedArgs& a, int bx) {
  const int64_t u = bx * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (u >= units) return;
  const int64_t e = u * W;  // offset within one (T, C) slab
  const int t = static_cast<int>(e / a.C);
  const int c0 = static_cast<int>(e - static_cast<int64_t>(t) * a.C);
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.0f;
    // The row's d_out is loaded whatever its token (the row exists; a padded or invalid one is then skipped), so
    // that the unrolled rows' loads do not wait on their tokens'.
#pragma unroll 4
  for (int b = 0; b < B; ++b) {
    const int64_t row = static_cast<int64_t>(b) * a.T + t;
    const int32_t tok = tokens[row];
    const int64_t e0 = row * a.C + c0;
    float g[W];
    cuda::load_f32<T, W>(d_out + e0, g);
    if (tok < 0 || tok >= a.V || tok == a.padding_id) continue;
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

// d_wpe and pass 2 in one launch: blocks [0, wpe_blocks) take d_wpe's columns, the rest pass 2 (block b =
// blockIdx.x - wpe_blocks is (b % runs_x, b / runs_x)). The two read the same d_out independently, so one launch
// saves one. Launched as a programmatic dependent (see
// embedding_backward_cuda), pass 2's blocks wait for the kernels before; d_wpe's need nothing they wrote and do not
// wait. Each of their threads walks B rows, the longest chain of loads in the launch, so they come first in the
// grid: there they start with the launch, beside the sort's last kernels, instead of being its tail.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_wte_runs_and_wpe(T* __restrict__ d_wte, T* __restrict__ d_wpe, const T* __restrict__ d_out,
                                        const int32_t* __restrict__ tokens, const int32_t* __restrict__ sorted_keys,
                                        const int32_t* __restrict__ sorted_rows, const float* __restrict__ partial,
                                        int n, int B, int64_t wpe_units, int runs_x, int wpe_blocks, EmbedArgs a) {
  apply_stream_base(a);
  const int blk = static_cast<int>(blockIdx.x);
  if (blk < wpe_blocks) {
    embedding_backward_wpe_columns<T, W>(d_wpe, d_out, tokens, B, wpe_units, a, blk);
  } else {
    // The sort and pass 1. This wait is also what makes the whole chain finished when this launch is: whatever
    // follows on the stream sees every write of it. Keep pass 2's blocks (at least one, and waiting before any
    // return) in this launch.
    cuda::wait_for_primary_grid();
    const int b = blk - wpe_blocks;
    embedding_backward_wte_sorted_runs<T, W>(d_wte, d_out, sorted_keys, sorted_rows, partial, n, a, b % runs_x,
                                             b / runs_x);
  }
}

EmbedArgs embed_args(const EmbeddingParams& p, const Context& ctx) {
  return {.T = p.T,
          .C = p.C,
          .V = p.V,
          .pos_offset = p.pos_offset,
          .padding_id = p.padding_id,
          .scale = p.scale,
          .dropout = p.dropout,
          .keep_scale = cuda::dropout_keep_scale(p.dropout),
          .seed = p.seed,
          .stream = p.stream,
          .stream_base = ctx.philox_stream_base()};
}

bool vector_ok(int C, int vec, std::initializer_list<const void*> ptrs) {
  if (C % vec != 0) return false;
  for (const void* p : ptrs)
    if (p && !cuda::aligned16(p)) return false;
  return true;
}

size_t align256(size_t b) { return (b + 255) & ~static_cast<size_t>(255); }

// Bits the radix sort needs for keys in [0, V]: the sentinel V included.
int key_bits(int V) {
  int bits = 1;
  while (bits < 31 && (1LL << bits) <= V) ++bits;
  return bits;
}
size_t radix_sort_bytes(int rows, int V) {
  size_t bytes = 0;
  TS_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), rows, 0, key_bits(V)));
  return bytes;
}
bool use_bucket_sort(int rows) { return rows <= kEmbeddingBucketSortMaxRows; }

// cub's temporary storage for the exclusive prefix sum of the V + 1 bucket counts.
size_t scan_bytes(int V) {
  size_t bytes = 0;
  TS_CHECK_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                              static_cast<int32_t*>(nullptr), V + 1));
  return bytes;
}

// The f32 partial sums of the chunks that continue a run: one row of C per chunk of kChunk sorted positions.
size_t chunk_partial_bytes(int rows, int C) {
  return align256(static_cast<size_t>(ceil_div(rows, kChunk)) * static_cast<size_t>(C) * sizeof(float));
}

// Scratch layout: keys, slots, bucket, sorted keys, sorted rows (rows int32 each); counts and offsets (V + 1
// int32 each); the chunk partials; cub's scan storage (or its radix sort's, above kEmbeddingBucketSortMaxRows rows).
struct BackwardScratch {
  int32_t *keys, *slot, *bucket, *sorted_keys, *sorted_rows, *counts, *offsets;
  float* partial;
  void* temp;
  size_t temp_bytes;  // cub's storage: the prefix sum's, or the radix sort's
};
size_t cub_temp_bytes(int rows, int V) { return use_bucket_sort(rows) ? scan_bytes(V) : radix_sort_bytes(rows, V); }
size_t backward_scratch_bytes(int rows, int V, int C, size_t temp_bytes) {
  return 5 * align256(static_cast<size_t>(rows) * sizeof(int32_t)) +
         2 * align256(static_cast<size_t>(V + 1) * sizeof(int32_t)) + chunk_partial_bytes(rows, C) +
         align256(temp_bytes);
}
BackwardScratch backward_scratch(int rows, int V, int C, Context& ctx) {
  const size_t arr = align256(static_cast<size_t>(rows) * sizeof(int32_t));
  const size_t cnt = align256(static_cast<size_t>(V + 1) * sizeof(int32_t));
  const size_t temp_bytes = cub_temp_bytes(rows, V);
  char* base = static_cast<char*>(ctx.scratch(backward_scratch_bytes(rows, V, C, temp_bytes)));
  BackwardScratch s{};
  s.keys = reinterpret_cast<int32_t*>(base);
  s.slot = reinterpret_cast<int32_t*>(base + arr);
  s.bucket = reinterpret_cast<int32_t*>(base + 2 * arr);
  s.sorted_keys = reinterpret_cast<int32_t*>(base + 3 * arr);
  s.sorted_rows = reinterpret_cast<int32_t*>(base + 4 * arr);
  s.counts = reinterpret_cast<int32_t*>(base + 5 * arr);
  s.offsets = reinterpret_cast<int32_t*>(base + 5 * arr + cnt);
  s.partial = reinterpret_cast<float*>(base + 5 * arr + 2 * cnt);
  s.temp = base + 5 * arr + 2 * cnt + chunk_partial_bytes(rows, C);
  s.temp_bytes = temp_bytes;
  return s;
}

}  // namespace

size_t embedding_backward_scratch_bytes(int rows, int V, int C) {
  return backward_scratch_bytes(rows, V, C, cub_temp_bytes(rows, V));
}

void embedding_forward_cuda(const EmbeddingParams& p, DType dtype, void* out, const int32_t* tokens, const void* wte,
                            const void* wpe, Context& ctx) {
  const int64_t BT = static_cast<int64_t>(p.B) * p.T;
  if (BT == 0) return;
  const EmbedArgs a = embed_args(p, ctx);
  cuda::dispatch_float(dtype, "embedding_forward", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::Pack<T>::kVec;
    const auto launch = [&](auto w) {
      constexpr int W = decltype(w)::value;
      const int64_t units = BT * p.C / W;
      constexpr auto kernel = embedding_forward_pack<T, W>;
      const unsigned grid = std::min<int64_t>(ceil_div(units, kThreads),
                                              int64_t{cuda::blocks_per_sm<kernel, kThreads>()} * ctx.gpu().sm_count);
      kernel<<<grid, kThreads, 0, ctx.stream()>>>(static_cast<T*>(out), tokens, static_cast<const T*>(wte),
                                                  static_cast<const T*>(wpe), units, a);
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

  const BackwardScratch sc = backward_scratch(n, p.V, p.C, ctx);
  int32_t* const sorted_keys = sc.sorted_keys;
  int32_t* const sorted_rows = sc.sorted_rows;
  float* const partial = sc.partial;
  const unsigned row_blocks = ceil_div(n, kThreads);
  size_t temp_bytes = sc.temp_bytes;
  // From the scatter on (after the radix sort: from pass 1 on), each kernel is a programmatic dependent of the one
  // before it (cuda::launch_dependent): it is launched while that one runs, and waits for its writes
  // (wait_for_primary_grid) before its first read of them; d_wpe's blocks of the last launch read nothing the chain
  // writes and never wait. The kernels before the chain (the memset, the count or keys kernel, cub's) are ordinary
  // launches, so the chain starts after everything earlier on the stream is done. Chaining hides the launch and the
  // ramp of each short kernel.
  if (use_bucket_sort(n)) {
    TS_CHECK_CUDA(cudaMemsetAsync(sc.counts, 0, static_cast<size_t>(p.V + 1) * sizeof(int32_t), ctx.stream()));
    embedding_backward_count<<<row_blocks, kThreads, 0, ctx.stream()>>>(sc.keys, sc.slot, sc.counts, tokens, n, p.V,
                                                                        p.padding_id);
    TS_CHECK_LAUNCH();
    TS_CHECK_CUDA(cub::DeviceScan::ExclusiveSum(sc.temp, temp_bytes, sc.counts, sc.offsets, p.V + 1, ctx.stream()));
    TS_CHECK_LAUNCH();
    cuda::launch_dependent(embedding_backward_scatter, dim3(row_blocks), dim3(kThreads), 0, ctx.stream(), sc.bucket,
                           static_cast<const int32_t*>(sc.keys), static_cast<const int32_t*>(sc.slot),
                           static_cast<const int32_t*>(sc.offsets), n);
    TS_CHECK_LAUNCH();
    cuda::launch_dependent(embedding_backward_rank, dim3(row_blocks), dim3(kThreads), 0, ctx.stream(), sorted_keys,
                           sorted_rows, static_cast<const int32_t*>(sc.bucket), static_cast<const int32_t*>(sc.keys),
                           static_cast<const int32_t*>(sc.offsets), static_cast<const int32_t*>(sc.counts), n, p.V);
    TS_CHECK_LAUNCH();
  } else {
    embedding_backward_keys<<<row_blocks, kThreads, 0, ctx.stream()>>>(sc.keys, sc.slot, tokens, n, p.V, p.padding_id);
    TS_CHECK_LAUNCH();
    TS_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sc.temp, temp_bytes, sc.keys, sorted_keys, sc.slot, sorted_rows, n, 0,
                                                  key_bits(p.V), ctx.stream()));
    TS_CHECK_LAUNCH();
  }

  cuda::dispatch_float(dtype, "embedding_backward", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::Pack<T>::kVec;
    const auto launch = [&](auto w) {
      constexpr int W = decltype(w)::value;
      const unsigned col_blocks = ceil_div(p.C / W, 32);
      const dim3 chunk_grid(ceil_div(ceil_div(n, kChunk), kWarps), col_blocks);
      cuda::launch_dependent(embedding_backward_wte_chunk_partials<T, W>, chunk_grid, dim3(kThreads), 0, ctx.stream(),
                             partial, static_cast<const T*>(d_out), static_cast<const int32_t*>(sorted_keys),
                             static_cast<const int32_t*>(sorted_rows), n, a);
      TS_CHECK_LAUNCH();
      const int runs_x = ceil_div(n, kWarps), runs_blocks = runs_x * static_cast<int>(col_blocks);
      const int64_t wpe_units = d_wpe ? static_cast<int64_t>(p.T) * p.C / W : 0;
      const int wpe_blocks = static_cast<int>(ceil_div(wpe_units, kThreads));
      cuda::launch_dependent(embedding_backward_wte_runs_and_wpe<T, W>, dim3(runs_blocks + wpe_blocks), dim3(kThreads),
                             0, ctx.stream(), static_cast<T*>(d_wte), static_cast<T*>(d_wpe),
                             static_cast<const T*>(d_out), tokens, static_cast<const int32_t*>(sorted_keys),
                             static_cast<const int32_t*>(sorted_rows), static_cast<const float*>(partial), n, p.B,
                             wpe_units, runs_x, wpe_blocks, a);
      TS_CHECK_LAUNCH();
    };
    if (vector_ok(p.C, V, {d_wte, d_wpe, d_out})) launch(std::integral_constant<int, V>{});
    else launch(std::integral_constant<int, 1>{});
  });
}

}  // namespace tessera
