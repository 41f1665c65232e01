#include "tessera/bench/model.h"

#include "tessera/bench/memory_timeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/buffer.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/core/error.h"
#include "tessera/core/memory.h"
#include "tessera/core/units.h"
#include "tessera/models/model.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/train/graph_step.h"
#include "tessera/train/optimizer.h"
#include "tessera/train/train_step.h"

namespace tessera {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// splitmix64: a reproducible stream for tokens and GEMM inputs (they only need to vary).
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [-1, 1)
};

// `steps` runs of fn, each between two synchronizations of the context, timed by the host clock, after `warmup`
// untimed runs.
RegionTiming time_region(Context& ctx, const std::function<void()>& fn, int warmup, int steps) {
  for (int i = 0; i < warmup; ++i) fn();
  ctx.synchronize();
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    ctx.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ctx.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  RegionTiming r;
  double sum = 0, sq = 0;
  for (double v : ms) sum += v;
  r.mean_ms = sum / static_cast<double>(ms.size());
  for (double v : ms) sq += (v - r.mean_ms) * (v - r.mean_ms);
  r.std_ms = ms.size() > 1 ? std::sqrt(sq / static_cast<double>(ms.size() - 1)) : 0.0;
  r.t = timing_summary(std::move(ms));
  return r;
}

}  // namespace

void bench_init_weights(Model& model) {
  ParamBuffer& pb = model.params();
  std::vector<float> w(pb.size(), 0.0f);
  for (const ParamSegment& seg : pb.segments()) {
    const bool gain = seg.name.ends_with("ln1.w") || seg.name.ends_with("ln2.w") || seg.name == "lnf.w";
    const bool bias = seg.name.ends_with(".b");
    const int64_t n = static_cast<int64_t>(seg.numel);
    float* dst = w.data() + seg.offset;
    const uint64_t salt = seg.offset * 0x9e3779b97f4a7c15ull;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      SplitMix h{salt + static_cast<uint64_t>(i)};
      dst[i] = gain ? 1.0f : bias ? 0.0f : 0.02f * h.uniform();
    }
  }
  pb.write_f32(w, model.context());
}

namespace {

// The memory free for a new size: the device's (total − in use) or the host's MemAvailable.
size_t free_memory(Context& ctx) {
  if (ctx.is_cuda()) {
    const size_t total = ctx.gpu().memory_bytes, used = ctx.device_memory_used();
    return total > used ? total - used : 0;
  }
  return available_host_memory();
}

// Device memory in use above `baseline` (0 on the CPU).
size_t used_above(Context& ctx, size_t baseline) {
  const size_t used = ctx.device_memory_used();
  return used > baseline ? used - baseline : 0;
}

}  // namespace

const char* model_bench_mode_name(ModelBenchMode m) {
  switch (m) {
    case ModelBenchMode::Fwd: return "fwd";
    case ModelBenchMode::FwdBwd: return "fwd-bwd";
    case ModelBenchMode::Step: return "step";
  }
  return "?";
}

PlannedMemory model_planned_memory(const ModelConfig& cfg, int B, int T, DType dtype) {
  // Segments: wte, wpe, lnf.w, lnf.b, lm_head and at most 12 per layer; each is padded by under 16 elements.
  const size_t segments = 5 + 12 * static_cast<size_t>(cfg.n_layers);
  const size_t elems = static_cast<size_t>(cfg.num_params()) + 16 * segments;
  const size_t es = dtype_size(dtype);
  PlannedMemory m;
  // Parameters and master weights; the gradients are planned with the activations, as the bench runs the model.
  m.params = elems * (es + (es < 4 ? 4 : 0));
  m.optimizer = elems * 8;
  m.activations = model_activation_bytes(cfg, B, T, dtype, GradMemory::Planned);
  return m;
}

double model_forward_flops(const ModelConfig& cfg, int B, int T) {
  const double N = static_cast<double>(B) * T, C = cfg.d_model, F = cfg.d_ff, Fin = cfg.d_ff_in(), V = cfg.vocab;
  const double L = cfg.n_layers;
  const double gemms = 2.0 * N * L * (3 * C * C + C * C + C * Fin + F * C);
  const double attention = L * 4.0 * N * T * C;  // QKᵀ and AV, 2·T·C each per token, per layer
  const double head = 2.0 * N * C * V;
  return gemms + attention + head;
}

GemmRate measure_gemm_rate(BenchHarness& h, int n, DType dtype, const TimingOptions& timing) {
  Context& ctx = h.context();
  const size_t count = static_cast<size_t>(n) * n, bytes = count * dtype_size(dtype);
  Buffer a(bytes, ctx.device(), "the GEMM-rate A"), b(bytes, ctx.device(), "the GEMM-rate B"),
      c(bytes, ctx.device(), "the GEMM-rate C");
  {
    SplitMix rng{7};
    std::vector<float> f32(count);
    std::vector<unsigned char> raw(bytes);
    for (const Buffer* buf : {&a, &b}) {
      for (float& v : f32) v = rng.uniform();
      convert_from_f32(f32.data(), count, dtype, raw.data());
      copy_bytes(buf->data(), ctx.device(), raw.data(), Device::cpu(), bytes, ctx);
    }
    ctx.synchronize();
  }
  const int64_t nn = static_cast<int64_t>(count);
  const Tensor ta = a.view(dtype, {nn}), tb = b.view(dtype, {nn}), tc = c.view(dtype, {nn});
  GemmRate r;
  r.n = n;
  r.dtype = dtype;
  r.t = h.time([&] { gemm({.M = n, .N = n, .K = n}, tc, ta, tb, Tensor(), ctx); }, timing);
  return r;
}

bool model_bench_loss_scaling(const ModelBenchConfig& bc) { return bc.loss_scaling || bc.dtype == DType::F16; }

std::string model_bench_graph_refusal(bool cuda_graph, const Context& ctx) {
  if (!cuda_graph) return "--cuda-graph off";
  if (!ctx.is_cuda()) return "the CPU has no CUDA graphs";
  if (!cuda_graph_capture_supported())
    return "a Debug build synchronizes after every kernel launch (TS_CHECK_LAUNCH), which a capture forbids";
  return "";
}

int model_bench_part_count(const ModelBenchConfig& bc) {
  return int{bc.fwd} + int{bc.fwd_bwd} + int{bc.step} + int{bc.trace || bc.memory_timeline};
}

namespace {

// One step of a size recorded after its timed regions: a Chrome trace of it (with the phase ranges and the memory
// counters) and the memory timeline's measured samples at the end of each phase, into row. A training step
// whenever the optimizer exists; else forward and backward (or the forward alone) as the regions asked for.
void record_step(Model& model, Context& ctx, size_t baseline, const ModelBenchConfig& bc, AdamW* opt,
                 const TrainStepConfig& step_cfg, float lr, double scale, RngState& rng,
                 const std::function<void()>& before_optimizer, const std::function<void()>& after_optimizer,
                 ModelBenchRow& row) {
  auto tracer = bc.trace ? std::make_shared<Tracer>(ctx) : nullptr;
  model.set_tracer(tracer.get());
  std::vector<size_t> at_phase_end;  // forward, backward, optimizer
  auto sample = [&](const char* what) {
    if (!ctx.is_cuda()) return;
    ctx.synchronize();
    const size_t used = used_above(ctx, baseline);
    at_phase_end.push_back(used);
    if (tracer) tracer->counter(std::string("device memory in use (measured) ") + what, static_cast<double>(used));
  };
  const bool full = opt != nullptr;  // a training step whenever the optimizer exists
  const bool backward = full || bc.fwd_bwd;
  TrainStepConfig recorded_cfg = step_cfg;
  recorded_cfg.backward = backward;
  TrainStep recorded(model, opt, recorded_cfg);
  if (!backward) model.zero_grad();  // as before every step's forward
  recorded.forward_backward(scale, &rng,
                            {.after_forward = [&](int) { sample("after forward"); },
                             .after_backward = [&](bool) { sample("after backward"); }});
  if (full) {
    before_optimizer();
    recorded.optimizer_step(lr, scale, tracer.get());
    after_optimizer();
    sample("after optimizer");
  }
  model.set_tracer(nullptr);
  ctx.synchronize();
  row.trace = tracer;

  if (bc.memory_timeline)
    row.timeline = memory_timeline_points(model, opt ? opt->state_bytes() : 0,
                                          ctx.is_cuda() ? at_phase_end : std::vector<size_t>{});
}

// A size that ran out of memory part way: the reason, and nothing measured.
void mark_out_of_memory(ModelBenchRow& row, const std::string& why) {
  row.oom = true;
  row.oom_reason = why;
  row.fwd.reset();
  row.fwd_bwd.reset();
  row.step.reset();
  row.mem_fwd.reset();
  row.mem_train.reset();
  row.trace.reset();
  row.timeline.clear();
  row.loss_scale.reset();
  row.optimizer_steps = row.skipped_steps = 0;
}

}  // namespace

ModelBenchRow bench_model(const ModelConfig& cfg, const ModelBenchConfig& bc, Context& ctx, double gemm_flops_per_s) {
  TS_CHECK(bc.batch > 0 && bc.seq > 0, "bench model: --batch and --seq must be positive");
  TS_CHECK(bc.seq <= cfg.max_seq, "bench model: --seq ", bc.seq, " exceeds max_seq ", cfg.max_seq, " of ", cfg.preset);
  TS_CHECK(bc.steps >= 1, "bench model: --steps must be >= 1, got ", bc.steps);
  TS_CHECK(bc.warmup >= 0, "bench model: --warmup must be >= 0, got ", bc.warmup);
  ModelBenchRow row;
  row.size = cfg.preset;
  row.cfg = cfg;
  row.params = cfg.num_params();
  row.flops_fwd = model_forward_flops(cfg, bc.batch, bc.seq);
  row.mem_measured = ctx.is_cuda();
  row.planned = model_planned_memory(cfg, bc.batch, bc.seq, bc.dtype);

  const size_t free_bytes = free_memory(ctx);
  size_t limit = free_bytes;
  if (bc.max_memory_bytes > 0 && (limit == 0 || bc.max_memory_bytes < limit)) limit = bc.max_memory_bytes;
  const bool needs_optimizer = bc.step || bc.memory_timeline;
  const size_t need = row.planned.params + row.planned.activations + (needs_optimizer ? row.planned.optimizer : 0);
  if (limit > 0 && need > limit) {
    row.oom = true;
    // In the unit that fits each: a --max-memory of 1KiB read "planned 1.86 GiB > 0.00 GiB".
    row.oom_reason = "planned " + human_bytes(static_cast<double>(need)) + " > " +
                     human_bytes(static_cast<double>(limit)) +
                     (limit == bc.max_memory_bytes ? " (--max-memory)" : " free");
    return row;
  }

  const size_t baseline = ctx.device_memory_used();
  const int B = bc.batch, T = bc.seq, N = B * T;
  try {
    const std::unique_ptr<Model> owned = make_model(cfg, ctx, bc.dtype);
    Model& model = *owned;
    model.set_grad_memory(GradMemory::Planned);  // as train runs it (no accumulation here)
    bench_init_weights(model);
    {
      std::vector<int32_t> tok(static_cast<size_t>(N)), tgt(tok.size());
      SplitMix rng{bc.seed * 0x2545f4914f6cdd1dull + 3};
      for (int32_t& t : tok) t = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(cfg.vocab));
      for (int32_t& t : tgt) t = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(cfg.vocab));
      copy_bytes(model.tokens_buffer(B, T).data(), ctx.device(), tok.data(), Device::cpu(), tok.size() * 4, ctx);
      copy_bytes(model.targets_buffer(B, T).data(), ctx.device(), tgt.data(), Device::cpu(), tgt.size() * 4, ctx);
      ctx.synchronize();
    }
    RngState rng{bc.seed, 0};
    // A small learning rate: the step must run its full arithmetic, not move the weights far from init.
    constexpr float kLr = 1e-5f;
    const size_t param_bytes = model.params().bytes();
    // The loss scaling of train's steps (f16): one scaler for the size, carried from region to region.
    StepLossScaling scaling = model_bench_loss_scaling(bc) ? StepLossScaling(bc.loss_scaler) : StepLossScaling();
    // The forward alone computes the loss; a training step's forward also writes the loss gradient at the scale its
    // backward will use (train's step, train_step.h).
    const TrainStepConfig step_cfg{.B = B, .T = T, .skip_nonfinite = scaling.on()};
    TrainStepConfig forward_cfg = step_cfg;
    forward_cfg.backward = false;
    TrainStep forward_only(model, nullptr, forward_cfg), forward_backward_only(model, nullptr, step_cfg);
    auto forward = [&] { forward_only.forward_backward(scaling.scale(), &rng); };
    auto forward_backward = [&] { forward_backward_only.forward_backward(scaling.scale(), &rng); };

    std::unique_ptr<AdamW> opt;  // made after the fwd and fwd-bwd regions, whose memory it is not part of
    auto before_optimizer = [&] {
      if (bc.before_optimizer_step) bc.before_optimizer_step(row.optimizer_steps + 1, model);
    };
    // After each optimizer step: with loss scaling, the report that says whether it was skipped (AdamW needs it read
    // before its next step) moves the scale, as after a train step.
    auto after_optimizer = [&] {
      row.optimizer_steps++;
      if (!scaling.on()) return;
      const StepReport report = opt->read_step();
      if (report.skipped) row.skipped_steps++;
      scaling.update(report, row.optimizer_steps);
    };
    std::unique_ptr<TrainStep> train_step;  // with the optimizer, once it exists
    auto step = [&] {
      train_step->run(kLr, scaling.scale(), &rng, {.before_optimizer = before_optimizer});
      after_optimizer();
    };

    // A region as CUDA graphs: the same launches replayed (GraphStep's first run is eager, its second captures;
    // both run untimed here, before the warm-up runs). The scale is the graph's argument, as in train: a changed
    // one captures the step graph again.
    const bool graphs = model_bench_graph_refusal(bc.cuda_graph, ctx).empty();
    row.cuda_graph = graphs;
    std::vector<std::unique_ptr<GraphStep>> graph_steps;
    auto as_graph = [&](const std::function<void()>& eager, bool backward, AdamW* optimizer) -> std::function<void()> {
      if (!graphs) return eager;
      std::function<void()> between;  // on the host between the step graph and the optimizer's, as train's hooks
      if (optimizer && bc.before_optimizer_step) between = before_optimizer;
      graph_steps.push_back(std::make_unique<GraphStep>(model, optimizer,
                                                        GraphStepConfig{.B = B,
                                                                        .T = T,
                                                                        .backward = backward,
                                                                        .optimizer = optimizer != nullptr,
                                                                        .upload_batch = false,
                                                                        .skip_nonfinite = scaling.on(),
                                                                        .host_between = static_cast<bool>(between)}));
      GraphStep* g = graph_steps.back().get();
      std::function<void()> replay = [&, g, optimizer, between] {
        g->run(kLr, scaling.scale(), &rng, between);
        if (optimizer) after_optimizer();
      };
      replay();
      replay();
      return replay;
    };

    const auto part = [&](const char* name) {
      if (bc.on_part) bc.on_part(name);
    };
    if (bc.fwd) {
      part("fwd");
      row.fwd = time_region(ctx, as_graph(forward, /*backward=*/false, nullptr), bc.warmup, bc.steps);
      row.mem_fwd = ctx.is_cuda() ? used_above(ctx, baseline) : param_bytes + model.activation_peak();
    }
    if (bc.fwd_bwd) {
      part("fwd+bwd");
      row.fwd_bwd = time_region(ctx, as_graph(forward_backward, /*backward=*/true, nullptr), bc.warmup, bc.steps);
    }
    if (needs_optimizer) {
      opt = std::make_unique<AdamW>(model.params(), AdamWConfig{}, ctx);
      train_step = std::make_unique<TrainStep>(model, opt.get(), step_cfg);
    }
    if (bc.step) {
      part("step");
      row.step = time_region(ctx, as_graph(step, /*backward=*/true, opt.get()), bc.warmup, bc.steps);
      row.mem_train = ctx.is_cuda() ? used_above(ctx, baseline)
                                    : param_bytes + model.activation_peak() + opt->state_bytes();
    }

    // One more step, recorded: the Chrome trace (with the phase ranges and the memory counters) and the
    // memory timeline's measured samples at the end of each phase.
    if (bc.trace || bc.memory_timeline) {
      part("recorded step");
      record_step(model, ctx, baseline, bc, opt.get(), step_cfg, kLr, scaling.scale(), rng, before_optimizer,
                  after_optimizer, row);
    }
    if (scaling.on()) row.loss_scale = scaling.scale();
  } catch (const Error& e) {
    if (!is_out_of_memory(e.what())) throw;
    mark_out_of_memory(row, e.what());
    return row;
  }

  const double tokens = static_cast<double>(N);
  const RegionTiming* r = row.step ? &*row.step : row.fwd_bwd ? &*row.fwd_bwd : row.fwd ? &*row.fwd : nullptr;
  if (r) {
    row.rate_region = row.step ? "step" : row.fwd_bwd ? "fwd-bwd" : "fwd";
    const double flops = row.fwd && r == &*row.fwd ? row.flops_fwd : 3.0 * row.flops_fwd;
    const double s = r->t.median_ms * 1e-3;
    row.tokens_per_s = tokens / s;
    row.mfu = gemm_flops_per_s > 0 ? flops / s / gemm_flops_per_s : 0.0;
  }
  return row;
}

std::optional<double> ModelPeerFigures::region_ms(const std::string& region) const {
  if (region == "fwd") return fwd_ms;
  if (region == "fwd-bwd") return fwd_bwd_ms;
  if (region == "step") return step_ms;
  return std::nullopt;
}

std::optional<ModelPeerFigures> model_peer_figures_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("size") || !j.contains("mode") || !j["size"].is_string() || !j["mode"].is_string())
    return std::nullopt;
  ModelPeerFigures f;
  f.size = j["size"].get<std::string>();
  f.mode = j["mode"].get<std::string>();
  auto number = [&](const char* key, double scale) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    TS_CHECK(j[key].is_number(), "bench model peer: ", key, " of ", f.size, " (", f.mode,
             ") is not a number: ", j[key].dump());
    return j[key].get<double>() * scale;
  };
  f.oom = j.contains("oom") && j["oom"].is_boolean() && j["oom"].get<bool>();
  if (j.contains("error") && j["error"].is_string()) f.error = j["error"].get<std::string>();
  if (const auto p = number("params", 1.0)) f.params = static_cast<int64_t>(*p);
  f.fwd_ms = number("fwd_ms", 1.0);
  f.fwd_bwd_ms = number("fwd_bwd_ms", 1.0);
  f.step_ms = number("step_ms", 1.0);
  // Whole bytes, as tessera's own memory figures are.
  auto bytes = [](std::optional<double> v) { return v ? std::optional<double>(std::round(*v)) : v; };
  f.fwd_mem_bytes = bytes(number("fwd_mem_gib", kGiB));
  f.train_mem_bytes = bytes(number("train_mem_gib", kGiB));
  return f;
}

std::optional<double> ModelBenchRow::region_ms(const std::string& region) const {
  const std::optional<RegionTiming>& t = region == "step" ? step : region == "fwd-bwd" ? fwd_bwd : fwd;
  if (oom || !t || (region != "step" && region != "fwd-bwd" && region != "fwd")) return std::nullopt;
  return t->t.median_ms;
}

std::optional<double> model_peer_speedup(const ModelBenchRow& row, const ModelPeerFigures& peer,
                                         const std::string& region) {
  if (row.oom || !peer.ran()) return std::nullopt;
  const std::optional<double> t = row.region_ms(region), p = peer.region_ms(region);
  if (!t || !p || *t <= 0) return std::nullopt;
  return *p / *t;
}

std::optional<double> model_peer_speedup(const ModelBenchRow& row, const ModelPeerFigures& peer) {
  if (row.rate_region.empty()) return std::nullopt;
  return model_peer_speedup(row, peer, row.rate_region);
}

}  // namespace tessera
