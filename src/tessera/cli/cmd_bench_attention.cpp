// tessera bench attention: the CS336 table (naive against flash: forward ms, backward ms, memory before and
// during the backward, out of memory marked) and the TFLOP/s table (causal multi-head, B·T = 32k tokens, width
// 2048), each with, under --peer, PyTorch's figures from the same run (bench/peers/attention.py: plain attention,
// scaled_dot_product_attention with the flash backend and with the cuDNN backend).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tessera/bench/attention.h"
#include "tessera/bench/harness.h"
#include "tessera/bench/peer.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/train/progress.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif

namespace tessera::cli {

namespace {

// The peer's rows, keyed by (table, impl, d, T); each value is the JSON object the script printed.
struct PeerRows {
  std::map<std::tuple<std::string, std::string, int, int>, nlohmann::json> rows;
  std::vector<std::string> impls[2];  // per table (0: memory, 1: flops), in the order first seen
  std::string note;
};

PeerRows run_peer(bool small, const std::string& dtype, const TimingOptions& t, float dropout,
                  const std::vector<int>& head_dims) {
  PeerRows r;
  std::string dims;
  for (int d : head_dims) dims += (dims.empty() ? "" : ",") + std::to_string(d);
  r.note = run_peer_script("'" TESSERA_PEERS_DIR "/attention.py' --size " + std::string(small ? "small" : "full") +
                               " --dtype " + dtype + " --warmup " + std::to_string(t.warmup) + " --iters " +
                               std::to_string(t.iters) + " --dropout " + fmt("%.9g", dropout) +
                               (dims.empty() ? "" : " --head-dims " + dims),
                           "attention.py", [&](const nlohmann::json& j) {
                             if (!j.contains("table") || !j.contains("impl") || !j.contains("d") || !j.contains("T"))
                               return false;
                             const std::string table = j["table"].get<std::string>(),
                                               impl = j["impl"].get<std::string>();
                             auto& names = r.impls[table == "memory" ? 0 : 1];
                             if (std::find(names.begin(), names.end(), impl) == names.end()) names.push_back(impl);
                             r.rows[{table, impl, j["d"].get<int>(), j["T"].get<int>()}] = j;
                             return true;
                           });
  return r;
}

// A peer figure as a cell: "OOM", "–" when absent, else the number.
std::string peer_cell(const nlohmann::json& j, const char* key, const char* f) {
  if (j.is_null()) return "–";
  if (j.value("oom", false)) return "OOM";
  if (!j.contains(key) || !j[key].is_number()) return "–";
  return fmt(f, j[key].get<double>());
}

// --head-dims: a comma list of distinct head dims, each written in digits, from 1 to max_dh.
std::vector<int> parse_head_dims(const std::string& s, int max_dh, const std::string& why) {
  std::vector<int> dims;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, j - i);
    const bool digits = !item.empty() && item.size() <= 9 && item.find_first_not_of("0123456789") == std::string::npos;
    const long v = digits ? std::stol(item) : 0;
    TS_CHECK(digits && v >= 1 && v <= max_dh, "--head-dims: '", item, "' is not a head dim from 1 to ", max_dh, " (",
             why, ") in '", s, "'");
    TS_CHECK(std::find(dims.begin(), dims.end(), v) == dims.end(), "--head-dims: ", v, " is listed twice in '", s, "'");
    dims.push_back(static_cast<int>(v));
    i = j + 1;
  }
  return dims;
}

void add_attention_flags(Flags& a) {
  a.add("device", "cpu|cuda|cuda:N", "where to run (default: the GPU when one is visible, else the CPU)");
  a.add("dtype", "f32|bf16|f16", "compute dtype (default bf16 on a GPU, f32 on the CPU)");
  a.add("size", "small|full",
        "small: tiny shapes, seconds on a CPU; full: the issue's sweeps (default: full on a "
        "GPU, small on the CPU)");
  a.add("warmup", "N", "untimed runs before timing (default 3)");
  a.add("iters", "N", "timed runs; the tables show their median (default 10)");
  a.add("out", "FILE", "also write the tables as markdown to FILE");
  a.add("attn-dropout", "P", "attention dropout in the TFLOP/s table, for tessera and the peers (default 0)");
  a.add("head-dims", "A,B,...",
        "head dims of the TFLOP/s table, width / Dh heads each (default 64,128; small: "
        "32,64)");
  a.add("gqa", "G",
        "query heads per KV head in the TFLOP/s table (grouped-query attention; default 1; rows whose "
        "heads G does not divide are left out; not with --peer)");
  a.add_switch("no-progress", "no progress bar on stderr");
  a.add_switch("peer",
               "run bench/peers/attention.py (PyTorch: plain attention, SDPA flash, SDPA cuDNN) in the "
               "same call and show its figures (GPU only)");
}

}  // namespace

int cmd_bench_attention(int argc, char** argv) {
  Flags a("bench attention",
          "Naive against flash attention (the CS336 table: ms and memory) and causal multi-head TFLOP/s.");
  add_attention_flags(a);
  if (!a.parse(argc, argv, 3)) return 0;

  const TimingOptions timing{.warmup = a.integer("warmup", 3), .iters = a.integer("iters", 10)};
  TS_CHECK(timing.warmup >= 0, "--warmup must be >= 0, got ", timing.warmup);
  TS_CHECK(timing.iters >= 1, "--iters must be >= 1, got ", timing.iters);
  Context ctx = a.has("device") ? Context::from_name(a.str("device")) : Context::best_available();
  const std::string dtype_name = a.str("dtype", ctx.is_cuda() ? "bf16" : "f32");
  TS_CHECK(dtype_name == "f32" || dtype_name == "bf16" || dtype_name == "f16", "--dtype must be f32, bf16 or f16, got ",
           dtype_name);
  TS_CHECK(ctx.is_cuda() || dtype_name == "f32", "--dtype ", dtype_name,
           ": the CPU reference computes in f32 (use --dtype f32, or --device cuda)");
  const std::string size = a.str("size", ctx.is_cuda() ? "full" : "small");
  TS_CHECK(size == "small" || size == "full", "--size must be small or full, got ", size);
  const DType dt = dtype_name == "bf16" ? DType::BF16 : dtype_name == "f16" ? DType::F16 : DType::F32;
  // Checked as read and as the kernels take it (0.9999999999 rounds to 1.0f), reported as given.
  const double attn_dropout_arg = a.number("attn-dropout", 0.0);
  TS_CHECK(attn_dropout_arg >= 0.0 && static_cast<float>(attn_dropout_arg) < 1.0f,
           "--attn-dropout must be in [0, 1), got ", attn_dropout_arg);
  const float attn_dropout = static_cast<float>(attn_dropout_arg);
  AttentionBenchConfig cfg{.small = size == "small",
                           .dtype = dt,
                           .attn_dropout = attn_dropout,
                           .head_dims = {},
                           .timing = timing,
                           .on_row = {}};
  cfg.gqa = a.integer("gqa", 1);
  TS_CHECK(cfg.gqa >= 1, "--gqa must be >= 1, got ", cfg.gqa);
  TS_CHECK(cfg.gqa == 1 || !a.has("peer"), "--gqa ", cfg.gqa, ": the PyTorch peers run multi-head attention only");
  if (a.has("head-dims")) {
    // A head is at most the table's width; on a GPU, at most what the attention kernels take.
    const int width = attention_sweeps(cfg.small).flops_width;
    const bool kernels = ctx.is_cuda() && kAttentionMaxDh < width;
    cfg.head_dims = parse_head_dims(a.str("head-dims"), kernels ? kAttentionMaxDh : width,
                                    kernels ? "the GPU kernels' largest" : "the table's width");
  }
  const std::string out = a.str("out");
  if (a.has("out")) check_output_path("out", out);

  BenchHarness h(ctx);
  const std::string device = ctx.is_cuda() ? ctx.device().str() + " (" + ctx.gpu().name + ")" : "cpu";
  std::printf("tessera bench attention on %s, %s, size %s, %d warm-up + %s\n", device.c_str(), dtype_name.c_str(),
              size.c_str(), timing.warmup, counted(timing.iters, "timed run").c_str());
  std::fflush(stdout);
  // A GPU marks the rows it cannot fit OOM (the CS336 table's point); on the host, or outside the rows, --size full
  // runs out of memory where small would not, and the error says so.
  const std::string_view hint = size == "full" ? "try --size small" : "";
  // Progress on stderr, as train's bar: --size full on the CPU runs for about 9 minutes before its tables. The
  // configurations take very different times (T from 256 to 16k), so the bar shows the time elapsed, not an ETA.
  const AttentionSweeps sw = attention_sweeps(cfg);
  ProgressBar bar(static_cast<int64_t>(sw.rows(cfg.gqa)), 0, !a.has("no-progress"), {.unit = "config", .eta = false});
  int64_t started = 0;
  cfg.on_row = [&](const std::string& row) { bar.update(started++, "running " + row); };  // as it starts
  const auto mem_rows = with_memory_hint(hint, [&] { return bench_attention_memory(cfg, h); });
  const auto flops_rows = with_memory_hint(hint, [&] { return bench_attention_flops(cfg, h); });
  bar.update(started, "done");
  bar.finish();
  PeerRows peer;
  if (a.has("peer")) {
    if (!ctx.is_cuda()) peer.note = "peer skipped: the PyTorch peers run on a GPU only";
    else peer = run_peer(cfg.small, dtype_name, timing, attn_dropout, cfg.head_dims);
  }
  // The kernel each head size of the tables takes, grouped: "flash-hopper for Dh 16, 32, 64, 128" on sm_90a.
  std::string kernel = "cpu reference";
#ifdef TESSERA_WITH_CUDA
  if (ctx.is_cuda()) {
    std::set<int> dhs(sw.mem_d.begin(), sw.mem_d.end());
    dhs.insert(sw.flops_Dh.begin(), sw.flops_Dh.end());
    std::vector<std::pair<std::string, std::string>> groups;  // kernel, its head sizes
    for (int dh : dhs) {
      std::string k = attention_cuda_kernel({.B = 1, .T = 1, .H = 1, .Dh = dh}, dt, ctx);
      if (cfg.gqa > 1 && sw.flops_Dh.size() > 0)
        k += ", GQA rows " +
             std::string(attention_cuda_kernel({.B = 1, .T = 1, .H = cfg.gqa, .Dh = dh, .n_kv_heads = 1}, dt, ctx));
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == k; });
      if (g == groups.end()) groups.push_back({k, "Dh " + std::to_string(dh)});
      else g->second += ", " + std::to_string(dh);
    }
    kernel.clear();
    for (const auto& [k, d] : groups) kernel += (kernel.empty() ? "" : "; ") + k + " for " + d;
  }
#endif

  std::string md = "# tessera bench attention\n\n";
  md += "- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) + "\n- device: " + device +
        "\n- dtype: " + dtype_name + ", size " + size + ", " + std::to_string(timing.warmup) + " warm-up + " +
        counted(timing.iters, "timed run") + " (median" + (ctx.is_cuda() ? "; L2 flushed before each run" : "") +
        ")\n- tessera flash = attention_forward / attention_backward (" + kernel +
        "); tessera naive = S and P materialized in the dtype (attention_naive)\n";
  if (!peer.note.empty()) md += "- " + peer.note + "\n";

  md += "\n## CS336 table: one head, batch " + std::to_string(sw.mem_batch) +
        ", no mask\n\nMemory: MiB held by the row's buffers (torch: max_memory_allocated after the forward, and its "
        "peak during the backward).\n\n| impl | d | T | fwd ms | bwd ms | MiB before bwd | MiB during bwd |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n";
  for (int d : sw.mem_d)
    for (int T : sw.mem_T) {
      for (const auto& r : mem_rows) {
        if (r.d != d || r.T != T) continue;
        md += "| " + r.impl + " | " + std::to_string(d) + " | " + std::to_string(T) + " | ";
        md += r.oom ? "OOM | OOM | OOM | OOM |\n"
                    : fmt("%.3f", r.fwd.median_ms) + " | " + fmt("%.3f", r.bwd.median_ms) + " | " +
                          fmt("%.2f", r.mib_before_bwd) + " | " + fmt("%.2f", r.mib_during_bwd) + " |\n";
      }
      for (const std::string& impl : peer.impls[0]) {
        const auto it = peer.rows.find({"memory", impl, d, T});
        const nlohmann::json j = it == peer.rows.end() ? nlohmann::json() : it->second;
        md += "| " + impl + " | " + std::to_string(d) + " | " + std::to_string(T) + " | " +
              peer_cell(j, "fwd_ms", "%.3f") + " | " + peer_cell(j, "bwd_ms", "%.3f") + " | " +
              peer_cell(j, "mib_before_bwd", "%.2f") + " | " + peer_cell(j, "mib_during_bwd", "%.2f") + " |\n";
      }
    }

  md += "\n## TFLOP/s: causal, B·T = " + std::to_string(sw.flops_tokens) + " tokens, width " +
        std::to_string(sw.flops_width) +
        (attn_dropout > 0.0f ? ", attention dropout " + fmt("%g", attn_dropout) + " (tessera and the peers)" : "") +
        "\n\nFLOPs: forward 4·B·H·T²·Dh / 2, forward + backward 3.5x that (FlashAttention's count).\n\n"
        "| impl | Dh | T | B × H | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  // Two significant digits below 1: the CPU's reference loops would read "0.0" in every cell.
  const auto tflops = [](double t) { return t >= 1.0 ? fmt("%.1f", t) : fmt("%.2g", t); };
  for (const auto& r : flops_rows) {
    const std::string key = "| " + std::to_string(r.Dh) + " | " + std::to_string(r.T) + " | " + std::to_string(r.B) +
                            " × " + std::to_string(r.H) + " | ";
    md += "| " + r.impl + " " + key;
    md += r.oom ? "OOM | OOM | OOM | OOM |\n"
                : fmt("%.3f", r.fwd.median_ms) + " | " + fmt("%.3f", r.fwd_bwd.median_ms) + " | " +
                      tflops(r.tflops_fwd()) + " | " + tflops(r.tflops_fwd_bwd()) + " |\n";
    for (const std::string& impl : peer.impls[1]) {
      const auto it = peer.rows.find({"flops", impl, r.Dh, r.T});
      const nlohmann::json j = it == peer.rows.end() ? nlohmann::json() : it->second;
      std::string tf = "– | –";
      if (!j.is_null() && !j.value("oom", false) && j.contains("fwd_ms") && j.contains("fwd_bwd_ms"))
        tf = fmt("%.1f", r.flops_fwd / (j["fwd_ms"].get<double>() * 1e-3) / 1e12) + " | " +
             fmt("%.1f", 3.5 * r.flops_fwd / (j["fwd_bwd_ms"].get<double>() * 1e-3) / 1e12);
      else if (!j.is_null() && j.value("oom", false)) tf = "OOM | OOM";
      md += "| " + impl + " " + key + peer_cell(j, "fwd_ms", "%.3f") + " | " + peer_cell(j, "fwd_bwd_ms", "%.3f") +
            " | " + tf + " |\n";
    }
  }
  print_bench_markdown(md, out);
  return 0;
}

}  // namespace tessera::cli
