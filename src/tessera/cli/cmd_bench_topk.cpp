// tessera bench topk: the beam step's top-k (ops/topk: log-softmax + running score, HARS retrieve + re-rank) on
// logits of (B*K, V), beside PyTorch in the same run (bench/peers/topk.py): torch.topk alone over keys already
// formed, and Hugging Face's step (log_softmax + scores, then torch.topk). Reports the retrieve's candidates per
// row (the keys >= R that the exact per-row top-k is taken from).
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/bench/harness.h"
#include "tessera/bench/peer.h"
#include "tessera/bench/topk.h"
#include "tessera/cli/bench_flags.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/ops/topk/topk.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif

namespace tessera::cli {

int cmd_bench_topk(int argc, char** argv) {
  Flags a("bench topk", "Times the beam step's HARS top-k beside torch.topk and Hugging Face's step.");
  a.add("device", "cpu|cuda|cuda:N", "where to run (default: the GPU when one is visible, else the CPU)");
  a.add("dtype", "f32|bf16", "logits dtype (default bf16 on a GPU, f32 on the CPU)");
  a.add("batch", "B", "batch entries (default 32)");
  a.add("beams", "K", "beams per entry: rows of logits per entry (default 4)");
  a.add("vocab", "V", "vocabulary (default 50257)");
  a.add("k", "N", "candidates kept per entry, 1..64 (default 8: 2 x beams, as Hugging Face keeps)");
  add_bench_run_flags(a, "topk.py");
  if (!a.parse(argc, argv, 3)) return 0;

  const TimingOptions timing = bench_timing(a);
  Context ctx = bench_context(a);
  const std::string dtype_name = bench_dtype(a, ctx);
  const DType dtype = dtype_name == "bf16" ? DType::BF16 : DType::F32;
  const BeamTopkParams p{.B = a.integer("batch", 32),
                         .K = a.integer("beams", 4),
                         .V = a.integer("vocab", 50257),
                         .k = a.integer("k", 8)};
  TS_CHECK(p.B >= 1 && p.K >= 1 && p.V >= 1, "--batch, --beams and --vocab must be at least 1");
  std::string why;
  TS_CHECK(beam_topk_supports(p, dtype, ctx.device(), &why), "bench topk: ", why);
  const std::string out = a.str("out");
  if (a.has("out")) check_output_path("out", out);

  BenchHarness h(ctx);
  const std::string device = ctx.is_cuda() ? ctx.device().str() + " (" + ctx.gpu().name + ")" : "cpu";
  std::printf("tessera bench topk on %s, %s, (%d x %d, %d), k %d, %d warm-up + %d timed runs\n", device.c_str(),
              dtype_name.c_str(), p.B, p.K, p.V, p.k, timing.warmup, timing.iters);
  std::fflush(stdout);
  const TopkBench bench = bench_beam_topk(p, dtype, h, timing);
  const Timing& t = bench.t;

  std::map<std::string, double> peer_ms;
  std::string note;
  if (a.has("peer")) {
    if (!ctx.is_cuda()) {
      note = "peer skipped: the PyTorch peers run on a GPU only";
    } else {
      note = run_peer_script("'" TESSERA_PEERS_DIR "/topk.py' --batch " + std::to_string(p.B) + " --beams " +
                                 std::to_string(p.K) + " --vocab " + std::to_string(p.V) + " --k " +
                                 std::to_string(p.k) + " --dtype " + dtype_name + " --warmup " +
                                 std::to_string(timing.warmup) + " --iters " + std::to_string(timing.iters),
                             "topk.py", [&](const nlohmann::json& j) {
                               if (!j.contains("kernel") || !j.contains("ms") || !j["ms"].is_number()) return false;
                               peer_ms[j["kernel"].get<std::string>()] = j["ms"].get<double>();
                               return true;
                             });
    }
  }
  const double logit_bytes = bench.logit_bytes;
  std::string md = "# tessera bench topk\n\n- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) +
                   "\n- device: " + device + "\n- logits (" + std::to_string(p.B) + " x " + std::to_string(p.K) + ", " +
                   std::to_string(p.V) + ") " + dtype_name + ", k " + std::to_string(p.k) + ", " +
                   std::to_string(timing.iters) + " timed runs (median" +
                   (ctx.is_cuda() ? "; L2 flushed before each run" : "") + ")\n";
  md += "- candidates per row after the retrieve (min / median / max): " + topk_candidate_summary(bench.candidates) +
        " of " + std::to_string(p.V) + "\n";
  if (!note.empty()) md += "- " + note + "\n";
  md += "\n| op | median ms | min ms | max ms | logits GB/s | its time / tessera's |\n|---|---:|---:|---:|---:|---:|\n";
  auto row = [&](const std::string& name, double median, const std::string& mn, const std::string& mx) {
    md += "| " + name + " | " + fmt("%.4f", median) + " | " + mn + " | " + mx + " | " +
          fmt("%.1f", logit_bytes / (median * 1e-3) / 1e9) + " | " + fmt("%.2f", median / t.median_ms) + " |\n";
  };
  row("tessera beam_topk (log-softmax + score + HARS)", t.median_ms, fmt("%.4f", t.min_ms), fmt("%.4f", t.max_ms));
  // The peer prints medians only.
  const std::pair<const char*, const char*> peers[] = {{"topk", "torch.topk alone"},
                                                       {"beam step", "HF step: log_softmax + score + torch.topk"}};
  for (const auto& [key, label] : peers)
    if (const auto it = peer_ms.find(key); it != peer_ms.end()) row(label, it->second, "–", "–");
  print_bench_markdown(md, out);
  return 0;
}

}  // namespace tessera::cli
