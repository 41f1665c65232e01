// tessera/infer/beam_search.h — beam search for B batch entries x K beams, on the device, with no host sync per
// step: Hugging Face `generate(num_beams=K)`'s rules (transformers 4.44, BeamSearchScorer).
//
// Rows (cache slots) are r = b * K + beam. Each step takes the logits of the B*K rows that the engine wrote and:
//   1. beam_topk (ops/topk): key = running score + log_softmax(logits)[token], the 2K best per entry over its
//      K*V extensions, ties lowest index (beam * V + token) first: HF's topk over (B, K*V) of
//      `log_softmax + beam_scores`.
//   2. per entry (beam_search_entry.h): HF's process loop. In rank order, an EOS candidate of rank < K becomes a
//      finished hypothesis with score sum_logprobs / (t + 1)^length_penalty (t + 1 tokens generated, EOS
//      included); any other candidate becomes the next beam, until K beams are filled. Up to K hypotheses are
//      kept per entry. An entry is done by HF's is_done (early_stopping true, false or "never").
// On the device it writes next_tokens (B*K) i32, parents (B*K) i32 (the row each new beam continues: the engine
// reorders its cache's slot table from it, then feeds next_tokens at the rows), and the running scores. The running
// score ranks the beams; the length penalty applies only to a finished hypothesis, as HF does.
// At step 0 only beam 0 expands (the others start at -inf; HF uses -1e9, the same whenever V >= 2K).
// finish() reads the state back once and finalizes as HF does: each open beam of an entry that is not done joins
// the hypotheses with generated_len = the steps taken; the best num_return_sequences are returned.
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/context.h"
#include "tessera/core/tensor.h"
#include "tessera/infer/beam_search_entry.h"

namespace tessera {

struct BeamSearchOptions {
  int batch = 1;           // B
  int beams = 1;           // K: 1..32 (the top-k keeps 2K <= kTopkMaxK candidates per entry)
  int vocab = 0;           // V >= K
  int max_new_tokens = 1;  // steps at most
  int eos_id = -1;         // -1: none
  int pad_id = 0;
  float length_penalty = 1.0f;
  beam::EarlyStopping early_stopping = beam::EarlyStopping::False;
  int num_return_sequences = 1;  // 1..K
};

// Checks the options: one line naming the flag (Error) for an impossible setting.
void beam_search_check(const BeamSearchOptions& o);

struct BeamSequence {
  std::vector<int32_t> tokens;  // the generated tokens, EOS last for a hypothesis that ended with it
  float score = 0;              // HF's sequence_scores: sum of log-probs / generated_len^length_penalty
};

class BeamSearch {
 public:
  BeamSearch(const BeamSearchOptions& o, Context& ctx);

  // One step over logits (B*K, ld) in the compute dtype (f32 on the CPU; f32, bf16 or f16 on CUDA), ld >= V
  // (0: V). Graph-capturable on CUDA: the step index lives on the device. Throws past max_new_tokens on the CPU;
  // on CUDA a step past it changes nothing.
  void step(const Tensor& logits, int64_t ld, Context& ctx);

  const Tensor& next_tokens() const { return tokens_; }  // (B*K) i32
  const Tensor& parents() const { return parents_; }     // (B*K) i32
  const Tensor& scores() const { return scores_; }       // (B*K) f32, the running sums of log-probs
  const Tensor& done() const { return done_; }           // (B) i32, 1 once an entry is done

  // The best num_return_sequences per entry, best first: [b][i]. Reads the device state back once.
  std::vector<std::vector<BeamSequence>> finish(Context& ctx);

 private:
  BeamSearchOptions o_;
  beam::StepShape shape_;
  Buffer mem_;  // every device array below, one allocation
  Tensor scores_, tokens_, parents_, done_, cand_s_, cand_i_, lse_, hist_tokens_, hist_parents_, step_;
  Tensor hyps_;  // (B) beam::Hyps, as bytes
};

// ---- CUDA (beam_search.cu): the per-entry step, one thread per entry; reads the step index at *step (and
// increments it); writes the step's tokens and parents into hist_* (max_new_tokens, B*K) as well. ----
void beam_search_entries_cuda(const beam::StepShape& s, int B, const float* cand_s, const int32_t* cand_i,
                              beam::Hyps* hyps, int32_t* done, int32_t* tokens, int32_t* parents, float* scores,
                              int32_t* hist_tokens, int32_t* hist_parents, int32_t* step, Context& ctx);

}  // namespace tessera
