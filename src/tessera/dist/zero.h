// tessera/dist/zero.h — ZeRO stage 1: the AdamW state sharded over the ranks by ranges of the flat buffers.
//
// Layout. The flat buffers hold S elements. Every rank owns one contiguous range: rank r < N-1 owns
// [r·c, (r+1)·c) and rank N-1 owns [(N-1)·c, S), with c = ⌊S / (16 N)⌋ · 16 (a multiple of the segment alignment,
// so each range starts 16-element aligned). The first N·c elements move by reduce-scatter and all-gather (equal
// blocks, as NCCL requires); the tail [N·c, S), fewer than 16 N elements, moves by a small all-reduce and a
// broadcast from rank N-1. No padding is allocated: the layout is cut from the buffers as they are.
//
// One step, on every rank r owning [b, e):
//   1. g[b, e) ← (1/N) Σ_q g_q[b, e)                      reduce-scatter (in place) + the tail's all-reduce
//   2. ‖g‖² = Σ_q Σ_{i∈[b_q, e_q)} g[i]²                  each rank's partial, summed by an all-reduce of one
//      c = min(1, max_norm / (‖g‖ + 1e-6))                  scalar (clipping needs the global norm)
//      g[b, e) ← c · g[b, e)
//   3. AdamW over [b, e) only: m, v (and the master weights' use) exist for this range alone — one launch of
//      the segment-table AdamW, with the segments cut to the range and rebased to its start
//   4. w ← all-gather of every rank's w[b_q, e_q)          in place, + the tail's broadcast from rank N-1
// So each rank keeps 8·(e − b) bytes of moments instead of 8·S: 1/N of the unsharded figure, to within the tail.
//
// Checkpoints keep the unsharded format: read_state() gathers m and v to rank 0 (over MPI, on the host) and
// all-gathers the f32 master weights (16-bit models), so rank 0 writes what a single process would, and
// load_state() takes this rank's range of whole vectors: a ZeRO checkpoint is an ordinary checkpoint, which a
// single process loads as it is.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/dist/communicator.h"
#include "tessera/dist/mpi_communicator.h"
#include "tessera/nn/param_buffer.h"
#include "tessera/train/optimizer.h"

namespace tessera {

struct ZeroLayout {
  size_t total = 0;  // S: elements of the flat buffers
  int world = 1;     // N
  size_t chunk = 0;  // c: the block each rank gets from reduce-scatter and gives to all-gather
  size_t tail_begin() const { return chunk * static_cast<size_t>(world); }
  size_t begin(int rank) const { return chunk * static_cast<size_t>(rank); }
  size_t end(int rank) const { return rank == world - 1 ? total : chunk * static_cast<size_t>(rank + 1); }
  size_t count(int rank) const { return end(rank) - begin(rank); }
};
ZeroLayout zero_layout(size_t total, int world);
// The most ranks that ZeRO-1 shards `total` elements over: one block of kSegmentAlign each. Past it c is 0, every
// block empty, and the last rank would hold the whole optimizer state as its tail, sharding nothing.
int zero_max_world(size_t total);
// Refuses ZeRO-1 over `world` ranks past zero_max_world(total), with a message that says how many would do. train
// checks it where its ranks agree on the run (one line from one rank), ZeroAdamW again as a precondition.
void check_zero_world(size_t total, int world);

// The segments of `segments` that fall in [begin, end), cut to it and rebased to begin.
std::vector<ParamSegment> segments_in_range(const std::vector<ParamSegment>& segments, size_t begin, size_t end);

class ZeroAdamW final : public Optimizer {
 public:
  // grads: the gradient communicator, on the model's device (MPI for a CPU model, NCCL for a GPU one); host: MPI,
  // for gathering checkpoints. Both, the buffer and ctx must outlive the optimizer.
  ZeroAdamW(const ParamBuffer& params, const AdamWConfig& cfg, Communicator& grads, MpiCommunicator& host,
            Context& ctx);

  // Reduce-scatters the gradients (they hold the averaged gradient only in this rank's range afterwards),
  // clips by the global norm, updates this rank's range and all-gathers the parameters. No loss scaling: a
  // scaling other than the default is refused (train refuses --zero 1 with --precision f16 before it starts).
  using Optimizer::step;
  void step(ParamBuffer& params, float lr, const GradScaling& scaling) override;
  double read_grad_norm() const override;
  StepReport read_step() override { return {.grad_norm = read_grad_norm(), .skipped = false}; }
  int64_t step_count() const override { return step_; }
  void read_state(ParamBuffer& params, std::vector<float>& m, std::vector<float>& v) override;
  void load_state(const std::vector<float>& m, const std::vector<float>& v, int64_t step) override;
  size_t state_bytes() const override { return m_.bytes() + v_.bytes(); }

  const ZeroLayout& layout() const { return layout_; }
  size_t shard_begin() const { return layout_.begin(rank_); }
  size_t shard_end() const { return layout_.end(rank_); }

 private:
  // The f32 master weights (16-bit models) or the f32 params of every rank, made whole by all-gather.
  void gather_f32_params(ParamBuffer& params);

  AdamWConfig cfg_;
  Communicator* grads_;
  MpiCommunicator* host_;
  Context* ctx_;
  ZeroLayout layout_;
  int rank_ = 0;
  std::unique_ptr<AdamWSegmentTable> table_;  // this rank's segments, rebased
  Buffer m_, v_;
  Buffer norm_sq_;  // f64: this rank's Σ g², then the sum over ranks
  Buffer norm_;     // f32: the global norm of the last step
  int64_t step_ = 0;
};

// ---- CUDA side (zero_cuda.cu; built only with TESSERA_WITH_CUDA). ----
// sum_sq[0] = Σ x[i]² over n elements of dtype (f32, bf16, f16), in f64 from per-block f32 sums added in a fixed
// order (deterministic). Uses ctx.scratch.
void zero_sum_squares_cuda(DType dtype, const void* x, int64_t n, double* sum_sq, Context& ctx);
// norm = sqrt(sum_sq[0]) into norm[0] (f32); with max_norm > 0, x[i] ← c · x[i], c = min(1, max_norm / (norm + 1e-6)),
// computed on the device (no host round trip).
void zero_clip_cuda(DType dtype, void* x, int64_t n, const double* sum_sq, float max_norm, float* norm, Context& ctx);

}  // namespace tessera
