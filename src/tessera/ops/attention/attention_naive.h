// tessera/ops/attention/attention_naive — attention that materializes the (B, H, T, T) score matrix in the compute
// dtype, as plain PyTorch attention does: the yardstick of FlashAttention's acceptance rule (the flash error
// must be at most 2x the error of this, computed in the same low precision, both against an f64 reference) and
// the "naive" rows of `tessera bench attention`. Runs on the CPU (f32, f64) and CUDA (f32, bf16, f16).
//
// Forward: Q, K, V are copied out of qkv into (B*H, T, Dh); S = Q Kᵀ / sqrt(Dh) (batched GEMM, rounded to the
// dtype); P = softmax(S) per row, causal entries j > i zero, rounded to the dtype, lse saved (f32);
// O = P V (batched GEMM) copied into out (B*T, C).
// Backward: dO copied into (B*H, T, Dh); dV = Pᵀ dO; dP = dO Vᵀ (rounded to the dtype);
// dS = P ∘ (dP − rowsum(P ∘ dP)) (in place of dP); dQ = dS K / sqrt(Dh); dK = dSᵀ Q / sqrt(Dh); all three
// copied into d_qkv (every element overwritten).
// The GEMMs are the gemm op (cuBLASLt on a GPU, exact f32 for f32; OpenBLAS on the CPU). Memory: the forward
// keeps P (B·H·T² elements) and Q, K, V for the backward, which adds dP (B·H·T²) and four (B·H·T·Dh) buffers.
// Profiling (the CS336 assignment's annotated attention): the forward opens the NVTX ranges ATTN_QK (S = Q Kᵀ),
// ATTN_SOFTMAX and ATTN_AV (O = P V), the backward ATTN_AV_BWD (dV, dP), ATTN_SOFTMAX_BWD and ATTN_QK_BWD (dQ, dK);
// with a `tracer` they are also its slices (core/trace.h).
#pragma once
#include "tessera/core/buffer.h"
#include "tessera/core/context.h"
#include "tessera/core/tensor.h"
#include "tessera/core/trace.h"
#include "tessera/ops/attention/attention.h"

namespace tessera {

// What the naive forward keeps for its backward (allocated by the forward on ctx's device, in the dtype).
struct AttentionNaiveSaved {
  Buffer q, k, v;  // (B*H, T, Dh)
  Buffer p;        // (B*H, T, T), the probabilities
  DType dtype = DType::F32;
  size_t bytes() const { return q.bytes() + k.bytes() + v.bytes() + p.bytes(); }
};

bool attention_naive_supports(const AttentionParams& p, DType dtype, Device device, std::string* why = nullptr);
// out: (B*T, C), lse: (B, H, T) f32 (f64 for f64), qkv: (B*T, 3C). Fills `saved` (replacing what it held).
void attention_naive_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                             AttentionNaiveSaved& saved, Context& ctx, Tracer* tracer = nullptr);
// d_qkv: (B*T, 3C), OVERWRITTEN; d_out: (B*T, C). Bytes of the temporaries it allocates (for the benchmark's
// memory columns): attention_naive_backward_bytes(p, dtype).
void attention_naive_backward(const AttentionParams& p, const Tensor& d_qkv, const Tensor& d_out,
                              const AttentionNaiveSaved& saved, Context& ctx, Tracer* tracer = nullptr);
size_t attention_naive_backward_bytes(const AttentionParams& p, DType dtype);

// ---- The element-wise pieces (CPU loops in attention_naive.cpp, CUDA kernels in attention_naive.cu). ----
// heads_split: dst (B*H, T, Dh) <- the (B*T, H*Dh) block of src at column `col` with row stride `ld`.
// heads_merge: the reverse; dst rows have stride `ld`, the block starts at column `col`.
// softmax_rows: s (B*H, T, T) in place: P = softmax of each row (causal: entries j > i are 0), lse (B*H*T) f32.
// softmax_backward_rows: dp (B*H, T, T) in place: dS = P ∘ (dP − rowsum(P ∘ dP)).
void attention_heads_split_cuda(const AttentionParams& p, DType dtype, void* dst, const void* src, int64_t ld,
                                int64_t col, Context& ctx);
void attention_heads_merge_cuda(const AttentionParams& p, DType dtype, void* dst, int64_t ld, int64_t col,
                                const void* src, Context& ctx);
void attention_softmax_rows_cuda(const AttentionParams& p, DType dtype, void* s, float* lse, Context& ctx);
void attention_softmax_backward_rows_cuda(const AttentionParams& p, DType dtype, void* dp, const void* prob,
                                          Context& ctx);

}  // namespace tessera
