// What a device-to-device copy of S bytes reaches on this GPU, by cudaMemcpyAsync and by several kernel shapes, at
// the sizes of tessera's memory-bound kernels and at 1 GiB: a reference for kernels that move as many bytes (see
// bench/results/2026-12-01-copy-size-and-pdl-h200.md). Timed as `tessera bench` times: the L2 flushed by reading
// 128 MiB before each run, cudaEvents around the run, median of 30.
//   nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -o /tmp/copy_by_size bench/micro/copy_by_size.cu
//   /tmp/copy_by_size
// Shapes: "full grid" one thread per 16-byte pack; "wave xB N blk/SM" a grid-stride loop over one wave of N blocks
// per SM, B packs loaded before they are stored; "tma" one thread per block streams its contiguous slice through a
// ring of shared-memory chunks with bulk copies (cp.async.bulk), storing each chunk by a bulk copy ("bulkst") or by
// the block's threads ("warpst").
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#define CK(x)                                                       \
  do {                                                              \
    cudaError_t e = (x);                                            \
    if (e != cudaSuccess) {                                         \
      printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                      \
    }                                                               \
  } while (0)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__global__ void flush_read(const int4* p, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    acc ^= p[i].x;
  if (acc == 0x12345678) *sink = acc;
}

__global__ void k_full(int4* __restrict__ d, const int4* __restrict__ s, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) d[i] = s[i];
}

template <int B>
__global__ void k_wave(int4* __restrict__ d, const int4* __restrict__ s, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += B * stride) {
    int4 v[B];
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (i + b * stride < n) v[b] = s[i + b * stride];
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (i + b * stride < n) d[i + b * stride] = v[b];
  }
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_u32(src)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Each block owns a contiguous slice; chunks of CH bytes through NS stages. mode 0: bulk store by thread 0;
// mode 1: warps copy smem -> global with 16-byte stores.
template <int MODE>
__global__ void k_tma(char* __restrict__ d, const char* __restrict__ s, size_t bytes, int CH, int NS) {
  extern __shared__ __align__(128) char sm[];
  __shared__ uint64_t bars[64];
  const size_t per = ((bytes / gridDim.x) + CH - 1) / CH * CH;
  const size_t lo = blockIdx.x * per, hi = std::min(bytes, lo + per);
  if (lo >= hi) return;
  const int chunks = (int)((hi - lo + CH - 1) / CH);
  if (threadIdx.x == 0) {
    for (int i = 0; i < NS; ++i) mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int c) {
    const size_t off = lo + (size_t)c * CH;
    const uint32_t n = (uint32_t)std::min<size_t>(CH, hi - off);
    uint64_t* bar = &bars[c % NS];
    mbar_expect(bar, n);
    bulk_load(sm + (size_t)(c % NS) * CH, s + off, n, bar);
  };
  if (threadIdx.x == 0)
    for (int c = 0; c < std::min(NS, chunks); ++c) issue(c);
  for (int c = 0; c < chunks; ++c) {
    const size_t off = lo + (size_t)c * CH;
    const uint32_t n = (uint32_t)std::min<size_t>(CH, hi - off);
    char* st = sm + (size_t)(c % NS) * CH;
    if (MODE == 0) {
      if (threadIdx.x == 0) {
        mbar_wait(&bars[c % NS], (c / NS) & 1);
        bulk_store(d + off, st, n);
        if (c + NS < chunks) {
          asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
          issue(c + NS);
        }
      }
    } else {
      mbar_wait(&bars[c % NS], (c / NS) & 1);
      for (uint32_t i = threadIdx.x * 16; i < n; i += blockDim.x * 16)
        *reinterpret_cast<int4*>(d + off + i) = *reinterpret_cast<const int4*>(st + i);
      __syncthreads();
      if (threadIdx.x == 0 && c + NS < chunks) issue(c + NS);
    }
  }
  if (MODE == 0 && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t flushN = 128ull << 20;
  int4* flush;
  int* sink;
  CK(cudaMalloc(&flush, flushN));
  CK(cudaMemset(flush, 1, flushN));
  CK(cudaMalloc(&sink, 4));
  const size_t maxS = 1ull << 30;
  char *src, *dst;
  CK(cudaMalloc(&src, maxS));
  CK(cudaMalloc(&dst, maxS));
  CK(cudaMemset(src, 3, maxS));
  CK(cudaMemset(dst, 0, maxS));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaFuncSetAttribute(k_tma<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CK(cudaFuncSetAttribute(k_tma<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  auto timeit = [&](const std::function<void()>& fn) {
    for (int i = 0; i < 3; ++i) fn();
    std::vector<float> ms;
    for (int i = 0; i < 30; ++i) {
      flush_read<<<sms * 4, 512, 0, st>>>(flush, flushN / 16, sink);
      CK(cudaEventRecord(e0, st));
      fn();
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaGetLastError());
    return ms[15];
  };
  double ref = 0;
  // 25232896 and 25231360: half of what the LayerNorm forward moves, and that rounded down to 64 KiB (cudaMemcpyAsync
  // ran 17% slower at the first on the H200).
  const size_t sizes[] = {1ull << 30, 25165824, 50331648, 12582912, 25232896, 25231360};
  for (size_t S : sizes) {
    auto report = [&](const char* name, float ms) {
      const double gbs = 2.0 * S / (ms * 1e-3) / 1e9;
      if (ref == 0) ref = gbs;
      printf("S=%10zu  %-34s %8.4f ms  %7.0f GB/s  %5.1f%% of 1GiB memcpy\n", S, name, ms, gbs, 100 * gbs / ref);
    };
    const size_t n16 = S / 16;
    report("cudaMemcpyAsync", timeit([&] { CK(cudaMemcpyAsync(dst, src, S, cudaMemcpyDeviceToDevice, st)); }));
    report("full grid 256t",
           timeit([&] { k_full<<<(n16 + 255) / 256, 256, 0, st>>>((int4*)dst, (const int4*)src, n16); }));
    for (int bps : {4, 8}) {
      char nm[64];
      snprintf(nm, 64, "wave x1 %d blk/SM", bps);
      report(nm, timeit([&] { k_wave<1><<<sms * bps, 256, 0, st>>>((int4*)dst, (const int4*)src, n16); }));
      snprintf(nm, 64, "wave x4 %d blk/SM", bps);
      report(nm, timeit([&] { k_wave<4><<<sms * bps, 256, 0, st>>>((int4*)dst, (const int4*)src, n16); }));
    }
    for (int mode = 0; mode < 2; ++mode)
      for (int bps : {1, 2})
        for (int CH : {8192, 16384, 32768}) {
          const int smem = (bps == 1 ? 192 : 96) * 1024, NS = std::min(64, smem / CH);
          char nm[64];
          snprintf(nm, 64, "tma %s %dblk/SM ch%dK ns%d", mode ? "warpst" : "bulkst", bps, CH / 1024, NS);
          report(nm, timeit([&] {
                   if (mode == 0)
                     k_tma<0><<<sms * bps, 128, smem, st>>>(dst, src, S, CH, NS);
                   else
                     k_tma<1><<<sms * bps, 256, smem, st>>>(dst, src, S, CH, NS);
                 }));
        }
    // verify last copy
    std::vector<char> h(16);
    CK(cudaMemcpy(h.data(), dst + S - 16, 16, cudaMemcpyDeviceToHost));
    if (h[0] != 3) printf("VERIFY FAILED at S=%zu\n", S);
    CK(cudaMemset(dst, 0, S));
  }
  return 0;
}
