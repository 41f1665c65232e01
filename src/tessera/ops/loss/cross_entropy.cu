// Cross-entropy kernels (see cross_entropy.h for the math and the launch strategy).
#include <algorithm>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/loss/cross_entropy.h"

namespace tessera {
namespace {

using cuda::from_f32;
using cuda::to_f32;

constexpr int kCeMaxThreads = 512;
constexpr int kLossSumThreads = 1024;

// A row split for 16-byte accesses: `head` scalar elements until the row pointer is 16-byte aligned, then
// `packs` aligned Pack<T>s, then the scalar tail [head + packs * kVec, V). vec = false makes the whole row the
// head (the scalar path). Rows of an odd V in a 16-bit dtype start at every 2-byte offset, so the head varies by
// row; a T* is always sizeof(T)-aligned, so the head is a whole number of elements.
template <typename T>
struct RowSplit {
  int head, packs;
  __device__ RowSplit(const T* row, int V, bool vec) {
    constexpr int kVec = cuda::Pack<T>::kVec;
    if (!vec) {
      head = V;
      packs = 0;
      return;
    }
    const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(row) & 15) / sizeof(T));
    head = min(V, mis ? kVec - mis : 0);
    packs = (V - head) / kVec;
  }
};

// The online softmax state of a set of values (m = max, s = Σ exp(x - m)), with the accurate expf.
using OnlineMaxSum = cuda::OnlineMaxSum</*kFastExp=*/false>;

// logits: (N, V) T row-major, rows ld apart; targets: (N) i32; losses, lse: (N) f32. Grid N, one block per row. Each
// thread runs the online max/sum and Σ logits over its elements (one read of the row), then the block merges the states
// in a fixed order (warp shuffles, then the warps' results in lane order: cuda::block_max_sum and cuda::block_sum):
//   lse = m + log s,   loss = lse - (1 - eps) z[y] - (eps / V) Σ z   (0 when y == ignore_index, NaN if y invalid)
template <typename T>
__global__ void __launch_bounds__(kCeMaxThreads)
    cross_entropy_forward_online_row(float* __restrict__ losses, float* __restrict__ lse, const T* __restrict__ logits,
                                     const int32_t* __restrict__ targets, int V, int64_t ld, float eps,
                                     int ignore_index) {
  constexpr int kVec = cuda::Pack<T>::kVec;
  const int row = blockIdx.x;
  const T* z = logits + static_cast<size_t>(row) * ld;
  const RowSplit<T> split(z, V, /*vec=*/true);
  OnlineMaxSum st;
  float zsum = 0.0f;
  for (int j = threadIdx.x; j < split.head; j += blockDim.x) {
    const float x = to_f32(z[j]);
    st.add(x);
    zsum += x;
  }
  const cuda::Pack<T>* body = reinterpret_cast<const cuda::Pack<T>*>(z + split.head);
  for (int k = threadIdx.x; k < split.packs; k += blockDim.x) {
    const cuda::Pack<T> pk = body[k];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float x = to_f32(pk.v[i]);
      st.add(x);
      zsum += x;
    }
  }
  for (int j = split.head + split.packs * kVec + threadIdx.x; j < V; j += blockDim.x) {
    const float x = to_f32(z[j]);
    st.add(x);
    zsum += x;
  }
  __shared__ float sm_m[32], sm_s[32], sm_z[32];
  const float zs = cuda::block_sum(zsum, sm_z);
  const OnlineMaxSum all = cuda::block_max_sum(st, sm_m, sm_s);
  if (threadIdx.x != 0) return;
  const float l = all.m + logf(all.s);
  lse[row] = l;
  const int32_t y = targets[row];
  float loss;
  if (y == ignore_index) loss = 0.0f;
  else if (y < 0 || y >= V) loss = NAN;
  else loss = l - (1.0f - eps) * to_f32(z[y]) - eps / static_cast<float>(V) * zs;
  losses[row] = loss;
}

// losses, targets: (N). One block; thread t sums rows t, t + blockDim, ... in f64, then a fixed-order block
// reduction: sum_mean = {Σ losses, Σ losses / count}, count = #(targets != ignore_index).
__global__ void __launch_bounds__(kLossSumThreads)
    cross_entropy_loss_sum_block(float* __restrict__ sum_mean, int32_t* __restrict__ count,
                                 const float* __restrict__ losses, const int32_t* __restrict__ targets, int N,
                                 int ignore_index) {
  double s = 0.0;
  int c = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    s += losses[n];
    c += targets[n] != ignore_index;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    c += __shfl_xor_sync(0xffffffffu, c, o);
  }
  __shared__ double sm_s[32];
  __shared__ int sm_c[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
    sm_s[warp] = s;
    sm_c[warp] = c;
  }
  __syncthreads();
  if (warp != 0) return;
  s = lane < warps ? sm_s[lane] : 0.0;
  c = lane < warps ? sm_c[lane] : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    c += __shfl_xor_sync(0xffffffffu, c, o);
  }
  if (lane == 0) {
    sum_mean[0] = static_cast<float>(s);
    sum_mean[1] = c ? static_cast<float>(s / c) : 0.0f;
    if (count) count[0] = c;
  }
}

// d_logits, logits: (N, V) T, rows ld apart, possibly the same memory; lse, targets: (N). Grid N, one block per row:
//   d[j] = (exp(z[j] - lse) - eps / V - (j == y ? 1 - eps : 0)) * scale,  scale = d_loss / max(count, 1)
// and d = 0 on an ignored row. Each element is read, then written, by the same thread, so the in-place case needs
// no synchronization. vec requires d_logits and logits to share their offset within 16 bytes.
template <typename T>
__global__ void __launch_bounds__(kCeMaxThreads)
    cross_entropy_backward_inplace_row(T* d_logits, const T* logits, const float* __restrict__ lse,
                                       const int32_t* __restrict__ targets, const int32_t* __restrict__ count, int V,
                                       int64_t ld, float eps, int ignore_index, float d_loss, bool vec) {
  constexpr int kVec = cuda::Pack<T>::kVec;
  const int row = blockIdx.x;
  const size_t off = static_cast<size_t>(row) * ld;
  const T* z = logits + off;
  T* d = d_logits + off;
  const int32_t y = targets[row];
  const bool ignored = y == ignore_index;
  const float scale = count ? d_loss / static_cast<float>(max(count[0], 1)) : d_loss;
  const float l = ignored ? 0.0f : lse[row], smooth = eps / static_cast<float>(V), on = 1.0f - eps;
  auto grad = [&](int j, float x) {  // ignored is uniform over the block: no divergence
    return from_f32<T>(ignored ? 0.0f : (expf(x - l) - smooth - (j == y ? on : 0.0f)) * scale);
  };
  const RowSplit<T> split(z, V, vec);
  for (int j = threadIdx.x; j < split.head; j += blockDim.x) d[j] = grad(j, to_f32(z[j]));
  const cuda::Pack<T>* zb = reinterpret_cast<const cuda::Pack<T>*>(z + split.head);
  cuda::Pack<T>* db = reinterpret_cast<cuda::Pack<T>*>(d + split.head);
  for (int k = threadIdx.x; k < split.packs; k += blockDim.x) {
    const cuda::Pack<T> pz = zb[k];
    cuda::Pack<T> pd;
    const int j0 = split.head + k * kVec;
#pragma unroll
    for (int i = 0; i < kVec; ++i) pd.v[i] = grad(j0 + i, to_f32(pz.v[i]));
    db[k] = pd;
  }
  for (int j = split.head + split.packs * kVec + threadIdx.x; j < V; j += blockDim.x) d[j] = grad(j, to_f32(z[j]));
}

// targets: (N) i32 -> count[0] = #(targets != ignore_index). One block; each thread counts a strided slice, then a
// fixed-order block sum (an integer sum: exact in any order anyway).
__global__ void __launch_bounds__(kLossSumThreads)
    cross_entropy_count_block(int32_t* __restrict__ count, const int32_t* __restrict__ targets, int N,
                              int ignore_index) {
  int c = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) c += targets[n] != ignore_index;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  __shared__ int sm_c[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) sm_c[warp] = c;
  __syncthreads();
  if (warp != 0) return;
  c = lane < warps ? sm_c[lane] : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if (lane == 0) count[0] = c;
}

// 16 bytes global -> shared without passing through registers (sm_80+): the copies of a whole row can be in flight
// at once, which a register-staged loop (a few loads per thread) cannot match.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Shared memory for one row of the fused kernel: V elements, plus up to kVec - 1 of shift so that the row's
// 16-byte-aligned body lands 16-byte aligned in shared memory too (rows of an odd V start at any 2-byte offset).
size_t fused_row_smem_bytes(int V, size_t elem_bytes) {
  return (static_cast<size_t>(V) + 16 / elem_bytes) * elem_bytes;
}

// Blocks per SM the fused kernel is built for: 2 rows of ~100 KB (bf16, V = 50257) fill a Hopper SM's 228 KB, and 2 ×
// 512 threads keeps registers at ≤ 64 a thread. While one block waits for its row, the other computes and stores.
constexpr int kFusedBlocksPerSm = 2;

// logits: (N, V) T row-major, rows ld apart, read then overwritten with the gradient; targets: (N) i32; losses,
// lse: (N) f32; count: (1) i32, written before this launch. Grid N, one block per row, dynamic shared memory
// fused_row_smem_bytes(V, sizeof(T)). The block
//   1. copies the row into shared memory s (cp.async for the aligned body, plain loads for the head and tail);
//   2. takes the max and Σ z over s, then Σ exp(z - max) (exp2f of (z - max) log2 e), each merged over the block
//      in a fixed order (deterministic):
//        lse = m + log s,  loss = lse - (1 - eps) z[y] - (eps / V) Σ z   (0 when y == ignore_index, NaN if y invalid)
//   3. writes d[j] = (exp(z[j] - lse) - eps / V - (j == y ? 1 - eps : 0)) * d_loss / max(count, 1) from s over the
//      row (0 on an ignored row).
// f32 state and the same lse in the gradient, as cross_entropy_forward_online_row and
// cross_entropy_backward_inplace_row; the exponentials are exp2f of the scaled difference (exact at 0), and the
// row's split among threads differs.
template <typename T>
__global__ void __launch_bounds__(kCeMaxThreads, kFusedBlocksPerSm)
    cross_entropy_forward_backward_smem_row(float* __restrict__ losses, float* __restrict__ lse, T* logits,
                                            const int32_t* __restrict__ targets, const int32_t* __restrict__ count,
                                            int V, int64_t ld, float eps, int ignore_index, float d_loss) {
  constexpr int kVec = cuda::Pack<T>::kVec;
  extern __shared__ __align__(16) unsigned char ce_row_smem[];
  const int row = blockIdx.x;
  T* z = logits + static_cast<size_t>(row) * ld;
  const RowSplit<T> split(z, V, /*vec=*/true);
  const int tail0 = split.head + split.packs * kVec;
  T* s = reinterpret_cast<T*>(ce_row_smem) + (split.head ? kVec - split.head : 0);  // s[j] holds z[j]
  cuda::Pack<T>* s_body = reinterpret_cast<cuda::Pack<T>*>(s + split.head);
  cuda::Pack<T>* z_body = reinterpret_cast<cuda::Pack<T>*>(z + split.head);

  // 1. The copy: the whole body in flight before the first wait.
  for (int k = threadIdx.x; k < split.packs; k += blockDim.x) cp_async_16(s_body + k, z_body + k);
  for (int j = threadIdx.x; j < split.head; j += blockDim.x) s[j] = z[j];
  for (int j = tail0 + threadIdx.x; j < V; j += blockDim.x) s[j] = z[j];
  cp_async_wait_all();

  // 2. Statistics from shared memory in two passes: the max (and Σ z), then Σ 2^((z - max) log2 e). With the whole
  // row at hand the online update's compare, branch and accurate expf per element are not needed: this kernel is
  // as much instruction-bound as memory-bound (gpt2-124m: 50304 logits a row, two exponentials each). exp(d) is
  // exp2f(d log2 e) of the difference d, so that d = 0 gives exactly 1 (a V = 1 row's gradient is exactly 0; the
  // FFMA form z log2 e - m log2 e leaves ~1e-7 there). Each pass merges over the block in a fixed order.
  __shared__ float sm_a[32], sm_b[32], sm_bcast;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  constexpr float kLog2e = 1.4426950408889634f;
  float mx = -INFINITY, zsum = 0.0f;
  for (int j = threadIdx.x; j < split.head; j += blockDim.x) {
    const float x = to_f32(s[j]);
    mx = fmaxf(mx, x);
    zsum += x;
  }
  for (int k = threadIdx.x; k < split.packs; k += blockDim.x) {
    const cuda::Pack<T> pk = s_body[k];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float x = to_f32(pk.v[i]);
      mx = fmaxf(mx, x);
      zsum += x;
    }
  }
  for (int j = tail0 + threadIdx.x; j < V; j += blockDim.x) {
    const float x = to_f32(s[j]);
    mx = fmaxf(mx, x);
    zsum += x;
  }
  mx = cuda::warp_max(mx);
  zsum = cuda::warp_sum(zsum);
  if (lane == 0) {
    sm_a[warp] = mx;
    sm_b[warp] = zsum;
  }
  __syncthreads();  // also: every thread's copies (and head/tail stores) are visible block-wide from here
  if (warp == 0) {
    const float m = cuda::warp_max(lane < warps ? sm_a[lane] : -INFINITY);
    if (lane == 0) sm_bcast = m;
  }
  __syncthreads();
  const float row_max = sm_bcast;
  const float shift = row_max == -INFINITY ? 0.0f : row_max;  // a row of -inf: Σ = 0, lse = -inf
  float sum = 0.0f;
  for (int j = threadIdx.x; j < split.head; j += blockDim.x) sum += exp2f((to_f32(s[j]) - shift) * kLog2e);
  for (int k = threadIdx.x; k < split.packs; k += blockDim.x) {
    const cuda::Pack<T> pk = s_body[k];
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum += exp2f((to_f32(pk.v[i]) - shift) * kLog2e);
  }
  for (int j = tail0 + threadIdx.x; j < V; j += blockDim.x) sum += exp2f((to_f32(s[j]) - shift) * kLog2e);
  sum = cuda::warp_sum(sum);
  __syncthreads();  // warp 0 has read sm_a
  if (lane == 0) sm_a[warp] = sum;
  __syncthreads();
  __shared__ float sm_lse;
  const int32_t y = targets[row];
  if (warp == 0) {
    const float total = cuda::warp_sum(lane < warps ? sm_a[lane] : 0.0f);
    const float zs = cuda::warp_sum(lane < warps ? sm_b[lane] : 0.0f);
    if (lane == 0) {
      const float l = row_max + logf(total);
      float loss;
      if (y == ignore_index) loss = 0.0f;
      else if (y < 0 || y >= V) loss = NAN;
      else loss = l - (1.0f - eps) * to_f32(s[y]) - eps / static_cast<float>(V) * zs;
      lse[row] = l;
      losses[row] = loss;
      sm_lse = l;
    }
  }
  __syncthreads();

  // 3. The gradient over the row, from shared memory (the global row is only written from here on).
  const bool ignored = y == ignore_index;  // uniform over the block: no divergence
  const float scale = d_loss / static_cast<float>(max(count[0], 1));
  const float l = ignored ? 0.0f : sm_lse, smooth = eps / static_cast<float>(V), on = 1.0f - eps;
  auto grad = [&](int j, float x) {  // exp(x - l) as exp2f((x - l) log2 e): see step 2
    return from_f32<T>(ignored ? 0.0f : (exp2f((x - l) * kLog2e) - smooth - (j == y ? on : 0.0f)) * scale);
  };
  for (int j = threadIdx.x; j < split.head; j += blockDim.x) z[j] = grad(j, to_f32(s[j]));
  for (int k = threadIdx.x; k < split.packs; k += blockDim.x) {
    const cuda::Pack<T> pz = s_body[k];
    cuda::Pack<T> pd;
    const int j0 = split.head + k * kVec;
#pragma unroll
    for (int i = 0; i < kVec; ++i) pd.v[i] = grad(j0 + i, to_f32(pz.v[i]));
    z_body[k] = pd;
  }
  for (int j = tail0 + threadIdx.x; j < V; j += blockDim.x) z[j] = grad(j, to_f32(s[j]));
}

// Threads per row block: enough for one 16-byte pack per thread up to kCeMaxThreads, a multiple of 32.
int ce_threads(int V, int vec) {
  const int want = (V + vec - 1) / vec;
  return std::clamp((want + 31) / 32 * 32, 32, kCeMaxThreads);
}

}  // namespace

void cross_entropy_forward_cuda(const CrossEntropyParams& p, DType dtype, float* losses, float* lse, const void* logits,
                                const int32_t* targets, Context& ctx) {
  if (p.N == 0) return;
  cuda::dispatch_float(dtype, "cross_entropy_forward", [&](auto t) {
    using T = decltype(t);
    cross_entropy_forward_online_row<T>
        <<<p.N, ce_threads(p.V, cuda::Pack<T>::kVec), 0, ctx.stream()>>>(losses, lse, static_cast<const T*>(logits),
                                                                         targets, p.V, p.row_stride(),
                                                                         p.label_smoothing, p.ignore_index);
    TS_CHECK_LAUNCH();
  });
}

void cross_entropy_loss_sum_cuda(const CrossEntropyParams& p, float* sum_mean, int32_t* count, const float* losses,
                                 const int32_t* targets, Context& ctx) {
  cross_entropy_loss_sum_block<<<1, kLossSumThreads, 0, ctx.stream()>>>(sum_mean, count, losses, targets, p.N,
                                                                        p.ignore_index);
  TS_CHECK_LAUNCH();
}

void cross_entropy_backward_cuda(const CrossEntropyParams& p, DType dtype, void* d_logits, const void* logits,
                                 const float* lse, const int32_t* targets, float d_loss, const int32_t* count,
                                 Context& ctx) {
  if (p.N == 0) return;
  const bool vec = ((reinterpret_cast<uintptr_t>(d_logits) - reinterpret_cast<uintptr_t>(logits)) & 15) == 0;
  cuda::dispatch_float(dtype, "cross_entropy_backward", [&](auto t) {
    using T = decltype(t);
    cross_entropy_backward_inplace_row<T>
        <<<p.N, ce_threads(p.V, cuda::Pack<T>::kVec), 0, ctx.stream()>>>(static_cast<T*>(d_logits),
                                                                         static_cast<const T*>(logits), lse, targets,
                                                                         count, p.V, p.row_stride(), p.label_smoothing,
                                                                         p.ignore_index, d_loss, vec);
    TS_CHECK_LAUNCH();
  });
}

bool cross_entropy_fused_row_fits(const CrossEntropyParams& p, DType dtype, const Context& ctx) {
  // The static shared memory of the block merge (~400 bytes) is counted with a margin.
  constexpr size_t kStaticMargin = 1024;
  return fused_row_smem_bytes(p.V, dtype_size(dtype)) + kStaticMargin <= ctx.gpu().smem_per_block_optin;
}

void cross_entropy_forward_backward_cuda(const CrossEntropyParams& p, DType dtype, float* losses, float* lse,
                                         void* logits, const int32_t* targets, float d_loss, int32_t* count,
                                         Context& ctx) {
  cross_entropy_count_block<<<1, kLossSumThreads, 0, ctx.stream()>>>(count, targets, p.N, p.ignore_index);
  TS_CHECK_LAUNCH();
  if (p.N == 0) return;
  if (!cross_entropy_fused_row_fits(p, dtype, ctx)) {
    cross_entropy_forward_cuda(p, dtype, losses, lse, logits, targets, ctx);
    cross_entropy_backward_cuda(p, dtype, logits, logits, lse, targets, d_loss, count, ctx);
    return;
  }
  cuda::dispatch_float(dtype, "cross_entropy_forward_backward", [&](auto t) {
    using T = decltype(t);
    const size_t smem = fused_row_smem_bytes(p.V, sizeof(T));
    const auto kernel = cross_entropy_forward_backward_smem_row<T>;
    TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    // All of the unified L1/shared storage as shared memory: 2 rows of ~100 KB per SM need it, and the kernel
    // reads every global byte once (nothing for L1 to cache).
    TS_CHECK_CUDA(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    kernel<<<p.N, ce_threads(p.V, cuda::Pack<T>::kVec), smem, ctx.stream()>>>(losses, lse, static_cast<T*>(logits),
                                                                              targets, count, p.V, p.row_stride(),
                                                                              p.label_smoothing, p.ignore_index,
                                                                              d_loss);
    TS_CHECK_LAUNCH();
  });
}

}  // namespace tessera
