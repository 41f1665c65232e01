// tessera/core/context.h — what an op needs to run: the device and, on a GPU, its stream, cuBLASLt handle and
// workspace, and its properties. No globals: every op receives the Context it runs under.
//
// A CPU Context is free to make. A CUDA Context selects its device, creates a non-blocking stream, a cuBLASLt
// handle with a 32 MiB workspace, and reads the device properties; all are released by its destructor (RAII).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tessera/core/stream.h"
#include "tessera/core/tensor.h"

namespace tessera {

struct GpuInfo {
  bool available = false;
  int count = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  size_t memory_bytes = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;  // the most dynamic shared memory one block may ask for
};

// Probes the CUDA runtime. Returns available=false when tessera was built without CUDA, when no driver is
// loaded or when no device is visible: a machine without a GPU is a normal case, not an error.
GpuInfo probe_gpu();

// True when tessera was compiled with the CUDA backend (whether or not a GPU is visible).
bool built_with_cuda();

class Context {
 public:
  // CUDA: throws Error when tessera was built without CUDA or the device is not visible.
  explicit Context(Device device = Device::cpu());
  ~Context();
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  bool is_cuda() const { return device_.kind == DeviceKind::Cuda; }

  // The best device here: the first GPU if one is visible and the CUDA backend was built, else the CPU.
  static Context best_available();
  // Parses "cpu", "cuda" or "cuda:N" (the --device flag) into a Context, with a one-line error otherwise.
  static Context from_name(const std::string& name);

  // CUDA only (Error on a CPU Context).
  Stream stream() const;
  void* cublaslt() const;        // cublasLtHandle_t
  void* gemm_workspace() const;  // device memory for cuBLASLt
  size_t gemm_workspace_bytes() const;
  const GpuInfo& gpu() const;
  // Device scratch of at least `bytes`, owned by the Context and reused by every op that needs temporary
  // memory (partial sums of deterministic reductions). Grows by reallocating, which synchronizes the device:
  // callers that capture CUDA graphs run the step once eagerly first, and a growth asked for during a capture is
  // an Error. Ops running on one stream may share it, one at a time.
  void* scratch(size_t bytes);
  // How many times the scratch has been reallocated: a CUDA graph that baked its address in is stale once this
  // changes (train/graph_step.h recaptures then). 0 on the CPU.
  int64_t scratch_generation() const;
  // A device table that ops derive from their parameters once and then keep (RoPE's cos / sin by position): the
  // first call with `key` allocates `bytes` and has fill(ptr) write them on the stream; later calls with the same
  // key return the same pointer, valid until the Context is destroyed (CUDA graphs may bake it in). A first call
  // during a CUDA graph capture is an Error (a step must run eagerly first).
  const void* device_table(const std::string& key, size_t bytes, const std::function<void(void*)>& fill);
  // kArrivalCounters device counters, zero between launches: a kernel that ends with a reduction across its blocks
  // counts its blocks' arrivals in them (the last block to arrive does the reduction, and sets its counter back to
  // 0), instead of launching a second kernel. Allocated with the Context, so CUDA graphs may bake the address in.
  // Kernels on the Context's one stream may use the same counters, one launch at a time (never two kernels that
  // can overlap; a programmatic dependent, see pdl(), touches them only after its wait, when the one before is done).
  static constexpr int kArrivalCounters = 1 << 16;
  uint32_t* arrival_counters() const;
  // Waits for all work queued on the stream (a no-op on the CPU).
  void synchronize() const;
  // Device memory in use as the driver counts it (total − free: tessera's buffers, the CUDA context and anything
  // else on the device); 0 on the CPU.
  size_t device_memory_used() const;

  // The SMs a cuBLASLt GEMM may plan for (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET); 0: all of them. Data-parallel
  // training that overlaps NCCL collectives with the backward sets it to the SM count less the collectives' CTAs:
  // Hopper's persistent GEMM kernels launch one CTA per SM, and with NCCL holding some SMs a whole wave of tiles
  // waits for the collective to end. It is off by default: planning for fewer SMs measured costlier than the waves
  // it saves (bench/results/2026-11-30-step-and-comm-2xh200.md); the option stays for tuning.
  int gemm_sm_target() const { return gemm_sm_target_; }
  void set_gemm_sm_target(int sms) { gemm_sm_target_ = sms; }

  // Dropout under a CUDA graph. While set (a device pointer to one uint64_t), every dropout kernel (embedding,
  // residual) draws Philox stream *base + its op's `stream` instead of `stream`: a graph captured with streams
  // relative to the step (0, 1, ...) then draws the step's own streams at each replay, from a base that one copy
  // before the replay writes (train/graph_step.h). Null, the default: `stream` as given. Read when an op is queued.
  const uint64_t* philox_stream_base() const { return philox_stream_base_; }
  void set_philox_stream_base(const uint64_t* device_base) { philox_stream_base_ = device_base; }

  // Programmatic dependent launch (Hopper). While set, the kernels that launch through cuda::launch (cuda_util.cuh)
  // ask to overlap the kernel before them on the stream: each may start while that one finishes, and waits for it
  // on the device (cuda::wait_for_primary_grid) before it touches global memory. Off, the default: the plain
  // launch. Read when a kernel is queued (a captured graph keeps what it was captured with); the inference engine
  // sets it around its decode step and prefill (EngineOptions::pdl). No effect on the CPU.
  bool pdl() const { return pdl_; }
  void set_pdl(bool on) { pdl_ = on; }

 private:
  struct Cuda;
  Device device_;
  int gemm_sm_target_ = 0;
  const uint64_t* philox_stream_base_ = nullptr;
  bool pdl_ = false;
  std::unique_ptr<Cuda> cuda_;
};

// Sets ctx.pdl() for a scope and puts back what it was on leaving it (also when an op in it throws).
class PdlScope {
 public:
  PdlScope(Context& ctx, bool on) : ctx_(ctx), was_(ctx.pdl()) { ctx_.set_pdl(on); }
  ~PdlScope() { ctx_.set_pdl(was_); }
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  Context& ctx_;
  bool was_;
};

}  // namespace tessera
