// tessera/infer/sampler.h — next-token sampling (greedy, temperature, top-k, top-p) and plain generation.
//
// With temperature == 0 the sampler is greedy (argmax, the lowest id on a tie). Otherwise
// p = softmax(logits / temperature), keeps the top_k most likely tokens (top_k > 0), then the smallest set of
// most likely tokens whose mass reaches top_p (top_p < 1), renormalises and draws with Philox: draw i of a
// run uses philox_uniform(seed, 0, i).
// Invalid settings (a negative or non-finite temperature, top_k < 0, top_p outside (0, 1]) and NaN or
// infinite logits are errors, never silently turned into another mode.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

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

}  // namespace tessera
