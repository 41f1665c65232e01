// tessera/train/train_options.h — the options of a training run, how they are saved with it, and the fingerprints
// that keep a resumed or data-parallel run on the same data and options.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tessera/models/config.h"

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
  std::string data;  // a directory of train_*/val_* shards, or one shard file
  std::string out = "runs/tiny";
  std::string resume;  // a checkpoint directory to continue from
  // A checkpoint (tessera's, or a Hugging Face save_pretrained directory) whose weights and config start a new run
  // (fine-tuning): the optimizer, the step count and the data position start afresh. Not saved with the run: its
  // own checkpoints hold the weights from then on.
  std::string init_from;
  int steps = 1000;
  int batch = 8;
  int seq = 0;    // 0: the model's max_seq
  int accum = 1;  // micro-batches per optimizer step, at most kMaxAccum
  float lr = 3e-3f;
  float min_lr_ratio = 0.1f;  // the cosine schedule ends at lr * min_lr_ratio
  int warmup = 20;
  float weight_decay = 0.1f;
  float beta1 = 0.9f, beta2 = 0.95f;
  float adam_eps = 1e-8f;  // AdamW's ε (no flag: the data-parallel tests raise it, see tests/dist)
  float grad_clip = 1.0f;  // 0: off
  float label_smoothing = 0.0f;
  uint64_t seed = 1337;
  int val_every = 100;       // 0: only at the end
  int val_batches = 4;       // batches per validation, capped at the split (never wrapping); 0: the whole split
  int ckpt_every = -1;       // N > 0: every N steps; 0: only at the end; -1: every ckpt_minutes of wall time
  double ckpt_minutes = 10;  // with ckpt_every -1
  int stop_after = 0;        // stop (with a checkpoint) after this step, as if interrupted; 0: run to `steps`
  // A Chrome trace (Perfetto) of optimizer step trace_step: FWD_STEP / BWD_STEP / OPTIM_STEP, every layer and op,
  // the planned live-activation counter (core/trace.h). Empty: none. Not saved with the run (like out).
  std::string trace;
  // 0: the run's second step, or its last where it ends sooner (--steps, --stop-after). The first step of every
  // process pays one-time costs (plans, handles), a resumed run's too; a fixed step 2 lay before a resumed run's.
  int trace_step = 0;
  // --memory-timeline FILE.png: memory over step trace_step, op by op (memory_record.h: static buffers, the plan's
  // live activations, the arena), and FILE.csv beside it, drawn by TrainControl::on_memory_timeline on rank 0 after
  // that step. Empty: none. Not saved with the run.
  std::string memory_timeline;
  bool progress = true;
  // --no-checkpoint: write no checkpoint at all (benchmark runs of big models, where each one is gigabytes). Not
  // saved with the run. An interrupted run then stops with nothing to resume from.
  bool checkpoints = true;
  // Where and in what precision to train; neither is saved with the run, so a checkpoint resumes anywhere.
  std::string device;     // "cpu", "cuda", "cuda:N"; empty: the GPU when one is visible, else the CPU
  std::string precision;  // "f32", "bf16", "f16"; empty: bf16 on a GPU (f32 master weights), f32 on the CPU
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

// A fingerprint of what must agree across the ranks of a run: the options (model, data path, batch, schedule,
// seed, ...), the world size, and the data itself (each shard's name, size and first and last 64 KiB).
uint64_t run_fingerprint(const TrainOptions& o);

}  // namespace tessera
