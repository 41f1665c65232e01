// Beam top-k kernels: HARS retrieve (one block per row) and re-rank (one block per batch entry). See topk.h for
// the key, the order and why the retrieve's bound is safe.
#include <climits>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/topk/topk.h"

namespace tessera {
namespace {

using cuda::to_f32;

constexpr int kWarps = kTopkThreads / 32;
// The retrieve's shared list of candidates (keys >= R): 16 KB. Random rows of a 50K vocab keep a few hundred; a row
// whose ties overflow it (a constant row keeps all V) selects over the whole row instead.
constexpr int kListCap = 2048;
constexpr int kRerankThreads = 128;

// The op's order: key descending, then index ascending. An empty slot is (-inf, INT_MAX), after every selectable
// key (selectable keys are > -inf).
struct Cand {
  float key;
  int idx;
};
__device__ __forceinline__ bool before(const Cand& a, const Cand& b) {
  return a.key > b.key || (a.key == b.key && a.idx < b.idx);
}
__device__ __forceinline__ Cand none() { return {-INFINITY, INT_MAX}; }

// The key of topk.h, rounded step by step as the host writes it (no contraction can apply: no product).
__device__ __forceinline__ float key_of(float beam_score, float x, float lse) {
  return __fadd_rn(beam_score, __fsub_rn(x, lse));
}

__device__ __forceinline__ Cand warp_first(Cand c) {
  for (int o = 16; o > 0; o >>= 1) {
    const Cand d{__shfl_xor_sync(0xffffffffu, c.key, o), __shfl_xor_sync(0xffffffffu, c.idx, o)};
    if (before(d, c)) c = d;
  }
  return c;
}

// The first candidate (in the op's order) over a block of `warps` warps; every thread gets it. smem: >= 32 Cands.
__device__ Cand block_first(Cand c, Cand* smem, int warps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  c = warp_first(c);
  __syncthreads();  // smem may still be read from the previous call
  if (lane == 0) smem[warp] = c;
  __syncthreads();
  c = lane < warps ? smem[lane] : none();
  return warp_first(c);
}

// Online max and Σ exp(x - max) over a row's values, with the fast exponential.
using MaxSum = cuda::OnlineMaxSum</*kFastExp=*/true>;

// k rounds of a block argmax: round i picks the first candidate after round i-1's pick. `key_at(j, &c)` yields
// element j (j < n) of the source as a candidate, or false when it is not one. Writes k picks (empty slots padded
// (-inf, -1)) to out_s, out_i. Ties are exact: (key, idx) pairs are distinct, so each round picks one element.
template <typename KeyAt>
__device__ void select_top(int n, int k, KeyAt key_at, Cand* smem, float* out_s, int32_t* out_i) {
  Cand prev{INFINITY, -1};
  bool first = true;
  for (int round = 0; round < k; ++round) {
    Cand best = none();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      Cand c;
      if (!key_at(j, &c)) continue;
      if ((first || before(prev, c)) && before(c, best)) best = c;
    }
    best = block_first(best, smem, blockDim.x / 32);
    if (threadIdx.x == 0) {
      const bool has = best.idx != INT_MAX;
      out_s[round] = has ? best.key : -INFINITY;
      out_i[round] = has ? best.idx : -1;
    }
    prev = best;
    first = false;
  }
}

// logits: (B*K, ld) T; beam_scores, lse: (B*K) f32; cand_s, cand_i: (B*K, k); counts: (B*K) or null;
// G = beam_topk_groups(k).
// Grid B*K, block kTopkThreads; thread t reads the columns j ≡ t (mod kTopkThreads).
template <typename T>
__global__ void __launch_bounds__(kTopkThreads)
    beam_topk_retrieve_row(float* cand_s, int32_t* cand_i, float* lse_out, int32_t* counts, const T* logits,
                           const float* beam_scores, int V, int64_t ld, int K, int k, int G) {
  __shared__ Cand list[kListCap];
  __shared__ Cand red[32];
  __shared__ float ms[2][kWarps];
  __shared__ float gk[kTopkThreads];
  __shared__ int n_list;
  __shared__ float bound[2];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * ld;
  const int beam = static_cast<int>(r % K), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) n_list = 0;

  // Pass 1: the row's max and sum over its non-NaN, non -inf values (a -inf adds 0, and would make
  // exp(-inf + inf) while the sum is empty), and this thread's group max (fmaxf ignores NaN).
  MaxSum st;
  float gmax = -INFINITY;
  for (int j = tid; j < V; j += kTopkThreads) {
    const float x = to_f32(row[j]);
    if (isnan(x)) continue;
    if (x > -INFINITY) st.add(x);
    gmax = fmaxf(gmax, x);
  }
  const MaxSum all = cuda::block_max_sum(st, ms[0], ms[1]);
  if (tid == 0) bound[0] = all.m > -INFINITY ? all.m + logf(all.s) : -INFINITY;
  __syncthreads();
  const float lse = bound[0], bs = beam_scores[r];
  // R: the min over the G non-empty groups of their max key; -inf (no filter) with fewer than k of them. Group g
  // is the columns j ≡ g (mod G), which are the columns of the threads t ≡ g (mod G) (G divides kTopkThreads):
  // its max key is the max of those threads' max keys (a thread without columns holds -inf; fmaxf ignores NaN).
  gk[tid] = key_of(bs, gmax, lse);
  __syncthreads();
  float gkey = INFINITY;
  if (tid < G && tid < V) {
    float m = -INFINITY;
    for (int t = tid; t < kTopkThreads; t += G) m = fmaxf(m, gk[t]);
    gkey = m;
  }
  for (int o = 16; o > 0; o >>= 1) gkey = fminf(gkey, __shfl_xor_sync(0xffffffffu, gkey, o));
  if (lane == 0) ms[0][warp] = gkey;
  __syncthreads();
  if (warp == 0) {
    float m = lane < kWarps ? ms[0][lane] : INFINITY;
    for (int o = 16; o > 0; o >>= 1) m = fminf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) bound[1] = min(V, G) < k ? -INFINITY : m;
  }
  __syncthreads();
  const float R = bound[1];
  auto candidate = [&](int j, Cand* c) {
    const float key = key_of(bs, to_f32(row[j]), lse);
    *c = {key, beam * V + j};
    return key >= R && key > -INFINITY;
  };

  // Pass 2: the keys >= R into the shared list.
  for (int j = tid; j < V; j += kTopkThreads) {
    Cand c;
    if (!candidate(j, &c)) continue;
    const int pos = atomicAdd(&n_list, 1);
    if (pos < kListCap) list[pos] = c;
  }
  __syncthreads();
  const int n = n_list;
  if (tid == 0) {
    lse_out[r] = lse;
    if (counts) counts[r] = n;
  }
  float* out_s = cand_s + r * k;
  int32_t* out_i = cand_i + r * k;
  if (n <= kListCap) {
    select_top(
        n, k,
        [&](int j, Cand* c) {
          *c = list[j];
          return true;
        },
        red, out_s, out_i);
  } else {
    select_top(V, k, candidate, red, out_s, out_i);
  }
}

// cand_s, cand_i: (B, K*k), the rows' picks; scores, indices: (B, k). Grid B, block kRerankThreads.
__global__ void __launch_bounds__(kRerankThreads)
    beam_topk_rerank_entry(float* scores, int32_t* indices, const float* cand_s, const int32_t* cand_i, int K, int k) {
  __shared__ Cand red[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * K * k;
  select_top(
      K * k, k,
      [&](int j, Cand* c) {
        *c = {cand_s[base + j], cand_i[base + j]};
        return c->key > -INFINITY;
      },
      red, scores + static_cast<int64_t>(blockIdx.x) * k, indices + static_cast<int64_t>(blockIdx.x) * k);
}

}  // namespace

void beam_topk_cuda(const BeamTopkParams& p, DType dtype, float* scores, int32_t* indices, float* lse, int32_t* counts,
                    const void* logits, const float* beam_scores, float* cand_scores, int32_t* cand_indices,
                    Context& ctx) {
  if (p.B == 0) return;
  cuda::dispatch_float(dtype, "beam_topk", [&](auto t) {
    using T = decltype(t);
    beam_topk_retrieve_row<T><<<p.B * p.K, kTopkThreads, 0, ctx.stream()>>>(cand_scores, cand_indices, lse, counts,
                                                                            static_cast<const T*>(logits), beam_scores,
                                                                            p.V, p.row_stride(), p.K, p.k,
                                                                            beam_topk_groups(p.k));
    TS_CHECK_LAUNCH();
  });
  beam_topk_rerank_entry<<<p.B, kRerankThreads, 0, ctx.stream()>>>(scores, indices, cand_scores, cand_indices, p.K,
                                                                   p.k);
  TS_CHECK_LAUNCH();
}

}  // namespace tessera
