// tessera/bench/model.h — the rows of `tessera bench model`: the CS336 assignment's end-to-end benchmark of a
// GPT over model sizes (forward, forward + backward and the whole training step with AdamW; peak memory;
// tokens/s; MFU against a GEMM rate measured in the same run).
//
// Timing follows the assignment's method (timeit around torch.cuda.synchronize()): each timed region is
//   ctx.synchronize(); t0 = steady_clock; work; ctx.synchronize(); t1 = steady_clock
// after `warmup` untimed runs, so a figure holds the host's launch overhead and every host round trip of the
// step, as a user waiting for the step sees it. The regions, on the model's own buffers and random tokens:
//   fwd      forward_device with targets (embedding .. cross-entropy loss, on the device; no host copy)
//   fwd-bwd  zero_grad + forward + backward (the gradients of every parameter)
//   step     zero_grad + forward + backward + AdamW step (clipping at 1.0, as the trainer's default)
// In f16 (ModelBenchConfig::loss_scaling) fwd-bwd and step take dynamic loss scaling as `train --precision f16`
// steps, through the same StepLossScaling (train/loss_scaler.h): the forward and backward on S·loss (S = 2^16 at
// first), and in step AdamW unscaling by 1/S and skipping a step whose gradients overflowed, then the optimizer's
// report read (the host round trip a train step makes; the unscaled step makes none) and S updated from it. fwd-bwd
// has no optimizer, hence no overflow check: it runs at the scale the size started with. Under CUDA graphs S is
// GraphStep's argument, as in train: a changed S captures the step graph again.
// On a GPU each region is replayed as CUDA graphs by default (ModelBenchConfig::cuda_graph), as `train` steps:
// the figure is then the GPU's time with almost no launch overhead; --cuda-graph off times the eager launches.
//
// Memory. On a GPU: the device memory in use as the driver counts it (Context::device_memory_used, what
// TrainResult::peak_device_bytes reports) after the region, minus what was in use before the model was made
// (the CUDA context, cuBLASLt's workspace, the benchmark's own buffers). tessera allocates nothing transient
// inside a step (parameters, gradients, master weights, the activation arena and AdamW's moments are held
// whole), so what is in use after a region is its peak. On the CPU: the bytes tessera allocates by plan
// (the parameter buffers, the planned activation arena, and for training the AdamW moments).
//
// Out of memory. Before a size is built, its planned bytes (parameters, gradients, master weights, AdamW m and v,
// the activation plan's peak) are compared with the memory free (the device's, or the host's MemAvailable), or
// with `max_memory_bytes` when that is smaller; a size above it is marked OOM without being tried. A size that
// fails an allocation anyway (tessera's "out of GPU memory" / "out of memory" Error: is_out_of_memory in
// core/memory.h) is marked OOM too, and the sweep goes on.
//
// FLOPs (for MFU), per step of N = B·T tokens, counted from the GEMMs the model runs (PaLM's rule: matmuls only,
// attention as the full T x T square although the causal kernels skip about half of it):
//   forward  = 2·N·L·(3C² + C² + C·Fin + F·C)  +  L·4·N·T·C  +  2·N·C·V
//   backward = 2 x forward;  a training step = 3 x forward (AdamW's elementwise work is not counted)
// with Fin = d_ff_in() (2·d_ff for SwiGLU) and F = d_ff. MFU = FLOPs / time / the measured GEMM rate.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/bench/harness.h"
#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "tessera/core/trace.h"
#include "tessera/models/config.h"
#include "tessera/train/loss_scaler.h"
#include "tessera/train/memory_record.h"

namespace tessera {

class Model;

enum class ModelBenchMode { Fwd, FwdBwd, Step };
const char* model_bench_mode_name(ModelBenchMode m);  // "fwd", "fwd-bwd", "step"

struct ModelBenchConfig {
  int batch = 4;
  int seq = 256;
  DType dtype = DType::F32;
  bool fwd = true, fwd_bwd = true, step = true;  // which regions to time
  int warmup = 5;
  int steps = 10;
  size_t max_memory_bytes = 0;   // 0: the memory free on the device (host MemAvailable on the CPU)
  bool trace = false;            // record one step with a Tracer (ModelBenchRow::trace)
  bool memory_timeline = false;  // fill ModelBenchRow::timeline from one training step
  uint64_t seed = 1;
  // Each region replayed as CUDA graphs (train/graph_step.h: the launches captured once, the dropout streams and
  // AdamW's scalars read from device memory), after two more untimed runs: an eager one (it sets up what a capture
  // may not) and the one that captures. Applies where model_bench_graph_refusal is empty; the --trace /
  // --memory-timeline step stays eager.
  bool cuda_graph = true;
  // Dynamic loss scaling in fwd-bwd and step (the header comment), from loss_scaler: always for f16, as train_setup
  // turns it on for f16; an f32 run may ask for it (no flag: the CPU tests drive the f16 step that way).
  bool loss_scaling = false;
  LossScalerConfig loss_scaler = {};
  // Test hook: on the host before each optimizer step of the step region (untimed runs included, and the --trace
  // step), with its number from 1 (a test reads the parameters there or plants an overflow in the gradient).
  std::function<void(int64_t step, Model& model)> before_optimizer_step = {};
  // Called as each part of a size starts (its untimed runs and CUDA graph captures included), for a progress bar:
  // "fwd", "fwd+bwd", "step" (the regions asked for), then "recorded step" (trace or memory timeline).
  std::function<void(const char* part)> on_part = {};
};

// How many times bench_model calls on_part for one size that fits: one a region asked for, one for the recorded step.
int model_bench_part_count(const ModelBenchConfig& bc);

// Whether bench_model scales the loss: loss_scaling, or dtype f16.
bool model_bench_loss_scaling(const ModelBenchConfig& bc);

// Why bench_model times its regions eagerly on ctx with cuda_graph asked or not ("" when they are graphs):
// "--cuda-graph off", the CPU, a Debug build.
std::string model_bench_graph_refusal(bool cuda_graph, const Context& ctx);

// Median, min, max (timing_summary) and mean and standard deviation of the timed runs of one region.
struct RegionTiming {
  Timing t;
  double mean_ms = 0, std_ms = 0;
};

// The bytes a size needs, by plan (before it is built): an upper bound by at most 16 elements per tensor (the
// parameter segments' padding).
struct PlannedMemory {
  size_t params = 0;       // parameters (compute dtype) + f32 master weights for 16-bit
  size_t optimizer = 0;    // AdamW m and v (f32)
  size_t activations = 0;  // the activation plan's peak (the arena), the gradients planned in it
  size_t total() const { return params + optimizer + activations; }
};
PlannedMemory model_planned_memory(const ModelConfig& cfg, int B, int T, DType dtype);

// GEMM FLOPs of one forward over B·T tokens (the formula in the header comment).
double model_forward_flops(const ModelConfig& cfg, int B, int T);

struct ModelBenchRow {
  std::string size;  // the preset
  ModelConfig cfg;
  int64_t params = 0;
  bool oom = false;
  std::string oom_reason;
  PlannedMemory planned;
  std::optional<RegionTiming> fwd, fwd_bwd, step;
  // Peak memory of the forward and of the training step (device: measured; CPU: planned); nullopt when the
  // region was not run.
  std::optional<size_t> mem_fwd, mem_train;
  bool cuda_graph = false;    // the regions were timed as CUDA graph replays
  bool mem_measured = false;  // true on a GPU
  double flops_fwd = 0;       // per forward (model_forward_flops)
  // tokens/s and MFU from the most complete region timed (step, else fwd-bwd, else fwd).
  std::string rate_region;
  double tokens_per_s = 0, mfu = 0;
  // With loss scaling (model_bench_loss_scaling): the scale after the last step the bench ran (the step region's,
  // else the scale fwd-bwd ran at), and how many optimizer steps it ran (untimed ones included) and skipped for an
  // overflow (a skipped step does not update the parameters, so it is cheaper: the figure holds it).
  std::optional<double> loss_scale;
  int64_t optimizer_steps = 0, skipped_steps = 0;
  std::shared_ptr<Tracer> trace;              // with cfg.trace: one traced training step (or the region timed)
  std::vector<MemoryTimelinePoint> timeline;  // with cfg.memory_timeline
  // The median ms of a region ("fwd", "fwd-bwd", "step"); nullopt when it was not timed (or the size is OOM).
  std::optional<double> region_ms(const std::string& region) const;
};

// The GEMM rate MFU is taken against: an n x n x n product through the gemm op in `dtype` (cuBLASLt on a GPU,
// OpenBLAS or the plain loop on the CPU), median of `timing.iters` runs.
struct GemmRate {
  int n = 0;
  DType dtype = DType::F32;
  Timing t;
  double flops_per_s() const { return 2.0 * n * static_cast<double>(n) * n / (t.median_ms * 1e-3); }
};
GemmRate measure_gemm_rate(BenchHarness& h, int n, DType dtype, const TimingOptions& timing);

// Weights for timing: norm gains 1, biases 0, everything else uniform in ±0.02 from a hash of (segment, index),
// filled by all cores. The model's init_weights draws N(0, 0.02) one element at a time on one core, which takes
// minutes for the 2.7B model; the timing of a step does not depend on the values, only on their being ordinary numbers.
void bench_init_weights(Model& model);

// Benchmarks one size on ctx. `gemm_flops_per_s` is the rate MFU is taken against (0: MFU left at 0).
ModelBenchRow bench_model(const ModelConfig& cfg, const ModelBenchConfig& bc, Context& ctx, double gemm_flops_per_s);

// ---- the PyTorch peer (bench/peers/model.py, run by `tessera bench model --peer`) ----
//
// One record the peer printed: the Hugging Face model of one size in one mode ("eager" or "compile"), timed over
// the same regions, batch, sequence length and runs as tessera's row. Times are medians in ms; memory is
// torch.cuda.max_memory_allocated above what was allocated before the model (bytes; nullopt on the CPU, where the
// peer measures none). A size the peer could not run has oom and/or error set and no figures.
struct ModelPeerFigures {
  std::string size, mode;
  bool oom = false;
  std::string error;   // "<type>: <message>" of the failure; "" when it ran
  int64_t params = 0;  // of the Hugging Face model (a tied matrix once): must equal ModelBenchRow::params
  std::optional<double> fwd_ms, fwd_bwd_ms, step_ms;
  std::optional<double> fwd_mem_bytes, train_mem_bytes;
  bool ran() const { return !oom && error.empty(); }
  // The time of a region as ModelBenchRow::rate_region names it ("fwd", "fwd-bwd", "step").
  std::optional<double> region_ms(const std::string& region) const;
};

// Reads one JSON object of the peer; nullopt when it is not a record (no "size" and "mode" strings). Throws Error
// for a record with a figure of the wrong type.
std::optional<ModelPeerFigures> model_peer_figures_from_json(const nlohmann::json& j);

// How many times faster tessera's row is than the peer's record over the row's rate region:
// peer ms / tessera ms (> 1: tessera is faster). nullopt when either has no time for that region.
std::optional<double> model_peer_speedup(const ModelBenchRow& row, const ModelPeerFigures& peer);
// The same over any region ("fwd", "fwd-bwd", "step"): peer ms / tessera ms, nullopt when either has no time
// for it, the row is OOM or the peer did not run.
std::optional<double> model_peer_speedup(const ModelBenchRow& row, const ModelPeerFigures& peer,
                                         const std::string& region);

}  // namespace tessera
