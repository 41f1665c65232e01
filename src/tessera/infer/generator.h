// tessera/infer/generator.h — batched generation over the inference engine: B prompts of unequal lengths, each
// continued by the batched sampler (sampler.h's sample_rows) on the model's device, each stopping on its own.
//
// The loop (generate_batch): one prefill of the n prompts into rows 0 .. n-1 of the engine; then per step
//   logits (rows, V) -> sample_rows on the device, writing each row's token straight into the engine's next input
//   (Engine::next_tokens) -> one read of the tokens through the engine's pinned buffer (the step's only host sync)
//   -> the host appends them, streams text and checks the stops -> Engine::decode.
// Temperature 0 (greedy) goes through sample_rows too: the penalties, the bias and the logprobs apply to it alike.
// Draws: row n's i-th new token uses Philox(seed, stream n, index i) (sample_rows keeps the index on the device),
//   so a prompt in row n draws the same tokens whatever the other rows hold.
// Stops, per row, after its i-th new token t (1-based i):
//   - "eos": t is one of eos_ids (not with ignore_eos). Before min_new_tokens new tokens every EOS id is banned
//     (a logit bias of -inf: every row draws its i-th token at the same step, so one bias list serves them all).
//   - "stop": the decoded new text holds one of the stop strings: the text is cut before its first occurrence
//     (OpenAI's stop; tokens keep every draw, through the one that completed the string).
//   - "length": i == max_new_tokens, or the row's context is full (prompt + i = max_seq + 1: the last draw read
//     a full cache, and the next would need a position past it).
//   A finished row keeps running in the batch (its draws are ignored); the loop ends when every row has finished.
//   A finished row whose cache fills while others run becomes, through the slot table, a child of a running row
//   (Engine::reorder): it then shares that row's position and never needs one past the cache. The engine needs a
//   slot table for that only where a prompt plus max_new_tokens can pass the cache: generator_engine_options.
// The text: the decoder's text of a row's new tokens (EOS excluded); streamed text holds back any tail that could
//   still begin a stop string, so nothing printed is later cut, and an unfinished UTF-8 character at the end, so
//   that only whole characters are printed while the row runs (its last piece is whatever remains).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/infer/engine.h"
#include "tessera/infer/sampler.h"

namespace tessera {

// The text of a row's new tokens, whole: any tokenizer's decode plugs in without touching the loop. It must be
// prefix-stable (the text of a token list begins with the text of each of its prefixes), as byte-level decoding
// and byte-level BPE are.
using TextDecoder = std::function<std::string(const std::vector<int32_t>&)>;

struct GenerateOptions {
  // temperature (0: greedy), top_k, top_p, min_p, the penalties, seed and logprobs; rows, V, ld, n_bias and
  // count_drawn are the loop's to set.
  SampleParams sampling;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias), each id once
  int max_new_tokens = 16;
  int min_new_tokens = 0;         // EOS banned before this many new tokens
  std::vector<int32_t> eos_ids;   // any of them ends a row (none: rows end by stop strings or length)
  bool ignore_eos = false;        // EOS is an ordinary token (and min_new_tokens bans nothing)
  std::vector<std::string> stop;  // non-empty strings
};

enum class FinishReason { Eos, Stop, Length };
const char* finish_reason_name(FinishReason r);  // "eos", "stop", "length"

// One step's logprobs: the top N (id, log-softmax) of the processed logits (sampler.h's SampleParams::logprobs),
// most likely first, and the drawn token's value where it is among them (NaN otherwise).
struct StepLogprobs {
  float chosen = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

struct GeneratedSequence {
  std::vector<int32_t> tokens;  // the new tokens, EOS included where it ended the row
  std::string text;             // the decoder's text of the new tokens: EOS excluded, cut before a stop string
  FinishReason finish = FinishReason::Length;
  std::vector<StepLogprobs> logprobs;  // one per new token, with sampling.logprobs > 0
};

// Sees each row's text as it becomes final (row, piece): the pieces of a row concatenate to its text.
using OnText = std::function<void(int row, const std::string& piece)>;

// Throws Error (one line, naming the flag) for options that cannot run with a vocab of V: the sampler's ranges
// (sample_params_check), a bad --logit-bias (sampler_bias_check), an EOS id outside [0, V), min > max new tokens,
// an empty stop string.
void generate_options_check(const GenerateOptions& o, int V);

// The engine options for `prompts` (at most `batch` of them at a time, each at most max_seq tokens): a slot table
// where a prompt plus max_new_tokens can pass the cache, so that finished rows can follow running ones.
EngineOptions generator_engine_options(const std::vector<std::vector<int32_t>>& prompts, int batch,
                                       const GenerateOptions& o, int max_seq);

// Continues prompts (1 .. engine.rows() of them, each 1 .. max_seq tokens) into rows 0 .. n-1 of the engine; rows
// past n run idle. `decode` is used for the stop strings, the streamed text and each result's text.
std::vector<GeneratedSequence> generate_batch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                              const GenerateOptions& o, const TextDecoder& decode,
                                              const OnText& on_text = {});

}  // namespace tessera
