// tessera/infer/beam_search_entry.h — one batch entry's bookkeeping in a beam step, as Hugging Face's
// BeamSearchScorer.process and BeamHypotheses (transformers 4.44) define it. Scalar, sequential code shared by the
// CPU step (beam_search.cpp) and the CUDA step (beam_search.cu, one thread per entry), so that both keep the same
// hypotheses in the same order.
#pragma once
#include <cmath>
#include <cstdint>

#include "tessera/core/philox.h"  // TS_HOST_DEVICE (inline, and __host__ __device__ under nvcc)

namespace tessera::beam {

enum class EarlyStopping : int32_t { False, True, Never };  // HF's early_stopping=False / True / "never"

// What every entry shares in a step.
struct StepShape {
  int K = 1;     // beams
  int V = 0;     // vocab
  int eos = -1;  // -1: no EOS
  int pad = 0;   // the token a finished entry's beams take
  float length_penalty = 1.0f;
  EarlyStopping early_stopping = EarlyStopping::False;
  int max_new_tokens = 0;  // HF's max_length - prompt length, for early_stopping "never"
};

// One entry's finished hypotheses: HF's BeamHypotheses, up to K in insertion order (the order HF's list keeps,
// which decides ties in eviction and in the final pick). A hypothesis is the beam row it continued at `step`
// (its tokens are that row's history, then EOS) and its score sum_logprobs / generated_len^length_penalty.
struct Hyps {
  static constexpr int kMax = 32;
  int n;
  float worst;  // HF's worst_score, 1e9 when empty
  float score[kMax + 1];
  int32_t step[kMax + 1], row[kMax + 1];
};

TS_HOST_DEVICE void hyps_init(Hyps& h) {
  h.n = 0;
  h.worst = 1e9f;
}

// HF's length term: generated_len ** length_penalty, in f64 as Python computes it.
TS_HOST_DEVICE float hyp_score(float sum_logprobs, int generated_len, float length_penalty) {
  return static_cast<float>(sum_logprobs /
                            pow(static_cast<double>(generated_len), static_cast<double>(length_penalty)));
}

// BeamHypotheses.add: keep it when there is room or it beats the worst; past K, drop the lowest score (the
// earliest of equal ones) and the worst becomes the second lowest.
TS_HOST_DEVICE void hyps_add(Hyps& h, int K, float score, int32_t step, int32_t row) {
  if (!(h.n < K || score > h.worst)) return;
  h.score[h.n] = score;
  h.step[h.n] = step;
  h.row[h.n] = row;
  ++h.n;
  if (h.n > K) {
    int lo = 0;
    for (int i = 1; i < h.n; ++i)
      if (h.score[i] < h.score[lo]) lo = i;
    float second = INFINITY;
    for (int i = 0; i < h.n; ++i)
      if (i != lo && h.score[i] < second) second = h.score[i];
    for (int i = lo; i + 1 < h.n; ++i) {
      h.score[i] = h.score[i + 1];
      h.step[i] = h.step[i + 1];
      h.row[i] = h.row[i + 1];
    }
    --h.n;
    h.worst = second;
  } else {
    h.worst = fminf(score, h.worst);
  }
}

// BeamHypotheses.is_done at generated length cur_len (the step's new tokens included), best = the entry's best
// candidate sum of log-probs this step.
TS_HOST_DEVICE bool hyps_is_done(const Hyps& h, const StepShape& s, float best, int cur_len) {
  if (h.n < s.K) return false;
  if (s.early_stopping == EarlyStopping::True) return true;
  const int len = s.early_stopping == EarlyStopping::Never && s.length_penalty > 0.0f ? s.max_new_tokens : cur_len;
  return h.worst >= hyp_score(best, len, s.length_penalty);
}

// One entry's step t (0-based; cur_len = t + 1). cand_s, cand_i: its 2K candidates from the top-k, best first
// (index = beam * V + token; pads (-inf, -1)); rows of this entry are b*K .. b*K + K - 1.
// Writes the K new beams: tokens, parents (the row each continues) and their running scores. A finished entry keeps
// its rows (parent = itself), takes the pad token and score 0. HF raises where fewer than K candidates are not EOS;
// here the missing beams are dead (score -inf, parent the entry's first row, the pad token).
TS_HOST_DEVICE void entry_step(const StepShape& s, int b, int t, const float* cand_s, const int32_t* cand_i, Hyps& h,
                               int32_t& done, int32_t* tokens, int32_t* parents, float* scores) {
  const int base = b * s.K;
  if (done) {
    for (int i = 0; i < s.K; ++i) {
      tokens[base + i] = s.pad;
      parents[base + i] = base + i;
      scores[base + i] = 0.0f;
    }
    return;
  }
  int beam_idx = 0;
  for (int rank = 0; rank < 2 * s.K && beam_idx < s.K; ++rank) {
    if (cand_i[rank] < 0) break;
    const int beam = cand_i[rank] / s.V, token = cand_i[rank] % s.V;
    if (token == s.eos) {
      if (rank < s.K) hyps_add(h, s.K, hyp_score(cand_s[rank], t + 1, s.length_penalty), t, base + beam);
      continue;
    }
    tokens[base + beam_idx] = token;
    parents[base + beam_idx] = base + beam;
    scores[base + beam_idx] = cand_s[rank];
    ++beam_idx;
  }
  for (; beam_idx < s.K; ++beam_idx) {
    tokens[base + beam_idx] = s.pad;
    parents[base + beam_idx] = base;
    scores[base + beam_idx] = -INFINITY;
  }
  done = hyps_is_done(h, s, cand_s[0], t + 1);
}

}  // namespace tessera::beam
