// tessera bench seq2seq: the encoder-decoder's rows (bench/seq2seq.h: a training step of transformer-base's shape
// at two batch sizes, beam-4 translation at batch 64 and 1, the layer-batched cross-attention K/V projection against
// per-layer GEMMs), with, under --peer, Hugging Face BART's figures from the same run (bench/peers/seq2seq.py:
// training eager and torch.compile with fused AdamW, generate(num_beams) eager and with the static cache) and the
// ratio.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/bench/peer.h"
#include "tessera/bench/seq2seq.h"
#include "tessera/cli/bench_model_common.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif

namespace tessera::cli {

namespace {

// "a,b" -> {"a", "b"}; an empty or unknown item is an error naming the flag.
std::vector<std::string> parse_list(const std::string& flag, const std::string& s,
                                    const std::vector<std::string>* known) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, j - i);
    TS_CHECK(!item.empty(), "--", flag, ": empty item in '", s, "'");
    if (known) {
      std::string names;
      for (const auto& n : *known) names += (names.empty() ? "" : ", ") + n;
      TS_CHECK(std::find(known->begin(), known->end(), item) != known->end(), "--", flag, ": unknown row '", item,
               "' (", names, ")");
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
    i = j + 1;
  }
  return out;
}

std::vector<int> parse_ints(const std::string& flag, const std::string& s) {
  std::vector<int> out;
  for (const std::string& item : parse_list(flag, s, nullptr)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TS_CHECK(used == item.size() && used > 0, "--", flag, ": '", item, "' is not an integer");
    out.push_back(v);
  }
  return out;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

// --size small: transformer-base's form (post-norm, ReLU, sinusoidal, scaled and tied embeddings, its dropout) at a
// size the CPU runs in seconds.
Seq2SeqBenchConfig small_config() {
  Seq2SeqBenchConfig c;
  c.model = encdec_preset("transformer-base");
  c.model.preset = "transformer-base (small: 2+2 layers, 64 wide)";
  c.model.vocab = 512;
  c.model.enc_layers = c.model.dec_layers = 2;
  c.model.d_model = 64;
  c.model.n_heads = 4;
  c.model.d_ff = 256;
  c.model.max_seq = 64;
  c.src_len = c.tgt_len = 8;
  c.train_tokens = {64, 256};
  c.sentences = 4;
  c.translate_batches = {2, 1};
  c.new_tokens = 8;
  c.cross_kv_tokens = 256;
  c.timing = {.warmup = 1, .iters = 2};
  return c;
}

std::string peer_args(const Seq2SeqBenchConfig& c, bool cuda, const std::string& precision) {
  const EncDecConfig& m = c.model;
  std::string rows;
  for (const auto& r : c.rows)
    if (r != "cross-kv") rows += (rows.empty() ? "" : ",") + r;
  auto n = [](double v) { return fmt("%g", v); };
  return "'" TESSERA_PEERS_DIR "/seq2seq.py' --device " + std::string(cuda ? "cuda" : "cpu") + " --precision " +
         precision + " --rows " + rows + " --vocab " + n(m.vocab) + " --d-model " + n(m.d_model) + " --layers " +
         n(m.enc_layers) + "," + n(m.dec_layers) + " --heads " + n(m.n_heads) + " --ffn " + n(m.d_ff) + " --max-pos " +
         n(m.max_seq) + " --dropout " + n(m.dropout) + "," + n(m.attn_dropout) + "," + n(m.act_dropout) +
         " --scale-embedding " + (m.scale_embedding ? "1" : "0") + " --label-smoothing " + n(c.label_smoothing) +
         " --src-len " + n(c.src_len) + " --tgt-len " + n(c.tgt_len) + " --train-tokens " + join(c.train_tokens) +
         " --sentences " + n(c.sentences) + " --batches " + join(c.translate_batches) + " --beams " + n(c.beams) +
         " --new-tokens " + n(c.new_tokens) + " --warmup " + n(c.timing.warmup) + " --iters " + n(c.timing.iters);
}

Seq2SeqBenchConfig read_config(const Flags& a, const Context& ctx, const std::string& size) {
  Seq2SeqBenchConfig c = size == "small" ? small_config() : Seq2SeqBenchConfig{};
  if (size == "full") {
    c.model = encdec_preset("transformer-base");
    if (!ctx.is_cuda()) c.sentences = 8;  // a few on the CPU
  }
  c.rows = a.has("rows") ? parse_list("rows", a.str("rows"), &seq2seq_row_names()) : seq2seq_row_names();
  if (a.has("train-tokens")) c.train_tokens = parse_ints("train-tokens", a.str("train-tokens"));
  if (a.has("batches")) c.translate_batches = parse_ints("batches", a.str("batches"));
  c.src_len = a.integer("src-len", c.src_len);
  c.tgt_len = a.integer("tgt-len", c.tgt_len);
  c.sentences = a.integer("sentences", c.sentences);
  c.beams = a.integer("beams", c.beams);
  c.new_tokens = a.integer("new-tokens", c.new_tokens);
  c.cross_kv_tokens = a.integer("cross-kv-tokens", c.cross_kv_tokens);
  c.timing = {.warmup = a.integer("warmup", c.timing.warmup), .iters = a.integer("iters", c.timing.iters)};
  TS_CHECK(c.timing.warmup >= 0, "--warmup must be >= 0, got ", c.timing.warmup);
  TS_CHECK(c.timing.iters >= 1, "--iters must be >= 1, got ", c.timing.iters);
  const std::string why = seq2seq_bench_check(c);
  TS_CHECK(why.empty(), "bench seq2seq: ", why);
  return c;
}

std::string header(const Seq2SeqBenchConfig& c, const Context& ctx, const std::string& precision,
                   const Seq2SeqPeerFigures& peer) {
  const EncDecConfig& m = c.model;
  const std::string device = ctx.is_cuda() ? ctx.device().str() + " (" + ctx.gpu().name + ")" : "cpu";
  return "# tessera bench seq2seq\n\n- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) +
         "\n- device: " + device + ", " + precision + (precision == "f32" ? "" : " (f32 master weights in training)") +
         "\n- model: " + m.preset + ": " + std::to_string(m.enc_layers) + "+" + std::to_string(m.dec_layers) +
         " layers, d_model " + std::to_string(m.d_model) + ", " + std::to_string(m.n_heads) + " heads, d_ff " +
         std::to_string(m.d_ff) + ", vocab " + std::to_string(m.vocab) + ", post-norm ReLU, random weights\n" +
         (peer.versions.empty() ? "" : "- peer: " + peer.versions + "\n");
}

}  // namespace

int cmd_bench_seq2seq(int argc, char** argv) {
  Flags a("bench seq2seq",
          "Times the encoder-decoder: a training step of transformer-base's shape, beam translation through\n"
          "the inference engine, and the layer-batched cross-attention K/V projection, beside Hugging Face BART.");
  std::string rows_help;
  for (const auto& n : seq2seq_row_names()) rows_help += (rows_help.empty() ? "" : ",") + n;
  a.add("device", "cpu|cuda|cuda:N", "where to run (default: the GPU when one is visible, else the CPU)");
  a.add("precision", "f32|bf16", "compute dtype (default bf16 on a GPU, f32 on the CPU)");
  a.add("rows", "A,B", "rows to run, of " + rows_help + " (default all)");
  a.add("size", "small|full", "full: transformer-base (default); small: a 2+2-layer 64-wide model, seconds on a CPU");
  a.add("train-tokens", "N,M", "target tokens per training batch (default 4096,16384; small 64,256)");
  a.add("src-len", "N", "source tokens per sentence (default 32; small 8)");
  a.add("tgt-len", "N", "target tokens per training sentence (default 32; small 8)");
  a.add("sentences", "N", "sources the translate row translates per batch size (default 1000 on a GPU, 8 on a CPU)");
  a.add("batches", "B,C", "the translate row's batch sizes (default 64,1; small 2,1)");
  a.add("beams", "K", "beams of the translate row, 1..32 (default 4)");
  a.add("new-tokens", "N", "target tokens each hypothesis runs to (default 32; small 8)");
  a.add("cross-kv-tokens", "N", "source tokens of the cross-kv row (default 4096; small 256)");
  a.add("warmup", "N", "untimed steps before timing (default 2; small 1)");
  a.add("iters", "N", "timed steps; the table shows their median (default 10; small 2)");
  a.add("out", "FILE", "also write the table as markdown to FILE");
  a.add_switch("no-progress", "no line on stderr as each row starts");
  a.add_switch("peer",
               "run bench/peers/seq2seq.py (Hugging Face BART: training eager and torch.compile, generate eager "
               "and static cache) in the same call and show its figures");
  a.add("peer-timeout", "S", kPeerTimeoutHelp);
  if (!a.parse(argc, argv, 3)) return 0;

  const std::string size = a.str("size", "full");
  TS_CHECK(size == "small" || size == "full", "--size must be small or full, got ", size);
  const double peer_timeout = read_peer_timeout(a, "bench seq2seq");
  Context ctx = a.has("device") ? Context::from_name(a.str("device")) : Context::best_available();
  const std::string precision = a.str("precision", ctx.is_cuda() ? "bf16" : "f32");
  TS_CHECK(precision == "f32" || precision == "bf16", "--precision must be f32 or bf16, got ", precision);
  TS_CHECK(ctx.is_cuda() || precision == "f32", "--precision ", precision,
           ": the CPU computes in f32 (use --precision f32, or --device cuda)");
  Seq2SeqBenchConfig c = read_config(a, ctx, size);
  c.dtype = precision == "bf16" ? DType::BF16 : DType::F32;
  const std::string out = a.str("out");
  if (a.has("out")) check_output_path("out", out);
  if (!a.has("no-progress"))
    c.on_row = [](const std::string& row) { std::fprintf(stderr, "bench seq2seq: %s ...\n", row.c_str()); };

  const Seq2SeqBenchResult r =
      with_memory_hint("try --size small, or smaller --train-tokens", [&] { return bench_seq2seq(c, ctx); });

  Seq2SeqPeerFigures peer;
  std::string peer_note;
  const bool peer_rows = std::any_of(c.rows.begin(), c.rows.end(), [](const auto& x) { return x != "cross-kv"; });
  if (a.has("peer") && !peer_rows) peer_note = "peer skipped: cross-kv has no peer (its figure is tessera's own)";
  else if (a.has("peer"))
    peer_note = run_peer_script(
        peer_args(c, ctx.is_cuda(), precision), "seq2seq.py",
        [&](const nlohmann::json& j) { return seq2seq_peer_take(j, peer); }, peer_timeout);

  std::string md = header(c, ctx, precision, peer);
  for (const auto& n : r.notes) md += "- " + n + "\n";
  if (a.has("peer"))
    md +=
        "- peer: Hugging Face BartForConditionalGeneration of the same shape (post-norm, ReLU; BART's learned "
        "positions and layernorm_embedding where tessera's preset has sinusoidal positions and none), f32 "
        "parameters" +
        std::string(ctx.is_cuda() && precision == "bf16" ? " under autocast bf16" : "") +
        ", torch.optim.AdamW (fused where the device has it); generate in " + precision + "\n";
  if (!peer_note.empty()) md += "- " + peer_note + "\n";
  for (const auto& [what, why] : peer.unsupported) md += "- peer " + what + ": unsupported (" + why + ")\n";
  for (const auto& e : peer.errors) md += "- peer error: " + e + "\n";
  md += "\n" + seq2seq_bench_table(r, peer, a.has("peer"));
  print_bench_markdown(md, out);
  return 0;
}

}  // namespace tessera::cli
