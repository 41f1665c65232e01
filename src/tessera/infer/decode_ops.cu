// The engine's small ops on the GPU (decode_ops.h): each a single launch with no host sync, so the decode step that
// holds them is graph-capturable. Each kernel launches through cuda::launch (a programmatic dependent under
// Context::pdl) and begins with the wait, before any global access.
#include <cstdint>

#include "tessera/core/cuda_check.h"
#include "tessera/core/cuda_util.cuh"
#include "tessera/infer/decode_ops.h"

namespace tessera {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::to_f32;

// One block per row b, threads over its C columns: out[b, c] = scale * wte[tok, c] + wpe[t, c] (f32 arithmetic,
// one rounding to T as the embedding kernel does), or 0 for the padding id.
template <typename T>
__global__ void decode_embedding_kernel(DecodeEmbeddingParams p, T* __restrict__ out,
                                        const int32_t* __restrict__ tokens, const int32_t* __restrict__ pos,
                                        const T* __restrict__ wte, const T* __restrict__ wpe) {
  cuda::dependent_prologue();
  const int b = blockIdx.x;
  const int32_t tok = tokens[b];
  T* o = out + static_cast<int64_t>(b) * p.C;
  if (tok == p.padding_id) {
    for (int c = threadIdx.x; c < p.C; c += blockDim.x) o[c] = from_f32<T>(0.0f);
    return;
  }
  const int32_t id = min(max(tok, 0), p.V - 1);
  const int32_t t = min(max(pos[b], 0), p.max_seq - 1);
  const T* e = wte + static_cast<int64_t>(id) * p.C;
  const T* w = wpe ? wpe + static_cast<int64_t>(t) * p.C : nullptr;
  for (int c = threadIdx.x; c < p.C; c += blockDim.x)
    o[c] = from_f32<T>(p.scale * to_f32(e[c]) + (w ? to_f32(w[c]) : 0.0f));
}

// One block of 1024 threads per row: each thread keeps the best (value, lowest id) of its strided columns, then
// warp shuffles and one pass over the warps' winners keep the larger value, the lower id on a tie. NaN never replaces a
// value (comparisons with NaN are false), and -inf starts each lane with id V (replaced by any finite or -inf column:
// see below).
constexpr int kArgmaxThreads = 1024;
template <typename T>
__global__ void greedy_argmax_kernel(int V, int64_t ld, const T* __restrict__ logits, int32_t* __restrict__ out) {
  cuda::dependent_prologue();
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  const T* row = logits + blockIdx.x * ld;
  float best = -INFINITY;
  int id = V;  // none yet
  // kBatch loads are issued before any is compared, so that a lane waits for memory once per batch rather than
  // once per column (the row is read a few columns per lane: the loop is bound by load latency, not bandwidth).
  constexpr int kBatch = 8;
  const int stride = static_cast<int>(blockDim.x);
  for (int v0 = threadIdx.x; v0 < V; v0 += kBatch * stride) {
    float x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) x[u] = v0 + u * stride < V ? to_f32(row[v0 + u * stride]) : 0.0f;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = v0 + u * stride;
      // The first column a lane sees is taken unless NaN (a row of -inf then still names its lowest id); later
      // ones only when strictly greater (ids rise along the lane, so the lowest wins a tie).
      if (v < V && (x[u] > best || (id == V && x[u] == best))) {
        best = x[u];
        id = v;
      }
    }
  }
  // (best, id) pairs merge by: a real id (< V) over none, then the larger value, then the lower id. Within each
  // warp by shuffles, then the warps' winners in warp 0.
  const auto merge = [V](float& mv, int& mi, float ov, int oi) {
    if (oi < V && (mi == V || ov > mv || (ov == mv && oi < mi))) mv = ov, mi = oi;
  };
  const auto warp_merge = [&](float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, i, o);
      merge(v, i, ov, oi);
    }
  };
  warp_merge(best, id);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sv[warp] = best, si[warp] = id;
  __syncthreads();
  if (warp == 0) {
    best = lane < kArgmaxThreads / 32 ? sv[lane] : -INFINITY;
    id = lane < kArgmaxThreads / 32 ? si[lane] : V;
    warp_merge(best, id);
    if (lane == 0) out[blockIdx.x] = id == V ? 0 : id;
  }
}

__global__ void positions_advance_kernel(int n, int32_t* pos) {
  cuda::dependent_prologue();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < n) pos[b] += 1;
}

// One thread per (row, position).
__global__ void slot_reorder_kernel(int S, int max_seq, const int32_t* __restrict__ parents,
                                    const int32_t* __restrict__ pos_in, const int32_t* __restrict__ slots_in,
                                    int32_t* __restrict__ pos_out, int32_t* __restrict__ slots_out) {
  cuda::dependent_prologue();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(S) * max_seq) return;
  const int b = static_cast<int>(i / max_seq), t = static_cast<int>(i % max_seq);
  const int p = min(max(parents[b], 0), S - 1);
  const int n = min(max(pos_in[p], 0), max_seq);
  if (t == 0) pos_out[b] = pos_in[p];
  slots_out[i] = t < n ? slots_in[static_cast<int64_t>(p) * max_seq + t] : slots_in[i];
}

}  // namespace

void decode_embedding_cuda(const DecodeEmbeddingParams& p, DType dtype, void* out, const int32_t* tokens,
                           const int32_t* pos, const void* wte, const void* wpe, Context& ctx) {
  if (p.B == 0) return;
  cuda::dispatch_float(dtype, "decode_embedding", [&](auto t) {
    using T = decltype(t);
    const int threads = p.C >= 256 ? 256 : ((p.C + 31) / 32) * 32;
    cuda::launch(decode_embedding_kernel<T>, dim3(p.B), dim3(threads), 0, ctx, p, static_cast<T*>(out), tokens, pos,
                 static_cast<const T*>(wte), static_cast<const T*>(wpe));
  });
  TS_CHECK_LAUNCH();
}

void greedy_argmax_cuda(int B, int V, int64_t ld, DType dtype, const void* logits, int32_t* out, Context& ctx) {
  if (B == 0) return;
  cuda::dispatch_float(dtype, "greedy_argmax", [&](auto t) {
    using T = decltype(t);
    cuda::launch(greedy_argmax_kernel<T>, dim3(B), dim3(kArgmaxThreads), 0, ctx, V, ld, static_cast<const T*>(logits),
                 out);
  });
  TS_CHECK_LAUNCH();
}

void positions_advance_cuda(int n, int32_t* pos, Context& ctx) {
  if (n == 0) return;
  cuda::launch(positions_advance_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, ctx, n, pos);
  TS_CHECK_LAUNCH();
}

void slot_reorder_cuda(int S, int max_seq, const int32_t* parents, const int32_t* pos_in, const int32_t* slots_in,
                       int32_t* pos_out, int32_t* slots_out, Context& ctx) {
  const int64_t n = static_cast<int64_t>(S) * max_seq;
  if (n == 0) return;
  cuda::launch(slot_reorder_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, ctx, S, max_seq, parents, pos_in, slots_in,
               pos_out, slots_out);
  TS_CHECK_LAUNCH();
}

}  // namespace tessera

namespace tessera {

void copy_device_to_host_async(void* pinned_host, const void* device, size_t bytes, Context& ctx) {
  TS_CHECK_CUDA(cudaMemcpyAsync(pinned_host, device, bytes, cudaMemcpyDeviceToHost, ctx.stream()));
}

}  // namespace tessera
