// tessera/train/trainer.h — the training loop: data, forward/backward with gradient accumulation, clipping,
// AdamW with a cosine schedule, validation, metrics (JSON Lines), checkpoints and exact resume.
#pragma once
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/models/model.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/loss_scaler.h"
#include "tessera/train/memory_record.h"
#include "tessera/train/optimizer.h"
#include "tessera/train/run_dir.h"
#include "tessera/train/train_options.h"

namespace tessera {

// Parses --cuda-graph: "on", "off" (and "auto", the default); an Error otherwise.
CudaGraphMode cuda_graph_mode_from_name(const std::string& name);

// Why this run's step cannot be CUDA graphs on ctx ("" when it can): --cuda-graph off; a data-parallel run (its
// NCCL collectives and the ranks' agreement stay eager); the CPU; a Debug build (TS_CHECK_LAUNCH synchronizes
// after every launch); TESSERA_POISON_DEAD (the plan's debug mode checks buffers on the host inside the step).
std::string train_cuda_graph_refusal(const TrainOptions& o, const Context& ctx);

// The loss scaler of a run with loss scaling (--loss-scale-init, --loss-scale-interval).
LossScalerConfig train_loss_scaler_config(const TrainOptions& o);

// Learning rate of optimizer step `step` (1-based): linear warm-up to lr over `warmup` steps, then a cosine
// decay to lr * min_lr_ratio at `total`.
float lr_at(int64_t step, int64_t total, const TrainOptions& o);

// The seam through which data-parallel training (dist/data_parallel.h: DDP, ZeRO-1, over MPI or NCCL) joins
// the loop, so that train/ itself knows nothing of MPI or NCCL. Every method except rank() and world_size() is a
// collective: all ranks call it at the same point of the loop. With world size N, rank r trains on rows
// [r·batch, (r+1)·batch) of each global batch of batch·N sequences, and only rank 0 writes files and prints.
class DataParallel {
 public:
  virtual ~DataParallel() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Refuses a run whose ranks disagree: throws on every rank when their fingerprints differ. `what` names what
  // the fingerprint covers, for the message.
  virtual void check_consistent(uint64_t fingerprint, const std::string& what) = 0;
  // Makes every rank's parameters rank 0's and prepares the gradient reduction for this model.
  virtual void attach(Model& model) = 0;
  // The run's optimizer over model.params(): AdamW on the whole buffer (DDP) or on this rank's range (ZeRO-1).
  virtual std::unique_ptr<Optimizer> make_optimizer(Model& model, const AdamWConfig& cfg) = 0;
  // Around each backward. `sync` marks the last micro-step of an optimizer step, the only one that
  // communicates; after it, end_backward has left the averaged gradients in params().grad() (under ZeRO-1 the
  // optimizer reduces them itself).
  virtual void begin_backward(Model& model, bool sync) = 0;
  virtual void end_backward(Model& model, bool sync) = 0;
  // Sums host values over the ranks, in place: every rank gets the same sums.
  virtual void sum_host(std::vector<double>& values) = 0;
};

// Everything a run needs, checked and loaded, with nothing written yet.
struct TrainSetup {
  TrainOptions options;               // when resuming, the saved run's, with steps/out/stop_after/progress applied
  std::unique_ptr<Context> context;   // the device the run trains on (declared first: it outlives the models)
  DType dtype = DType::F32;           // the compute dtype
  std::unique_ptr<Model> model;       // the checkpoint's model when resuming; null for a fresh run
  std::unique_ptr<Model> init_model;  // --init-from: the checkpoint's model, whose weights start this fresh run
  TrainState state;                   // the checkpoint's state when resuming
  std::unique_ptr<TokenStream> train_data, val_data;  // set by train_open_data (val_data may stay null)
  std::string no_validation;         // set by train_open_data: why val_data is null ("" when it is not)
  DataParallel* parallel = nullptr;  // data-parallel ranks (owned by the launcher); null: one process
};

// Checks every option against the model, loads the resume checkpoint and checks that the run fits in host
// memory. Reads files, never writes one: a failure here leaves nothing behind.
TrainSetup train_setup(TrainOptions o);
// The files --trace and --memory-timeline write (the plot's CSV beside it), each with its flag; empty paths for
// the flags not given.
std::vector<std::pair<const char*, std::string>> trace_outputs(const TrainOptions& o);
// Opens options.data: shards that exist, are well-formed, fit the vocab and hold at least one batch. A val
// split too short for one sequence disables validation. Reads only.
void train_open_data(TrainSetup& s);

struct TrainControl {
  // Polled after every step: when nonzero, the step finishes, a checkpoint is written and train() returns
  // with `interrupted` set. Written by a signal handler, hence volatile sig_atomic_t.
  const volatile std::sig_atomic_t* stop = nullptr;
  // Called after each checkpoint written to <out>/checkpoint, with its step.
  std::function<void(int64_t step)> on_checkpoint;
  // Called once before the first step, with the optimizer state this rank holds (m and v: 8 bytes a parameter
  // unsharded, 1/N of that under ZeRO-1) and what one unsharded optimizer would hold.
  std::function<void(size_t state_bytes, size_t unsharded_bytes)> on_start;
  // Called after the backward of each step, before the optimizer step: the tests plant an overflow here (an inf
  // written into model.params().grad()) to watch loss scaling skip the step.
  std::function<void(int64_t step, Model& model)> before_optimizer_step;
  // Test hook: on the last micro-step of each step, after this rank's backward and before the data-parallel
  // reduction completes (for --ddp naive and flat, before it starts), so that a test can plant a value into one
  // rank's gradient and see it reach the others.
  std::function<void(int64_t step, Model& model)> before_grad_sync;
  // With --memory-timeline: called by rank 0 after step trace_step with that step's memory op by op and a title,
  // to write options.memory_timeline (the PNG) and the CSV beside it (trace_outputs). The drawing is the caller's
  // (the CLI draws with bench/memory_timeline.h); train() refuses --memory-timeline without it.
  std::function<void(const std::vector<MemoryTimelinePoint>& points, const std::string& title)> on_memory_timeline;
  // Test hook: called inside each CUDA graph capture of the step (GraphStepConfig::in_capture).
  std::function<void()> in_graph_capture = {};
};

struct TrainResult {
  std::unique_ptr<Context> context;  // the device of `model` (declared first: destroyed after it)
  int64_t steps = 0;                 // steps run by this call
  int64_t skipped_steps = 0;         // of those, steps that loss scaling skipped (an f16 overflow)
  double loss_scale = 0;             // the loss scale at the end (0: no loss scaling)
  int64_t last_step = 0;             // the step the run stopped at (the checkpoint's)
  double last_loss = 0, last_val_loss = 0, first_loss = 0;
  double best_val_loss = 0;  // lowest validation loss so far (0: no validation); saved in best_checkpoint
  int64_t best_step = 0;
  double seconds = 0;
  size_t peak_device_bytes = 0;  // the most device memory in use after any step (GPU runs; 0 on the CPU)
  int64_t graph_steps = 0;       // steps replayed as CUDA graphs (the others ran eagerly)
  int64_t graph_captures = 0;    // how many times the step was captured (again when the f16 loss scale changes)
  int graphs_per_step = 0;       // graphs a replayed step launches: 1, 2 with host test hooks before AdamW, 0: none
  bool interrupted = false;      // stopped by TrainControl::stop
  // The files --trace and --memory-timeline wrote (the trace's JSON; the timeline's PNG and CSV), for the summary;
  // empty when the run stopped before its --trace-step.
  std::vector<std::string> traced;
  std::string checkpoint, best_checkpoint;
  std::unique_ptr<Model> model;  // the trained model, as saved in `checkpoint`
};

// Runs training to options.steps (continuing a resumed run). Writes <out>/metrics.jsonl, <out>/checkpoint/
// (periodically, see ckpt_every, and at the end) and, with validation, <out>/best/: the checkpoint with the
// lowest validation loss so far. Opens the data if train_open_data has not. Throws Error on bad input.
TrainResult train(TrainSetup setup, const TrainControl& control = {});
// train(train_setup(o)).
TrainResult train(TrainOptions o);

// Mean loss over consecutive non-overlapping windows of T+1 tokens from the start of `val`: full batches of
// B sequences, then the sequences left over one at a time, never wrapping past the end. max_batches > 0 caps
// the windows at max_batches * B; 0 takes all (size - 1) / T of them. Each window weighs the same.
double validation_loss(Model& model, TokenStream& val, int B, int T, int max_batches);
// The windows of validation_loss(model, val, B·world, T, max_batches) shared among `world` ranks of batch B (rank r
// takes its B windows of each global batch, then every world-th window left over): {Σ of this rank's window
// losses, its window count}. Summed over the ranks, their ratio is that validation loss.
std::pair<double, double> validation_loss_share(Model& model, TokenStream& val, int B, int T, int max_batches, int rank,
                                                int world);
// The batch of `rank` in a global batch of B·world sequences of T + 1 tokens (train data): its rows [rank·B,
// (rank+1)·B), read straight from the stream, which then stands after the whole global batch, as it would after
// next_batch(B·world, T). world = 1 is next_batch(B, T).
void next_batch_share(TokenStream& data, int B, int T, int rank, int world, int32_t* inputs, int32_t* targets);

}  // namespace tessera
