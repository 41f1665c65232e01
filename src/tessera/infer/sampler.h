// tessera/infer/sampler.h — next-token sampling: the batched sampler over a logits tensor (CPU reference and CUDA
// kernel, below), and the single-row host sampler with plain generation that the CLI used before the engine.
//
// Single row (sample_token): with temperature == 0 the sampler is greedy (argmax, the lowest id on a tie). Otherwise
// p = softmax(logits / temperature), keeps the top_k most likely tokens (top_k > 0), then the smallest set of
// most likely tokens whose mass reaches top_p (top_p < 1), renormalises and draws with Philox: draw i of a
// run uses philox_uniform(seed, 0, i).
// Invalid settings (a negative or non-finite temperature, top_k < 0, top_p outside (0, 1]) and NaN or
// infinite logits are errors, never silently turned into another mode.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"
#include "tessera/models/model.h"

namespace tessera {

struct SamplerParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
};

// Throws Error naming the flag (--temperature, --top-k, --top-p) that is out of range.
void sampler_check(const SamplerParams& p);
// One token from logits (V). Throws Error for invalid params or a NaN or infinite logit.
int32_t sample_token(const SamplerParams& p, const float* logits, int V, uint64_t draw);

// Appends max_new tokens to prompt; the context is the last max_seq tokens. (Recomputes the whole context
// per token; the KV-cache generator replaces this in the inference issue.) Reserves the model's activations
// once for the longest context it will run, so the arena is not re-planned per token. on_token, when given, sees
// each new token as soon as it is drawn (the CLI prints the text as it comes).
std::vector<int32_t> generate(Model& model, std::vector<int32_t> tokens, int max_new, const SamplerParams& p,
                              const std::function<void(int32_t)>& on_token = {});

// ---- The batched sampler: one token per row of a logits tensor, on the CPU or the GPU. ----
//
// Row n of logits l (V valid columns, rows ld apart) is processed in Hugging Face's order of logits processors and
// warpers, then drawn from:
//   1. penalties, for the counts c_j of token j in the row's history (RepetitionPenaltyLogitsProcessor, then
//      OpenAI's frequency and presence penalties): for c_j > 0, l_j <- (l_j < 0 ? l_j r : l_j / r)
//      - (c_j frequency + presence);
//   2. logit bias: l_j <- l_j + bias_j for the listed ids (the same list for every row);
//   3. temperature: greedy when temperature == 0 (the argmax of the processed l, the lowest id on a tie; no draw);
//      else weights w_j = exp((l_j - max l) / T), so the maximum's w is 1;
//   4. top-k (k > 0): keep the tokens whose l is >= the k-th largest l (HF's TopKLogitsWarper: ties at the cut are
//      all kept);
//   5. top-p (p < 1), over the top-k set K: keep j iff the mass of the tokens of K with a larger l is < p · mass(K)
//      (HF's TopPLogitsWarper: the smallest set of most likely tokens reaching p; ties at the cut all kept);
//   6. min-p (> 0): keep j iff w_j >= min_p · w_max = min_p (HF's MinPLogitsWarper: p_j >= min_p · p_max);
//   7. draw: u = philox_u32(seed, /*stream=*/n, /*index=*/steps[n]); the token is the first, in id order, whose
//      inclusive prefix of kept mass exceeds floor(u · Z / 2^32), Z the kept mass.
// Masses are integers, floor(w 2^38) (sampler_math.h): deterministic sums in any order, and the same numbers in
// the reference and the kernel, which share every float operation; for f32 logits both draw the same token for the
// same (seed, row, step). Steps 1-2 write the processed logits back into `logits` (in its dtype), as HF's
// processors do in place; steps 3-7 only read.
//
// The history is a count table, counts: (rows, V) int32, c_j = occurrences of token j in row n's prompt and
// output. The engine zeroes it and adds each prompt once (sampler_counts_add), and the sampler adds each drawn
// token itself when count_drawn is set, so nothing else is kept up to date per step. It is read only when a
// penalty is active (repetition != 1, presence != 0 or frequency != 0) and may be undefined otherwise.
// The step counter is in device memory: steps: (rows) int32 read as uint32; the sampler reads steps[n] for its
// draw and stores steps[n] + 1 (every mode, greedy included), so a captured CUDA graph replays with new draws.
//
// GPU method (sampler.cu): one block per row, one kernel, no sort, no host sync, no allocation (graph-capturable).
// The passes over the row: penalties and bias in place; max and argmax (and NaN / +inf detection); for top-k, a
// radix select of the k-th largest order key (4 passes of a 256-bin count histogram over the keys that match the
// prefix found so far); for top-p, the same descent over a 256-bin mass histogram, finding the largest key v with
// mass(K, key >= v) >= ceil(p · mass(K)); then each thread sums the kept mass of a contiguous chunk of ids, a block
// scan gives the chunks' prefixes in id order, and the thread whose chunk holds the target finds the token. The
// invariant of each descent, once the top b bits are fixed to P: the elements whose keys lie above every key with
// those top bits P weigh (count, or sum of masses) less than the target (k, or ceil(p · mass(K))), and with the
// keys of top bits P added they reach it; after 32 bits P is the cut itself. A row is read about 12 times (L2
// serves the decode batch); the count table costs rows · V · 4 bytes (51 MB for 256 rows of 50257).
// A logit of -inf is a masked token (a bias of -inf bans one): it has mass 0 and is never drawn.
struct SampleParams {
  int rows = 0, V = 0;
  int64_t ld = 0;  // the row stride of logits in elements; 0: V
  float temperature = 1.0f;
  int top_k = 0;       // 0: off
  float top_p = 1.0f;  // 1: off
  float min_p = 0.0f;  // 0: off
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int n_bias = 0;            // entries of bias_ids / bias_values
  bool count_drawn = false;  // add each drawn token to counts
  // The N most likely tokens per row (0: off, at most kMaxLogprobs): their ids and log-softmax values of l / T (of
  // l when greedy) after the penalties and bias, before top-k / top-p / min-p; most likely first, ties by id.
  int logprobs = 0;
  static constexpr int kMaxLogprobs = 20;
  constexpr int64_t row_stride() const { return ld ? ld : V; }
  constexpr bool penalized() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// Throws Error naming the flag (--temperature, --top-k, --top-p, --min-p, --repetition-penalty,
// --presence-penalty, --frequency-penalty, --logprobs) that is out of range, or a bad shape.
void sample_params_check(const SampleParams& p);
// Throws Error naming --logit-bias for an id outside [0, V), a repeated id or a non-finite bias: the device list
// is checked on the host, before its upload, since the kernel cannot report it (it skips an id outside [0, V)).
void sampler_bias_check(const std::vector<std::pair<int32_t, float>>& bias, int V);

// tokens: (rows) i32, written; logits: (rows · row_stride) in the compute dtype (f32 / f64 on the CPU, f32 / bf16 /
// f16 on the GPU), its columns [0, V) overwritten by steps 1-2 when a penalty or bias is active; counts: (rows · V)
// i32 or undefined; bias_ids: (n_bias) i32 and bias_values: (n_bias) f32, undefined when n_bias == 0; steps: (rows)
// i32; logprob_ids: (rows · logprobs) i32 and logprob_values: (rows · logprobs) f32, undefined when logprobs == 0.
// A row with a NaN or +inf logit, or none above -inf, after steps 1-2: the CPU throws an Error naming the row; the
// GPU writes token -1 for it (and leaves its step, counts and logprobs alone): the caller checks the tokens it
// copies back to stream the text.
void sample_rows(const SampleParams& p, const Tensor& tokens, const Tensor& logits, const Tensor& counts,
                 const Tensor& bias_ids, const Tensor& bias_values, const Tensor& steps, const Tensor& logprob_ids,
                 const Tensor& logprob_values, Context& ctx);
// counts[n, tokens[n, i]] += 1 for i < lengths[n]: tokens (rows, max_len) i32, lengths (rows) i32, counts (rows, V)
// i32. Ids outside [0, V) are an Error on the CPU and skipped on the GPU.
void sampler_counts_add(int rows, int V, int max_len, const Tensor& counts, const Tensor& tokens, const Tensor& lengths,
                        Context& ctx);

// The reference: T is float or double; every operation after the load is in f32 (the kernel's arithmetic), and the
// processed logits are stored back as T.
template <typename T>
void sample_rows_ref(const SampleParams& p, int32_t* tokens, T* logits, int32_t* counts, const int32_t* bias_ids,
                     const float* bias_values, uint32_t* steps, int32_t* logprob_ids, float* logprob_values);

// CUDA launchers (sampler.cu), on ctx's stream; pointers are device memory, logits in `dtype`.
void sample_rows_cuda(const SampleParams& p, DType dtype, int32_t* tokens, void* logits, int32_t* counts,
                      const int32_t* bias_ids, const float* bias_values, uint32_t* steps, int32_t* logprob_ids,
                      float* logprob_values, Context& ctx);
void sampler_counts_add_cuda(int rows, int V, int max_len, int32_t* counts, const int32_t* tokens,
                             const int32_t* lengths, Context& ctx);

}  // namespace tessera
