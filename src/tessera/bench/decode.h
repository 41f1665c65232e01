// tessera/bench/decode.h — the rows of `tessera bench decode`: the inference engine (infer/engine.h) timed on
// random weights, each figure in the unit Hugging Face's peer (bench/peers/decode.py) reports, so that the two sit
// side by side as a ratio.
//
// Rows (DecodeBenchConfig::rows), all batch entries given random prompts of `prompt` tokens:
//   greedy      batch 1, greedy, new_tokens tokens. "decode step": the median of new_tokens engine.decode(greedy)
//               calls after kDecodeWarmupSteps untimed ones (the first runs eagerly, the second captures the CUDA
//               graph, the rest replay it), each between CUDA events with L2 flushed (BenchHarness). "generate": the
//               wall time of prefill + the first token + (new_tokens - 1) decode steps, each step's tokens read to
//               the host as a streaming generate does, / new_tokens: what the peer's ms_per_token measures.
//   batch       the same with `batch` sequences: per step (the peer's unit), and per token (per step / batch).
//   beams       batch 1, `beams` beams, no EOS (as the peer's min_new_tokens = max_new_tokens): beam_generate
//               (infer/beam_generate.h: the prefill, then per step reorder + decode + BeamSearch::step, one CUDA
//               graph on the GPU, no host read but the done flags' poll), wall / steps.
//   bandwidth   the `large` model (cs336-2.7b's shape), batch 1, greedy: the decode step as in greedy, and the
//               weight bytes it reads per step / its time, as a fraction of the copy bandwidth of the same run
//               (BenchHarness::copy_bandwidth_gbs of a 1 GiB device-to-device copy: bytes read + written). The
//               bytes: every parameter but the position table and an untied token embedding table, of which one
//               row is read; the KV cache's reads are not counted, so the fraction errs low.
//               The notes give each model's bandwidth floor: those bytes / the copy bandwidth.
//   prefill     one prompt of prefill_tokens through Engine::prefill, and bench_model's training forward of the
//               same (1, prefill_tokens) shape (embedding .. loss over every position; bench/model.h), both as
//               wall time around a synchronize, the median of timing.iters after timing.warmup.
//   topk        beam_topk on (32 x beams, V) logits, k = 2 x beams (bench/topk.h), with its candidates per row.
//   first-token `tessera generate` run as a child process on a checkpoint of the model that save_checkpoint wrote
//               to a temporary directory (f32, as training writes it): from the start of the process until the
//               byte after the echoed prompt reaches its stdout, model load included — what a user waits for.
//               One untimed run first (the page cache holds the checkpoint after it, as it does for the peer).
// The gpt2 rows' model and the large model run in the compute dtype without master weights (inference keeps none),
// with dropout off, weights from bench_init_weights. On the GPU the ms and GB/s hold for that GPU only: compare
// them with the peer's as a ratio.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/bench/harness.h"
#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "tessera/models/config.h"

namespace tessera {

inline constexpr int kDecodeWarmupSteps = 3;

// The row names, in the order they run.
const std::vector<std::string>& decode_row_names();

struct DecodeBenchConfig {
  ModelConfig model;  // the greedy, batch, beams, prefill and first-token rows (and topk's V)
  ModelConfig large;  // the bandwidth row
  DType dtype = DType::F32;
  std::vector<std::string> rows;  // names from decode_row_names()
  int prompt = 16;                // tokens per prompt, >= 2 (the beams row prefills all but the last)
  int new_tokens = 128;
  int batch = 16;
  int beams = 4;
  int prefill_tokens = 1024;
  int topk_batch = 32;
  TimingOptions timing{.warmup = 1, .iters = 3};  // runs of each whole generate, prefill and first token
  bool pdl = false;    // EngineOptions::pdl of the engines the rows make (first-token's child runs generate's default)
  std::string binary;  // the tessera binary for first-token
  std::function<void(const std::string& row)> on_row = {};
};

// Why `c` cannot run (one line naming the flag), or "": prompt and new tokens within each model's max_seq, the
// engine supports both models, prefill_tokens within max_seq.
std::string decode_bench_check(const DecodeBenchConfig& c);

// One line of the table. `value` is in `unit`; a peer figure (ms, keyed as decode_peer_key / decode_peer_prefill_key,
// decode_peer_topk_key, "first token") is shown as peer_ms x peer_factor in the same unit, with the ratio peer / value
// (> 1: tessera is faster). Lines without peers show only tessera's figure.
struct DecodeLine {
  std::string row;      // its row's name
  std::string measure;  // what was timed
  double value = 0;
  std::string unit;
  double peer_factor = 1;
  std::vector<std::pair<std::string, std::string>> peers;  // (label, peer key)
};

struct DecodeBenchResult {
  std::vector<DecodeLine> lines;
  std::optional<double> copy_gbs;  // the 1 GiB copy's bandwidth (GPU only)
  std::vector<std::string> notes;  // one line each: bandwidth floors, candidates per row, how a row was timed
};

DecodeBenchResult bench_decode(const DecodeBenchConfig& c, Context& ctx);

class Model;
// The weight bytes one decode step of `model` reads: every parameter but the position table and, where the head is
// not tied to it, the token embedding table (one row of each is read: C elements, counted).
double decode_weight_bytes(const Model& model);

// ---- the peer (bench/peers/decode.py) ----
std::string decode_peer_key(const std::string& mode, int batch, int beams);  // "generate eager b1 k1"
std::string decode_peer_prefill_key(int tokens);                             // "prefill 1024"
std::string decode_peer_topk_key(int rows, int cols, int k);                 // "topk 32 x 201028 k 8"

struct DecodePeerFigures {
  std::map<std::string, double> ms;  // per key: generate ms per step (its ms_per_token), prefill, topk, first token
  std::optional<double> copy_gbs;
  std::vector<std::string> errors;  // "<key>: <error>" of a record that failed
};

// Takes one JSON object the peer printed into f; returns whether it was a figure (or an error record).
bool decode_peer_take(const nlohmann::json& j, DecodePeerFigures& f);

// The markdown table of r: one line per (tessera figure, peer), with_peer: the peer's figure in the line's unit
// and peer / tessera ("–" where the peer gave none).
std::string decode_bench_table(const DecodeBenchResult& r, const DecodePeerFigures& peer, bool with_peer);

}  // namespace tessera
