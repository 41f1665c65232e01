// tessera bench model: the CS336 assignment's end-to-end table over model sizes — forward, forward + backward
// and the whole training step (AdamW) in ms (median ± standard deviation), peak memory of the forward and of
// training, tokens/s and MFU against a GEMM rate measured in the same run; out-of-memory sizes marked OOM.
// Markdown (--out), JSON (--json), CSV (--csv), a Chrome trace of one step (--trace) and the memory timeline
// of one step (--memory-timeline: a PNG plot and its CSV). --precision f16 steps with train's dynamic loss scaling
// and reports the loss scale each size ended at. The measurement itself is bench/model.h. With --peer,
// bench/peers/model.py then times the Hugging Face model of each size (eager and/or torch.compile) the same way,
// and a second table sets its step ms and memory beside tessera's, with the speedup (peer ms / tessera ms).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tessera/bench/harness.h"
#include "tessera/bench/memory_timeline.h"
#include "tessera/bench/model.h"
#include "tessera/cli/bench_model_common.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;

// The GEMM MFU is taken against: the 8192³ bf16 on a GPU; on the CPU a size that takes tens of ms on
// two cores (8192³ in f32 would take minutes there).
constexpr int kGemmGpu = 8192, kGemmCpu = 1024;

// FILE.ext for one size; FILE.<size>.ext when the sweep has several.
std::string per_size_path(const std::string& path, const std::string& size, bool several) {
  if (!several) return path;
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + "." + size + p.extension().string())).string();
}

std::string cell_ms(const std::optional<RegionTiming>& r, bool oom) {
  if (oom) return "OOM";
  if (!r) return "–";
  return fmt(r->t.median_ms < 10 ? "%.3f" : "%.2f", r->t.median_ms) + " ±" +
         fmt(r->std_ms < 10 ? "%.3f" : "%.2f", r->std_ms);
}

// The loss-scaling cells: the scale a size ended at, and its skipped steps of the optimizer steps it ran.
std::string cell_loss_scale(const ModelBenchRow& r) {
  if (r.oom) return "OOM";
  return r.loss_scale ? fmt("%g", *r.loss_scale) : "–";
}
std::string cell_skipped(const ModelBenchRow& r) {
  if (r.oom) return "OOM";
  if (!r.loss_scale || r.optimizer_steps == 0) return "–";
  return std::to_string(r.skipped_steps) + " of " + std::to_string(r.optimizer_steps);
}

nlohmann::ordered_json timing_json(const std::optional<RegionTiming>& r) {
  if (!r) return nullptr;
  return {{"median_ms", r->t.median_ms}, {"min_ms", r->t.min_ms}, {"max_ms", r->t.max_ms},
          {"mean_ms", r->mean_ms},       {"std_ms", r->std_ms},   {"runs", r->t.iters}};
}

void add_bench_model_flags(Flags& a) {
  a.add("preset", "NAME", "one model size (a preset: tiny, gpt2-124m, cs336-small|medium|large|xl|2.7b)");
  a.add("sizes", "A,B,...",
        "several presets, one row each (default: tiny on the CPU; cs336-small,medium,large,xl,"
        "2.7b on a GPU)");
  a.add("batch", "B", "sequences per step (default 4)");
  a.add("seq", "T", "tokens per sequence (default 256, or the smallest max_seq of the sizes when below)");
  a.add("precision", "f32|bf16|f16",
        "compute dtype (default bf16 on a GPU, f32 on the CPU); f16 (GPU) steps with "
        "dynamic loss scaling as train --precision f16 does, and reports the loss scale at the end");
  a.add("mode", "fwd|fwd-bwd|step|all", "which regions to time (default all three columns)");
  a.add("warmup", "N", "untimed runs of each region first (default 5)");
  a.add("steps", "N", "timed runs of each region; the table shows their median ± standard deviation (default 10)");
  a.add("device", "cpu|cuda|cuda:N", "where to run (default: the GPU when one is visible, else the CPU)");
  a.add("cuda-graph", "on|off",
        "on a GPU, replay each region as CUDA graphs, as train steps (default on); off times "
        "the eager launches");
  a.add("max-memory", "SIZE", "treat at most SIZE (512MiB, 2GiB, bytes) as free: a size planned above it is OOM");
  a.add("out", "FILE", "also write the table as markdown to FILE");
  a.add("json", "FILE", "also write the rows as JSON to FILE");
  a.add("csv", "FILE", "also write the rows as CSV to FILE");
  a.add("trace", "FILE.json", "Chrome trace (Perfetto) of one more step; FILE.<size>.json for several sizes");
  a.add("memory-timeline", "FILE.png",
        "plot memory over one training step per op, phases shaded, and write "
        "FILE.csv beside it (FILE.<size>.png for several sizes)");
  a.add_switch("no-progress", "no progress bar on stderr (the sizes' own lines stay)");
  a.add_switch("peer",
               "then time the Hugging Face model of each size (bench/peers/model.py: PyTorch eager and "
               "torch.compile, same regions and runs) and show its step ms, memory and tessera's speedup");
  a.add("peer-mode", "eager|compile|both", "which PyTorch modes --peer times (default both)");
  a.add("peer-timeout", "S", kPeerTimeoutHelp);
}

// bench model's own flags: the regions, the files to write and the peer, read and checked (the runs too:
// read_model_bench_runs). The sizes and where they run are read after (read_model_bench_target).
struct BenchModelOptions {
  ModelBenchConfig bc;
  std::string out, json_path, csv_path, trace_path, timeline_path;
  OutputFiles files;  // one file per flag: two flags on one path lost the first file, both "wrote"
  bool with_peer = false;
  std::vector<std::string> peer_modes;
  std::string peer_mode;  // "eager", "compile" or "both"
  double peer_timeout = 0;
};

BenchModelOptions read_bench_model_options(const Flags& a) {
  BenchModelOptions o;
  ModelBenchConfig& bc = o.bc;
  TS_CHECK(!(a.has("preset") && a.has("sizes")), "bench model: give --preset or --sizes, not both");
  const std::string mode = a.str("mode", "all");
  TS_CHECK(mode == "fwd" || mode == "fwd-bwd" || mode == "step" || mode == "all",
           "bench model: --mode must be fwd, fwd-bwd, step or all, got '", mode, "'");
  bc.fwd = mode == "fwd" || mode == "all";
  bc.fwd_bwd = mode == "fwd-bwd" || mode == "all";
  bc.step = mode == "step" || mode == "all";
  read_model_bench_runs(a, "bench model", bc);
  o.out = a.str("out");
  o.json_path = a.str("json");
  o.csv_path = a.str("csv");
  o.trace_path = a.str("trace");
  o.timeline_path = a.str("memory-timeline");
  if (a.has("out")) check_output_path("out", o.out);
  if (a.has("json")) check_output_path("json", o.json_path);
  if (a.has("csv")) check_output_path("csv", o.csv_path);
  o.files.claim("--out", a.has("out") ? o.out : "");
  o.files.claim("--json", a.has("json") ? o.json_path : "");
  o.files.claim("--csv", a.has("csv") ? o.csv_path : "");
  // --trace and --memory-timeline are checked by claim_size_files, once the sizes (and so their per-size names) are
  // known.
  TS_CHECK(!a.has("memory-timeline") || fs::path(o.timeline_path).extension() == ".png",
           "bench model: "
           "--memory-timeline ",
           o.timeline_path, " must end in .png (the CSV is written beside it as .csv)");
  bc.trace = a.has("trace");
  bc.memory_timeline = a.has("memory-timeline");
  o.with_peer = a.has("peer");
  TS_CHECK(o.with_peer || !a.has("peer-mode"), "bench model: --peer-mode needs --peer");
  o.peer_modes = read_peer_modes(a, "bench model");
  o.peer_mode = o.peer_modes.size() == 2 ? "both" : o.peer_modes[0];
  TS_CHECK(o.with_peer || !a.has("peer-timeout"), "bench model: --peer-timeout needs --peer");
  o.peer_timeout = read_peer_timeout(a, "bench model");
  TS_CHECK(!(o.with_peer && a.str("precision") == "f16"),
           "bench model: --peer with --precision f16: the PyTorch "
           "peer times f32 and bf16 only; drop --peer to time tessera's f16 step alone");
  return o;
}

// Every file the sweep will write, checked before its first step: the per-size names, and each plot's CSV (a
// directory named FILE.csv would fail only after the timing, beside the PNG it had written).
void claim_size_files(BenchModelOptions& o, const std::vector<ModelConfig>& cfgs) {
  const bool several = cfgs.size() > 1;
  for (const ModelConfig& c : cfgs) {
    if (o.bc.trace) {
      const std::string trace = per_size_path(o.trace_path, c.preset, several);
      check_output_path("trace", trace);
      o.files.claim("--trace", trace);
    }
    if (o.bc.memory_timeline) {
      const std::string png = per_size_path(o.timeline_path, c.preset, several);
      const std::string csv = fs::path(png).replace_extension(".csv").string();
      check_output_path("memory-timeline", png);
      check_output_path("memory-timeline's CSV,", csv);
      o.files.claim("--memory-timeline", png);
      o.files.claim("--memory-timeline's CSV", csv);
    }
  }
}

// f16: the loss scaling of train's steps (bench/model.h), from the same scaler configuration.
std::string loss_scaling_line(const ModelBenchConfig& bc) {
  return "loss scaling (as train --precision f16): fwd+bwd and step run the backward on S·loss, S = " +
         fmt("%g", bc.loss_scaler.init_scale) +
         " at the start of each size; step: AdamW unscales by 1/S and skips a "
         "step whose gradients overflowed (S halves; it doubles after " +
         std::to_string(bc.loss_scaler.growth_interval) +
         " good steps), and AdamW's report is read after each step, the host round trip a train step makes";
}

// The GEMM rate of this run, which MFU is taken against: bf16 cuBLASLt on a GPU, f32 on the CPU.
struct GemmReference {
  int n = 0;
  DType dtype = DType::F32;
  std::string impl, line;  // "cuBLASLt", "OpenBLAS" or "plain loop"; the header's line
  GemmRate rate;
};

GemmReference measure_gemm_reference(BenchHarness& h, const ModelBenchConfig& bc) {
  constexpr int kGemmRateMinRuns = 10;
  const Context& ctx = h.context();
  GemmReference g;
  g.n = ctx.is_cuda() ? kGemmGpu : kGemmCpu;
  g.dtype = ctx.is_cuda() ? DType::BF16 : DType::F32;
  // At least 2 + 10 runs whatever --warmup and --steps: with only a couple of timed runs, one slow run on a loaded
  // machine would lower the rate that MFU divides by, and MFU could read above 100%.
  g.rate = measure_gemm_rate(h, g.n, g.dtype,
                             {.warmup = std::max(bc.warmup, 2), .iters = std::max(bc.steps, kGemmRateMinRuns)});
  g.impl = ctx.is_cuda() ? "cuBLASLt" : gemm_uses_blas() ? "OpenBLAS" : "plain loop";
  g.line = "GEMM rate (MFU reference): " + std::to_string(g.n) + "³ " + std::string(dtype_name(g.dtype)) + " " +
           g.impl + ", " + fmt("%.3f", g.rate.t.median_ms) + " ms (median of " + std::to_string(g.rate.t.iters) +
           "), " + fmt("%.2f", g.rate.flops_per_s() / 1e12) + " TFLOP/s";
  return g;
}

// After a size is done: its Chrome trace and its memory timeline (PNG and CSV), where asked for.
void write_size_files(const BenchModelOptions& o, const ModelBenchTarget& target, bool several, const ModelConfig& c,
                      const ModelBenchRow& r) {
  const ModelBenchConfig& bc = o.bc;
  const Context& ctx = target.ctx;
  if (r.trace) {
    const std::string p = per_size_path(o.trace_path, c.preset, several);
    r.trace->write_chrome_json(p);
    std::fprintf(stderr, "  wrote %s\n", p.c_str());
  }
  if (!r.timeline.empty()) {
    const std::string png = per_size_path(o.timeline_path, c.preset, several);
    const std::string csv = (fs::path(png).replace_extension(".csv")).string();
    const std::string title = c.preset + " B" + std::to_string(bc.batch) + " T" + std::to_string(bc.seq) + " " +
                              target.prec + " on " + (ctx.is_cuda() ? ctx.gpu().name : std::string("cpu"));
    write_memory_timeline(png, csv, r.timeline, title);
    std::fprintf(stderr, "  wrote %s and %s\n", png.c_str(), csv.c_str());
  }
}

// What the report's three forms (markdown, JSON, CSV) are made of.
struct BenchModelReport {
  const BenchModelOptions& o;
  const ModelBenchTarget& target;
  const GemmReference& gemm;
  const std::vector<ModelBenchRow>& rows;
  const ModelPeer& peer;
  bool scaled;               // f16: the loss-scaling line and columns
  std::string scaling_line;  // loss_scaling_line
  std::string region;        // the region compared with the peer: the one tokens/s comes from
};

// The header and the table of the sizes, with a line per OOM size.
std::string sizes_markdown(const BenchModelReport& rep) {
  const ModelBenchConfig& bc = rep.o.bc;
  const bool gpu = rep.target.ctx.is_cuda();
  const bool scaled = rep.scaled;
  std::string md = "# tessera bench model\n\n";
  md += "- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) + "\n- device: " + rep.target.device +
        "\n- precision " + rep.target.prec + ", batch " + std::to_string(bc.batch) + ", seq " + std::to_string(bc.seq) +
        ", " + std::to_string(bc.warmup) + " warm-up + " + counted(bc.steps, "timed run") +
        " per region, each between two synchronizations (host clock); cells: median ± std ms\n";
  md += "- step = zero_grad + forward + backward + AdamW; fwd+bwd = zero_grad + forward + backward\n";
  if (scaled)
    md += "- " + rep.scaling_line +
          "; loss scale: S at the end; skipped: the steps skipped of the optimizer steps "
          "run (untimed ones included; a skipped step leaves AdamW's update out)\n";
  md += "- " + rep.target.regions_line + "\n";
  md += "- " + rep.gemm.line + "\n";
  md += std::string("- memory: ") +
        (gpu ? "device memory in use after the region (cudaMemGetInfo) above what was in use before the size was built"
             : "planned bytes (parameters, gradients, the activation arena; training adds AdamW's m and v)") +
        "\n";
  md +=
      "- tokens/s and MFU from the step column (else fwd+bwd, else fwd); FLOPs: GEMMs only, attention as the full "
      "T² square, step = 3 x forward\n";
  md +=
      "\n| size | d_model | d_ff | layers | heads | params | fwd ms | fwd+bwd ms | step ms | fwd mem | train mem | "
      "tokens/s | MFU |";
  md += scaled ? " loss scale | skipped |\n" : "\n";
  md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";
  md += scaled ? "---:|---:|\n" : "\n";
  for (const ModelBenchRow& r : rep.rows) {
    md += "| " + r.size + " | " + std::to_string(r.cfg.d_model) + " | " + std::to_string(r.cfg.d_ff) + " | " +
          std::to_string(r.cfg.n_layers) + " | " + std::to_string(r.cfg.n_heads) + " | " +
          human_count(static_cast<double>(r.params)) + " | " + cell_ms(r.fwd, r.oom) + " | " +
          cell_ms(r.fwd_bwd, r.oom) + " | " + cell_ms(r.step, r.oom) + " | " + cell_bytes(r.mem_fwd, r.oom) + " | " +
          cell_bytes(r.mem_train, r.oom) + " | " + (r.oom ? "OOM" : human_count(r.tokens_per_s)) + " | " +
          (r.oom ? "OOM" : fmt("%.1f%%", 100.0 * r.mfu)) + " |";
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "lit" + std::string here.
    if (scaled) md.append(" ").append(cell_loss_scale(r)).append(" | ").append(cell_skipped(r)).append(" |");
    md += "\n";
  }
  for (const ModelBenchRow& r : rep.rows)
    if (r.oom) md += "\n- " + r.size + ": OOM: " + r.oom_reason;
  if (std::any_of(rep.rows.begin(), rep.rows.end(), [](const ModelBenchRow& r) { return r.oom; })) md += "\n";
  return md;
}

// The peer's lines: what it ran, how to read the speedup, and its notes.
std::string peer_header_markdown(const BenchModelReport& rep, const std::string& region_label) {
  const ModelPeer& peer = rep.peer;
  const bool gpu = rep.target.ctx.is_cuda();
  const std::string& peer_mode = rep.o.peer_mode;
  std::string md =
      "- bench/peers/model.py: Hugging Face GPT2LMHeadModel (gpt2 presets) / LlamaForCausalLM (cs336), torch " +
      peer.torch + ", transformers " + peer.transformers + ", on " + peer.device + "; f32 weights" +
      (rep.target.prec == "bf16" ? " + torch.autocast(bfloat16)" : "") + ", AdamW" + (gpu ? "(fused=True)" : "") +
      ", clipping 1.0; " +
      (peer_mode == "both"    ? std::string("eager and torch.compile(model)")
       : peer_mode == "eager" ? std::string("eager")
                              : std::string("torch.compile(model)")) +
      "; the same regions, runs and host-clock timing\n";
  md += "- speedup = torch " + region_label + " ms / tessera " + region_label +
        " ms (> 1: tessera is faster); torch memory: " +
        (gpu ? "torch.cuda.max_memory_allocated above the start (tessera's: device memory in use, above)"
             : "not measured on the CPU") +
        "\n";
  if (!peer.note.empty()) md += "- " + peer.note + "\n";
  return md;
}

// One size's row of the peer table (tessera's region ms and memory, then each mode's ms, memory and speedup); its
// notes (a peer that failed, or a model of other parameters) are appended to `notes`.
std::string peer_row_markdown(const BenchModelReport& rep, const ModelBenchRow& r, std::string& notes) {
  const std::string& region = rep.region;
  const std::optional<RegionTiming>& t = region == "step" ? r.step : region == "fwd-bwd" ? r.fwd_bwd : r.fwd;
  const std::optional<size_t>& tm = region == "fwd" ? r.mem_fwd : r.mem_train;
  std::string md = "| " + r.size + " | " +
                   (r.oom ? std::string("OOM")
                    : t   ? ms_text(t->t.median_ms)
                          : std::string("–")) +
                   " | " + cell_bytes(tm, r.oom) + " |";
  for (const std::string& m : rep.o.peer_modes) {
    const ModelPeerFigures* f = rep.peer.find(r.size, m);
    const std::optional<double> speedup = f ? model_peer_speedup(r, *f) : std::nullopt;
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "lit" + std::string here.
    md.append(" ").append(peer_cell(f, f ? f->region_ms(region) : std::nullopt, false)).append(" | ");
    md.append(peer_cell(f, f ? (region == "fwd" ? f->fwd_mem_bytes : f->train_mem_bytes) : std::nullopt, true));
    md.append(" | ").append(speedup ? fmt("%.2f×", *speedup) : std::string("–")).append(" |");
    if (!f) continue;
    if (!f->ran())
      notes += "- torch " + m + " " + r.size + ": " + (f->oom ? "OOM" : "failed") +
               (f->error.empty() ? "" : ": " + f->error) + "\n";
    else if (f->params != r.params)
      notes += "- torch " + m + " " + r.size + ": the Hugging Face model has " + std::to_string(f->params) +
               " parameters, tessera's " + std::to_string(r.params) + " (bench/peers/model.py's PRESETS differ)\n";
  }
  return md + "\n";
}

// --peer: the section that sets the peer's region ms and memory beside tessera's.
std::string peer_markdown(const BenchModelReport& rep) {
  const std::string& region = rep.region;
  const std::string region_label = region == "fwd-bwd" ? "fwd+bwd" : region;
  const std::string mem_label = region == "fwd" ? "fwd mem" : "train mem";
  std::string md = "\n## PyTorch peer (same run)\n\n";
  if (rep.peer.figures.empty()) return md + "- peer (bench/peers/model.py): " + rep.peer.note + "\n";
  md += peer_header_markdown(rep, region_label);
  md += "\n| size | tessera " + region_label + " ms | tessera " + mem_label + " |";
  std::string rule = "\n|---|---:|---:|";
  for (const std::string& m : rep.o.peer_modes) {
    md += " torch " + m + " " + region_label + " ms | torch " + m + " " + mem_label + " | speedup vs " + m + " |";
    rule += "---:|---:|---:|";
  }
  md += rule + "\n";
  std::string notes;
  for (const ModelBenchRow& r : rep.rows) md += peer_row_markdown(rep, r, notes);
  if (!notes.empty()) md += "\n" + notes;
  return md;
}

// A row's peer figures, by mode (null where the peer printed none).
nlohmann::ordered_json peer_row_json(const BenchModelReport& rep, const ModelBenchRow& r) {
  nlohmann::ordered_json po;
  for (const std::string& m : rep.o.peer_modes) {
    const ModelPeerFigures* f = rep.peer.find(r.size, m);
    if (!f) {
      po[m] = nullptr;
      continue;
    }
    auto num = [](const std::optional<double>& v) {
      return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
    };
    auto bytes = [](const std::optional<double>& v) {
      return v ? nlohmann::ordered_json(static_cast<int64_t>(*v)) : nlohmann::ordered_json(nullptr);
    };
    const std::optional<double> speedup = model_peer_speedup(r, *f);
    po[m] = {{"oom", f->oom},
             {"error", f->error.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(f->error)},
             {"params", f->params},
             {"fwd_ms", num(f->fwd_ms)},
             {"fwd_bwd_ms", num(f->fwd_bwd_ms)},
             {"step_ms", num(f->step_ms)},
             {"fwd_mem_bytes", bytes(f->fwd_mem_bytes)},
             {"train_mem_bytes", bytes(f->train_mem_bytes)},
             {"speedup", num(speedup)}};
  }
  return po;
}

nlohmann::ordered_json row_json(const BenchModelReport& rep, const ModelBenchRow& r) {
  nlohmann::ordered_json j;
  j["size"] = r.size;
  j["d_model"] = r.cfg.d_model;
  j["d_ff"] = r.cfg.d_ff;
  j["n_layers"] = r.cfg.n_layers;
  j["n_heads"] = r.cfg.n_heads;
  j["params"] = r.params;
  j["oom"] = r.oom;
  if (r.oom) j["oom_reason"] = r.oom_reason;
  j["planned_bytes"] = {{"params", r.planned.params},
                        {"optimizer", r.planned.optimizer},
                        {"activations", r.planned.activations}};
  j["fwd"] = timing_json(r.fwd);
  j["fwd_bwd"] = timing_json(r.fwd_bwd);
  j["step"] = timing_json(r.step);
  j["mem_fwd_bytes"] = r.mem_fwd ? nlohmann::ordered_json(*r.mem_fwd) : nlohmann::ordered_json(nullptr);
  j["mem_train_bytes"] = r.mem_train ? nlohmann::ordered_json(*r.mem_train) : nlohmann::ordered_json(nullptr);
  j["flops_fwd"] = r.flops_fwd;
  j["rate_region"] = r.oom ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.rate_region);
  j["tokens_per_s"] = r.oom ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.tokens_per_s);
  j["mfu"] = r.oom ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.mfu);
  if (r.loss_scale) {
    j["loss_scale"] = *r.loss_scale;
    j["optimizer_steps"] = r.optimizer_steps;
    j["skipped_steps"] = r.skipped_steps;
  } else {
    j["loss_scale"] = nullptr;
  }
  if (rep.o.with_peer) j["peer"] = peer_row_json(rep, r);
  return j;
}

// --json: the run's settings, the GEMM reference, a record per size and the peer's versions.
void write_report_json(const BenchModelReport& rep, const std::string& json_path) {
  const ModelBenchConfig& bc = rep.o.bc;
  const ModelPeer& peer = rep.peer;
  nlohmann::ordered_json j;
  j["date"] = utc_now();
  j["commit"] = TESSERA_GIT_COMMIT;
  j["device"] = rep.target.device;
  j["precision"] = rep.target.prec;
  j["batch"] = bc.batch;
  j["seq"] = bc.seq;
  j["warmup"] = bc.warmup;
  j["steps"] = bc.steps;
  j["cuda_graph"] = rep.target.no_graph.empty();
  if (rep.scaled)
    j["loss_scaling"] = {{"init_scale", bc.loss_scaler.init_scale},
                         {"growth_interval", bc.loss_scaler.growth_interval}};
  else j["loss_scaling"] = nullptr;
  j["memory"] = rep.target.ctx.is_cuda() ? "measured" : "planned";
  j["gemm"] = {{"n", rep.gemm.n},
               {"dtype", std::string(dtype_name(rep.gemm.dtype))},
               {"impl", rep.gemm.impl},
               {"median_ms", rep.gemm.rate.t.median_ms},
               {"tflops", rep.gemm.rate.flops_per_s() / 1e12}};
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const ModelBenchRow& r : rep.rows) arr.push_back(row_json(rep, r));
  j["rows"] = std::move(arr);
  if (rep.o.with_peer) {
    nlohmann::ordered_json pj;
    pj["script"] = "bench/peers/model.py";
    pj["modes"] = rep.o.peer_modes;
    pj["region"] = rep.region;
    pj["note"] = peer.note.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(peer.note);
    pj["torch"] = peer.torch;
    pj["transformers"] = peer.transformers;
    pj["device"] = peer.device;
    j["peer"] = std::move(pj);
  }
  write_file_atomic(json_path, j.dump(2) + "\n");
  std::fprintf(stderr, "wrote %s\n", json_path.c_str());
}

// A size's CSV fields, in the header's order.
std::vector<std::string> csv_fields(const BenchModelReport& rep, const ModelBenchRow& r) {
  std::vector<std::string> f = {r.size,
                                std::to_string(r.cfg.d_model),
                                std::to_string(r.cfg.d_ff),
                                std::to_string(r.cfg.n_layers),
                                std::to_string(r.cfg.n_heads),
                                std::to_string(r.params),
                                r.oom ? "oom" : "ok",
                                rep.target.prec,
                                r.loss_scale ? csv_num(*r.loss_scale) : std::string(),
                                r.loss_scale ? std::to_string(r.skipped_steps) : std::string()};
  for (const auto* t : {&r.fwd, &r.fwd_bwd, &r.step}) {
    for (double v : {*t ? (*t)->t.median_ms : -1.0, *t ? (*t)->t.min_ms : -1.0, *t ? (*t)->t.max_ms : -1.0,
                     *t ? (*t)->std_ms : -1.0})
      f.push_back(*t ? csv_num(v) : std::string());
  }
  f.push_back(r.mem_fwd ? std::to_string(*r.mem_fwd) : std::string());
  f.push_back(r.mem_train ? std::to_string(*r.mem_train) : std::string());
  f.push_back(r.oom ? std::string() : csv_num(r.tokens_per_s));
  f.push_back(r.oom ? std::string() : csv_num(r.mfu));
  if (rep.o.with_peer)
    for (const std::string& m : rep.o.peer_modes) {
      const ModelPeerFigures* p = rep.peer.find(r.size, m);
      auto num = [](const std::optional<double>& v) { return v ? csv_num(*v) : std::string(); };
      auto bytes = [](const std::optional<double>& v) { return v ? fmt("%.0f", *v) : std::string(); };
      f.push_back(!p ? "missing" : p->oom ? "oom" : !p->error.empty() ? "failed" : "ok");
      for (auto v : {&ModelPeerFigures::fwd_ms, &ModelPeerFigures::fwd_bwd_ms, &ModelPeerFigures::step_ms})
        f.push_back(p ? num(p->*v) : std::string());
      for (auto v : {&ModelPeerFigures::fwd_mem_bytes, &ModelPeerFigures::train_mem_bytes})
        f.push_back(p ? bytes(p->*v) : std::string());
      f.push_back(p ? num(model_peer_speedup(r, *p)) : std::string());
    }
  return f;
}

// --csv: a header line, then a line per size.
void write_report_csv(const BenchModelReport& rep, const std::string& csv_path) {
  std::string csv = "size,d_model,d_ff,n_layers,n_heads,params,status,precision,loss_scale,skipped_steps";
  for (const char* region : {"fwd", "fwd_bwd", "step"})
    for (const char* stat : {"median_ms", "min_ms", "max_ms", "std_ms"}) csv += std::string(",") + region + "_" + stat;
  csv += ",mem_fwd_bytes,mem_train_bytes,tokens_per_s,mfu";
  if (rep.o.with_peer)
    for (const std::string& m : rep.o.peer_modes)
      for (const char* col :
           {"status", "fwd_ms", "fwd_bwd_ms", "step_ms", "fwd_mem_bytes", "train_mem_bytes", "speedup"})
        csv.append(",torch_").append(m).append("_").append(col);
  csv += "\n";
  for (const ModelBenchRow& r : rep.rows) {
    const std::vector<std::string> f = csv_fields(rep, r);
    for (size_t i = 0; i < f.size(); ++i) {
      if (i) csv.push_back(',');
      csv.append(f[i]);
    }
    csv.push_back('\n');
  }
  write_file_atomic(csv_path, csv);
  std::fprintf(stderr, "wrote %s\n", csv_path.c_str());
}

}  // namespace

int cmd_bench_model(int argc, char** argv) {
  Flags a("bench model",
          "The CS336 end-to-end benchmark: forward, forward+backward and training-step ms, peak memory, tokens/s "
          "and MFU over model sizes.");
  add_bench_model_flags(a);
  if (!a.parse(argc, argv, 3)) return 0;
  BenchModelOptions o = read_bench_model_options(a);
  ModelBenchTarget target = read_model_bench_target(a, "bench model", o.bc);
  const ModelBenchConfig& bc = o.bc;
  Context& ctx = target.ctx;
  claim_size_files(o, target.cfgs);

  std::printf("tessera bench model on %s, %s, batch %d, seq %d, %d warm-up + %s per region\n", target.device.c_str(),
              target.prec.c_str(), bc.batch, bc.seq, bc.warmup, counted(bc.steps, "timed run").c_str());
  std::printf("%s\n", target.regions_line.c_str());
  const bool scaled = model_bench_loss_scaling(bc);
  const std::string scaling_line = loss_scaling_line(bc);
  if (scaled) std::printf("%s\n", scaling_line.c_str());
  std::fflush(stdout);

  BenchHarness h(ctx);  // its L2-flush scratch stays allocated through the sweep
  const GemmReference gemm = measure_gemm_reference(h, bc);
  std::printf("%s\n", gemm.line.c_str());
  std::fflush(stdout);

  const bool several = target.cfgs.size() > 1;
  const std::vector<ModelBenchRow> rows = run_model_bench_sizes(target.cfgs, bc, ctx, gemm.rate.flops_per_s(),
                                                                !a.has("no-progress"),
                                                                [&](const ModelConfig& c, const ModelBenchRow& r) {
                                                                  write_size_files(o, target, several, c, r);
                                                                });

  // The peer runs after every size of tessera's is done and its buffers are gone (one process on the device).
  ModelPeer peer;
  if (o.with_peer) {
    std::fprintf(stderr, "  peer: bench/peers/model.py (%s) ...\n", o.peer_mode.c_str());
    peer = run_model_peer(target.names, o.peer_modes, bc, target.prec, ctx.device().str(),
                          o.peer_timeout);                                                 // "cpu" or "cuda:N"
    std::fprintf(stderr, "  %s\n", peer.note.empty() ? "peer: done" : peer.note.c_str());  // a note says "peer ..."
  }

  const BenchModelReport rep{.o = o,
                             .target = target,
                             .gemm = gemm,
                             .rows = rows,
                             .peer = peer,
                             .scaled = scaled,
                             .scaling_line = scaling_line,
                             .region = bc.step      ? "step"
                                       : bc.fwd_bwd ? "fwd-bwd"
                                                    : "fwd"};
  std::string md = sizes_markdown(rep);
  if (o.with_peer) md += peer_markdown(rep);
  print_bench_markdown(md, o.out);
  if (!o.json_path.empty()) write_report_json(rep, o.json_path);
  if (!o.csv_path.empty()) write_report_csv(rep, o.csv_path);
  return 0;
}

}  // namespace tessera::cli
