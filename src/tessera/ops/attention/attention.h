// tessera/ops/attention — multi-head attention (reference), its general form, and rotary position embedding.
//
// Packed call (the decoder-only model's fast path): qkv (B, T, H + 2 Hkv, Dh) row-major, i.e. rows of width
//   W = (H + 2 Hkv) Dh = [q (H Dh) | k (Hkv Dh) | v (Hkv Dh)], query head h at column h Dh, key / value head g at
//   H Dh + g Dh / (H + Hkv) Dh + g Dh. With Hkv = H (n_kv_heads 0) that is (B, T, 3, H, Dh), W = 3C, C = H Dh.
// General call: Q (B, Tq, H, Dh), K and V (B, Tk, Hkv, Dh), separate strided views (the last dim contiguous).
// out: (B, Tq, H, Dh).  lse: (B, H, Tq), the logsumexp of each score row, saved for the backward.
// Grouped-query attention: Hkv divides H; query head h reads key / value head h / (H / Hkv) (torch's
//   repeat_interleave of K and V over heads, Hugging Face's repeat_kv). Hkv = 1 is multi-query attention.
// Masks: key j is visible to query i of sequence b when j < len_b (key_lens, else Tk) and, when causal,
//   j <= i + q_offset (queries start at position q_offset of the keys: a decode step against a cache, or the
//   bottom-right alignment Tk - Tq). The packed call has Tq = Tk = T and q_offset 0 unless set.
//   S = Q Kᵀ / sqrt(Dh) (masked entries -inf),  lse_i = log Σ_j exp(S_ij),  O = exp(S - lse) V
// A query row with no visible key (len_b = 0, or a causal diagonal before key 0) has out = 0 and lse = +inf
//   (FlashAttention-2's convention): P = exp(S - lse) = 0 in the backward, so its dQ is 0 and it adds nothing to
//   dK and dV; a masked key's dK and dV are 0.
// Backward (FlashAttention-2 form, P recomputed from lse): D_i = dO_i · O_i,  dS = P ∘ (dO Vᵀ - D),
//   dQ = dS K / sqrt(Dh),  dK = dSᵀ Q / sqrt(Dh),  dV = Pᵀ dO; with GQA a key / value head's dK and dV are the sums
//   over the H / Hkv query heads that read it, in head order (deterministic). d_qkv, dQ, dK, dV are overwritten.
// Attention dropout (dropout > 0): O = (P ∘ Z) V with Z_ij = keep_ij / (1 - dropout), keep_ij drawn for query i
//   and key j of query head (b, h) from the shared Philox streams under (seed, stream) as attention_dropout.h lays
//   the draws out (eight scores per Philox block, in the grouping the tensor-core fragments hold), so the reference
//   and every CUDA kernel drop the same elements; lse is that of the undropped scores. The backward keeps its form
//   with dP = Z ∘ (dO Vᵀ): D_i = dO_i · O_i = Σ_j P_ij dP_ij still holds, dS = P ∘ (dP - D), dV = (P ∘ Z)ᵀ dO.
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

// RoPE (rope_theta > 0, Llama-style models): attention_forward (the Tensor-level entry) first rotates q and k of
//   qkv IN PLACE as rope_forward does (theta rope_theta, positions rope_pos_offset + t) and attends over them, so
//   that qkv holds them rotated for the backward; attention_backward's d_qkv is the gradient with respect to q and
//   k before the rotation (rope_backward of the plain one). The CUDA flash kernels apply that transposed rotation
//   to dQ and dK in registers as they store them, with no pass over d_qkv of its own (attention.cu).
// The general call's RoPE rotates Q in place at positions rope_pos_offset + q_offset + i and K at
//   rope_pos_offset + j (all Tk keys: a cache that holds rotated keys calls it with rope_theta 0 and rotates its
//   new keys where it writes them); its backward rotates dQ and dK back.
struct AttentionParams {
  int B = 0, T = 0, H = 0, Dh = 0;
  bool causal = true;
  float dropout = 0.0f;  // in [0, 1)
  uint64_t seed = 0, stream = 0;
  float rope_theta = 0.0f;  // 0: no RoPE
  int rope_pos_offset = 0;
  int n_kv_heads = 0;  // Hkv, dividing H; 0: H (no grouping)
  int Tq = 0, Tk = 0;  // the general call's query and key lengths; 0: T. The packed call has Tq = Tk = T.
  int q_offset = 0;    // >= 0; when causal, query i sees keys j <= i + q_offset
  // Optional (B) int32 on the call's device: keys j >= key_lens[b] are masked for sequence b. Values must lie in
  // [0, Tk]: the CPU entry refuses others, the CUDA kernels clamp them (they cannot read device memory to refuse).
  Tensor key_lens{};
};

// The effective sizes of a call (the defaults above resolved).
inline int attention_kv_heads(const AttentionParams& p) { return p.n_kv_heads > 0 ? p.n_kv_heads : p.H; }
inline int attention_tq(const AttentionParams& p) { return p.Tq > 0 ? p.Tq : p.T; }
inline int attention_tk(const AttentionParams& p) { return p.Tk > 0 ? p.Tk : p.T; }
// True for the call the packed kernels have always taken: no grouping, Tq = Tk = T, no offset, no key lengths.
inline bool attention_is_plain(const AttentionParams& p) {
  return attention_kv_heads(p) == p.H && attention_tq(p) == p.T && attention_tk(p) == p.T && p.q_offset == 0 &&
         !p.key_lens.defined();
}
// The packed qkv's row width, (H + 2 Hkv) Dh.
inline int64_t attention_qkv_width(const AttentionParams& p) {
  return (static_cast<int64_t>(p.H) + 2 * attention_kv_heads(p)) * p.Dh;
}

// A (B, T, heads, Dh) view of a buffer: element (b, t, h, d) at data[b sb + t st + h sh + d].
template <typename T>
struct AttentionView {
  T* data = nullptr;
  int64_t sb = 0, st = 0, sh = 0;
  T* at(int b, int t, int h) const { return data + b * sb + t * st + h * sh; }
};

// The references attend over q, k, v as given (rope_theta must be 0: the Tensor-level entries apply RoPE around
// them). The general one reads p.key_lens (on the CPU) and writes every element of dq, dk, dv.
template <typename T>
void attention_forward_ref(const AttentionParams& p, AttentionView<T> out, T* lse, AttentionView<const T> q,
                           AttentionView<const T> k, AttentionView<const T> v);
template <typename T>
void attention_backward_ref(const AttentionParams& p, AttentionView<T> dq, AttentionView<T> dk, AttentionView<T> dv,
                            AttentionView<const T> d_out, AttentionView<const T> q, AttentionView<const T> k,
                            AttentionView<const T> v, AttentionView<const T> out, const T* lse);
// The packed call: views of qkv (B*T, W) and out (B*T, C) handed to the general references.
template <typename T>
void attention_forward_ref(const AttentionParams& p, T* out, T* lse, const T* qkv);
template <typename T>
void attention_backward_ref(const AttentionParams& p, T* d_qkv, const T* d_out, const T* qkv, const T* out,
                            const T* lse);

// Rotary position embedding (the "rotate half" form of GPT-NeoX and Hugging Face Llama), applied in place to
// the q and k parts of qkv (the first H + Hkv heads of each row of width (H + 2 Hkv) Dh). For i < Dh/2 and
// position pos = pos_offset + t, with a = pos * theta^(-2i/Dh):
//   x'[i] = x[i] cos a - x[i + Dh/2] sin a,   x'[i + Dh/2] = x[i + Dh/2] cos a + x[i] sin a
// The backward applies the transposed rotation to d_qkv in place.
struct RopeParams {
  int B = 0, T = 0, H = 0, Dh = 0;
  float theta = 10000.0f;
  int pos_offset = 0;
  int n_kv_heads = 0;  // Hkv; 0: H
};

// The RoPE of an attention call (its rope_theta and rope_pos_offset).
RopeParams attention_rope(const AttentionParams& p);

template <typename T>
void rope_forward_ref(const RopeParams& p, T* qkv);
template <typename T>
void rope_backward_ref(const RopeParams& p, T* d_qkv);
// The same rotation on a (B, T, heads, Dh) view (the general call's Q or K); sign -1 rotates back.
template <typename T>
void rope_rotate_view_ref(const RopeParams& p, int heads, AttentionView<T> x, double sign);

}  // namespace tessera

// ---- Tensor-level entries (attention.cpp): route to the reference or the CUDA kernels by device and dtype. ----
// Packed: qkv, d_qkv: (B*T, W), W = (H + 2 Hkv) Dh; out, d_out: (B*T, C), all in the compute dtype, contiguous;
// lse: (B, H, T) f32 (f64 for an f64 computation). attention_backward OVERWRITES d_qkv (every element of it).
// General: q, dq (B, Tq, H, Dh); k, v, dk, dv (B, Tk, Hkv, Dh); out, d_out (B, Tq, H, Dh): 4-D views with the last
// stride 1 (any others: slices of a fused projection, or a cache); lse (B, H, Tq) contiguous. dq, dk, dv are
// overwritten and must not overlap each other or the inputs. rope_forward / rope_backward rotate qkv / d_qkv IN
// PLACE (the q and k parts; the v part is left as it is).
namespace tessera {

bool attention_supports(const AttentionParams& p, DType dtype, Device device, std::string* why = nullptr);
bool rope_supports(const RopeParams& p, DType dtype, Device device, std::string* why = nullptr);

void attention_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& qkv, Context& ctx);
void attention_backward(const AttentionParams& p, const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, Context& ctx);
void attention_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, Context& ctx);
void attention_backward(const AttentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const Tensor& d_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, Context& ctx);
void rope_forward(const RopeParams& p, const Tensor& qkv, Context& ctx);
void rope_backward(const RopeParams& p, const Tensor& d_qkv, Context& ctx);

// ---- CUDA launchers (attention.cu), on ctx's stream. Pointers are device memory in `dtype` unless typed. ----
// Calls in bf16 / f16 with Dh % 8 == 0, Dh <= 128 and 16-byte-aligned buffers (and, for the general call's views,
// strides that are multiples of 8 elements) run FlashAttention-2 on tensor cores (flash.h: mma.sync m16n8k16, f32
// accumulators, head widths 32, 64, 80, 128; a dQ pass and a dK/dV pass, deterministic): the packed call's plain
// case in its own kernels (flash_hopper.h's wgmma + TMA ones on sm_90a), every other case (grouped KV heads,
// Tq != Tk, offsets, key lengths, the general call) in flash_general.cu. The rest (f32, other head dims, misaligned
// views) runs the tiled f32-FMA kernels described next; attention_policy.cu holds the choice. With grouped heads the
// dK/dV kernel's grid is over (key tile, KV head, batch), each block summing its group's query heads in order
// (deterministic, no atomics). Forward: one block of 256 threads per (query tile of 64 rows, head, batch); K/V tiles of
// 64 rows in shared memory, online softmax (running max and sum in f32 registers), the T x T matrix never stored; lse
// saved. Backward: D = rowsum(d_out * out) (f32, in ctx.scratch: B*H*T floats), then one kernel per query tile for dQ
// and one per key tile for dK and dV, recomputing P = exp(S - lse) tile by tile (no atomics, deterministic). Q, K and V
// are read in place from qkv. Head dims up to kAttentionMaxDh (compiled for padded widths 32, 64, 96, 128; any Dh in
// between runs on the next wider instance). Causal tiles above the diagonal are skipped.
constexpr int kAttentionMaxDh = 128;
// RoPE on the GPU reads cos / sin from a table over positions (pos_offset + T at most this).
constexpr int64_t kRopeMaxPositions = int64_t{1} << 22;
// The kernel family that the packed CUDA entries run for (p, dtype) on 16-byte-aligned buffers on ctx's GPU: for
// the plain case (attention_is_plain) "flash-mma", or on sm_90a (TESSERA_FLASH_PATH auto or hopper,
// flash_hopper.h) "flash-hopper", "flash-hopper forward, flash-mma backward" or "flash-mma forward, flash-hopper
// backward"; for the others the general call's family (below); else "tiled-fma" (tests and benchmarks name the
// path they measure).
const char* attention_cuda_kernel(const AttentionParams& p, DType dtype, const Context& ctx);
// The family that the general entries run for (p, dtype) on 16-byte-aligned views whose strides are multiples of
// 8 elements: bf16 / f16, Dh % 8 == 0 up to 128, H and B at most 65535: "flash-mma", or on sm_90a (TESSERA_FLASH_PATH
// auto or hopper) "flash-hopper" (either direction falls back to mma.sync where TMA refuses a view's strides);
// else "tiled-fma".
const char* attention_cuda_kernel_general(const AttentionParams& p, DType dtype, const Context& ctx);
void attention_forward_cuda(const AttentionParams& p, DType dtype, void* out, float* lse, const void* qkv,
                            Context& ctx);
void attention_backward_cuda(const AttentionParams& p, DType dtype, void* d_qkv, const void* d_out, const void* qkv,
                             const void* out, const float* lse, Context& ctx);
// attention_forward_cuda attends over qkv as given (rope_theta must be 0; the Tensor entry rotates first);
// attention_backward_cuda takes rope_theta > 0: on the flash paths with Dh equal to a compiled width the kernels
// rotate dQ and dK back as they store them, elsewhere a rope_backward pass over d_qkv follows.
// RoPE: cos / sin of pos * theta^(-2i/Dh) come from a table per (theta, Dh) in the Context (ctx.device_table),
// computed once in f64 as the reference does (positions in the thousands would lose 1e-4 of the angle in f32)
// and rounded to f32. One thread per (row, 16-byte pack of pairs, 4 q / k heads) when Dh / 2 is a whole number of
// packs and qkv is 16-byte aligned, else one per (row, pair) over every q and k head of the row.
void rope_forward_cuda(const RopeParams& p, DType dtype, void* qkv, Context& ctx);
// The general call's launchers (views in device memory, the last dim contiguous; p.key_lens device int32 or
// absent). attention_policy.h chooses the kernel family; every case has a correct one.
void attention_forward_general_cuda(const AttentionParams& p, DType dtype, AttentionView<void> out, float* lse,
                                    AttentionView<const void> q, AttentionView<const void> k,
                                    AttentionView<const void> v, Context& ctx);
void attention_backward_general_cuda(const AttentionParams& p, DType dtype, AttentionView<void> dq,
                                     AttentionView<void> dk, AttentionView<void> dv, AttentionView<const void> d_out,
                                     AttentionView<const void> q, AttentionView<const void> k,
                                     AttentionView<const void> v, AttentionView<const void> out, const float* lse,
                                     Context& ctx);
// RoPE over a (B, p.T, heads, Dh) view in place (positions p.pos_offset + t); sign -1 rotates back.
void rope_view_cuda(const RopeParams& p, int heads, DType dtype, AttentionView<void> x, float sign, Context& ctx);
void rope_backward_cuda(const RopeParams& p, DType dtype, void* d_qkv, Context& ctx);

}  // namespace tessera
