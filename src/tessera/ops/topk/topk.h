// tessera/ops/topk — the beam step's top-k: log-softmax + running score, then HARS (retrieve, then re-rank).
//
// Shapes: B batch entries, K beams (rows) per entry, V vocab; logits (B*K, V) rows ld apart in the compute dtype;
// beam_scores (B*K) f32, the running sum of log-probabilities of each beam.
// The ranked key of token j of row r = b*K + beam, in f32, with this exact expression everywhere:
//   lse_r  = log Σ_j exp(x_rj)           over the row's non-NaN logits (NaN never poisons the max or the sum)
//   key_rj = beam_scores[r] + (x_rj - lse_r)
// Its index is the flat candidate index beam * V + j (Hugging Face's `next_indices * V + next_tokens`).
// The output per batch entry b: the k largest keys over its K rows, sorted by key descending, ties lowest index
// first. A key that is NaN or -inf is never selected; an entry with fewer than k selectable keys yields all of
// them, then pads (-inf, -1).
// The length penalty does not enter the key. Hugging Face ranks the open beams by the plain sum of log-probs and
// divides by a length term only when a hypothesis is finished (infer/beam_search.h); every candidate of one step
// has the same length, so a per-step divisor (LightSeq's ((5+L)/6)^α) would not change this order anyway.
//
// HARS (the CUDA path, and beam_topk_hars_cpu, its algorithm on the host):
//   retrieve, per row: split the V keys into G >= k groups and take each group's max; R = the min of those maxima
//     is a lower bound on the row's k-th largest key (each of >= k groups holds a key >= R). Only keys >= R (the same
//     f32 expression as the bound) are candidates; among them the row's exact top k (ties lowest index) are kept.
//     G = beam_topk_groups(k), the fewest the bound allows (a power of two): the more columns a group holds, the
//     larger its max and the tighter R (on N(0, 3^2) logits of 50257 columns, G = 8 keeps tens of candidates a
//     row where 256 groups would keep over a thousand).
//     Every key of the row is a monotone function of x (rounding is monotone), so a group's max key is the key of
//     its max logit: the maxima come from the same pass as the row's max and sum, and the filter is the second pass.
//   re-rank, per batch entry: the exact top k among its K rows' kept candidates (K * k of them), segmented by entry
//     (one block each; no score offset per entry, so no precision is lost).
//   The top k of an entry is always within the union of its rows' own top k, so the result equals a full sort.
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "tessera/core/tensor.h"

namespace tessera {

inline constexpr int kTopkMaxK = 64;  // Hugging Face keeps 2 * num_beams candidates: 32 beams at most

struct BeamTopkParams {
  int B = 0;       // batch entries
  int K = 1;       // rows (beams) per batch entry
  int V = 0;       // vocab: columns per row
  int k = 1;       // candidates kept per batch entry, 1..kTopkMaxK
  int64_t ld = 0;  // row stride of logits in elements; 0: V (packed)
  int64_t row_stride() const { return ld ? ld : V; }
};

bool beam_topk_supports(const BeamTopkParams& p, DType dtype, Device device, std::string* why = nullptr);

// The key expression of the header, written once for the host; the kernels spell it the same way.
inline float beam_topk_key(float beam_score, float x, float lse) { return beam_score + (x - lse); }

// ---- CPU (topk_ref.cpp). logits in `dtype` (f32, bf16, f16 or f64, read as f32), host memory. ----
// lse[r] of each row: max and Σ exp(x - max) in f64 over the non-NaN logits, rounded to f32 (-inf for a row with
// no finite logit; +inf logits are outside the contract).
void beam_topk_lse_ref(const BeamTopkParams& p, DType dtype, float* lse, const void* logits);
// The reference: every selectable key of the entry, sorted in full, the first k taken. lse is an input, so that a
// test can rank with the lse another implementation computed (the order of near-ties depends on it).
// scores, indices: (B, k).
void beam_topk_sort_ref(const BeamTopkParams& p, DType dtype, float* scores, int32_t* indices, const void* logits,
                        const float* beam_scores, const float* lse);
// The retrieve's group count for k: the least power of two >= k (it divides kTopkThreads).
inline int beam_topk_groups(int k) {
  int g = 1;
  while (g < k) g *= 2;
  return g;
}

// HARS as the kernels run it (groups = beam_topk_groups(k)), on the host: `groups` strided groups per row (group g
// holds the columns j with j % groups == g), retrieve into cand (B*K, k) scores and indices, then re-rank into scores,
// indices (B, k). counts (B*K), may be null: the keys >= R per row (the retrieve's candidates before the exact top k).
void beam_topk_hars_cpu(const BeamTopkParams& p, int groups, DType dtype, float* scores, int32_t* indices,
                        int32_t* counts, const void* logits, const float* beam_scores, const float* lse);

// ---- Tensor-level entry (topk.cpp): the reference on the CPU (f32), the HARS kernels on CUDA (f32, bf16). ----
// logits: (B*K, row_stride) in the compute dtype (the last row may stop at V); beam_scores: (B*K) f32;
// scores: (B, k) f32; indices: (B, k) i32; lse: (B*K) f32, written; counts: (B*K) i32 or undefined. No host
// synchronization and no allocation on CUDA after the first call for a shape (graph-capturable): the retrieve's
// (B*K, k) candidates live in ctx.scratch.
void beam_topk(const BeamTopkParams& p, const Tensor& scores, const Tensor& indices, const Tensor& lse,
               const Tensor& counts, const Tensor& logits, const Tensor& beam_scores, Context& ctx);

// ---- CUDA launchers (topk.cu), on ctx's stream. ----
// Retrieve: one block of kTopkThreads per row, thread t reading the columns j ≡ t (mod kTopkThreads). Pass 1: the
// online max/sum and each thread's max logit; block reduce -> lse, then the groups' max keys and R. Pass 2: keys >= R
// are appended to a shared-memory list; then k rounds of a block argmax over the list pick the row's top k. A row whose
// list overflows (ties wider than the list: constant rows) runs the k rounds over the whole row instead. Re-rank: one
// block per entry, k rounds of a block argmax over its K * k candidates. cand_scores, cand_indices: (B*K, k) workspace;
// counts may be null.
void beam_topk_cuda(const BeamTopkParams& p, DType dtype, float* scores, int32_t* indices, float* lse, int32_t* counts,
                    const void* logits, const float* beam_scores, float* cand_scores, int32_t* cand_indices,
                    Context& ctx);
// 512 threads a row: 100 columns a thread at V = 50257, so that B*K = 128 rows (one block an SM) keep enough loads in
// flight. `tessera bench topk` is the measure to choose it by.
inline constexpr int kTopkThreads = 512;

}  // namespace tessera
