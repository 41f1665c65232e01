// tessera/core/cuda_util.cuh — device helpers shared by every CUDA kernel (CUDA sources only).
//
// Numerics: 16-bit values live only in memory; kernels convert to f32 on load (to_f32) and back on store
// (from_f32, round to nearest even), and keep every sum in f32 registers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "tessera/core/context.h"
#include "tessera/core/cuda_check.h"
#include "tessera/core/dtype.h"

namespace tessera::cuda {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// kVec elements of T in one 16-byte access.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kVec = 16 / sizeof(T);
  T v[kVec];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T>*>(p);
}

// U elements as stored (one 16-byte pack, U = Pack<T>::kVec, or one element), converted to f32 on use: a bf16 pack
// held this way is 4 registers where its f32 values are 8 (the norm and residual kernels load rows ahead in it).
template <typename T, int U>
struct RawUnit {
  T v[U];
};
template <typename T, int U>
__device__ __forceinline__ RawUnit<T, U> load_raw(const T* p) {
  RawUnit<T, U> r;
  if constexpr (U == 1) {
    r.v[0] = *p;
  } else {
    static_assert(U == Pack<T>::kVec, "a vector access is one 16-byte pack");
    const Pack<T> q = load_pack(p);
#pragma unroll
    for (int i = 0; i < U; ++i) r.v[i] = q.v[i];
  }
  return r;
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& v) {
  *reinterpret_cast<Pack<T>*>(p) = v;
}
template <typename T, int U>
__device__ __forceinline__ void store_raw(T* p, const RawUnit<T, U>& r) {
  if constexpr (U == 1) {
    *p = r.v[0];
  } else {
    static_assert(U == Pack<T>::kVec, "a vector access is one 16-byte pack");
    Pack<T> q;
#pragma unroll
    for (int i = 0; i < U; ++i) q.v[i] = r.v[i];
    store_pack(p, q);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block, returned to every thread. `smem` holds at least 32 floats. One __syncthreads pair;
// blockDim.x must be a multiple of 32. The order is fixed, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : -INFINITY;
  return warp_max(v);
}

// The online softmax statistics of a set of values: m = max, s = Σ exp(x - m). The empty set is (-inf, 0); merging
// it changes nothing. add(x) takes x > -inf, or x = -inf once m > -inf (it adds exp(-inf) = 0): a -inf added to
// the empty set makes s = exp(-inf - -inf), NaN. kFastExp picks __expf (ex2.approx: fewer instructions, a larger
// error) over expf.
template <bool kFastExp>
struct OnlineMaxSum {
  float m = -INFINITY, s = 0.0f;
  static __device__ __forceinline__ float exp(float x) {
    if constexpr (kFastExp) return __expf(x);
    else return expf(x);
  }
  __device__ __forceinline__ void add(float x) {
    if (x > m) {
      s = s * exp(m - x) + 1.0f;
      m = x;
    } else {
      s += exp(x - m);
    }
  }
  __device__ __forceinline__ void merge(float m2, float s2) {
    const float M = fmaxf(m, m2);
    if (M == -INFINITY) return;
    s = s * exp(m - M) + s2 * exp(m2 - M);
    m = M;
  }
};

// The statistics over the block, returned to every thread: each warp merges its lanes (xor butterfly), then every
// warp merges the warps' results, read in lane order, so the result is the same in every thread and deterministic.
// smem_m, smem_s hold at least blockDim.x / 32 floats each; the caller makes sure no thread still reads them. One
// __syncthreads; blockDim.x must be a multiple of 32.
template <bool kFastExp>
__device__ __forceinline__ OnlineMaxSum<kFastExp> block_max_sum(OnlineMaxSum<kFastExp> st, float* smem_m,
                                                                float* smem_s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    st.merge(__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o));
  }
  if (lane == 0) {
    smem_m[warp] = st.m;
    smem_s[warp] = st.s;
  }
  __syncthreads();
  OnlineMaxSum<kFastExp> all;
  if (lane < warps) {
    all.m = smem_m[lane];
    all.s = smem_s[lane];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    all.merge(__shfl_xor_sync(0xffffffffu, all.m, o), __shfl_xor_sync(0xffffffffu, all.s, o));
  }
  return all;
}

// The CUDA element type of a tessera float DType.
template <DType D>
struct CudaType;
template <>
struct CudaType<DType::F32> {
  using type = float;
};
template <>
struct CudaType<DType::BF16> {
  using type = __nv_bfloat16;
};
template <>
struct CudaType<DType::F16> {
  using type = __half;
};

// Calls f(T{}) with T the CUDA type of dtype (f32, bf16 or f16); any other dtype is an error naming `op`.
template <typename F>
void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    case DType::F16: f(__half{}); return;
    default: TS_THROW(op, ": no CUDA kernel for dtype ", dtype_name(dtype));
  }
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// True when p is 16-byte aligned (vectorized paths check this before taking the fast route).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Programmatic dependent launch (sm_90). A kernel launched as a programmatic dependent (launch_dependent, or launch
// under Context::pdl) may start while the kernel before it on the stream still runs, once every block of that one
// has called allow_dependent_launch (or exited). Such a kernel keeps one invariant: every thread calls
// wait_for_primary_grid before its first global read of anything an earlier kernel wrote AND before its first
// global write (the kernel before it may still be reading that buffer), and before it exits. The wait returns once
// the kernel before has completed and its writes are visible; that one waited in turn before it completed, so every
// earlier kernel has completed too: the order is transitive along a chain of such kernels, and an ordinary launch
// after one of them still sees all that came before. Ahead of the wait a kernel does only what no earlier kernel can
// change: index math, shared-memory setup, L2 prefetches (a hint: no load returns other values for it).
// wait_for_primary_grid is a no-op in a kernel launched the ordinary way, and allow_dependent_launch does nothing when
// no programmatic dependent follows. Calling allow_dependent_launch right after the wait cannot deadlock: the
// dependent grid launches only once every block of this one has called it or exited, so this grid's blocks are all
// resident or done by then, and the dependent's blocks that wait hold no SM this grid still needs. What it saves is
// the gap between the two kernels and the second one's launch.
// Code built for an architecture below sm_90 has no griddepcontrol. On such a GPU the dependent launches do not
// overlap, but the same code JIT-compiled for an sm_90 GPU would run them overlapped without their waits, reading
// inputs before they are written: such a build is refused here rather than compiled with the waits dropped.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "tessera's kernels chain their launches (griddepcontrol, sm_90): build for CUDA architecture 90a"
#endif
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// The prologue of a kernel that may be launched as a programmatic dependent (launch under Context::pdl): the wait,
// then the early trigger that lets the next kernel launch while this one runs.
__device__ __forceinline__ void dependent_prologue() {
  wait_for_primary_grid();
  allow_dependent_launch();
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the kernel before it on the stream
// (see allow_dependent_launch). Captured into CUDA graphs as a programmatic edge.
template <typename... KArgs, typename... Args>
void launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  TS_CHECK_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// kernel<<<grid, block, smem, ctx.stream()>>>(args...); while ctx.pdl() is set, as a programmatic dependent of the
// kernel before it (launch_dependent), so the kernel must keep wait_for_primary_grid's invariant (its first
// statement dependent_prologue() does). The caller checks the launch with TS_CHECK_LAUNCH, as after <<<>>>.
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, const Context& ctx, Args&&... args) {
  if (ctx.pdl()) launch_dependent(kernel, grid, block, smem, ctx.stream(), std::forward<Args>(args)...);
  else kernel<<<grid, block, smem, ctx.stream()>>>(std::forward<Args>(args)...);
}

}  // namespace tessera::cuda
