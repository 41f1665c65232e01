// FlashAttention forward for Hopper (sm_90a): wgmma tensor-core products fed by TMA, warp-specialized.
// See flash_hopper.h for the contract and flash_hopper_kernel.cuh for the descriptor / swizzle / fragment layouts.
//
// out: (B*T, C), lse: (B, H, T) f32, qkv: (B*T, 3C) read in place through one 4-D TMA tensor map over its 3H
// heads (make_heads_map: columns Dh, heads 3H, rows T, batches B): Q of head h is head h of the map, K head H + h,
// V head 2H + h. Rows past T, and columns from Dh up to the compiled width kD (64 or 128: flash_hopper_head_pad), lie
// outside the map, so TMA fills them with zeros: a narrower head (Dh 16, 32, 80, 96, ...) runs zero-padded, its
// scores and its first Dh output columns exactly those of an unpadded kernel, the other columns never stored.
//
// Block: 384 threads = 3 warpgroups, one (128-query tile, head, batch) each; grid (ceil(T/128), H, B), block x
// taking query tile n_q - 1 - x so that under a causal mask the longest tiles start first.
//   warpgroup 0, the producer: one thread loads the Q tile once, then K and V tiles of 128 keys into a 2-stage
//     ring (full_k / full_v barriers signalled by the TMA byte count; empty_k / empty_v barriers released by the
//     256 consumer threads, K's a tile before V's); it gives its registers away (setmaxnreg 24).
//   warpgroups 1 and 2, the consumers (setmaxnreg 240): consumer c owns query rows q0 + 64c .. q0 + 64c + 63.
//     Per key tile j (keys k0 = 128 j ..):
//       S = Q Kᵀ                          wgmma m64n128k16, A and B from shared memory, kD/16 steps
//       x = S log2e / sqrt(Dh) (-inf where key >= T or, causal, key > query),  m' = max(m, rowmax x)
//       P = exp2(x - m'),  l = l 2^(m - m') + rowsum P (lane-partial),  O = O 2^(m - m')
//       O += P V                          wgmma m64n64k16 per 64 head columns, A = P from registers (rounded
//                                         to the dtype), B = V from shared memory (MN-major)
//     At the end out = O / l and lse = (m + log2 l) ln 2: the natural-log logsumexp of the scaled scores, the
//     same quantity the mma.sync forward saves and both backwards read.
//     Attention dropout (flash.h): P's dropped elements are zeroed after l has summed them (the draws run with the
//     softmax, while the tensor cores add the previous tile's P V), and out takes 1 / (1 - p).
// Overlap, as FlashAttention-3 does it: each consumer issues tile j's S with tile j - 1's P V and runs tile j's
// softmax while they execute (software pipelining), and the two consumers take turns issuing their products
// (ping-pong on two named barriers), so that one's softmax runs while the other's products do. Both together
// measured faster than neither at Dh 64 and 128; pipelining without the turns measured slower than neither, as the
// two consumers then issue their products together and then both sit in their softmax
// (bench/results/2026-12-01-split-waits-and-fused-d-h200.md).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <cudaTypedefs.h>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_hopper.h"
#include "tessera/ops/attention/flash_hopper_kernel.cuh"
#include "tessera/ops/attention/flash_kernel.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_hopper_forward.cu: wgmma needs the sm_90a target; build with CMAKE_CUDA_ARCHITECTURES=90a"
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSERA_FLASH_HOPPER_DEVICE 1
#endif

namespace tessera {
namespace flash_hopper {
namespace {

using namespace fwd;  // NOLINT(google-build-using-namespace): the shared forward pieces

// kDropout: an instance of its own for attention dropout, so that the forward without dropout carries no draws:
// behind a runtime branch in one instance they measured slower without dropout (the backward passes did not, and
// keep one instance: bench/results/2026-12-01-attention-dropout-wgmma-h200.md).
template <typename T, int kD, bool kDropout>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_forward_wgmma(const __grid_constant__ CUtensorMap qkv_map, T* __restrict__ out,
                                  float* __restrict__ lse, int seq_len, int H, int Dh, bool causal, float scale_log2,
                                  AttentionDropoutDraw drop) {
#if defined(TESSERA_FLASH_HOPPER_DEVICE)
  if constexpr (kDropout) attention_dropout_resolve(drop);
  constexpr int kBoxes = kD / kBoxCols;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages], bar_empty_k[kStages], bar_empty_v[kStages];
  const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;

  const int q_tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = q_tile * kBlockM;
  const int C = H * Dh;
  const int n_kt_all = (seq_len + kBlockN - 1) / kBlockN;
  const int n_kt = causal ? min((q0 + kBlockM - 1) / kBlockN + 1, n_kt_all) : n_kt_all;

  if (threadIdx.x == 0) {
    tma_prefetch_map(&qkv_map);
    init_barriers(bar_q, bar_k, bar_v, bar_empty_k, bar_empty_v);
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    regs_release<kProducerRegs>();
    if (threadIdx.x == 0)
      produce<kD>(&qkv_map, &qkv_map, &qkv_map, h, h, H, 2 * H, bar_q, bar_k, bar_v, bar_empty_k, bar_empty_v, smem0,
                  n_kt, q0, b);
    return;
  }

  // ---- consumer warpgroups ----
  regs_claim<kConsumerRegs>();
  const int cw = warpgroup_uniform(128), tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int row_w = q0 + cw * 64 + warp * 16;  // this warp's first query row
  const int row_a = row_w + lane / 4;          // this lane's rows: row_a and row_a + 8
  const int q_first = q0 + cw * 64;            // the warpgroup's first query row
  float o[kBoxes][8][4];
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) flash::zero(o[bx]);
  float sacc[kN8][4];
  flash::zero(sacc);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t pa[kN8 / 2][4];  // P of the tile whose P V is next, as wgmma A fragments
  mbar_wait(&bar_q, 0);

  // Ping-pong: a consumer issues its products only in its turn (turn_wait / turn_pass, flash_hopper_kernel.cuh),
  // and hands the turn over once they are issued, so that one consumer's softmax runs while the other's products
  // do. Both take n_kt + 1 turns, and every arrival is waited for: consumer 1 makes no hand-over after the last
  // turn, so no named barrier is left part-arrived at exit.
  if (cw == 1) turn_pass(cw);  // consumer 0 goes first

  // The online softmax of tile j's scores (in sacc, complete): sacc becomes P, l and m advance, and alpha is the
  // factor O must take before P V is added.
  auto softmax = [&](int j, float(&alpha)[2]) {
    // Only a tile on the diagonal or past T masks (a warpgroup-uniform branch).
    const int k0 = j * kBlockN;
    if (k0 + kBlockN > seq_len || (causal && k0 + kBlockN - 1 > q_first))
      flash::mask_scores(sacc, k0, row_a, seq_len, causal);
    online_softmax(sacc, m, l, alpha, scale_log2);
    if constexpr (kDropout)
      flash::for_each_draw_query_rows<kN8>(drop, static_cast<uint64_t>(b) * H + h, seq_len, row_a, k0,
                                           [&](int n, int e, bool kept) {
                                             if (!kept) sacc[n][e] = 0.0f;
                                           });
  };

  // Software-pipelined (FlashAttention-3's intra-warpgroup overlap): tile j's scores are issued before tile
  // j - 1's P V, so the exponentials of tile j run while the tensor cores add P_{j-1} V_{j-1}. K_j's stage is
  // released once S_j is read, V_j's once P_j V_j is.
  float alpha[2];
  turn_wait(cw);
  issue_scores<T, kD>(sacc, bar_k, smem0, cw, 0);
  turn_pass(cw);
  wgmma_wait<0>();
  fence_regs(sacc);
  mbar_arrive(&bar_empty_k[0]);
  softmax(0, alpha);
  flash::c_to_a<T, kN8>(pa, sacc);
  for (int j = 1; j < n_kt; ++j) {
    turn_wait(cw);
    issue_scores<T, kD>(sacc, bar_k, smem0, cw, j);
    issue_pv<T, kD>(o, pa, bar_v, smem0, j - 1);
    turn_pass(cw);
    wgmma_wait<1>();  // S_j (committed first) is complete; P_{j-1} V_{j-1} may still run
    fence_regs(sacc);
    mbar_arrive(&bar_empty_k[j % kStages]);
    softmax(j, alpha);
    wgmma_wait<0>();
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx) fence_regs(o[bx]);
    mbar_arrive(&bar_empty_v[(j - 1) % kStages]);
    rescale_o(o, alpha);
    flash::c_to_a<T, kN8>(pa, sacc);
  }
  turn_wait(cw);
  issue_pv<T, kD>(o, pa, bar_v, smem0, n_kt - 1);
  if (cw == 0) turn_pass(cw);  // consumer 1's last turn; nobody waits for a hand-over after it
  wgmma_wait<0>();
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) fence_regs(o[bx]);
  mbar_arrive(&bar_empty_v[(n_kt - 1) % kStages]);

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
    inv[half] = 1.0f / l[half];
    if constexpr (kDropout) inv[half] *= drop.scale;
  }
  T* o_base = out + static_cast<int64_t>(b) * seq_len * C + static_cast<int64_t>(h) * Dh;
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx)  // the box's columns below Dh
    flash::store_rows<T, 8>(o_base + bx * kBoxCols, C, o[bx], row_w, seq_len, Dh - bx * kBoxCols, inv);
  if ((lane & 3) == 0) {
    float* lse_row = lse + (static_cast<int64_t>(b) * H + h) * seq_len;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row_a + 8 * half;
      if (r < seq_len) lse_row[r] = (m[half] + log2f(l[half])) * kLn2;
    }
  }
#endif
}

// qkv (B, T, 3H heads of Dh) as a 4-D tensor map with (64-column, 1-head, 128-row, 1) boxes (make_heads_map).
CUtensorMap make_qkv_map(const AttentionParams& p, DType dtype, const void* qkv) {
  return make_heads_map("attention_forward (Hopper path)", dtype, qkv, p.Dh, 3 * p.H, p.T, p.B, kBlockN);
}

template <typename T, int kD>
void launch_forward(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a, Context& ctx) {
  constexpr size_t smem = smem_bytes<kD>();
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  auto kernel = drop.threshold ? flash_attention_forward_wgmma<T, kD, true>
                               : flash_attention_forward_wgmma<T, kD, false>;
  TS_CHECK(smem <= ctx.gpu().smem_per_block_optin, "attention_forward (Hopper path): needs ", smem,
           " bytes of shared memory per block, the device has ", ctx.gpu().smem_per_block_optin);
  TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const CUtensorMap map = make_qkv_map(p, dtype, a.qkv);
  const dim3 grid(cuda::ceil_div(p.T, kBlockM), p.H, p.B);
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh))) * kLog2e;
  kernel<<<grid, kThreads, smem, ctx.stream()>>>(map, static_cast<T*>(a.out), a.lse, p.T, p.H, p.Dh, p.causal,
                                                 scale_log2, drop);
  TS_CHECK_LAUNCH();
}

template <typename F>
void dispatch(int Dh, DType dtype, F&& f) {
  auto by_dtype = [&](auto d) {
    if (dtype == DType::BF16) f(__nv_bfloat16{}, d);
    else if (dtype == DType::F16) f(__half{}, d);
    else TS_THROW("attention_forward (Hopper path): takes bf16 or f16, not ", dtype_name(dtype));
  };
  switch (flash_hopper_head_pad(Dh)) {
    case 64: by_dtype(std::integral_constant<int, 64>{}); break;
    case 128: by_dtype(std::integral_constant<int, 128>{}); break;
    default: TS_THROW("attention_forward (Hopper path): no kernel for head dim ", Dh);
  }
}

// True when this binary holds sm_90a machine code of the kernel and the device is compute capability 9.0.
bool compiled_for(const Context& ctx) {
  if (ctx.gpu().sm_major != 9 || ctx.gpu().sm_minor != 0) return false;
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, flash_attention_forward_wgmma<__nv_bfloat16, 64, false>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;  // the #error above makes every sm_90 image an sm_90a one
}

}  // namespace

}  // namespace flash_hopper

bool flash_hopper_available(const Context& ctx) { return ctx.is_cuda() && flash_hopper::compiled_for(ctx); }

void flash_attention_forward_hopper_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a,
                                         Context& ctx) {
  TS_CHECK(flash_hopper_forward_eligible(p, dtype, ctx), "attention_forward (Hopper path): not eligible for ",
           "Dh=", p.Dh, ", ", dtype_name(dtype), " on this device");
  flash_hopper::dispatch(p.Dh, dtype, [&](auto t, auto d) {
    flash_hopper::launch_forward<decltype(t), decltype(d)::value>(p, dtype, a, ctx);
  });
}

}  // namespace tessera
