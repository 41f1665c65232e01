// tessera/infer/beam_generate.h — beam search through the inference engine: B prompts of unequal lengths, K beams
// each, decoded with the KV cache, whose slot table follows the parent beams; no host synchronization per step.
//
// Rows: the engine's S = B x K rows; row r = e * K + i is beam i of entry e (beam_search.h's layout).
// Prefill: the B prompts run into rows 0 .. B-1 longest first (entry e is the e-th longest prompt; ties keep the
//   prompts' order), then one reorder makes every row e * K + i a child of row e: the K beams of an entry read its
//   prompt's K and V from one slot, and no layer's history is copied. Longest first because a row writes its new
//   tokens into its own slot, at the positions past its entry's prompt (slot_reorder's rule, decode_ops.h), while
//   slot r < B holds entry r's prompt: row r belongs to entry r / K <= r, whose prompt is at least as long, so no
//   row overwrites a prompt position that another entry reads.
// Step 0 ranks the prefill's logits, row e placed at row e * K (beams 1..K-1 start at score -inf: only beam 0
//   expands). Step t >= 1, through Engine::decode_with: engine.reorder(parents) and engine.set_tokens(next_tokens),
//   both BeamSearch's device tensors; the decode (logits (S, V)); BeamSearch::step. Nothing of a step is read on the
//   host, and on the GPU the whole step is one CUDA graph, replayed from step 2 on.
// Stop: when every entry is done or after max_new_tokens steps. The done flags are read on the host every step on
//   the CPU (host memory: the read costs nothing) and every kBeamDonePollSteps steps on the GPU (a copy and one
//   stream sync): a step past an entry's end is a no-op for it (its rows keep their own history and take the pad
//   token), so stopping a few steps late changes only the time. Then BeamSearch::finish reads the result once.
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/infer/beam_search.h"
#include "tessera/infer/engine.h"

namespace tessera {

// How often, in steps, the GPU loop reads the done flags back.
constexpr int kBeamDonePollSteps = 8;

// The best o.num_return_sequences hypotheses of each prompt, best first: [b][j], b in the prompts' order; Hugging
// Face generate(num_beams = o.beams)'s sequences (the generated tokens, EOS last where a hypothesis ended with it)
// and sequences_scores. The engine must have rows() == prompts.size() x o.beams (EngineOptions{.batch = B, .beams =
// K}). o.batch and o.vocab are set here from the prompts and the engine. Throws Error (one line) for impossible
// options (beam_search_check) or a prompt with no room in the cache: each prompt of L tokens needs
// L + max_new_tokens - 1 <= engine.max_seq() positions (the last new token is never fed back).
std::vector<std::vector<BeamSequence>> beam_generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                     const BeamSearchOptions& o);

}  // namespace tessera
