// The flags of `tessera train`, and the options they make.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessera/cli/cmd_train.h"
#include "tessera/cli/common.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/dist/ddp.h"
#include "tessera/models/model.h"
#include "tessera/train/checkpoint.h"

namespace tessera::cli {

namespace fs = std::filesystem;

void add_train_flags(Flags& a) {
  add_model_flags(a);
  a.add("data", "DIR|FILE",
        "token shards, or a UTF-8 text file to tokenize into OUT/data (default: the bundled corpus)");
  a.add("out", "DIR",
        "output directory for metrics.jsonl, checkpoint/ and best/ (default runs/<preset>; with "
        "--resume, the checkpoint's parent)");
  a.add("resume", "DIR", "continue from a training checkpoint directory");
  a.add("init-from", "DIR",
        "start a new run (fine-tuning) from the weights and config of a checkpoint: tessera's, or a "
        "directory that Hugging Face's save_pretrained wrote (GPT-2 or Llama); the optimizer starts afresh");
  a.add_switch("force", "train into an output directory that already holds a run, replacing it");
  a.add("steps", "N", "optimizer steps in total (default 1000; with --resume, the saved run's)");
  a.add("batch", "N", "sequences per micro-batch, on each rank under mpirun (default 8)");
  a.add("seq", "N", "tokens per sequence (default: the model's max_seq)");
  a.add("accum", "N", "micro-batches per step, gradient accumulation (default 1)");
  a.add("lr", "X", "peak learning rate (default 3e-3; 2e-3 for an encoder-decoder preset)");
  a.add("warmup", "N", "linear warm-up steps (default 20; 100 for an encoder-decoder preset)");
  a.add("min-lr-ratio", "X", "final lr as a fraction of the peak, cosine decay (default 0.1)");
  a.add("weight-decay", "X",
        "AdamW weight decay on matrices and embeddings (default 0.1; 0.01 for an encoder-decoder preset)");
  a.add("grad-clip", "X", "clip the global gradient norm, 0 = off (default 1.0)");
  a.add("label-smoothing", "X", "cross-entropy label smoothing (default 0; 0.1 for an encoder-decoder preset)");
  a.add("max-tokens", "N",
        "encoder-decoder presets: padded tokens per batch, pairs of similar length together (default 1024)");
  a.add("seed", "N", "seed for init, dropout and data (default 1337)");
  a.add("device", "cpu|cuda|cuda:N", "where to train (default: the GPU when one is visible, else the CPU)");
  a.add("precision", "f32|bf16|f16",
        "compute dtype (default bf16 on a GPU, with f32 master weights; f32 on the CPU); "
        "f16 trains with dynamic loss scaling, skipping the steps that overflow");
  a.add("master-weights", "on|off",
        "bf16/f16 on a GPU: keep f32 master weights (on, the default), or only the 16-bit "
        "parameters, updated in f32 registers and rounded back (off: LightSeq's mode, 4 bytes a parameter less)");
  a.add("cuda-graph", "on|off",
        "on a GPU, replay each training step as CUDA graphs (forward, backward and AdamW; "
        "the same results, fewer launches): on by default where the step can be one (a single process), off steps "
        "eagerly; the log says which and why. By default a capture that fails is a warning and the run steps eagerly "
        "from there; with on it is an error");
  a.add("loss-scale-init", "X", "--precision f16: the first loss scale (default 65536 = 2^16)");
  a.add("loss-scale-interval", "N",
        "--precision f16: steps without overflow before the loss scale doubles "
        "(default 2000)");
  a.add("val-every", "N",
        "validation loss every N steps, 0 = at the end only (default 100; 250 for an encoder-decoder preset)");
  a.add("val-batches", "N", "batches per validation, at most the whole val split, 0 = all of it (default 4)");
  a.add(
      "ckpt-every", "N",
      "checkpoint every N steps; 0 = at the end only (default: every --ckpt-minutes; 0 for an encoder-decoder preset)");
  a.add(
      "ckpt-minutes", "X",
      "without --ckpt-every, checkpoint every X minutes of wall time (default 10; not for an encoder-decoder preset)");
  a.add("stop-after", "N",
        "stop with a checkpoint after step N, as if interrupted (resume later with --resume); 0: off");
  a.add("trace", "FILE.json",
        "write a Chrome trace (opens in Perfetto) of one training step: FWD_STEP, BWD_STEP, "
        "OPTIM_STEP, each layer and op, the planned activation memory");
  a.add("memory-timeline", "FILE.png",
        "plot the planned memory of one training step per op (static buffers, live "
        "activations, the arena; forward, backward and optimizer shaded) and write FILE.csv beside it");
  a.add("trace-step", "N",
        "the step --trace and --memory-timeline record (default: the run's second step, as its "
        "first pays one-time costs: 2, or the --resume checkpoint's step + 2; its last if it ends sooner)");
  a.add("sample-tokens", "N",
        "tokens to sample after training (default 100; none for models over 100M params on the CPU)");
  a.add("prompt", "TEXT", "prompt for that sample (default \"The \")");
  a.add_switch("no-progress", "no progress bar");
  a.add_switch("no-checkpoint",
               "write no checkpoint (benchmark runs: a big model's checkpoint is gigabytes); an "
               "interrupted run then has nothing to resume from");
  a.add("ddp", "naive|flat|overlap|bucket", "under mpirun: how gradients are averaged across ranks (default bucket)");
  a.add("bucket-mb", "M", "under mpirun, --ddp bucket: MB of gradients per all-reduce (default 25)");
  a.add("zero", "1", "under mpirun: ZeRO-1, the optimizer state sharded across ranks (instead of --ddp)");
  a.add("comm-timeout", "S", "under mpirun: seconds a collective may wait before the run fails (default 300)");
  a.add("comm-sms", "N",
        "under mpirun on GPUs: SMs (CTAs) each NCCL collective may use; the GEMMs that overlap "
        "them plan for the rest (default 0: NCCL's choice, GEMMs plan for every SM)");
}

void TrainCommand::read_flags() {
  // 1. The flags, with nothing read or written yet.
  o.resume = a.str("resume");
  o.init_from = a.str("init-from", "");
  TS_CHECK(o.resume.empty() || o.init_from.empty(),
           "--init-from starts a new run from a checkpoint's weights, and "
           "--resume continues the run that wrote one: give one of them");
  if (!o.init_from.empty()) {
    // The checkpoint fixes the model's shape; a model flag would change it, or be silently ignored.
    for (const auto& f : model_flag_names())
      TS_CHECK(!a.has(f), "--", f, " cannot be combined with --init-from (the checkpoint fixes the model)");
    // A new run needs a directory of its own: the default, runs/<preset>, names no preset here.
    TS_CHECK(a.has("out"), "--init-from starts a new run: give it an output directory with --out DIR");
    const std::string dir = resolve_checkpoint_dir(o.init_from);
    TS_CHECK(fs::exists(dir), "--init-from: ", o.init_from, " does not exist", dangling_link_note(o.init_from),
             unfinished_checkpoint_note(o.init_from));
    o.model = load_checkpoint_config(dir);
  } else if (o.resume.empty()) {
    o.model = model_from_flags(a);
  } else {
    // A resumed run continues the saved run: model and data flags would silently be ignored, so refuse them.
    for (const auto& f : model_flag_names())
      TS_CHECK(!a.has(f), "--", f, " cannot be combined with --resume (the checkpoint fixes the model)");
    for (const char* f : {"data", "batch", "seq", "accum", "lr", "warmup", "min-lr-ratio", "weight-decay", "grad-clip",
                          "label-smoothing", "seed", "val-every", "val-batches", "ckpt-every", "ckpt-minutes"})
      TS_CHECK(!a.has(f), "--", f, " cannot be combined with --resume (the checkpoint records the run's settings)");
    TS_CHECK(!a.has("force"), "--force cannot be combined with --resume (a resumed run continues its directory)");
  }
  if (a.has("steps")) TS_CHECK(a.integer("steps", 0) > 0, "--steps must be positive, got ", a.str("steps"));
  o.steps = a.integer("steps", o.resume.empty() ? o.steps : 0);
  o.stop_after = a.integer("stop-after", 0);
  o.checkpoints = !a.has("no-checkpoint");
  TS_CHECK(o.checkpoints || !a.has("stop-after"),
           "--stop-after stops with a checkpoint to resume from: drop --no-checkpoint");
  for (const char* f : {"ckpt-every", "ckpt-minutes"})
    TS_CHECK(o.checkpoints || !a.has(f), "--", f, " times checkpoints, and --no-checkpoint writes none");
  for (const char* f : {"out", "resume", "init-from", "trace", "memory-timeline", "data", "device", "prompt"})
    TS_CHECK(!a.has(f) || !a.str(f).empty(), "--", f, " is empty");
  o.trace = a.str("trace", "");
  o.trace_step = a.integer("trace-step", 0);
  if (a.has("trace-step")) TS_CHECK(o.trace_step > 0, "--trace-step must be >= 1, got ", o.trace_step);
  o.memory_timeline = a.str("memory-timeline", "");
  TS_CHECK(!a.has("trace-step") || a.has("trace") || a.has("memory-timeline"),
           "--trace-step needs --trace FILE.json or --memory-timeline FILE.png");
  o.batch = a.integer("batch", o.batch);
  o.seq = a.integer("seq", 0);
  if (a.has("seq")) TS_CHECK(o.seq > 0, "--seq must be positive, got ", o.seq);
  o.accum = a.integer("accum", o.accum);
  o.lr = a.number_f32("lr", o.lr);
  o.warmup = a.integer("warmup", o.warmup);
  o.min_lr_ratio = a.number_f32("min-lr-ratio", o.min_lr_ratio);
  o.weight_decay = a.number_f32("weight-decay", o.weight_decay);
  o.grad_clip = a.number_f32("grad-clip", o.grad_clip);
  o.label_smoothing = a.number_f32("label-smoothing", o.label_smoothing);
  // Said as typed: 0.99999999 is 1 as a float, and "got 1" would read as if the number had been misread.
  TS_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1, "--label-smoothing must be in [0, 1), got ",
           a.str("label-smoothing"),
           o.label_smoothing == 1 && a.number("label-smoothing", 1.0) < 1 ? " (1 as a float)" : "");
  o.seed = a.u64("seed", o.seed);
  o.device = a.str("device", "");
  o.precision = a.str("precision", "");
  // Empty means "the device's default" inside TrainOptions, so `--precision ''` is refused here, as info and bench
  // refuse it, rather than taken as if the flag were absent.
  TS_CHECK(!a.has("precision") || !o.precision.empty(),
           "--precision: unknown precision '' (expected f32, bf16 or f16)");
  const std::string master = a.str("master-weights", "on");
  TS_CHECK(master == "on" || master == "off", "--master-weights must be on or off, got '", master, "'");
  o.master_weights = master == "on";
  if (a.has("cuda-graph")) {
    const std::string graph = a.str("cuda-graph");
    TS_CHECK(graph == "on" || graph == "off", "--cuda-graph must be on or off, got '", graph, "'");
    o.cuda_graph = cuda_graph_mode_from_name(graph);
  }
  o.loss_scale_init = a.number("loss-scale-init", o.loss_scale_init);
  o.loss_scale_interval = a.integer("loss-scale-interval", o.loss_scale_interval);
  o.val_every = a.integer("val-every", o.val_every);
  o.val_batches = a.integer("val-batches", o.val_batches);
  o.ckpt_every = a.integer("ckpt-every", o.ckpt_every);
  if (a.has("ckpt-every")) TS_CHECK(o.ckpt_every >= 0, "--ckpt-every must be >= 0, got ", o.ckpt_every);
  o.ckpt_minutes = a.number("ckpt-minutes", o.ckpt_minutes);
  TS_CHECK(!a.has("ckpt-every") || !a.has("ckpt-minutes"),
           "--ckpt-every times checkpoints by steps, and "
           "--ckpt-minutes by wall time (only without --ckpt-every): give one of them");
  o.progress = !a.has("no-progress");
  sample_flag = a.integer("sample-tokens", kDefaultSampleTokens);
  TS_CHECK(sample_flag >= 0, "--sample-tokens must be >= 0, got ", sample_flag);
  if (o.resume.empty()) {
    o.out = a.str("out", "runs/" + a.str("preset", "tiny"));  // the preset asked for, overrides or not
  } else {
    const fs::path parent = resume_dir(o.resume).parent_path();
    o.out = a.str("out", parent.empty() ? "." : parent.string());
  }
  if (lead && fs::is_directory(o.out)) out_lock.emplace(o.out, "output directory", kOutBusy);
  read_data_parallel_flags();
}

void TrainCommand::read_data_parallel_flags() {
  if (!ranks.world) {
    for (const char* f : {"ddp", "bucket-mb", "zero", "comm-timeout", "comm-sms"})
      TS_CHECK(!a.has(f), "--", f,
               " applies to a data-parallel run: start the ranks with mpirun -np N tessera train ...");
  } else {
    TS_CHECK(!(a.has("zero") && a.has("ddp")), "--zero 1 reduce-scatters the gradients itself: drop --ddp");
    dist.ddp = ddp_mode_from_name(a.str("ddp", "bucket"));
    TS_CHECK(!a.has("bucket-mb") || dist.ddp == DdpMode::Bucket, "--bucket-mb applies to --ddp bucket");
    dist.bucket_mb = a.number("bucket-mb", dist.bucket_mb);
    TS_CHECK(dist.bucket_mb > 0, "--bucket-mb must be positive, got ", a.str("bucket-mb"));
    dist.zero = a.integer("zero", 0);
    TS_CHECK(dist.zero == 0 || dist.zero == 1, "--zero: only stage 1 is built (--zero 1), got ", dist.zero);
    dist.timeout_s = a.number("comm-timeout", dist.timeout_s);
    TS_CHECK(dist.timeout_s > 0, "--comm-timeout must be positive, got ", a.str("comm-timeout"));
    dist.comm_sms = a.integer("comm-sms", dist.comm_sms);
    TS_CHECK(dist.comm_sms >= 0 && dist.comm_sms <= 64, "--comm-sms must lie in [0, 64], got ", dist.comm_sms);
    ranks.launch->set_timeout(dist.timeout_s);
    o.world_size = ranks.size();
    // Each rank its own GPU (unless --device names one); --device cpu trains every rank on the CPU.
    const GpuInfo gpu = probe_gpu();
    if ((o.device.empty() || o.device == "cuda") && gpu.available && gpu.count > 0)
      o.device = "cuda:" + std::to_string(ranks.world->gpu(gpu.count));
  }
}

}  // namespace tessera::cli
