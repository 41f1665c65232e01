// The Hopper (sm_90a) forward for the general call: flash_hopper_forward.cu's kernel (a producer warpgroup
// loading by TMA, two consumer warpgroups on wgmma, software pipelining and ping-pong turns; its comments hold the
// schedule) over three tensor maps, one per view (make_view_map: dimensions (Dh, heads, T, B) with the view's own
// strides), with grouped KV heads (query head h reads map head h / group of K and V), Tq != Tk, the causal
// q_offset and key lengths (keys at or past key_end(b) masked). A kernel of its own, so that the packed call's
// instances stay as they are. A block whose queries see no key loads nothing and stores out 0, lse +inf.
#include <cmath>

#include <cudaTypedefs.h>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_hopper.h"
#include "tessera/ops/attention/flash_hopper_kernel.cuh"
#include "tessera/ops/attention/flash_kernel.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSERA_FLASH_HOPPER_GENERAL_DEVICE 1
#endif

namespace tessera {
namespace flash_hopper {
namespace {

using namespace fwd;  // NOLINT(google-build-using-namespace): the shared forward pieces

// Sizes and masks of the call (attention.h), as flash_general.cu's GShape.
struct HShape {
  int Tq, Tk, H, group, Dh, q_offset;
  bool causal;
  const int32_t* key_lens;  // (B) or null
};

// Out 0 and lse +inf for the 16 rows from row_w of one consumer warp (a tile whose queries see no key).
template <typename T, int kBoxes>
__device__ __forceinline__ void store_empty_rows(T* o_base, int64_t ld, float* lse_row, int row_w, int Tq, int Dh) {
  const int lane = threadIdx.x % 32;
  float zeros[8][4];
  flash::zero(zeros);
  const float one[2] = {1.0f, 1.0f};
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx)
    flash::store_rows<T, 8>(o_base + bx * kBoxCols, ld, zeros, row_w, Tq, Dh - bx * kBoxCols, one);
  if ((lane & 3) == 0) {
    for (int half = 0; half < 2; ++half) {
      const int r = row_w + lane / 4 + 8 * half;
      if (r < Tq) lse_row[r] = INFINITY;
    }
  }
}

// Dropout of this lane's scores: attention_dropout.h's blocks for Tq queries and Tk keys, drawn as
// flash::for_each_draw_query_rows draws them; a dropped score's P becomes 0.
template <int kN8>
__device__ __forceinline__ void drop_scores(float (&s)[kN8][4], const AttentionDropoutDraw& d, uint64_t bh, int Tq,
                                            int Tk, int row_a, int k0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    const Philox4 r =
        philox_block(d.seed, d.stream, attention_dropout_block(bh, Tq, Tk, row_a, k0 + 16 * kk + 2 * (lane & 3)));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int n = 2 * kk + (w & 1), e = 2 * (w >> 1);
      if (!attention_dropout_keeps(r.v[w], 0, d.threshold)) s[n][e] = 0.0f;
      if (!attention_dropout_keeps(r.v[w], 1, d.threshold)) s[n][e + 1] = 0.0f;
    }
  }
}

template <typename T, int kD, bool kDropout>
__global__ void __launch_bounds__(kThreads, 1)
    flash_general_forward_wgmma(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, T* __restrict__ out, int64_t out_sb,
                                int64_t out_st, int64_t out_sh, float* __restrict__ lse, HShape g, float scale_log2,
                                AttentionDropoutDraw drop) {
#if defined(TESSERA_FLASH_HOPPER_GENERAL_DEVICE)
  if constexpr (kDropout) attention_dropout_resolve(drop);
  constexpr int kBoxes = kD / kBoxCols;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages], bar_empty_k[kStages], bar_empty_v[kStages];
  const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;

  const int q_tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / g.group;
  const int q0 = q_tile * kBlockM;
  const int kend = g.key_lens ? min(max(g.key_lens[b], 0), g.Tk) : g.Tk;
  const int klim = max(g.causal ? min(kend, min(q0 + kBlockM, g.Tq) + g.q_offset) : kend, 0);
  const int n_kt = (klim + kBlockN - 1) / kBlockN;  // block-uniform

  if (n_kt == 0) {  // no query of the tile sees a key: out 0, lse +inf, nothing loaded
    if (threadIdx.x >= 128) {
      const int tid = threadIdx.x - 128, row_w = q0 + (tid / 128) * 64 + ((tid % 128) / 32) * 16;
      store_empty_rows<T, kBoxes>(out + b * out_sb + h * out_sh, out_st,
                                  lse + (static_cast<int64_t>(b) * g.H + h) * g.Tq, row_w, g.Tq, g.Dh);
    }
    return;
  }

  if (threadIdx.x == 0) {
    tma_prefetch_maps(&q_map, &k_map, &v_map);
    init_barriers(bar_q, bar_k, bar_v, bar_empty_k, bar_empty_v);
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    regs_release<kProducerRegs>();
    if (threadIdx.x == 0)
      produce<kD>(&q_map, &k_map, &v_map, h, hk, 0, 0, bar_q, bar_k, bar_v, bar_empty_k, bar_empty_v, smem0, n_kt, q0,
                  b);
    return;
  }

  // ---- consumer warpgroups ----
  regs_claim<kConsumerRegs>();
  const int cw = warpgroup_uniform(128), tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int row_w = q0 + cw * 64 + warp * 16;
  const int row_a = row_w + lane / 4;
  const int q_first = q0 + cw * 64;
  float o[kBoxes][8][4];
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) flash::zero(o[bx]);
  float sacc[kN8][4];
  flash::zero(sacc);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t pa[kN8 / 2][4];
  mbar_wait(&bar_q, 0);

  if (cw == 1) turn_pass(cw);

  auto softmax = [&](int j, float(&alpha)[2]) {
    // Masked: keys at or past kend and, causal, keys after query + q_offset (mask_scores' causal test on rows
    // shifted by q_offset).
    const int k0 = j * kBlockN;
    if (k0 + kBlockN > kend || (g.causal && k0 + kBlockN - 1 > q_first + g.q_offset))
      flash::mask_scores(sacc, k0, row_a + g.q_offset, kend, g.causal);
    online_softmax(sacc, m, l, alpha, scale_log2);
    if constexpr (kDropout) drop_scores<kN8>(sacc, drop, static_cast<uint64_t>(b) * g.H + h, g.Tq, g.Tk, row_a, k0);
  };
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
    wgmma_wait<1>();
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
  if (cw == 0) turn_pass(cw);
  wgmma_wait<0>();
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) fence_regs(o[bx]);
  mbar_arrive(&bar_empty_v[(n_kt - 1) % kStages]);

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
    inv[half] = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;  // a row that sees no key: out 0
    if constexpr (kDropout) inv[half] *= drop.scale;
  }
  T* o_base = out + b * out_sb + h * out_sh;
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx)
    flash::store_rows<T, 8>(o_base + bx * kBoxCols, out_st, o[bx], row_w, g.Tq, g.Dh - bx * kBoxCols, inv);
  if ((lane & 3) == 0) {
    float* lse_row = lse + (static_cast<int64_t>(b) * g.H + h) * g.Tq;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row_a + 8 * half;
      if (r < g.Tq) lse_row[r] = l[half] > 0.0f ? (m[half] + log2f(l[half])) * kLn2 : INFINITY;
    }
  }
#endif
}

template <typename T, int kD>
void launch_general_forward(const AttentionParams& p, const FlashGeneralArgs& a, const CUtensorMap (&maps)[3],
                            Context& ctx) {
  constexpr size_t smem = smem_bytes<kD>();
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  auto kernel = drop.threshold ? flash_general_forward_wgmma<T, kD, true> : flash_general_forward_wgmma<T, kD, false>;
  TS_CHECK(smem <= ctx.gpu().smem_per_block_optin, "attention_forward (Hopper path): needs ", smem,
           " bytes of shared memory per block, the device has ", ctx.gpu().smem_per_block_optin);
  TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const HShape g{.Tq = attention_tq(p),
                 .Tk = attention_tk(p),
                 .H = p.H,
                 .group = p.H / attention_kv_heads(p),
                 .Dh = p.Dh,
                 .q_offset = p.q_offset,
                 .causal = p.causal,
                 .key_lens = p.key_lens.defined() ? p.key_lens.as<int32_t>() : nullptr};
  const dim3 grid(cuda::ceil_div(g.Tq, kBlockM), p.H, p.B);
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh))) * kLog2e;
  kernel<<<grid, kThreads, smem, ctx.stream()>>>(maps[0], maps[1], maps[2], static_cast<T*>(a.out.data), a.out.sb,
                                                 a.out.st, a.out.sh, a.lse, g, scale_log2, drop);
  TS_CHECK_LAUNCH();
}

}  // namespace
}  // namespace flash_hopper

bool flash_general_forward_hopper_cuda(const AttentionParams& p, DType dtype, const FlashGeneralArgs& a, Context& ctx) {
  TS_CHECK(flash_hopper_general_forward_eligible(p, dtype, ctx), "attention_forward (Hopper path): not eligible for ",
           "Dh=", p.Dh, ", ", dtype_name(dtype), " on this device");
  const int Tq = attention_tq(p), Tk = attention_tk(p), Hkv = attention_kv_heads(p);
  if (static_cast<int64_t>(p.B) * Tq == 0) return true;
  if (!cuda::aligned16(a.out.data) || a.out.st % 2 != 0) return false;  // store_rows' 4-byte pairs
  CUtensorMap maps[3];
  const int box = flash_hopper::fwd::kBlockN;
  // A tensor map needs every dimension at least 1: an empty key sequence runs mma.sync.
  if (Tk == 0) return false;
  if (!flash_hopper::make_view_map(&maps[0], dtype, a.q.data, p.Dh, p.H, Tq, p.B, a.q.sb, a.q.st, a.q.sh, box) ||
      !flash_hopper::make_view_map(&maps[1], dtype, a.k.data, p.Dh, Hkv, Tk, p.B, a.k.sb, a.k.st, a.k.sh, box) ||
      !flash_hopper::make_view_map(&maps[2], dtype, a.v.data, p.Dh, Hkv, Tk, p.B, a.v.sb, a.v.st, a.v.sh, box))
    return false;
  auto launch = [&](auto t) {
    using T = decltype(t);
    if (flash_hopper_head_pad(p.Dh) == 64) flash_hopper::launch_general_forward<T, 64>(p, a, maps, ctx);
    else flash_hopper::launch_general_forward<T, 128>(p, a, maps, ctx);
  };
  if (dtype == DType::BF16) launch(__nv_bfloat16{});
  else launch(__half{});
  return true;
}

}  // namespace tessera
