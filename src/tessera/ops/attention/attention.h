// tessera/ops/attention — causal multi-head attention (reference) and rotary position embedding.
//
// qkv: (B, T, 3, H, Dh) row-major, i.e. rows of width 3C = [q | k | v] with C = H * Dh, head h at h*Dh.
// out: (B, T, H, Dh) = (B*T, C).  lse: (B, H, T), the logsumexp of each score row, saved for the backward.
//   S = Q Kᵀ / sqrt(Dh) (entries j > i masked when causal),  lse_i = log Σ_j exp(S_ij),  O = exp(S - lse) V
// Backward (FlashAttention-2 form, P recomputed from lse): D_i = dO_i · O_i,  dS = P ∘ (dO Vᵀ - D),
//   dQ = dS K / sqrt(Dh),  dK = dSᵀ Q / sqrt(Dh),  dV = Pᵀ dO.   d_qkv is overwritten.
// Attention dropout (dropout > 0): O = (P ∘ Z) V with Z_ij = keep_ij / (1 - dropout), keep_ij drawn for query i
//   and key j of head (b, h) from the shared Philox streams under (seed, stream) as attention_dropout.h lays the
//   draws out (eight scores per Philox block, in the grouping the tensor-core fragments hold), so the reference and
//   every CUDA kernel drop the same elements; lse is that of the undropped scores. The backward keeps its form
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
struct AttentionParams {
  int B = 0, T = 0, H = 0, Dh = 0;
  bool causal = true;
  float dropout = 0.0f;  // in [0, 1)
  uint64_t seed = 0, stream = 0;
  float rope_theta = 0.0f;  // 0: no RoPE
  int rope_pos_offset = 0;
};

// The references attend over qkv as given (rope_theta must be 0: the Tensor-level entries apply RoPE around them).
template <typename T>
void attention_forward_ref(const AttentionParams& p, T* out, T* lse, const T* qkv);
template <typename T>
void attention_backward_ref(const AttentionParams& p, T* d_qkv, const T* d_out, const T* qkv, const T* out,
                            const T* lse);

// Rotary position embedding (the "rotate half" form of GPT-NeoX and Hugging Face Llama), applied in place to
// the q and k parts of qkv. For i < Dh/2 and position pos = pos_offset + t, with a = pos * theta^(-2i/Dh):
//   x'[i] = x[i] cos a - x[i + Dh/2] sin a,   x'[i + Dh/2] = x[i + Dh/2] cos a + x[i] sin a
// The backward applies the transposed rotation to d_qkv in place.
struct RopeParams {
  int B = 0, T = 0, H = 0, Dh = 0;
  float theta = 10000.0f;
  int pos_offset = 0;
};

// The RoPE of an attention call (its rope_theta and rope_pos_offset).
RopeParams attention_rope(const AttentionParams& p);

template <typename T>
void rope_forward_ref(const RopeParams& p, T* qkv);
template <typename T>
void rope_backward_ref(const RopeParams& p, T* d_qkv);

}  // namespace tessera

// ---- Tensor-level entries (attention.cpp): route to the reference or the CUDA kernels by device and dtype. ----
// qkv, d_qkv: (B*T, 3C); out, d_out: (B*T, C), all in the compute dtype; lse: (B, H, T) f32 (f64 for an f64
// computation). attention_backward OVERWRITES d_qkv (every element of it). rope_forward / rope_backward rotate
// qkv / d_qkv IN PLACE (the q and k parts; the v part is left as it is).
namespace tessera {

bool attention_supports(const AttentionParams& p, DType dtype, Device device, std::string* why = nullptr);
bool rope_supports(const RopeParams& p, DType dtype, Device device, std::string* why = nullptr);

void attention_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       Context& ctx);
void attention_backward(const AttentionParams& p, const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, Context& ctx);
void rope_forward(const RopeParams& p, const Tensor& qkv, Context& ctx);
void rope_backward(const RopeParams& p, const Tensor& d_qkv, Context& ctx);

// ---- CUDA launchers (attention.cu), on ctx's stream. Pointers are device memory in `dtype` unless typed. ----
// bf16 / f16 with Dh % 8 == 0, Dh <= 128 and 16-byte-aligned qkv, out, d_out, d_qkv run FlashAttention-2 on
// tensor cores (flash.h: mma.sync m16n8k16, f32 accumulators, head widths 32, 64, 80, 128; a dQ pass and a dK/dV
// pass, deterministic). Everything else, f32 included, runs the tiled f32-FMA kernels described next.
// Forward: one block of 256 threads per (query tile of 64 rows, head, batch); K/V tiles of 64 rows in shared
// memory, online softmax (running max and sum in f32 registers), the T x T matrix never stored; lse saved.
// Backward: D = rowsum(d_out * out) (f32, in ctx.scratch: B*H*T floats), then one kernel per query tile for
// dQ and one per key tile for dK and dV, recomputing P = exp(S - lse) tile by tile (no atomics, deterministic).
// Q, K and V are read in place from qkv. Head dims up to kAttentionMaxDh (compiled for padded widths 32, 64,
// 96, 128; any Dh in between runs on the next wider instance). Causal tiles above the diagonal are skipped.
constexpr int kAttentionMaxDh = 128;
// RoPE on the GPU reads cos / sin from a table over positions (pos_offset + T at most this).
constexpr int64_t kRopeMaxPositions = int64_t{1} << 22;
// The kernel family that the CUDA entries run for (p, dtype) on 16-byte-aligned buffers on ctx's GPU:
// "flash-mma", or on sm_90a (TESSERA_FLASH_PATH auto or hopper, flash_hopper.h) "flash-hopper",
// "flash-hopper forward, flash-mma backward" or "flash-mma forward, flash-hopper backward"; else "tiled-fma"
// (tests and benchmarks name the path they measure).
const char* attention_cuda_kernel(const AttentionParams& p, DType dtype, const Context& ctx);
void attention_forward_cuda(const AttentionParams& p, DType dtype, void* out, float* lse, const void* qkv,
                            Context& ctx);
void attention_backward_cuda(const AttentionParams& p, DType dtype, void* d_qkv, const void* d_out,
                             const void* qkv, const void* out, const float* lse, Context& ctx);
// attention_forward_cuda attends over qkv as given (rope_theta must be 0; the Tensor entry rotates first);
// attention_backward_cuda takes rope_theta > 0: on the flash paths with Dh equal to a compiled width the kernels
// rotate dQ and dK back as they store them, elsewhere a rope_backward pass over d_qkv follows.
// RoPE: cos / sin of pos * theta^(-2i/Dh) come from a table per (theta, Dh) in the Context (ctx.device_table),
// computed once in f64 as the reference does (positions in the thousands would lose 1e-4 of the angle in f32)
// and rounded to f32. One thread per (row, 16-byte pack of pairs, 4 q / k heads) when Dh / 2 is a whole number of
// packs and qkv is 16-byte aligned, else one per (row, pair) over every q and k head of the row.
void rope_forward_cuda(const RopeParams& p, DType dtype, void* qkv, Context& ctx);
void rope_backward_cuda(const RopeParams& p, DType dtype, void* d_qkv, Context& ctx);

}  // namespace tessera
