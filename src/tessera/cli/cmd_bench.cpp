// tessera bench kernels | optimizer: times each kernel through its Tensor-level entry and prints a table of
// median time, bytes moved and achieved bandwidth; on a GPU also the ratio to the device-to-device copy
// bandwidth measured in the same run and, with --peer, PyTorch's time for the same work (bench/peers/kernels.py,
// run by this command after tessera's kernels, in the same call).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/bench/harness.h"
#include "tessera/bench/kernels.h"
#include "tessera/bench/peer.h"
#include "tessera/cli/bench_flags.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/train/progress.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif

namespace tessera::cli {

int cmd_bench_allreduce(int argc, char** argv);        // cmd_bench_allreduce.cpp
int cmd_bench_tokenizer(int argc, char** argv);        // cmd_bench_tokenizer.cpp
int cmd_bench_tokenizer_train(int argc, char** argv);  // cmd_bench_tokenizer_train.cpp
int cmd_bench_topk(int argc, char** argv);             // cmd_bench_topk.cpp
int cmd_bench_decode(int argc, char** argv);           // cmd_bench_decode.cpp
int cmd_bench_seq2seq(int argc, char** argv);          // cmd_bench_seq2seq.cpp

namespace {

constexpr size_t kCopyBytes = size_t{1} << 30;  // the D2D copy that the bandwidth ratio is taken against

// The copy that a row of `bytes` moved is also set against: half of them read, half written, at most the 1 GiB
// copy. A small copy pays the launch and the ramp that a 1 GiB one hides, so a kernel is set against a copy of its
// own size too (bench/micro/copy_by_size.cu measures the copy against its size).
// The size is rounded to whole 64 KiB: cudaMemcpyAsync is slower at sizes off such a boundary, a quirk of the copy,
// not of the memory (bench/results/2026-12-01-copy-size-and-pdl-h200.md).
size_t same_size_copy_bytes(double bytes) {
  constexpr double kGrain = 64 * 1024;
  const double half = std::max(kGrain, std::round(bytes / 2 / kGrain) * kGrain);
  return half >= static_cast<double>(kCopyBytes) ? kCopyBytes : static_cast<size_t>(half);
}

const char* kBenchUsage =
    "usage: tessera bench <kernels|optimizer|attention|model|compare|allreduce|tokenizer|tokenizer-train|topk|decode|"
    "seq2seq> [flags]\n"
    "\n"
    "  kernels    embedding, layernorm, residual, gelu, swiglu (fwd and bwd) and cross-entropy fwd+bwd\n"
    "  optimizer  one AdamW step over the flat buffers of gpt2-124m (--size small: tiny)\n"
    "  attention  naive against flash attention (ms, memory) and causal multi-head TFLOP/s\n"
    "  model      the CS336 end-to-end table: fwd, fwd+bwd, step ms, memory, tokens/s, MFU over model sizes\n"
    "  compare    tessera against PyTorch (Hugging Face, eager and torch.compile) over model sizes, one table\n"
    "  allreduce  all-reduce bandwidth over the ranks of mpirun -np N (MPI on CPUs, NCCL on GPUs)\n"
    "  tokenizer  GPT-2 encoding MB/s against tiktoken and Hugging Face tokenizers, one thread and all cores\n"
    "  tokenizer-train  BPE training beside Hugging Face tokenizers' BpeTrainer: seconds, MB/s, peak memory\n"
    "  topk       the beam step's HARS top-k (32 x 4 beams x 50257, k 8) beside torch.topk, candidates per row\n"
    "  decode     the inference engine: greedy, batch 16, beams, 2.7B against the copy bandwidth, prefill, top-k,\n"
    "             time to first token, beside Hugging Face generate\n"
    "  seq2seq    the encoder-decoder: a transformer-base training step, beam-4 translation, the batched\n"
    "             cross-attention K/V projection, beside Hugging Face BART\n"
    "\n"
    "Run `tessera bench kernels --help` for the flags.\n";

// The PyTorch peer's median ms per kernel name, or a one-line reason why there is none.
struct PeerResult {
  std::map<std::string, double> ms;
  std::string note;
};

// only: the families bench kernels runs (names from kKernelFamilies, checked: safe in the command line); empty: all.
PeerResult run_peer(const std::string& which, const std::string& size, const std::string& dtype, const TimingOptions& t,
                    const std::vector<std::string>& only) {
  PeerResult r;
  std::string only_arg;
  for (const auto& f : only) only_arg += (only_arg.empty() ? " --only " : ",") + f;
  r.note = run_peer_script("'" TESSERA_PEERS_DIR "/kernels.py' --which " + which + " --size " + size + " --dtype " +
                               dtype + " --warmup " + std::to_string(t.warmup) + " --iters " + std::to_string(t.iters) +
                               only_arg,
                           "kernels.py", [&](const nlohmann::json& j) {
                             if (!j.contains("kernel") || !j.contains("ms") || !j["ms"].is_number()) return false;
                             r.ms[j["kernel"].get<std::string>()] = j["ms"].get<double>();
                             return true;
                           });
  return r;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  const std::string which = argc > 2 ? argv[2] : "";
  if (which.empty() || which == "--help" || which == "-h") {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  if (which == "attention") return cmd_bench_attention(argc, argv);
  if (which == "model") return cmd_bench_model(argc, argv);
  if (which == "compare") return cmd_bench_compare(argc, argv);
  if (which == "allreduce") return cmd_bench_allreduce(argc, argv);
  if (which == "tokenizer") return cmd_bench_tokenizer(argc, argv);
  if (which == "tokenizer-train") return cmd_bench_tokenizer_train(argc, argv);
  if (which == "topk") return cmd_bench_topk(argc, argv);
  if (which == "decode") return cmd_bench_decode(argc, argv);
  if (which == "seq2seq") return cmd_bench_seq2seq(argc, argv);
  TS_CHECK(which == "kernels" || which == "optimizer", "bench: unknown benchmark '", which,
           "' (kernels, optimizer, attention, model, compare, allreduce, tokenizer, tokenizer-train, topk, decode or "
           "seq2seq)");
  Flags a("bench " + which, which == "kernels" ? "Times tessera's memory-bound kernels: median ms, bytes moved, GB/s."
                                               : "Times one AdamW step over a model's flat parameter buffers.");
  a.add("device", "cpu|cuda|cuda:N", "where to run (default: the GPU when one is visible, else the CPU)");
  a.add("dtype", "f32|bf16", "compute dtype (default bf16 on a GPU, f32 on the CPU)");
  a.add("size", "small|full|large",
        "small: tiny shapes, seconds on a CPU; full: 16384 rows, width 768, d_ff 3072, vocab 50257, AdamW over "
        "gpt2-124m (default: full on a GPU, small on the CPU); large (kernels only): 65536 rows, no cross-entropy");
  if (which == "kernels")
    a.add("only", "FAMILY,...",
          "run only these kernel families: embedding, layernorm, residual, gelu, swiglu, "
          "cross-entropy (default: all)");
  add_bench_run_flags(a, "kernels.py");
  a.add_switch("no-progress", "no progress bar on stderr");
  if (!a.parse(argc, argv, 3)) return 0;

  const TimingOptions timing = bench_timing(a);
  Context ctx = bench_context(a);
  const std::string dtype_name = bench_dtype(a, ctx);
  const std::string size = a.str("size", ctx.is_cuda() ? "full" : "small");
  TS_CHECK(size == "small" || size == "full" || size == "large", "--size must be small, full or large, got ", size);
  TS_CHECK(size != "large" || which == "kernels", "--size large applies to bench kernels only");
  const BenchSize bench_size = size == "full" ? BenchSize::Full : size == "large" ? BenchSize::Large : BenchSize::Small;
  BenchConfig cfg{.size = bench_size,
                  .dtype = dtype_name == "bf16" ? DType::BF16 : DType::F32,
                  .timing = timing,
                  .only = which == "kernels" && a.has("only") ? parse_kernel_families(a.str("only"))
                                                              : std::vector<std::string>{},
                  .on_row = nullptr};
  TS_CHECK(!(cfg.only.size() == 1 && cfg.only[0] == "cross-entropy" && bench_size == BenchSize::Large),
           "--only cross-entropy: --size large has no cross-entropy rows (use --size full)");
  const std::string out = a.str("out");
  if (a.has("out")) check_output_path("out", out);

  BenchHarness h(ctx);
  const std::string device = ctx.is_cuda() ? ctx.device().str() + " (" + ctx.gpu().name + ")" : "cpu";
  std::printf("tessera bench %s on %s, %s, size %s, %d warm-up + %s\n", which.c_str(), device.c_str(),
              dtype_name.c_str(), size.c_str(), timing.warmup, counted(timing.iters, "timed run").c_str());
  std::fflush(stdout);
  const double copy_gbs = ctx.is_cuda() ? h.copy_bandwidth_gbs(kCopyBytes, timing) : 0.0;
  // Progress on stderr, as bench attention's: --size full on the CPU runs for minutes before its table (each row's
  // random fill and timed runs). The rows take very different times, so the bar shows the time elapsed, not an ETA.
  ProgressBar bar(bench_row_count(which, cfg), 0, !a.has("no-progress"), {.unit = "row", .eta = false});
  int64_t started = 0;
  cfg.on_row = [&](const std::string& kernel) { bar.update(started++, "running " + kernel); };  // as it starts
  // --size full or large runs out of memory where small would not: the error says so.
  const std::vector<BenchRow> rows = with_memory_hint(size != "small" ? "try --size small" : "", [&] {
    return which == "kernels" ? bench_kernels(cfg, h) : bench_optimizer(cfg, h);
  });
  std::vector<double> same_copy_gbs(rows.size(), 0.0);
  if (ctx.is_cuda())
    for (size_t i = 0; i < rows.size(); ++i)
      same_copy_gbs[i] = same_size_copy_bytes(rows[i].bytes) == kCopyBytes
                             ? copy_gbs  // the cross-entropy rows: the 1 GiB copy, already timed
                             : h.copy_bandwidth_gbs(same_size_copy_bytes(rows[i].bytes), timing);

  bar.update(started, "done");
  bar.finish();

  PeerResult peer;
  if (a.has("peer")) {
    if (!ctx.is_cuda()) peer.note = "peer skipped: the PyTorch peers run on a GPU only";
    else peer = run_peer(which, size, dtype_name, timing, cfg.only);
  }
  const bool with_peer = !peer.ms.empty();

  std::string md = "# tessera bench " + which + "\n\n";
  md += "- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) + "\n- device: " + device +
        "\n- dtype: " + dtype_name + ", size " + size + ", " + std::to_string(timing.warmup) + " warm-up + " +
        counted(timing.iters, "timed run") + " (median" + (ctx.is_cuda() ? "; L2 flushed before each run" : "") + ")\n";
  if (ctx.is_cuda())
    md += "- device-to-device copy: " + fmt("%.0f", copy_gbs) +
          " GB/s (1 GiB cudaMemcpyAsync, read + write counted); \"same-size copy\": a cudaMemcpyAsync of half the "
          "row's bytes (in whole 64 KiB, at most 1 GiB), timed the same way\n";
  if (!peer.note.empty()) md += "- " + peer.note + "\n";
  md += "\n| kernel | shape | MB moved | median ms | min ms | max ms | GB/s |";
  md += ctx.is_cuda() ? " % of copy | same-size copy GB/s | % of same-size copy |" : "";
  md += with_peer ? " torch ms | torch / tessera |" : "";
  md += "\n|---|---|---:|---:|---:|---:|---:|";
  md += ctx.is_cuda() ? "---:|---:|---:|" : "";
  md += with_peer ? "---:|---:|" : "";
  md += "\n";
  // GB/s below 10 (a loaded CPU) with 3 significant digits: "0.0" would read as no bandwidth at all.
  for (size_t i = 0; i < rows.size(); ++i) {
    const BenchRow& r = rows[i];
    md += "| " + r.kernel + " | " + r.shape + " | " + fmt("%.2f", r.bytes / 1e6) + " | " +
          fmt("%.4f", r.timing.median_ms) + " | " + fmt("%.4f", r.timing.min_ms) + " | " +
          fmt("%.4f", r.timing.max_ms) + " | " + fmt(r.gbs() < 10 ? "%.3g" : "%.1f", r.gbs()) + " |";
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on `" " + std::string` here.
    if (ctx.is_cuda()) {
      md += " " + fmt("%.0f%%", 100.0 * r.gbs() / copy_gbs).append(" |");
      md += " " + fmt("%.1f", same_copy_gbs[i]).append(" |");
      md += " " + fmt("%.0f%%", 100.0 * r.gbs() / same_copy_gbs[i]).append(" |");
    }
    if (with_peer) {
      const auto it = peer.ms.find(r.kernel);
      if (it == peer.ms.end()) {
        md += " – | – |";
      } else {
        md += " ";
        md += fmt("%.4f", it->second);
        md += " | ";
        md += fmt("%.2f×", it->second / r.timing.median_ms);
        md += " |";
      }
    }
    md += "\n";
  }
  print_bench_markdown(md, out);
  return 0;
}

}  // namespace tessera::cli
