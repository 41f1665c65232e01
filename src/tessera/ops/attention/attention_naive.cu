// Naive (materialized) attention: the CUDA element-wise pieces. See attention_naive.h.
#include <cmath>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/attention_naive.h"

namespace tessera {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::to_f32;

constexpr int kRowThreads = 256;

// One thread per element of dst (B*H, T, Dh) <- src (B*T, ld) at column col + h*Dh (split), or the reverse
// (merge: dst (B*T, ld) at column col + h*Dh <- src (B*H, T, Dh)).
template <typename T, bool kSplit>
__global__ void attention_heads_copy(T* __restrict__ dst, const T* __restrict__ src, int64_t ld, int64_t col,
                                     int seq_len, int H, int Dh, int64_t n) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int d = static_cast<int>(idx % Dh);
  const int64_t rest = idx / Dh;
  const int t = static_cast<int>(rest % seq_len);
  const int64_t bh = rest / seq_len;
  const int h = static_cast<int>(bh % H);
  const int64_t b = bh / H;
  const int64_t strided = (b * seq_len + t) * ld + col + static_cast<int64_t>(h) * Dh + d;
  if (kSplit) dst[idx] = src[strided];
  else dst[strided] = src[idx];
}

// s: (B*H*T rows, T) in place. One block per row: max, sum of exp (f32, from the stored scores), then
// P = exp(s - max) / sum rounded to T (0 past the diagonal when causal); lse = max + log(sum).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    attention_softmax_rows_block(T* __restrict__ s, float* __restrict__ lse, int seq_len, bool causal) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  T* row = s + r * seq_len;
  const int n = causal ? static_cast<int>(r % seq_len) + 1 : seq_len;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += kRowThreads) mx = fmaxf(mx, to_f32(row[j]));
  mx = cuda::block_max(mx, red);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += kRowThreads) sum += expf(to_f32(row[j]) - mx);
  sum = cuda::block_sum(sum, red);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < seq_len; j += kRowThreads)
    row[j] = from_f32<T>(j < n ? expf(to_f32(row[j]) - mx) * inv : 0.0f);
  if (threadIdx.x == 0) lse[r] = mx + logf(sum);
}

// dp: (rows, T) in place: dS = P ∘ (dP - rowsum(P ∘ dP)), one block per row, f32 sums.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    attention_softmax_backward_rows_block(T* __restrict__ dp, const T* __restrict__ prob, int seq_len) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  T* d = dp + r * seq_len;
  const T* pr = prob + r * seq_len;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < seq_len; j += kRowThreads) dot = fmaf(to_f32(pr[j]), to_f32(d[j]), dot);
  dot = cuda::block_sum(dot, red);
  for (int j = threadIdx.x; j < seq_len; j += kRowThreads) d[j] = from_f32<T>(to_f32(pr[j]) * (to_f32(d[j]) - dot));
}

template <bool kSplit>
void heads_copy(const AttentionParams& p, DType dtype, void* dst, const void* src, int64_t ld, int64_t col,
                Context& ctx) {
  const int64_t n = static_cast<int64_t>(p.B) * p.H * p.T * p.Dh;
  if (n == 0) return;
  cuda::dispatch_float(dtype, "attention_naive", [&](auto t) {
    using T = decltype(t);
    attention_heads_copy<T, kSplit><<<ceil_div(n, 256), 256, 0, ctx.stream()>>>(static_cast<T*>(dst),
                                                                                static_cast<const T*>(src), ld, col,
                                                                                p.T, p.H, p.Dh, n);
    TS_CHECK_LAUNCH();
  });
}

}  // namespace

void attention_heads_split_cuda(const AttentionParams& p, DType dtype, void* dst, const void* src, int64_t ld,
                                int64_t col, Context& ctx) {
  heads_copy<true>(p, dtype, dst, src, ld, col, ctx);
}

void attention_heads_merge_cuda(const AttentionParams& p, DType dtype, void* dst, int64_t ld, int64_t col,
                                const void* src, Context& ctx) {
  heads_copy<false>(p, dtype, dst, src, ld, col, ctx);
}

void attention_softmax_rows_cuda(const AttentionParams& p, DType dtype, void* s, float* lse, Context& ctx) {
  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.T;
  if (rows == 0) return;
  TS_CHECK(rows <= 0x7fffffff, "attention_naive_forward: too many rows");
  cuda::dispatch_float(dtype, "attention_naive_forward", [&](auto t) {
    using T = decltype(t);
    attention_softmax_rows_block<T>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, ctx.stream()>>>(static_cast<T*>(s), lse, p.T, p.causal);
    TS_CHECK_LAUNCH();
  });
}

void attention_softmax_backward_rows_cuda(const AttentionParams& p, DType dtype, void* dp, const void* prob,
                                          Context& ctx) {
  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.T;
  if (rows == 0) return;
  TS_CHECK(rows <= 0x7fffffff, "attention_naive_backward: too many rows");
  cuda::dispatch_float(dtype, "attention_naive_backward", [&](auto t) {
    using T = decltype(t);
    attention_softmax_backward_rows_block<T>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, ctx.stream()>>>(static_cast<T*>(dp),
                                                                        static_cast<const T*>(prob), p.T);
    TS_CHECK_LAUNCH();
  });
}

}  // namespace tessera
