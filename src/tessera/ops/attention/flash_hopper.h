// tessera/ops/attention/flash_hopper.h — the Hopper (sm_90a) FlashAttention forward and backward: wgmma
// tensor-core products fed by TMA bulk tensor copies, a producer warpgroup and two consumer warpgroups
// (flash_hopper_forward.cu, flash_hopper_backward.cu). Internal to the attention family: attention.cu routes a
// flash-eligible forward / backward (flash.h) here when flash_forward_uses_hopper() / flash_backward_uses_hopper(),
// else to the mma.sync kernels. Either backward takes either forward's results: both forwards write the same out
// and the same lse (natural-log logsumexp of the scaled scores, (B, H, T) f32).
//
// Coverage: bf16 / f16, Dh a multiple of 8 up to 128, compiled for 64 and 128 (flash_hopper_head_pad; a narrower
// head runs zero-padded in the next one: the tensor maps are 4-D over (Dh, heads, T, B), so a 64-column box of
// head h reads zeros from column Dh on, never its neighbour's columns), any T, causal or not, qkv and out
// 16-byte aligned (flash_attention_eligible), a device of compute capability 9.0 and a binary built for sm_90a;
// attention dropout drawn as the mma.sync kernels draw it (flash.h, attention_dropout.h).
//
// TESSERA_FLASH_PATH chooses both: unset or "auto" — the Hopper kernels where eligible, mma.sync elsewhere (measured
// faster in both directions at Dh 32, 64, 80, 96 and 128 and in the CS336 table's d 16 rows:
// bench/results/2026-12-02-padded-heads-hopper-h200.md); "mma" — always mma.sync; "hopper" —
// as auto, but an Error when this device or build cannot run the Hopper kernels at all (shapes outside their
// coverage still run mma.sync). The tests set it to run both paths on the same inputs.
#pragma once
#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/flash.h"

namespace tessera {

enum class FlashForwardPath { Auto, Mma, Hopper };

// The compiled head width of the Hopper kernels that serves Dh: 64 for Dh <= 64, 128 for Dh <= 128, 0 above or when
// Dh is no multiple of 8 (the tensor maps' row stride, 2 Dh bytes, must be a multiple of 16). A Dh below its width
// runs zero-padded: its tensor maps read the columns from Dh on as zeros.
constexpr int flash_hopper_head_pad(int Dh) { return Dh <= 0 || Dh % 8 != 0 ? 0 : Dh <= 64 ? 64 : Dh <= 128 ? 128 : 0; }

// TESSERA_FLASH_PATH, read at each call; an unknown value is an Error.
FlashForwardPath flash_forward_path_requested();
// True when the device is compute capability 9.0 and this binary holds the sm_90a kernels.
bool flash_hopper_available(const Context& ctx);
// True when the Hopper forward takes (p, dtype) on ctx's device (pointer alignment is flash_attention_eligible's).
bool flash_hopper_forward_eligible(const AttentionParams& p, DType dtype, const Context& ctx);
// The routing decision for a flash-eligible forward, TESSERA_FLASH_PATH included.
bool flash_forward_uses_hopper(const AttentionParams& p, DType dtype, const Context& ctx);

// TESSERA_FLASH_PATH's rule, shared by both directions: mma — false; auto — eligible; hopper — eligible, and an
// Error naming `op` when this device or build has no Hopper kernels at all.
using FlashEligibility = bool (*)(const AttentionParams&, DType, const Context&);
bool flash_path_takes_hopper(const char* op, FlashEligibility eligible, const AttentionParams& p, DType dtype,
                             const Context& ctx);

// out, lse <- the forward of (p, qkv); an Error (never a silent fallback) when the call is not eligible or the
// tensor map cannot be built.
void flash_attention_forward_hopper_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a,
                                         Context& ctx);

// The general call's forward (flash_hopper_general.cu): the forward above over separate views (a tensor map for
// each of Q, K and V with its own strides), grouped KV heads, Tq != Tk, the causal q_offset and key lengths, a row
// with no visible key getting out 0 and lse +inf; dropout as above. Eligible: bf16 / f16, a Hopper head width,
// H and B at most 65535, sm_90a.
bool flash_hopper_general_forward_eligible(const AttentionParams& p, DType dtype, const Context& ctx);
bool flash_general_forward_uses_hopper(const AttentionParams& p, DType dtype, const Context& ctx);
// Returns false, having launched nothing, where a view breaks TMA's rules (cuTensorMapEncodeTiled: 16-byte aligned
// base, strides multiples of 16 bytes), so that the caller runs mma.sync; else out and lse are written.
bool flash_general_forward_hopper_cuda(const AttentionParams& p, DType dtype, const FlashGeneralArgs& a, Context& ctx);

// The general call's backward (flash_hopper_general_backward.cu): the packed backward's two passes over a tensor map
// for each of Q, K, V and dO, grouped KV heads (dK / dV of KV head g summed over g's query heads inside one block, in
// head order: no atomics, deterministic), Tq != Tk, the causal q_offset, key lengths and dropout (drawn as the
// general forwards draw it), from lse_in and D = rowsum(dO ∘ O) computed before (a.D); dq, dk, dv stored through
// their strides, every element of rows [0, Tq) / [0, Tk) written (0 for keys at or past a sequence's length and rows
// that see no key). Eligible where the general forward is. Returns false, having launched nothing, where a view
// breaks TMA's rules or Tq or Tk is 0, so that the caller runs mma.sync.
bool flash_hopper_general_backward_eligible(const AttentionParams& p, DType dtype, const Context& ctx);
bool flash_general_backward_uses_hopper(const AttentionParams& p, DType dtype, const Context& ctx);
bool flash_general_backward_hopper_cuda(const AttentionParams& p, DType dtype, const FlashGeneralArgs& a, Context& ctx);

// The backward's coverage is the forward's (Dh a multiple of 8 up to 128, bf16 / f16, sm_90a); d_out must be
// 16-byte aligned too.
bool flash_hopper_backward_eligible(const AttentionParams& p, DType dtype, const Context& ctx);
bool flash_backward_uses_hopper(const AttentionParams& p, DType dtype, const Context& ctx);
// d_qkv <- the gradient through (p, qkv) of d_out, from lse_in and D = rowsum(dO ∘ O) in D_out (flash.h's
// arguments; a.D is not read): the dQ pass computes D into D_out from out_in (16-byte aligned) and the dO tile it
// holds, or, when out_in is null, reads it there; the dK / dV pass reads it there. Every element of d_qkv written.
// An Error when not eligible or a tensor map cannot be built.
void flash_attention_backward_hopper_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a,
                                          Context& ctx);

}  // namespace tessera
