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

constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerThreads = 256;
constexpr int kBlockM = 128;  // queries per block, 64 per consumer warpgroup
constexpr int kBlockN = 128;  // keys per K/V tile
constexpr int kStages = 2;
constexpr int kBoxBytes = kBlockN * kBoxCols * 2;
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kD>
constexpr int tile_bytes() {
  return (kD / kBoxCols) * kBoxBytes;
}
template <int kD>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(tile_bytes<kD>()) * (1 + 2 * kStages) + 1024;
}
template <int kD, typename Make>
__device__ __forceinline__ uint64_t desc_at(Make make, uint32_t base, uint32_t off) {
  if constexpr (kD == 128) return desc_plus(make(base), off);
  else return make(base + off);
}

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
  constexpr int kBoxes = kD / kBoxCols, kTile = tile_bytes<kD>(), kN8 = kBlockN / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages], bar_empty_k[kStages], bar_empty_v[kStages];
  const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = smem0;
  auto sK = [&](int s) { return smem0 + kTile * (1 + s); };
  auto sV = [&](int s) { return smem0 + kTile * (1 + kStages + s); };

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
    tma_prefetch_map(&q_map);
    tma_prefetch_map(&k_map);
    tma_prefetch_map(&v_map);
    mbar_init(&bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&bar_k[s], 1);
      mbar_init(&bar_v[s], 1);
      mbar_init(&bar_empty_k[s], kConsumerThreads);
      mbar_init(&bar_empty_v[s], kConsumerThreads);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    regs_release<kProducerRegs>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(&bar_q, kTile);
      for (int bx = 0; bx < kBoxes; ++bx) tma_load_4d(sQ + bx * kBoxBytes, &q_map, bx * kBoxCols, h, q0, b, &bar_q);
      for (int j = 0; j < n_kt; ++j) {
        const int s = j % kStages;
        if (j >= kStages) mbar_wait(&bar_empty_k[s], ((j / kStages) - 1) & 1);
        mbar_arrive_expect_tx(&bar_k[s], kTile);
        for (int bx = 0; bx < kBoxes; ++bx)
          tma_load_4d(sK(s) + bx * kBoxBytes, &k_map, bx * kBoxCols, hk, j * kBlockN, b, &bar_k[s]);
        if (j >= kStages) mbar_wait(&bar_empty_v[s], ((j / kStages) - 1) & 1);
        mbar_arrive_expect_tx(&bar_v[s], kTile);
        for (int bx = 0; bx < kBoxes; ++bx)
          tma_load_4d(sV(s) + bx * kBoxBytes, &v_map, bx * kBoxCols, hk, j * kBlockN, b, &bar_v[s]);
      }
    }
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

  auto issue_scores = [&](int j) {
    const int s = j % kStages;
    mbar_wait(&bar_k[s], (j / kStages) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t k_off = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      wgmma_ss_n128<T>(sacc, desc_at<kD>(desc_k_major, sQ + cw * 64 * 128, k_off),
                       desc_at<kD>(desc_k_major, sK(s), k_off), /*scale_d=*/kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int j) {
    const int s = j % kStages;
    mbar_wait(&bar_v[s], (j / kStages) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int bx = 0; bx < kBoxes; ++bx)
        wgmma_rs_n64<T>(o[bx], pa[kk], desc_at<kD>(desc_mn_major, sV(s), bx * kBoxBytes + kk * 16 * 128),
                        /*scale_d=*/1);
    wgmma_commit();
  };
  auto softmax = [&](int j, float(&alpha)[2]) {
    // Masked: keys at or past kend and, causal, keys after query + q_offset (mask_scores' causal test on rows
    // shifted by q_offset).
    const int k0 = j * kBlockN;
    if (k0 + kBlockN > kend || (g.causal && k0 + kBlockN - 1 > q_first + g.q_offset))
      flash::mask_scores(sacc, k0, row_a + g.q_offset, kend, g.causal);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kN8; ++n) mx = fmaxf(mx, fmaxf(sacc[n][2 * half], sacc[n][2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[half], mx * scale_log2);
      const float shift = m_new == -INFINITY ? 0.0f : m_new;
      alpha[half] = flash::exp2_approx(m[half] - shift);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kN8; ++n)
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          sacc[n][e] = flash::exp2_approx(fmaf(sacc[n][e], scale_log2, -shift));
          sum += sacc[n][e];
        }
      l[half] = l[half] * alpha[half] + sum;
      m[half] = m_new;
    }
    if constexpr (kDropout) drop_scores<kN8>(sacc, drop, static_cast<uint64_t>(b) * g.H + h, g.Tq, g.Tk, row_a, k0);
  };
  auto rescale_o = [&](const float(&alpha)[2]) {
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx)
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        o[bx][n][0] *= alpha[0];
        o[bx][n][1] *= alpha[0];
        o[bx][n][2] *= alpha[1];
        o[bx][n][3] *= alpha[1];
      }
  };

  float alpha[2];
  turn_wait(cw);
  issue_scores(0);
  turn_pass(cw);
  wgmma_wait<0>();
  fence_regs(sacc);
  mbar_arrive(&bar_empty_k[0]);
  softmax(0, alpha);
  flash::c_to_a<T, kN8>(pa, sacc);
  for (int j = 1; j < n_kt; ++j) {
    turn_wait(cw);
    issue_scores(j);
    issue_pv(j - 1);
    turn_pass(cw);
    wgmma_wait<1>();
    fence_regs(sacc);
    mbar_arrive(&bar_empty_k[j % kStages]);
    softmax(j, alpha);
    wgmma_wait<0>();
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx) fence_regs(o[bx]);
    mbar_arrive(&bar_empty_v[(j - 1) % kStages]);
    rescale_o(alpha);
    flash::c_to_a<T, kN8>(pa, sacc);
  }
  turn_wait(cw);
  issue_pv(n_kt - 1);
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
  const int box = flash_hopper::kBlockN;
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
