// tessera bench compare: tessera and its PyTorch peer over the same model sizes in one call, one table. Each size
// is timed by bench/model.h (as `bench model` times it: forward, forward + backward and the training step, the
// median of timed runs between two synchronizations), then bench/peers/model.py times the Hugging Face model of
// each size (GPT-2 or Llama; eager and/or torch.compile) over the same regions, batch, sequence length and runs.
// A row per size and peer mode: tessera ms, peer ms and the speedup (peer ms / tessera ms) of each region, and the
// training memory of both. Markdown (--out), JSON (--json), CSV (--csv) and a grouped bar chart of the step ms
// (--chart FILE.png, bench/bar_chart.h). A peer that cannot run is a note, and its cells are "–".
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tessera/bench/bar_chart.h"
#include "tessera/bench/model.h"
#include "tessera/bench/png.h"
#include "tessera/cli/bench_model_common.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// The regions of every row: bench/model.h's names, and the labels of the table's columns.
struct Region {
  const char* name;   // "fwd-bwd", as ModelBenchRow::region_ms and the peer name it
  const char* label;  // "fwd+bwd", in the table
  const char* key;    // "fwd_bwd", in the JSON and CSV
};
constexpr Region kRegions[] = {{"fwd", "fwd", "fwd"}, {"fwd-bwd", "fwd+bwd", "fwd_bwd"}, {"step", "step", "step"}};

std::string peer_status(const ModelPeerFigures* f) {
  return !f ? "missing" : f->oom ? "oom" : !f->error.empty() ? "failed" : "ok";
}

void add_compare_flags(Flags& a) {
  a.add("preset", "NAME", "one model size (a preset: tiny, gpt2-124m, cs336-small|medium|large|xl|2.7b)");
  a.add("sizes", "A,B,...",
        "several presets, one row each per peer mode (default: tiny on the CPU; "
        "cs336-small,medium,large,xl,2.7b on a GPU)");
  a.add("batch", "B", "sequences per step (default 4)");
  a.add("seq", "T", "tokens per sequence (default 256, or the smallest max_seq of the sizes when below)");
  a.add("precision", "f32|bf16", "compute dtype (default bf16 on a GPU, f32 on the CPU)");
  a.add("warmup", "N", "untimed runs of each region first, both sides (default 5)");
  a.add("steps", "N", "timed runs of each region, both sides; the table shows their median (default 10)");
  a.add("device", "cpu|cuda|cuda:N", "where both run (default: the GPU when one is visible, else the CPU)");
  a.add("cuda-graph", "on|off",
        "on a GPU, replay tessera's regions as CUDA graphs, as train steps (default on); "
        "off times the eager launches");
  a.add("max-memory", "SIZE", "treat at most SIZE (512MiB, 2GiB, bytes) as free: a size planned above it is OOM");
  a.add("peer-mode", "eager|compile|both", "which PyTorch modes to time (default both)");
  a.add("peer-timeout", "S", kPeerTimeoutHelp);
  a.add_switch("no-progress", "no progress bar on stderr (the sizes' own lines stay)");
  a.add("out", "FILE", "also write the table as markdown to FILE");
  a.add("json", "FILE", "also write the rows as JSON to FILE");
  a.add("csv", "FILE", "also write the rows as CSV to FILE");
  a.add("chart", "FILE.png", "draw the step ms per size as grouped bars: tessera, torch eager, torch compile");
}

// The files the flags ask for ("" where not given), each checked writable and no two on one path.
struct CompareOutputs {
  std::string out, json, csv, chart;
};

CompareOutputs read_compare_outputs(const Flags& a, const std::string& what) {
  const CompareOutputs o{.out = a.str("out"), .json = a.str("json"), .csv = a.str("csv"), .chart = a.str("chart")};
  if (a.has("out")) check_output_path("out", o.out);
  if (a.has("json")) check_output_path("json", o.json);
  if (a.has("csv")) check_output_path("csv", o.csv);
  if (a.has("chart")) {
    check_output_path("chart", o.chart);
    TS_CHECK(fs::path(o.chart).extension() == ".png", what, ": --chart ", o.chart, " must end in .png");
  }
  OutputFiles files;  // one file per flag: two flags on one path lost the first file, both "wrote"
  for (const auto& [flag, path] :
       {std::pair<std::string, std::string>{"out", o.out}, {"json", o.json}, {"csv", o.csv}, {"chart", o.chart}})
    if (a.has(flag)) files.claim("--" + flag, path);
  return o;
}

// What both sides measured, and how: everything the table, the JSON, the CSV and the chart are made of.
struct CompareRun {
  const ModelBenchConfig& bc;
  const ModelBenchTarget& target;
  const std::vector<std::string>& modes;
  const std::vector<ModelBenchRow>& rows;
  const ModelPeer& peer;
  bool gpu() const { return target.ctx.is_cuda(); }
};

// The markdown's header: the setup of both sides, and what the columns mean.
std::string compare_markdown_header(const CompareRun& c) {
  const ModelBenchConfig& bc = c.bc;
  const ModelPeer& peer = c.peer;
  const std::string& prec = c.target.prec;
  const bool gpu = c.gpu();
  std::string md = "# tessera bench compare\n\n";
  md += "- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) + "\n- device: " + c.target.device +
        (gpu ? " (GPU)" : " (CPU)") + "\n- precision " + prec + ", batch " + std::to_string(bc.batch) + ", seq " +
        std::to_string(bc.seq) + ", " + std::to_string(bc.warmup) + " warm-up + " + counted(bc.steps, "timed run") +
        " per region on both sides, each between two synchronizations (host clock); cells: median ms\n";
  md += "- step = zero_grad + forward + backward + AdamW; fwd+bwd = zero_grad + forward + backward\n";
  md += "- tessera " + c.target.regions_line + "\n";
  if (peer.figures.empty()) {
    md += "- peer (bench/peers/model.py): " + peer.note + "\n";
  } else {
    md +=
        "- peer: bench/peers/model.py: Hugging Face GPT2LMHeadModel (gpt2 presets) / LlamaForCausalLM (cs336), "
        "torch " +
        peer.torch + ", transformers " + peer.transformers + ", on " + peer.device + "; f32 weights" +
        (prec == "bf16" ? " + torch.autocast(bfloat16)" : "") + ", AdamW" + (gpu ? "(fused=True)" : "") +
        ", clipping 1.0; eager = the model as is, compile = torch.compile(model)\n";
    if (!peer.note.empty()) md += "- " + peer.note + "\n";
  }
  md += "- speedup = peer ms / tessera ms (> 1: tessera is faster); train mem: tessera's " +
        std::string(gpu ? "device memory in use after the step above what was in use before the size was built"
                        : "planned bytes (parameters, gradients, activation arena, AdamW m and v)") +
        ", the peer's " + (gpu ? "torch.cuda.max_memory_allocated above the start" : "not measured on the CPU") + "\n";
  return md;
}

// The whole markdown: the header, a row per size and peer mode, then the notes (OOMs, failures, other sizes).
std::string compare_markdown(const CompareRun& c) {
  std::string md = compare_markdown_header(c);
  md += "\n| size | peer mode |";
  std::string rule = "\n|---|---|";
  for (const Region& g : kRegions) {
    md.append(" tessera ").append(g.label).append(" ms | peer ").append(g.label).append(" ms | ");
    md.append(g.label).append(" speedup |");
    rule += "---:|---:|---:|";
  }
  md += " tessera train mem | peer train mem |" + rule + "---:|---:|\n";
  std::string notes;
  for (const ModelBenchRow& r : c.rows) {
    for (const std::string& m : c.modes) {
      const ModelPeerFigures* f = c.peer.find(r.size, m);
      md += "| " + r.size + " | " + m + " |";
      for (const Region& g : kRegions) {
        const std::optional<double> t = r.region_ms(g.name);
        const std::optional<double> x = f ? model_peer_speedup(r, *f, g.name) : std::nullopt;
        md.append(" ").append(r.oom ? std::string("OOM") : t ? ms_text(*t) : std::string("–")).append(" | ");
        md.append(peer_cell(f, f ? f->region_ms(g.name) : std::nullopt, /*bytes=*/false)).append(" | ");
        md.append(x ? fmt("%.2f×", *x) : std::string("–")).append(" |");
      }
      md.append(" ").append(cell_bytes(r.mem_train, r.oom)).append(" | ");
      md.append(peer_cell(f, f ? f->train_mem_bytes : std::nullopt, /*bytes=*/true)).append(" |\n");
      if (f && !f->ran())
        notes += "- torch " + m + " " + r.size + ": " + (f->oom ? "OOM" : "failed") +
                 (f->error.empty() ? "" : ": " + f->error) + "\n";
      else if (f && f->params != r.params)
        notes += "- torch " + m + " " + r.size + ": the Hugging Face model has " + std::to_string(f->params) +
                 " parameters, tessera's " + std::to_string(r.params) + " (bench/peers/model.py's PRESETS differ)\n";
    }
    if (r.oom) notes += "- tessera " + r.size + ": OOM: " + r.oom_reason + "\n";
  }
  if (!notes.empty()) md += "\n" + notes;
  return md;
}

void write_compare_json(const std::string& json_path, const CompareRun& c) {
  const ModelBenchConfig& bc = c.bc;
  const ModelPeer& peer = c.peer;
  auto num = [](const std::optional<double>& v) { return v ? ojson(*v) : ojson(nullptr); };
  ojson j;
  j["date"] = utc_now();
  j["commit"] = TESSERA_GIT_COMMIT;
  j["device"] = c.target.device;
  j["gpu"] = c.gpu();
  j["precision"] = c.target.prec;
  j["batch"] = bc.batch;
  j["seq"] = bc.seq;
  j["warmup"] = bc.warmup;
  j["steps"] = bc.steps;
  j["cuda_graph"] = c.target.no_graph.empty();
  j["peer"] = {{"script", "bench/peers/model.py"},
               {"modes", c.modes},
               {"note", peer.note.empty() ? ojson(nullptr) : ojson(peer.note)},
               {"torch", peer.torch},
               {"transformers", peer.transformers},
               {"device", peer.device}};
  ojson arr = ojson::array();
  for (const ModelBenchRow& r : c.rows)
    for (const std::string& m : c.modes) {
      const ModelPeerFigures* f = peer.find(r.size, m);
      ojson o;
      o["size"] = r.size;
      o["mode"] = m;
      o["params"] = r.params;
      o["tessera_status"] = r.oom ? "oom" : "ok";
      if (r.oom) o["oom_reason"] = r.oom_reason;
      o["peer_status"] = peer_status(f);
      if (f && !f->error.empty()) o["peer_error"] = f->error;
      o["peer_params"] = f ? ojson(f->params) : ojson(nullptr);
      for (const Region& g : kRegions)
        o[g.key] = {{"tessera_ms", num(r.region_ms(g.name))},
                    {"peer_ms", num(f ? f->region_ms(g.name) : std::nullopt)},
                    {"speedup", num(f ? model_peer_speedup(r, *f, g.name) : std::nullopt)}};
      o["tessera_train_mem_bytes"] = r.mem_train && !r.oom ? ojson(*r.mem_train) : ojson(nullptr);
      o["peer_train_mem_bytes"] = f && f->train_mem_bytes ? ojson(static_cast<int64_t>(*f->train_mem_bytes))
                                                          : ojson(nullptr);
      arr.push_back(std::move(o));
    }
  j["rows"] = std::move(arr);
  write_file_atomic(json_path, j.dump(2) + "\n");
  std::fprintf(stderr, "wrote %s\n", json_path.c_str());
}

void write_compare_csv(const std::string& csv_path, const CompareRun& c) {
  std::string csv = "size,mode,params,tessera_status,peer_status";
  for (const Region& g : kRegions)
    for (const char* col : {"tessera_ms", "peer_ms", "speedup"}) csv.append(",").append(g.key).append("_").append(col);
  csv += ",tessera_train_mem_bytes,peer_train_mem_bytes\n";
  auto num = [](const std::optional<double>& v) { return v ? csv_num(*v) : std::string(); };
  for (const ModelBenchRow& r : c.rows)
    for (const std::string& m : c.modes) {
      const ModelPeerFigures* f = c.peer.find(r.size, m);
      csv += r.size + "," + m + "," + std::to_string(r.params) + "," + (r.oom ? "oom" : "ok") + "," + peer_status(f);
      for (const Region& g : kRegions) {
        csv.append(",").append(num(r.region_ms(g.name)));
        csv.append(",").append(num(f ? f->region_ms(g.name) : std::nullopt));
        csv.append(",").append(num(f ? model_peer_speedup(r, *f, g.name) : std::nullopt));
      }
      csv.append(",").append(r.mem_train && !r.oom ? std::to_string(*r.mem_train) : std::string());
      csv.append(",").append(f && f->train_mem_bytes ? fmt("%.0f", *f->train_mem_bytes) : std::string());
      csv.push_back('\n');
    }
  write_file_atomic(csv_path, csv);
  std::fprintf(stderr, "wrote %s\n", csv_path.c_str());
}

// The step ms per size: tessera's bar, then one per peer mode.
void write_compare_chart(const std::string& chart, const CompareRun& c) {
  std::vector<BarSeries> series = {{"tessera", kColorTessera}};
  for (const std::string& m : c.modes)
    series.push_back({"torch " + m, m == "eager" ? kColorTorchEager : kColorTorchCompile});
  std::vector<BarGroup> groups;
  for (const ModelBenchRow& r : c.rows) {
    BarGroup g{.label = r.size, .values = {r.region_ms("step")}};
    for (const std::string& m : c.modes) {
      const ModelPeerFigures* f = c.peer.find(r.size, m);
      g.values.push_back(f && f->ran() ? f->step_ms : std::nullopt);
    }
    groups.push_back(std::move(g));
  }
  const std::string title = "training step, tessera vs pytorch: B" + std::to_string(c.bc.batch) + " T" +
                            std::to_string(c.bc.seq) + " " + c.target.prec + " on " +
                            (c.gpu() ? c.target.ctx.gpu().name : std::string("cpu"));
  write_png(chart, bar_chart(title, "step ms", series, groups));
  std::fprintf(stderr, "wrote %s\n", chart.c_str());
}

}  // namespace

int cmd_bench_compare(int argc, char** argv) {
  Flags a("bench compare",
          "tessera against its PyTorch peer (bench/peers/model.py: the Hugging Face model, eager and torch.compile) "
          "over the same model sizes: forward, forward+backward and step ms with tessera's speedup, and training "
          "memory, in one table.");
  add_compare_flags(a);
  if (!a.parse(argc, argv, 3)) return 0;

  const std::string what = "bench compare";
  TS_CHECK(!(a.has("preset") && a.has("sizes")), what, ": give --preset or --sizes, not both");
  ModelBenchConfig bc;  // every region: the table has them all
  read_model_bench_runs(a, what, bc);
  const CompareOutputs outputs = read_compare_outputs(a, what);
  const std::vector<std::string> modes = read_peer_modes(a, what);
  const double peer_timeout = read_peer_timeout(a, what);
  TS_CHECK(a.str("precision") != "f16", what,
           ": --precision f16: the PyTorch peer times f32 and bf16 only; "
           "bench model --precision f16 times tessera's f16 step alone");
  ModelBenchTarget target = read_model_bench_target(a, what, bc);

  std::printf("tessera bench compare on %s, %s, batch %d, seq %d, %d warm-up + %s per region\n", target.device.c_str(),
              target.prec.c_str(), bc.batch, bc.seq, bc.warmup, counted(bc.steps, "timed run").c_str());
  std::printf("%s\n", target.regions_line.c_str());
  std::fflush(stdout);
  const std::vector<ModelBenchRow> rows = run_model_bench_sizes(target.cfgs, bc, target.ctx,
                                                                /*gemm_flops_per_s=*/0, !a.has("no-progress"));
  // The peer runs after every size of tessera's is done and its buffers are gone (one process on the device).
  std::fprintf(stderr, "  peer: bench/peers/model.py (%s) ...\n", modes.size() == 2 ? "both" : modes[0].c_str());
  const ModelPeer peer = run_model_peer(target.names, modes, bc, target.prec, target.ctx.device().str(), peer_timeout);
  std::fprintf(stderr, "  %s\n", peer.note.empty() ? "peer: done" : peer.note.c_str());  // a note says "peer ..."

  const CompareRun run{.bc = bc, .target = target, .modes = modes, .rows = rows, .peer = peer};
  print_bench_markdown(compare_markdown(run), outputs.out);
  if (!outputs.json.empty()) write_compare_json(outputs.json, run);
  if (!outputs.csv.empty()) write_compare_csv(outputs.csv, run);
  if (!outputs.chart.empty()) write_compare_chart(outputs.chart, run);
  return 0;
}

}  // namespace tessera::cli
