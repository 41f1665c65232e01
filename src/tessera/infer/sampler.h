// tessera/infer/sampler.h — next-token sampling (greedy, temperature, top-k, top-p) and plain generation.
//
// With temperature <= 0 the sampler is greedy (argmax). Otherwise p = softmax(logits / temperature), keeps the
// top_k most likely tokens (top_k > 0), then the smallest set of most likely tokens whose mass reaches top_p
// (top_p < 1), renormalises and draws with Philox: draw i of a run uses philox_uniform(seed, 0, i).
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/models/gpt.h"

namespace tessera {

struct SamplerParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
};

void sampler_check(const SamplerParams& p);
int32_t sample_token(const SamplerParams& p, const float* logits, int V, uint64_t draw);

// Appends max_new tokens to prompt; the context is the last max_seq tokens. (Recomputes the whole context
// per token; the KV-cache generator replaces this in the inference issue.)
std::vector<int32_t> generate(Gpt& model, std::vector<int32_t> tokens, int max_new, const SamplerParams& p);

}  // namespace tessera
