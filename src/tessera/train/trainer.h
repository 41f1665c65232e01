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

#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/optimizer.h"

namespace tessera {

// What a training run out of memory advises (the flags that size it): the trainer's memory check, and train's
// out-of-memory lines for an allocation that fails past it (one process, or a rank under mpirun).
inline constexpr const char* kTrainMemoryHint = "try a smaller model, --batch or --seq";

// --cuda-graph: whether each step is replayed as CUDA graphs (train/graph_step.h).
enum class CudaGraphMode {
  Auto,  // where the step can be a graph (train_cuda_graph_refusal is empty), else eagerly, the reason logged
  On,    // a graph, or refuse to start (train_setup) with the reason
  Off,   // eagerly
};

// The most micro-batches one step may take (--accum).
constexpr int kMaxAccum = 1 << 20;

struct TrainOptions {
  ModelConfig model;
  std::string data;            // a directory of train_*/val_* shards, or one shard file
  std::string out = "runs/tiny";
  std::string resume;          // a checkpoint directory to continue from
  int steps = 1000;
  int batch = 8;
  int seq = 0;                 // 0: the model's max_seq
  int accum = 1;               // micro-batches per optimizer step, at most kMaxAccum
  float lr = 3e-3f;
  float min_lr_ratio = 0.1f;   // the cosine schedule ends at lr * min_lr_ratio
  int warmup = 20;
  float weight_decay = 0.1f;
  float beta1 = 0.9f, beta2 = 0.95f;
  float adam_eps = 1e-8f;      // AdamW's ε (no flag: the data-parallel tests raise it, see tests/dist)
  float grad_clip = 1.0f;      // 0: off
  float label_smoothing = 0.0f;
  uint64_t seed = 1337;
  int val_every = 100;         // 0: only at the end
  int val_batches = 4;         // batches per validation, capped at the split (never wrapping); 0: the whole split
  int ckpt_every = -1;         // N > 0: every N steps; 0: only at the end; -1: every ckpt_minutes of wall time
  double ckpt_minutes = 10;    // with ckpt_every -1
  int stop_after = 0;          // stop (with a checkpoint) after this step, as if interrupted; 0: run to `steps`
  // A Chrome trace (Perfetto) of optimizer step trace_step: FWD_STEP / BWD_STEP / OPTIM_STEP, every layer and op,
  // the planned live-activation counter (core/trace.h). Empty: none. Not saved with the run (like out).
  std::string trace;
  // 0: the run's second step, or its last where it ends sooner (--steps, --stop-after). The first step of every
  // process pays one-time costs (plans, handles), a resumed run's too; a fixed step 2 lay before a resumed run's.
  int trace_step = 0;
  // --memory-timeline FILE.png: memory over step trace_step, op by op (bench/memory_timeline.h: static buffers,
  // the plan's live activations, the arena), and FILE.csv beside it; written by rank 0 after that step. Empty:
  // none. Not saved with the run.
  std::string memory_timeline;
  bool progress = true;
  // --no-checkpoint: write no checkpoint at all (benchmark runs of big models, where each one is gigabytes). Not
  // saved with the run. An interrupted run then stops with nothing to resume from.
  bool checkpoints = true;
  // Where and in what precision to train; neither is saved with the run, so a checkpoint resumes anywhere.
  std::string device;          // "cpu", "cuda", "cuda:N"; empty: the GPU when one is visible, else the CPU
  std::string precision;       // "f32", "bf16", "f16"; empty: bf16 on a GPU (f32 master weights), f32 on the CPU
  // Dynamic loss scaling (loss_scaler.h): train_setup turns it on for f16. An f32 run may ask for it too (no flag:
  // that is how the CPU tests drive the loop's skips). Not saved with the run, like the precision; the scaler's
  // state is, in the checkpoint, and a resumed f16 run continues from it.
  bool loss_scaling = false;
  // --master-weights: f32 master weights for bf16 / f16 parameters (on), or only the 16-bit parameters, updated
  // in f32 registers and rounded back (off: LightSeq's mode, 4 bytes a parameter less). Not saved with the run:
  // checkpoints hold f32 either way.
  bool master_weights = true;
  // --cuda-graph: the step as CUDA graphs (not saved with the run: a checkpoint resumes either way, to the same bits).
  // The run's first step, and the --trace step, run eagerly.
  CudaGraphMode cuda_graph = CudaGraphMode::Auto;
  double loss_scale_init = 65536.0;  // --loss-scale-init: the first scale (a power of 2 keeps unscaling exact)
  int loss_scale_interval = 2000;    // --loss-scale-interval: good steps before the scale doubles
  // Data-parallel ranks (mpirun -np N); set by the launcher, not a flag. `batch` is each rank's, so a step takes
  // batch x world sequences. Saved with the run: a checkpoint resumes at the same world size (the global batch
  // and the data position depend on it), and loads anywhere as a model.
  int world_size = 1;
  // The train split's fingerprint (data_fingerprint below), set when the data is opened: saved with the run and
  // checked on resume, so that a resumed run never continues on other data than it trained on. 0: unknown (a
  // checkpoint written before it was saved).
  uint64_t data_fingerprint = 0;
};

// A fingerprint of a data path's train split: its shards' names and sizes and their first and last 64 KiB. Text
// prepared again from another file, another shard set, or a file cut or grown, gives another one.
uint64_t data_fingerprint(const std::string& data);

// The checkpoint directory --resume names, as written; through a symbolic link (a "latest" link to the checkpoint,
// or a link on the way to it), the directory the link leads to: the run it belongs to is the one that holds it, not
// the link's directory. The links are followed one at a time, and the first run's own checkpoint/ (or
// checkpoint.old/) met, a metrics.jsonl beside it, names the run even when it is itself a link to an archived copy:
// RUN/checkpoint -> ../arch/step2 continues RUN, not arch/, and so does "latest" -> RUN/checkpoint.
std::filesystem::path resume_dir(const std::string& resume);

// The data path is saved absolute ("data"), and relative to the run directory (o.out) when it lies inside it
// ("data_in_run": train's own OUT/data, which then moves with the run), so that --resume finds the same data from
// any working directory. Checkpoints from before "data_in_run" hold the path as typed.
nlohmann::json train_options_to_json(const TrainOptions& o);
// Fills the options saved in a checkpoint (everything but out, resume, stop_after and progress). Throws Error
// "training options: missing field 'batch'" (or a field of the wrong type).
void train_options_from_json(const nlohmann::json& j, TrainOptions& o);

// Parses --cuda-graph: "on", "off" (and "auto", the default); an Error otherwise.
CudaGraphMode cuda_graph_mode_from_name(const std::string& name);

// Why this run's step cannot be CUDA graphs on ctx ("" when it can): --cuda-graph off; a data-parallel run (its
// NCCL collectives and the ranks' agreement stay eager); the CPU; a Debug build (TS_CHECK_LAUNCH synchronizes
// after every launch); TESSERA_POISON_DEAD (the plan's debug mode checks buffers on the host inside the step).
std::string train_cuda_graph_refusal(const TrainOptions& o, const Context& ctx);

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
  virtual void attach(Gpt& model) = 0;
  // The run's optimizer over model.params(): AdamW on the whole buffer (DDP) or on this rank's range (ZeRO-1).
  virtual std::unique_ptr<Optimizer> make_optimizer(Gpt& model, const AdamWConfig& cfg) = 0;
  // Around each backward. `sync` marks the last micro-step of an optimizer step, the only one that
  // communicates; after it, end_backward has left the averaged gradients in params().grad() (under ZeRO-1 the
  // optimizer reduces them itself).
  virtual void begin_backward(Gpt& model, bool sync) = 0;
  virtual void end_backward(Gpt& model, bool sync) = 0;
  // Sums host values over the ranks, in place: every rank gets the same sums.
  virtual void sum_host(std::vector<double>& values) = 0;
};

// A fingerprint of what must agree across the ranks of a run: the options (model, data path, batch, schedule,
// seed, ...), the world size, and the data itself (each shard's name, size and first and last 64 KiB).
uint64_t run_fingerprint(const TrainOptions& o);

// Everything a run needs, checked and loaded, with nothing written yet.
struct TrainSetup {
  TrainOptions options;             // when resuming, the saved run's, with steps/out/stop_after/progress applied
  std::unique_ptr<Context> context; // the device the run trains on (declared first: it outlives the models)
  DType dtype = DType::F32;         // the compute dtype
  std::unique_ptr<Gpt> model;       // the checkpoint's model when resuming; null for a fresh run
  TrainState state;                 // the checkpoint's state when resuming
  std::unique_ptr<TokenStream> train_data, val_data;  // set by train_open_data (val_data may stay null)
  std::string no_validation;        // set by train_open_data: why val_data is null ("" when it is not)
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
  std::function<void(int64_t step, Gpt& model)> before_optimizer_step;
  // Test hook: on the last micro-step of each step, after this rank's backward and before the data-parallel
  // reduction completes (for --ddp naive and flat, before it starts), so that a test can plant a value into one
  // rank's gradient and see it reach the others.
  std::function<void(int64_t step, Gpt& model)> before_grad_sync;
  // Test hook: called inside each CUDA graph capture of the step (GraphStepConfig::in_capture).
  std::function<void()> in_graph_capture = {};
};

struct TrainResult {
  std::unique_ptr<Context> context;  // the device of `model` (declared first: destroyed after it)
  int64_t steps = 0;           // steps run by this call
  int64_t skipped_steps = 0;   // of those, steps that loss scaling skipped (an f16 overflow)
  double loss_scale = 0;       // the loss scale at the end (0: no loss scaling)
  int64_t last_step = 0;       // the step the run stopped at (the checkpoint's)
  double last_loss = 0, last_val_loss = 0, first_loss = 0;
  double best_val_loss = 0;    // lowest validation loss so far (0: no validation); saved in best_checkpoint
  int64_t best_step = 0;
  double seconds = 0;
  size_t peak_device_bytes = 0;  // the most device memory in use after any step (GPU runs; 0 on the CPU)
  int64_t graph_steps = 0;     // steps replayed as CUDA graphs (the others ran eagerly)
  int64_t graph_captures = 0;  // how many times the step was captured (again when the f16 loss scale changes)
  int graphs_per_step = 0;     // graphs a replayed step launches: 1, 2 with host test hooks before AdamW, 0: none
  bool interrupted = false;    // stopped by TrainControl::stop
  // The files --trace and --memory-timeline wrote (the trace's JSON; the timeline's PNG and CSV), for the summary;
  // empty when the run stopped before its --trace-step.
  std::vector<std::string> traced;
  std::string checkpoint, best_checkpoint;
  std::unique_ptr<Gpt> model;  // the trained model, as saved in `checkpoint`
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
double validation_loss(Gpt& model, TokenStream& val, int B, int T, int max_batches);
// The windows of validation_loss(model, val, B·world, T, max_batches) shared among `world` ranks of batch B (rank r
// takes its B windows of each global batch, then every world-th window left over): {Σ of this rank's window
// losses, its window count}. Summed over the ranks, their ratio is that validation loss.
std::pair<double, double> validation_loss_share(Gpt& model, TokenStream& val, int B, int T, int max_batches, int rank,
                                                int world);
// The batch of `rank` in a global batch of B·world sequences of T + 1 tokens (train data): its rows [rank·B,
// (rank+1)·B), read straight from the stream, which then stands after the whole global batch, as it would after
// next_batch(B·world, T). world = 1 is next_batch(B, T).
void next_batch_share(TokenStream& data, int B, int T, int rank, int world, int32_t* inputs, int32_t* targets);

}  // namespace tessera
