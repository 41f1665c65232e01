// tessera/bench/harness.h — times a callable on a Context: warm-up runs, then timed runs; median, min and max.
//
// CPU: std::chrono::steady_clock around each run. CUDA: a cudaEvent pair recorded on ctx.stream() around each
// run, so only the GPU time of the work queued by the callable counts (not the host's launch overhead, unless the
// GPU waits on it). Before every run on CUDA the L2 cache is flushed by READING a 128 MiB scratch buffer (larger
// than a Hopper GPU's 50-60 MiB L2), so each run reads its inputs from HBM as it would inside a training step;
// the flush is queued before the start event and is not timed. A read, not a write: a written flush buffer leaves
// L2 full of dirty lines, whose write-back the next (timed) run pays for — up to 60 MB of extra HBM traffic,
// which more than doubles the traffic of a 50 MB kernel. The read also writes back the previous run's outputs
// before the clock starts. The PyTorch peers flush the same way.
// Figures are only comparable within one run on one machine: compare tessera with its peer as a ratio.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/context.h"

namespace tessera {

struct TimingOptions {
  int warmup = 5;  // untimed runs first (caches, lazy allocations, cuBLASLt heuristics)
  int iters = 20;  // timed runs
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int iters = 0;
};

// Median (the mean of the middle two for an even count), min and max of `ms`; `ms` must not be empty.
Timing timing_summary(std::vector<double> ms);

class BenchHarness {
 public:
  // On CUDA allocates the 128 MiB L2-flush scratch on ctx's device. The context must outlive the harness.
  explicit BenchHarness(Context& ctx);

  Context& context() const { return *ctx_; }
  // Runs fn opt.warmup times, then opt.iters times timed; every run waits for the previous one to finish.
  Timing time(const std::function<void()>& fn, const TimingOptions& opt);
  // CUDA only: the device-to-device copy bandwidth in GB/s (1e9 bytes/s) of a `bytes` cudaMemcpyAsync, counting
  // each byte read once and written once (2 × bytes moved per copy), median of opt.iters runs. Every size copies
  // between the starts of one pair of buffers, allocated at the largest size asked for so far (the first call,
  // 1 GiB, sets it), so that copies of different sizes differ in their size alone.
  double copy_bandwidth_gbs(size_t bytes, const TimingOptions& opt);

  static constexpr size_t kL2FlushBytes = size_t{128} << 20;

 private:
  Context* ctx_;
  Buffer flush_;                // empty on the CPU
  Buffer copy_src_, copy_dst_;  // copy_bandwidth_gbs's pair, empty until it is first called
};

// ---- CUDA side (harness_cuda.cu; built only with TESSERA_WITH_CUDA). ----
// Per-run milliseconds from cudaEvents on ctx.stream(); `before` runs (untimed) ahead of each timed run.
std::vector<double> time_cuda_runs(Context& ctx, const std::function<void()>& fn, const std::function<void()>& before,
                                   int iters);
// Queues a cudaMemcpyAsync D2D of `bytes` on ctx.stream().
void copy_d2d_async(void* dst, const void* src, size_t bytes, Context& ctx);
// Reads `bytes` (a multiple of 16) at `buf` on ctx's stream and writes nothing that matters (a sink word only
// when an impossible sum appears, so that the reads are not optimized away): the L2 flush above.
void read_flush_async(const void* buf, size_t bytes, Context& ctx);

}  // namespace tessera
