// tessera/ops/attention/flash.h — FlashAttention-2 on tensor cores (mma.sync m16n8k16, bf16 / f16 in, f32
// accumulators), the CUDA path of attention_forward / attention_backward for 16-bit dtypes. Internal to the
// attention family: attention.cu routes here when flash_attention_eligible(), else to the tiled f32-FMA kernels.
//
// Layout (attention.h): qkv (B*T, 3C) with q, k, v of head h at columns h*Dh, C + h*Dh, 2C + h*Dh, read in place
// through the row stride 3C; out, d_out (B*T, C); lse, D (B, H, T) f32; d_qkv (B*T, 3C), every element written.
// Head dims are compiled for kD in {32, 64, 80, 128}; a Dh below one (a multiple of 8) runs zero-padded in it.
//
// Forward (flash_forward.cu): grid (ceil(T/64), H, B), 4 warps; each warp owns 16 query rows. Key/value tiles of
// 64 rows are double-buffered in shared memory by cp.async. Per tile: S = Q Kᵀ (mma), online softmax in the
// log2 domain (running max m and a lane-partial running sum l in registers), P rounded to the dtype in
// registers as the A operand of O += P V. lse = (m + log2 l) ln 2.
// Backward: D = rowsum(dO ∘ O) (attention.cu; the Hopper dQ pass computes it itself), then two deterministic
// passes with no atomics, each recomputing P = exp2(S log2e / sqrt(Dh) − lse log2e) tile by tile:
//   dQ (flash_backward_dq.cu): grid over query tiles; per key tile S = Q Kᵀ, dP = dO Vᵀ, dS = P ∘ (dP − D),
//     dQ += dS K.
//   dK, dV (flash_backward_dkdv.cu): grid over key tiles; per query tile Sᵀ = K Qᵀ, dPᵀ = V dOᵀ,
//     dSᵀ = Pᵀ ∘ (dPᵀ − D), dV += Pᵀ dO, dK += dSᵀ Q.
// Causal: tiles wholly above the diagonal are never visited; only tiles that straddle it (or T) are masked.
// Attention dropout (attention_dropout.h): each lane draws the keep bits of the scores it holds, one Philox block
// per eight scores (where rows are keys, in the dK / dV pass, two lanes share two blocks by a shuffle), under a
// branch uniform over the grid in the forward, and in instances of their own in the backward passes (a call
// without dropout runs the instructions it ran before dropout existed). Forward: the
// dropped elements of P are zeroed after l has summed them, out takes 1 / (1 - p); dQ pass: dP = Z ∘ (dO Vᵀ);
// dK / dV pass: dPᵀ = Zᵀ ∘ (V dOᵀ) and dV += (P ∘ Z)ᵀ dO.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "tessera/ops/attention/attention.h"

namespace tessera {

struct FlashAttentionArgs {
  const void* qkv = nullptr;      // (B*T, 3C)
  void* out = nullptr;            // (B*T, C)       forward output
  float* lse = nullptr;           // (B, H, T)      forward output
  const void* d_out = nullptr;    // (B*T, C)       backward input
  const float* lse_in = nullptr;  // (B, H, T)   backward input
  const float* D = nullptr;       // (B, H, T)      backward input: rowsum(dO ∘ O)
  const void* out_in = nullptr;   // (B*T, C)     Hopper backward input: the forward's out (see D_out)
  float* D_out = nullptr;         // (B, H, T)      Hopper backward: rowsum(dO ∘ O), which its dQ pass computes from
                                  //                out_in, or reads when out_in is null (computed before)
  void* d_qkv = nullptr;          // (B*T, 3C)      backward output
  // Backward with RoPE: its {cos, sin} table (float2 [pos][Dh/2]) and the first position, when the passes rotate
  // dQ and dK back as they store them (Dh equal to the compiled width); null: they store them as computed.
  const void* rope_cs = nullptr;
  int rope_pos_offset = 0;
};

// The padded head width that serves Dh (32, 64, 80 or 128), or 0 when no flash instance does.
int flash_attention_head_pad(int Dh);
// True when the flash kernels take this call: bf16 / f16, Dh % 8 == 0 and Dh <= 128, and every pointer
// 16-byte aligned (the cp.async tile loads copy 16-byte chunks; with Dh % 8 == 0 every row start is aligned too).
bool flash_attention_eligible(const AttentionParams& p, DType dtype, std::initializer_list<const void*> ptrs);

// General call (flash_general.cu): the same three kernels over separate strided (B, T, heads, Dh) views, for
// grouped KV heads (query head h reads KV head h / (H / Hkv)), Tq != Tk, the causal q_offset and key lengths
// (device int32, clamped to [0, Tk]), dropout as above; RoPE stays outside (the entry rotates Q and K around the
// call). Forward and dQ: grid (ceil(Tq/64), H, B) over the key tiles some query of the tile sees. dK/dV: grid
// (ceil(Tk/64), Hkv, B); a block owning a key tile of KV head g runs the query steps of g's query heads in head
// order in one pipeline, summing into the same registers: no atomics, deterministic. A query row that sees no key
// gets out 0 and lse +inf (attention.h), hence dQ 0; keys past a sequence's length get dK = dV = 0.
struct FlashGeneralArgs {
  AttentionView<const void> q, k, v;
  AttentionView<void> out;          // forward output
  float* lse = nullptr;             // (B, H, Tq)  forward output
  AttentionView<const void> d_out;  // backward input
  const float* lse_in = nullptr;    // (B, H, Tq)  backward input
  const float* D = nullptr;         // (B, H, Tq)  backward input: rowsum(dO ∘ O)
  AttentionView<void> dq, dk, dv;   // backward outputs, every element of rows [0, Tq) / [0, Tk) written
};
// True when the general kernels take this call: bf16 / f16, a flash head width for Dh, H and B at most 65535,
// every base 16-byte aligned and every stride a multiple of 8 elements (each row then starts 16-byte aligned,
// as cp.async needs).
bool flash_general_eligible(const AttentionParams& p, DType dtype,
                            std::initializer_list<AttentionView<const void>> views);
void flash_general_forward_cuda(const AttentionParams& p, DType dtype, const FlashGeneralArgs& a, Context& ctx);
void flash_general_backward_cuda(const AttentionParams& p, DType dtype, const FlashGeneralArgs& a, Context& ctx);

void flash_attention_forward_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a, Context& ctx);
void flash_attention_backward_dq_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a, Context& ctx);
void flash_attention_backward_dkdv_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a,
                                        Context& ctx);

}  // namespace tessera
