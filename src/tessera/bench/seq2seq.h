// tessera/bench/seq2seq.h — the rows of `tessera bench seq2seq`: the encoder-decoder (models/encoder_decoder.h)
// trained and translating on random weights, and its layer-batched cross-attention K/V projection, each figure in
// the unit Hugging Face BART's peer (bench/peers/seq2seq.py) reports, so that the two sit side by side as a ratio.
//
// Rows (Seq2SeqBenchConfig::rows), every sentence of random ids in [3, vocab) (no pad, BOS or EOS inside it):
//   train      one training step per timed run: zero_grad, forward with the label-smoothed loss (dropout on, as the
//              preset trains), backward, AdamW (f32 master weights for a 16-bit model, as tessera's GPU training
//              keeps them). A fixed bucket: B sentences of src_len source and tgt_len target tokens, B chosen per
//              entry of train_tokens as target tokens / tgt_len. Figures: the median ms per step over timing.iters
//              steps after timing.warmup, target tokens/s (B tgt_len / step time), and the device memory the run
//              added (the driver's count after the steps less before the model: weights, gradients, moments,
//              activations and the libraries' workspaces).
//   translate  beam search (beams) of `sentences` sources of src_len tokens through the engine `tessera translate`
//              uses (infer/seq2seq_engine.h, seq2seq_beam) in batches of each entry of translate_batches, without
//              an EOS id, so that every hypothesis runs the full new_tokens steps (the peer sets min_new_tokens =
//              max_new_tokens for the same count). Figures: sentences/s and ms per sentence, the wall time of all
//              the batches (encode, steps, the search's host reads) after one untimed batch.
//   cross-kv   the decoder's cross-attention K/V projection of cross_kv_tokens source tokens: the layer-batched op
//              (ops/cross_kv: ONE GEMM of width 2 L KV over all L decoder layers, then the layout step) against L
//              separate calls of the same op with L = 1 (one GEMM of width 2 KV per layer over the same memory),
//              forward and backward (d_memory summed over the layers, d_W, d_b), ms each and the ratio.
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
#include "tessera/models/encdec_config.h"

namespace tessera {

// The row names, in the order they run.
const std::vector<std::string>& seq2seq_row_names();

struct Seq2SeqBenchConfig {
  EncDecConfig model;
  DType dtype = DType::F32;
  std::vector<std::string> rows;  // names from seq2seq_row_names()
  int src_len = 32, tgt_len = 32;
  std::vector<int> train_tokens = {4096, 16384};  // target tokens per batch, each a multiple of tgt_len
  float label_smoothing = 0.1f;
  int sentences = 1000;  // translate: sources per batch size
  std::vector<int> translate_batches = {64, 1};
  int beams = 4;
  int new_tokens = 32;         // target tokens per hypothesis
  int cross_kv_tokens = 4096;  // source tokens of the cross-kv row
  TimingOptions timing{.warmup = 2, .iters = 10};
  std::function<void(const std::string& row)> on_row = {};
};

// Why `c` cannot run (one line naming the flag), or "".
std::string seq2seq_bench_check(const Seq2SeqBenchConfig& c);

// One line of the table: `value` in `unit`; peers by key into Seq2SeqPeerFigures (in the same unit). higher_better:
// the ratio is value / peer (tokens/s, sentences/s), else peer / value (ms, bytes); > 1: tessera ahead.
struct Seq2SeqLine {
  std::string row, measure;
  double value = 0;
  std::string unit;
  bool higher_better = false;
  std::vector<std::pair<std::string, std::string>> peers;  // (label, peer key)
};

struct Seq2SeqBenchResult {
  std::vector<Seq2SeqLine> lines;
  std::vector<std::string> notes;  // one line each: shapes, how a row was timed
};

Seq2SeqBenchResult bench_seq2seq(const Seq2SeqBenchConfig& c, Context& ctx);

// ---- the peer (bench/peers/seq2seq.py) ----
// "<row> <mode> <n> <unit>": e.g. row train, mode eager or compile, n the target tokens, unit one of the table's units
std::string seq2seq_peer_key(const std::string& row, const std::string& mode, int n, const std::string& unit);

struct Seq2SeqPeerFigures {
  std::map<std::string, double> values;            // by seq2seq_peer_key
  std::map<std::string, std::string> unsupported;  // "<row> <mode>" -> the one-line reason
  std::vector<std::string> errors;                 // "<key>: <error>" of a record that failed
  std::string versions;                            // "torch X, transformers Y"
};

// Takes one JSON object the peer printed; returns whether it was a figure (or an error / unsupported record).
bool seq2seq_peer_take(const nlohmann::json& j, Seq2SeqPeerFigures& f);

// The markdown table: one line per (tessera figure, peer); with_peer adds the peer's figure and the ratio ("–"
// where the peer gave none).
std::string seq2seq_bench_table(const Seq2SeqBenchResult& r, const Seq2SeqPeerFigures& peer, bool with_peer);

}  // namespace tessera
