#include "tessera/cli/bench_model_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tessera/bench/peer.h"
#include "tessera/cli/common.h"
#include "tessera/core/error.h"
#include "tessera/core/units.h"
#include "tessera/train/progress.h"

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif

namespace tessera::cli {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    std::string item = s.substr(i, j - i);
    const size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
    TS_CHECK(a != std::string::npos, "--sizes: empty item in '", s, "' (a comma list of presets)");
    out.push_back(item.substr(a, b - a + 1));
    i = j + 1;
  }
  return out;
}

size_t parse_bytes(const std::string& what, const std::string& v) {
  const std::optional<double> x = parse_byte_size(v);
  // A size in the form, but not one to take ('0', '99999999999999999999'), says so, rather than asking for the
  // form it already has.
  TS_CHECK(x, what, ": --max-memory expects a size such as 512MiB or 2GiB, got '", v, "'");
  TS_CHECK(*x > 0, what, ": --max-memory must be positive, got '", v, "'");
  TS_CHECK(*x >= 1, what, ": --max-memory '", v, "' is less than 1 byte");
  TS_CHECK(*x <= 1e18, what, ": --max-memory '", v, "' is out of range (more than 1 EB)");
  return static_cast<size_t>(*x);
}

std::vector<ModelBenchRow> run_model_bench_sizes(
    const std::vector<ModelConfig>& cfgs, ModelBenchConfig bc, Context& ctx, double gemm_flops_per_s, bool progress,
    const std::function<void(const ModelConfig&, const ModelBenchRow&)>& after) {
  const int parts = model_bench_part_count(bc);
  ProgressBar bar(static_cast<int64_t>(cfgs.size()) * parts, 0, progress, {.unit = "part", .eta = false});
  std::vector<ModelBenchRow> rows;
  for (size_t i = 0; i < cfgs.size(); ++i) {
    const ModelConfig& c = cfgs[i];
    int64_t done = static_cast<int64_t>(i) * parts;
    bc.on_part = [&](const char* part) { bar.update(done++, c.preset + " " + part); };
    const auto t0 = std::chrono::steady_clock::now();
    rows.push_back(bench_model(c, bc, ctx, gemm_flops_per_s));
    const ModelBenchRow& r = rows.back();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bar.update(static_cast<int64_t>(i + 1) * parts, c.preset + " done");
    bar.finish();  // the bar's line ends before the size's own
    std::fflush(stdout);
    if (r.oom) std::fprintf(stderr, "  %s: OOM (%s)\n", c.preset.c_str(), r.oom_reason.c_str());
    else if (r.loss_scale)
      std::fprintf(stderr, "  %s: done in %.1f s, loss scale %g at the end, %lld of %lld steps skipped\n",
                   c.preset.c_str(), s, *r.loss_scale, static_cast<long long>(r.skipped_steps),
                   static_cast<long long>(r.optimizer_steps));
    else std::fprintf(stderr, "  %s: done in %.1f s\n", c.preset.c_str(), s);
    if (after) after(c, r);
    std::fflush(stderr);
  }
  return rows;
}

void read_model_bench_runs(const Flags& a, const std::string& what, ModelBenchConfig& bc) {
  bc.warmup = a.integer("warmup", 5);
  bc.steps = a.integer("steps", 10);
  TS_CHECK(bc.warmup >= 0, what, ": --warmup must be >= 0, got ", bc.warmup);
  TS_CHECK(bc.steps >= 1, what, ": --steps must be >= 1, got ", bc.steps);
  bc.batch = a.integer("batch", 4);
  TS_CHECK(bc.batch >= 1, what, ": --batch must be >= 1, got ", bc.batch);
  if (a.has("max-memory")) bc.max_memory_bytes = parse_bytes(what, a.str("max-memory"));
}

ModelBenchTarget read_model_bench_target(const Flags& a, const std::string& what, ModelBenchConfig& bc) {
  ModelBenchTarget t{.ctx = a.has("device") ? Context::from_name(a.str("device")) : Context::best_available()};
  const Context& ctx = t.ctx;
  t.prec = a.str("precision", ctx.is_cuda() ? "bf16" : "f32");
  const std::string& prec = t.prec;
  TS_CHECK(prec == "f32" || prec == "bf16" || prec == "f16", what, ": --precision must be f32, bf16 or f16, got '",
           prec, "'");
  TS_CHECK(ctx.is_cuda() || prec == "f32", what, ": --precision ", prec,
           " needs a GPU: the CPU reference computes in f32 (use --precision f32, or --device cuda)");
  bc.dtype = prec == "bf16" ? DType::BF16 : prec == "f16" ? DType::F16 : DType::F32;
  bc.loss_scaling = bc.dtype == DType::F16;  // as train --precision f16 (model_bench_loss_scaling)
  if (a.has("cuda-graph")) {
    const std::string graph = a.str("cuda-graph");
    TS_CHECK(graph == "on" || graph == "off", what, ": --cuda-graph must be on or off, got '", graph, "'");
    bc.cuda_graph = graph == "on";
    const std::string why = model_bench_graph_refusal(bc.cuda_graph, ctx);
    TS_CHECK(!bc.cuda_graph || why.empty(), what, ": --cuda-graph on: ", why);
  }
  t.no_graph = model_bench_graph_refusal(bc.cuda_graph, ctx);
  t.regions_line = t.no_graph.empty() ? "regions: CUDA graph replays (one eager and one capturing run untimed first)"
                                      : "regions: eager launches (" + t.no_graph + ")";

  const std::string default_sizes = ctx.is_cuda() ? "cs336-small,cs336-medium,cs336-large,cs336-xl,cs336-2.7b" : "tiny";
  t.names = a.has("preset") ? std::vector<std::string>{a.str("preset")} : split_list(a.str("sizes", default_sizes));
  int min_max_seq = 1 << 30;
  for (const std::string& n : t.names) {
    t.cfgs.push_back(model_preset(n));
    min_max_seq = std::min(min_max_seq, t.cfgs.back().max_seq);
  }
  bc.seq = a.integer("seq", std::min(256, min_max_seq));
  TS_CHECK(bc.seq >= 1, what, ": --seq must be >= 1, got ", bc.seq);
  for (const ModelConfig& c : t.cfgs)
    TS_CHECK(bc.seq <= c.max_seq, what, ": --seq ", bc.seq, " exceeds max_seq ", c.max_seq, " of ", c.preset);
  t.device = ctx.is_cuda() ? ctx.device().str() + " (" + ctx.gpu().name + ")" : "cpu";
  return t;
}

std::vector<std::string> read_peer_modes(const Flags& a, const std::string& what) {
  const std::string peer_mode = a.str("peer-mode", "both");
  TS_CHECK(peer_mode == "eager" || peer_mode == "compile" || peer_mode == "both", what,
           ": --peer-mode must be eager, compile or both, got '", peer_mode, "'");
  return peer_mode == "both" ? std::vector<std::string>{"eager", "compile"} : std::vector<std::string>{peer_mode};
}

double read_peer_timeout(const Flags& a, const std::string& what) {
  const double s = a.number("peer-timeout", 0.0);
  TS_CHECK(s >= 0, what, ": --peer-timeout must be 0 (no limit) or a positive number of seconds, got ",
           a.str("peer-timeout"));
  // The deadline is a clock reading in nanoseconds (64 bits): a timeout past about 292 years overflows it into the
  // past, which would stop the peer at once. A year is beyond any peer run.
  constexpr double kYear = 365.0 * 24 * 3600;
  TS_CHECK(s <= kYear, what, ": --peer-timeout ", a.str("peer-timeout"), " is out of range (at most a year, ",
           static_cast<long long>(kYear), " s; 0 for no limit)");
  return s;
}

ModelPeer run_model_peer(const std::vector<std::string>& sizes, const std::vector<std::string>& modes,
                         const ModelBenchConfig& bc, const std::string& precision, const std::string& device,
                         double timeout_s) {
  ModelPeer p;
  std::string args = "'" TESSERA_PEERS_DIR "/model.py' --sizes ";
  for (size_t i = 0; i < sizes.size(); ++i) args.append(i ? "," : "").append(sizes[i]);
  args += " --modes ";
  for (size_t i = 0; i < modes.size(); ++i) args.append(i ? "," : "").append(modes[i]);
  args += " --regions ";
  std::string regions;
  for (const auto& [on, name] : {std::pair{bc.fwd, "fwd"}, {bc.fwd_bwd, "fwd-bwd"}, {bc.step, "step"}})
    if (on) regions.append(regions.empty() ? "" : ",").append(name);
  args += regions + " --batch " + std::to_string(bc.batch) + " --seq " + std::to_string(bc.seq) + " --precision " +
          precision + " --warmup " + std::to_string(bc.warmup) + " --steps " + std::to_string(bc.steps) + " --device " +
          device;
  p.note = run_peer_script(
      args, "model.py",
      [&](const nlohmann::json& j) {
        std::optional<ModelPeerFigures> f = model_peer_figures_from_json(j);
        if (!f) return false;
        for (auto [key, dst] : {std::pair{"torch", &p.torch}, {"transformers", &p.transformers}, {"device", &p.device}})
          if (j.contains(key) && j[key].is_string()) *dst = j[key].get<std::string>();
        p.figures[{f->size, f->mode}] = std::move(*f);
        return true;
      },
      timeout_s);
  return p;
}

std::string ms_text(double ms) { return fmt(ms < 10 ? "%.3f" : "%.2f", ms); }

std::string csv_num(double v) { return fmt("%.6g", v); }

std::string cell_bytes(const std::optional<size_t>& b, bool oom) {
  if (oom) return "OOM";
  return b ? human_bytes(static_cast<double>(*b)) : "–";
}

std::string peer_cell(const ModelPeerFigures* f, const std::optional<double>& v, bool bytes) {
  if (!f) return "–";
  if (f->oom) return "OOM";
  if (!f->error.empty()) return "failed";
  if (!v) return "–";
  return bytes ? human_bytes(*v) : ms_text(*v);
}

}  // namespace tessera::cli
