// tessera bench decode: the inference engine's rows (bench/decode.h: greedy decode at batch 1 and 16, beam search,
// the 2.7B shape against the copy bandwidth, prefill against the training forward, the beam step's top-k, and
// `tessera generate`'s time to first token), with, under --peer, Hugging Face's figures from the same run
// (bench/peers/decode.py: generate eager and with the static cache, its prefill forward, torch.topk,
// from_pretrained + first token, and its own copy bandwidth) and the ratio peer / tessera.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/bench/decode.h"
#include "tessera/bench/peer.h"
#include "tessera/cli/bench_model_common.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/infer/engine.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif

namespace tessera::cli {

namespace {

// "a,b" -> {"a", "b"}; an empty item is an error naming --rows.
std::vector<std::string> parse_rows(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, j - i);
    TS_CHECK(!item.empty(), "--rows: empty item in '", s, "'");
    const auto& names = decode_row_names();
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    TS_CHECK(std::find(names.begin(), names.end(), item) != names.end(), "--rows: unknown row '", item, "' (", known,
             ")");
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
    i = j + 1;
  }
  return out;
}

// A preset for inference: dropout off (the engine runs none; the training forward it is set beside runs the same
// math). "tiny-llama": tiny's size in the Llama layout, the CPU's stand-in for cs336-2.7b.
ModelConfig inference_preset(const std::string& name) {
  ModelConfig c = name == "tiny-llama" ? llama_style(model_preset("tiny")) : model_preset(name);
  if (name == "tiny-llama") c.preset = name;
  c.dropout = 0.0f;
  c.attn_dropout = 0.0f;
  return c;
}

std::string peer_args(const DecodeBenchConfig& c, const std::string& precision) {
  auto has = [&](const char* r) { return std::find(c.rows.begin(), c.rows.end(), r) != c.rows.end(); };
  std::string batches;
  if (has("greedy")) batches = "1";
  if (has("batch")) batches += (batches.empty() ? "" : ",") + std::to_string(c.batch);
  std::string args = "'" TESSERA_PEERS_DIR "/decode.py' --size full --device cuda --precision " + precision +
                     " --models " + c.model.preset + " --new-tokens " + std::to_string(c.new_tokens) + " --prompt " +
                     std::to_string(c.prompt) + " --iters " + std::to_string(c.timing.iters) + " --prefill " +
                     std::to_string(has("prefill") ? c.prefill_tokens : 0);
  if (!batches.empty()) args += " --batches " + batches;
  else args += " --batches ''";
  if (!has("topk")) args += " --no-topk";
  if (!has("first-token")) args += " --no-first-token";
  return args;
}

}  // namespace

int cmd_bench_decode(int argc, char** argv) {
  Flags a("bench decode",
          "Times the inference engine (greedy, batched, beams, the 2.7B shape against the copy "
          "bandwidth,\nprefill, top-k, time to first token) beside Hugging Face generate.");
  std::string rows_help;
  for (const auto& n : decode_row_names()) rows_help += (rows_help.empty() ? "" : ",") + n;
  a.add("device", "cpu|cuda|cuda:N", "where to run (default: the GPU when one is visible, else the CPU)");
  a.add("dtype", "f32|bf16|f16", "compute dtype (default bf16 on a GPU, f32 on the CPU)");
  a.add("rows", "A,B", "rows to run, of " + rows_help + " (default all)");
  a.add("model", "PRESET", "the model of every row but bandwidth (default gpt2-124m on a GPU, tiny on the CPU)");
  a.add("large-model", "PRESET", "the bandwidth row's model (default cs336-2.7b; tiny-llama with --model tiny)");
  a.add("new-tokens", "N", "tokens generated per sequence (default 128, or as many as the models' max_seq leaves)");
  a.add("prompt", "N", "random prompt tokens per sequence, at least 2 (default 16)");
  a.add("batch", "B", "sequences of the batch row (default 16)");
  a.add("beams", "K", "beams of the beams row, and of the top-k row's rows per entry (default 4)");
  a.add("warmup", "N", "untimed runs of each generate, prefill and forward before timing (default 1)");
  a.add("iters", "N", "timed runs of each; the table shows their median (default 3)");
  a.add("pdl", "on|off",
        "programmatic dependent launch of the engine's decode-step and prefill kernels (GPU; default off)");
  a.add("out", "FILE", "also write the table as markdown to FILE");
  a.add_switch("no-progress", "no line on stderr as each row starts");
  a.add_switch("peer",
               "run bench/peers/decode.py (Hugging Face generate, eager and static cache; torch.topk; "
               "from_pretrained) in the same call and show its figures (GPU, gpt2-124m only)");
  a.add("peer-timeout", "S", kPeerTimeoutHelp);
  if (!a.parse(argc, argv, 3)) return 0;

  DecodeBenchConfig c;
  c.rows = a.has("rows") ? parse_rows(a.str("rows")) : decode_row_names();
  c.timing = {.warmup = a.integer("warmup", 1), .iters = a.integer("iters", 3)};
  TS_CHECK(c.timing.warmup >= 0, "--warmup must be >= 0, got ", c.timing.warmup);
  TS_CHECK(c.timing.iters >= 1, "--iters must be >= 1, got ", c.timing.iters);
  const std::string pdl = a.str("pdl", "off");
  TS_CHECK(pdl == "on" || pdl == "off", "--pdl must be on or off, got '", pdl, "'");
  c.pdl = pdl == "on";
  const double peer_timeout = read_peer_timeout(a, "bench decode");
  Context ctx = a.has("device") ? Context::from_name(a.str("device")) : Context::best_available();
  const std::string dtype_name = a.str("dtype", ctx.is_cuda() ? "bf16" : "f32");
  TS_CHECK(dtype_name == "f32" || dtype_name == "bf16" || dtype_name == "f16", "--dtype must be f32, bf16 or f16, got ",
           dtype_name);
  TS_CHECK(ctx.is_cuda() || dtype_name == "f32", "--dtype ", dtype_name,
           ": the CPU engine computes in f32 (use --dtype f32, or --device cuda)");
  c.dtype = dtype_name == "bf16" ? DType::BF16 : dtype_name == "f16" ? DType::F16 : DType::F32;
  const std::string model = a.str("model", ctx.is_cuda() ? "gpt2-124m" : "tiny");
  c.model = inference_preset(model);
  c.large = inference_preset(a.str("large-model", model == "tiny" ? "tiny-llama" : "cs336-2.7b"));
  c.prompt = a.integer("prompt", 16);
  c.batch = a.integer("batch", 16);
  c.beams = a.integer("beams", 4);
  TS_CHECK(c.batch >= 1, "--batch must be at least 1, got ", c.batch);
  TS_CHECK(c.beams >= 1 && c.beams <= 16, "--beams must be 1 to 16 (the top-k keeps 2 x beams <= 32), got ", c.beams);
  int room = c.model.max_seq;
  if (std::find(c.rows.begin(), c.rows.end(), "bandwidth") != c.rows.end()) room = std::min(room, c.large.max_seq);
  c.new_tokens = a.integer("new-tokens", std::max(1, std::min(128, room - c.prompt - kDecodeWarmupSteps)));
  c.prefill_tokens = std::min(1024, c.model.max_seq);
  c.binary = std::filesystem::read_symlink("/proc/self/exe").string();  // this binary, for first-token
  const std::string why = decode_bench_check(c);
  TS_CHECK(why.empty(), "bench decode: ", why);
  const std::string out = a.str("out");
  if (a.has("out")) check_output_path("out", out);
  if (!a.has("no-progress"))
    c.on_row = [](const std::string& row) { std::fprintf(stderr, "bench decode: %s ...\n", row.c_str()); };

  const std::string device = ctx.is_cuda() ? ctx.device().str() + " (" + ctx.gpu().name + ")" : "cpu";
  const DecodeBenchResult r =
      with_memory_hint("try --model tiny, or --rows without bandwidth", [&] { return bench_decode(c, ctx); });

  DecodePeerFigures peer;
  std::string peer_note;
  if (a.has("peer")) {
    if (!ctx.is_cuda()) peer_note = "peer skipped: the PyTorch peers run on a GPU only";
    else if (c.model.preset != "gpt2-124m") peer_note = "peer skipped: the peer builds gpt2-124m's shape only";
    else
      peer_note = run_peer_script(
          peer_args(c, dtype_name), "decode.py", [&](const nlohmann::json& j) { return decode_peer_take(j, peer); },
          peer_timeout);
  }

  std::string md = "# tessera bench decode\n\n- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) +
                   "\n- device: " + device + ", " + dtype_name + (ctx.is_cuda() ? ", PDL " + pdl : "") +
                   "\n- model: " + c.model.preset + " (" + human_count(static_cast<double>(c.model.num_params())) +
                   " parameters), random weights; prompts of " + std::to_string(c.prompt) + " random tokens, " +
                   std::to_string(c.new_tokens) + " new tokens; medians of " + std::to_string(c.timing.iters) +
                   " runs (decode steps: of " + std::to_string(c.new_tokens) + " steps)\n";
  if (r.copy_gbs)
    md += "- copy bandwidth (1 GiB device-to-device, bytes read + written): " + fmt("%.0f", *r.copy_gbs) + " GB/s";
  if (r.copy_gbs && peer.copy_gbs)
    md += "; the peer's (torch copy_ of 2 GiB): " + fmt("%.0f", *peer.copy_gbs) + " GB/s";
  if (r.copy_gbs) md += "\n";
  for (const auto& n : r.notes) md += "- " + n + "\n";
  if (!peer_note.empty()) md += "- " + peer_note + "\n";
  for (const auto& e : peer.errors) md += "- peer error: " + e + "\n";
  md += "\n" + decode_bench_table(r, peer, a.has("peer"));
  print_bench_markdown(md, out);
  return 0;
}

}  // namespace tessera::cli
