// tessera train: every flag, the resume checkpoint and the data are checked before the first file is written;
// a failure leaves nothing behind. SIGINT/SIGTERM end the run at the next step boundary with a checkpoint.
//
// Under mpirun (mpirun -np N tessera train ...) each process is one rank of a data-parallel run: the checks run
// on every rank and their outcome is agreed (a failure anywhere ends every rank with one line from the lowest
// failing rank), rank 0 alone writes files and prints, and an error during training that only one rank sees ends
// the whole job at once (MPI_Abort) instead of leaving the others waiting.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/fnv.h"
#include "tessera/core/signals.h"
#include "tessera/core/units.h"
#include "tessera/dist/data_parallel.h"
#include "tessera/dist/ddp.h"
#include "tessera/dist/mpi_communicator.h"
#include "tessera/dist/mpi_world.h"
#include "tessera/dist/zero.h"
#include "tessera/infer/sampler.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/text.h"
#include "tessera/train/trainer.h"

#ifndef TESSERA_DEFAULT_CORPUS
#define TESSERA_DEFAULT_CORPUS "data/corpus.txt"
#endif

namespace tessera::cli {

namespace fs = std::filesystem;

namespace {

// Above this many parameters no sample is drawn by default: on the CPU it would take minutes.
constexpr int64_t kSampleMaxParams = 100'000'000;
constexpr int kDefaultSampleTokens = 100;

SignalFlag g_stop = 0;
// What the first stop signal prints at once, chosen before the handlers are installed: rank 0's line, which says
// whether a checkpoint follows; null (the other ranks) for none.
const char* g_stop_note = nullptr;
size_t g_stop_note_len = 0;
constexpr char kStopNoteCheckpoint[] =
    "\ntessera: stopping after this step, with a checkpoint (a second signal exits at once, without one)\n";
constexpr char kStopNoteNone[] = "\ntessera: stopping after this step (--no-checkpoint: nothing is written)\n";
// When the first stop came (CLOCK_MONOTONIC, ns; a lock-free atomic, safe in the handler).
std::atomic<int64_t> g_stop_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the stop handler reads it");
// A repeat within this of the first signal is the same stop: `timeout` signals the command and then its process
// group, microseconds apart, and `kill` run twice in a script lands milliseconds apart; either way the run left
// without its checkpoint, losing up to --ckpt-minutes of training. A person's second Ctrl-C comes later than this.
constexpr int64_t kRepeatNs = 250'000'000;

int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

extern "C" void on_stop_signal(int sig) {
  // A closed output pipe (`tessera train | head`) raises SIGPIPE at every write after the first: only the first
  // counts, as a stop.
  if (sig == SIGPIPE && g_stop != 0) return;
  if (g_stop != 0 && monotonic_ns() - g_stop_ns.load() < kRepeatNs) return;
  if (g_stop != 0) {  // the second signal: leave now, without a checkpoint
    constexpr char kMsg[] = "\ntessera: interrupted again: exiting without a checkpoint\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    ::_exit(128 + sig);
  }
  g_stop_ns.store(monotonic_ns());
  g_stop = sig;
  // Said at once: the step, or a checkpoint being written, can take minutes, and a stop that printed nothing until
  // then drew the second Ctrl-C that abandons the checkpoint (a new user's trial). Not for SIGPIPE: stderr may be
  // the pipe that closed. The interrupted code sees errno as it was.
  if (sig != SIGPIPE && g_stop_note != nullptr) {
    const int saved = errno;
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, g_stop_note, g_stop_note_len);
    errno = saved;
  }
}

// Removes the directories this command created when it fails before its first step, so that a failed command
// leaves no empty output directory and no prepared shards.
class CreatedDirs {
 public:
  ~CreatedDirs() {
    if (keep_) return;
    std::error_code ec;
    // The directories asked for go with what is in them; the parents made on the way only when empty (fs::remove
    // refuses a directory that is not), so that another run started into the same new parent keeps its files.
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
      if (it->second) fs::remove_all(it->first, ec);
      else fs::remove(it->first, ec);
    }
  }
  // Creates `dir`, remembering each directory on its path that this process's own mkdir made
  // (create_dirs_recorded): dir itself is the last of them when it was made.
  void create(const std::string& dir) {
    bool made_dir = false;
    const std::vector<fs::path> made = create_dirs_recorded(dir, &made_dir);
    for (size_t i = 0; i < made.size(); ++i) created_.emplace_back(made[i], made_dir && i + 1 == made.size());
  }
  void keep() { keep_ = true; }

 private:
  std::vector<std::pair<fs::path, bool>> created_;  // (directory, whether it is one asked for), outermost first
  bool keep_ = false;
};

constexpr const char* kOutBusy =
    "(a train into it, or a resume of it): wait for that one to end, or choose another --out";

// Locks, shared, the directory of the shards a run reads (that of a single shard file) for the run's life: a tessera
// prepare into it (which takes it exclusively) replaced the shards under a running train, whose resume then failed.
// Data in the output directory itself is covered by its lock; data that is missing is left to the check that says so.
void lock_data(std::optional<DirectoryLock>& lock, const std::string& data, const std::string& out) {
  const fs::path p(data);
  const fs::path dir = fs::is_directory(p) ? p : p.has_parent_path() ? p.parent_path() : fs::path(".");
  lock.reset();
  std::error_code ec;
  // A directory this user may not list (a shard file given in it) cannot be opened to lock: it runs unlocked.
  if (!fs::is_directory(dir) || fs::equivalent(dir, out, ec) || ::access(dir.c_str(), R_OK) != 0) return;
  lock.emplace(dir.string(), "data directory", "(a prepare writes its shards): wait for it to end",
               DirectoryLock::Mode::Shared);
}

// A path as a shell word.
std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:+,@") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Why the sample after training, byte-level text as tessera generate's, cannot come from this model; "" when it can.
// max_token: the largest token id in the training shards (-1 for text, which is tokenized as bytes).
std::string byte_sample_refusal(int vocab, int max_token) {
  if (vocab < kByteVocab)
    return "the model's vocab of " + std::to_string(vocab) + " tokens is not the byte vocabulary (256), and the sample "
           "is byte-level text";
  if (max_token >= kByteVocab)
    return "the training data holds token ids up to " + std::to_string(max_token) + ", not bytes, and the sample is "
           "byte-level text";
  return "";
}

// What a run's directory holds besides the run itself: the shards of data/ (prepared there beforehand, or by an
// earlier run), and what a checkpoint swap or a metrics rewrite that was cut short leaves (<dir>.tmp, <dir>.old,
// ".metrics.jsonl.tmp.<pid>").
bool is_run_entry(const std::string& name) {
  for (const std::string dir : {"checkpoint", "best"})
    if (name == dir + ".tmp" || name == dir + ".old") return true;
  return name == "data" || name.starts_with(".metrics.jsonl.tmp.");
}

// The entries of `out`, an existing directory that holds no run, that are not a run's: sorted, for the message.
std::vector<std::string> foreign_entries(const fs::path& out) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out))
    if (!is_run_entry(e.path().filename().string())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// "a, b, c and 2 more": a refusal names what it found without running past its one line.
std::string first_names(const std::vector<std::string>& names) {
  std::string shown;
  for (size_t i = 0; i < names.size() && i < 3; ++i) shown += (i ? ", " : "") + names[i];
  if (names.size() > 3) shown += " and " + std::to_string(names.size() - 3) + " more";
  return shown;
}

// The ranks of a run under mpirun: the MPI runtime, and a communicator on which the ranks agree on the outcome
// of each phase of the command.
struct Ranks {
  const MpiWorld* world = nullptr;
  MpiCommunicator* launch = nullptr;
  int rank() const { return world ? world->rank() : 0; }
  int size() const { return world ? world->size() : 1; }
  // Runs fn; under mpirun every rank learns whether it failed anywhere (run_collectively).
  void agree(const std::function<void()>& fn) const {
    if (launch) run_collectively(*launch, fn, kTrainMemoryHint);
    else fn();
  }
};

int train_command(int argc, char** argv, const Ranks& ranks) {
  Flags a("train", "Trains a GPT model. With no flags: the tiny preset on the bundled corpus, on the GPU when one\n"
                   "is visible (bf16 with f32 master weights), else on the CPU (f32).");
  add_model_flags(a);
  a.add("data", "DIR|FILE", "token shards, or a UTF-8 text file to tokenize into OUT/data (default: the bundled corpus)");
  a.add("out", "DIR", "output directory for metrics.jsonl, checkpoint/ and best/ (default runs/<preset>; with "
                      "--resume, the checkpoint's parent)");
  a.add("resume", "DIR", "continue from a training checkpoint directory");
  a.add_switch("force", "train into an output directory that already holds a run, replacing it");
  a.add("steps", "N", "optimizer steps in total (default 1000; with --resume, the saved run's)");
  a.add("batch", "N", "sequences per micro-batch, on each rank under mpirun (default 8)");
  a.add("seq", "N", "tokens per sequence (default: the model's max_seq)");
  a.add("accum", "N", "micro-batches per step, gradient accumulation (default 1)");
  a.add("lr", "X", "peak learning rate (default 3e-3)");
  a.add("warmup", "N", "linear warm-up steps (default 20)");
  a.add("min-lr-ratio", "X", "final lr as a fraction of the peak, cosine decay (default 0.1)");
  a.add("weight-decay", "X", "AdamW weight decay on matrices and embeddings (default 0.1)");
  a.add("grad-clip", "X", "clip the global gradient norm, 0 = off (default 1.0)");
  a.add("label-smoothing", "X", "cross-entropy label smoothing (default 0)");
  a.add("seed", "N", "seed for init, dropout and data (default 1337)");
  a.add("device", "cpu|cuda|cuda:N", "where to train (default: the GPU when one is visible, else the CPU)");
  a.add("precision", "f32|bf16|f16", "compute dtype (default bf16 on a GPU, with f32 master weights; f32 on the CPU); "
        "f16 trains with dynamic loss scaling, skipping the steps that overflow");
  a.add("master-weights", "on|off", "bf16/f16 on a GPU: keep f32 master weights (on, the default), or only the 16-bit "
        "parameters, updated in f32 registers and rounded back (off: LightSeq's mode, 4 bytes a parameter less)");
  a.add("cuda-graph", "on|off", "on a GPU, replay each training step as CUDA graphs (forward, backward and AdamW; "
        "the same results, fewer launches): on by default where the step can be one (a single process), off steps "
        "eagerly; the log says which and why. By default a capture that fails is a warning and the run steps eagerly "
        "from there; with on it is an error");
  a.add("loss-scale-init", "X", "--precision f16: the first loss scale (default 65536 = 2^16)");
  a.add("loss-scale-interval", "N", "--precision f16: steps without overflow before the loss scale doubles "
        "(default 2000)");
  a.add("val-every", "N", "validation loss every N steps, 0 = at the end only (default 100)");
  a.add("val-batches", "N", "batches per validation, at most the whole val split, 0 = all of it (default 4)");
  a.add("ckpt-every", "N", "checkpoint every N steps; 0 = at the end only (default: every --ckpt-minutes)");
  a.add("ckpt-minutes", "X", "without --ckpt-every, checkpoint every X minutes of wall time (default 10)");
  a.add("stop-after", "N",
        "stop with a checkpoint after step N, as if interrupted (resume later with --resume); 0: off");
  a.add("trace", "FILE.json", "write a Chrome trace (opens in Perfetto) of one training step: FWD_STEP, BWD_STEP, "
        "OPTIM_STEP, each layer and op, the planned activation memory");
  a.add("memory-timeline", "FILE.png", "plot the planned memory of one training step per op (static buffers, live "
        "activations, the arena; forward, backward and optimizer shaded) and write FILE.csv beside it");
  a.add("trace-step", "N", "the step --trace and --memory-timeline record (default: the run's second step, as its "
        "first pays one-time costs: 2, or the --resume checkpoint's step + 2; its last if it ends sooner)");
  a.add("sample-tokens", "N", "tokens to sample after training (default 100; none for models over 100M params on the CPU)");
  a.add("prompt", "TEXT", "prompt for that sample (default \"The \")");
  a.add_switch("no-progress", "no progress bar");
  a.add_switch("no-checkpoint", "write no checkpoint (benchmark runs: a big model's checkpoint is gigabytes); an "
                                "interrupted run then has nothing to resume from");
  a.add("ddp", "naive|flat|overlap|bucket", "under mpirun: how gradients are averaged across ranks (default bucket)");
  a.add("bucket-mb", "M", "under mpirun, --ddp bucket: MB of gradients per all-reduce (default 25)");
  a.add("zero", "1", "under mpirun: ZeRO-1, the optimizer state sharded across ranks (instead of --ddp)");
  a.add("comm-timeout", "S", "under mpirun: seconds a collective may wait before the run fails (default 300)");
  a.add("comm-sms", "N", "under mpirun on GPUs: SMs (CTAs) each NCCL collective may use; the GEMMs that overlap "
                         "them plan for the rest (default 0: NCCL's choice, GEMMs plan for every SM)");
  const bool lead = ranks.rank() == 0;  // the one rank that writes files and prints
  // Under mpirun every rank parses the same flags: a bad one is one line (from one rank), not one per rank, and
  // the job ends without MPI_Abort.
  bool help = false;
  ranks.agree([&] { help = !a.parse(argc, argv, 2, /*print_help=*/lead); });
  if (help) return 0;

  TrainOptions o;
  TrainSetup setup;
  DataParallelOptions dist;
  std::string text, text_source, no_sample;
  int sample_flag = kDefaultSampleTokens;
  // Held by rank 0 until it exits: one train at a time in OUT. Taken as soon as OUT is known, when it exists
  // (before the checks read its checkpoint, which a running train may be swapping), else once it is made.
  std::optional<DirectoryLock> out_lock;
  // Rank 0's lock on the directory of the shards it reads: shared (exclusive while train prepares its text there).
  std::optional<DirectoryLock> data_lock;
  SignalFlag read_stop = 0;  // a stop while the --data text is read
  // One process: from the read of a --data text until the training's own handlers, a stop is recorded in read_stop
  // and said, where between the read, the prepare and the training the default action had killed train without a
  // word (seconds, for gigabytes of text). Ranks keep it for the read alone: a flag that some ranks saw and others
  // did not would part them, and mpirun ends them all on a stop anyway.
  std::optional<ScopedSignals> text_signals;
  ranks.agree([&] {
    // 1. The flags, with nothing read or written yet.
    o.resume = a.str("resume");
    if (o.resume.empty()) {
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
    for (const char* f : {"out", "resume", "trace", "memory-timeline", "data", "device", "prompt"})
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
    // Said as typed: 0.99999999 is 1 as a float, and "got 1" read as if the number had been misread.
    TS_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1, "--label-smoothing must be in [0, 1), got ",
             a.str("label-smoothing"),
             o.label_smoothing == 1 && a.number("label-smoothing", 1.0) < 1 ? " (1 as a float)" : "");
    o.seed = a.u64("seed", o.seed);
    o.device = a.str("device", "");
    o.precision = a.str("precision", "");
    // Empty means "the device's default" inside TrainOptions: `--precision ''` trained as if the flag were absent,
    // where info and bench refuse it.
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
    TS_CHECK(!a.has("ckpt-every") || !a.has("ckpt-minutes"), "--ckpt-every times checkpoints by steps, and "
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
    if (!ranks.world) {
      for (const char* f : {"ddp", "bucket-mb", "zero", "comm-timeout", "comm-sms"})
        TS_CHECK(!a.has(f), "--", f, " applies to a data-parallel run: start the ranks with mpirun -np N tessera train ...");
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

    // 2. Every option against the model, the resume checkpoint and the memory the run needs (reads only).
    setup = train_setup(o);
    o = setup.options;
    for (const char* f : {"loss-scale-init", "loss-scale-interval"})
      TS_CHECK(!a.has(f) || o.loss_scaling, "--", f, " applies to --precision f16 (dynamic loss scaling)");
    // CPU ranks all-reduce over MPI, which has no CTAs to limit; 0, the default (NCCL's choice), asks for nothing,
    // so a launch script that always passes it runs on CPU ranks too.
    TS_CHECK(dist.comm_sms == 0 || setup.context->is_cuda(), "--comm-sms applies to ranks on GPUs (the SMs NCCL's "
             "collectives use): these ranks train on the CPU");
    // ZeRO-1 clips each rank's range after an all-reduce of the norm; skipping a step there is not built.
    TS_CHECK(!(dist.zero && o.loss_scaling), "--zero 1 does not support --precision f16 (dynamic loss scaling): use "
             "--precision bf16, or --ddp");
    // ZeRO-1 over more ranks than the flat parameters have blocks would shard nothing. Checked here, where the
    // ranks agree, rather than where each rank makes its optimizer in train(): there every rank failed alone, a
    // line and an MPI_Abort each.
    if (dist.zero) check_zero_world(Gpt::flat_params(o.model), ranks.size());

    // 3. The data: shards are opened and checked now; text is read and checked, and tokenized once the output
    // directory may be created.
    if (o.resume.empty()) {
      if (!a.has("data")) {
        TS_CHECK(o.model.vocab >= kByteVocab, "--data is required: the bundled corpus is byte-level (vocab 256) and the "
                                              "model's vocab is ", o.model.vocab);
        text_source = TESSERA_DEFAULT_CORPUS;
      } else {
        o.data = a.str("data");
        TS_CHECK(fs::exists(o.data), "data: ", o.data, " does not exist", dangling_link_note(o.data));
        if (!fs::is_directory(o.data) && !is_shard_file(o.data)) {
          TS_CHECK(o.model.vocab >= kByteVocab, "data ", o.data, ": text is tokenized byte-level (vocab 256) and the "
                                                "model's vocab is ", o.model.vocab, "; give token shards instead");
          text_source = o.data;
        }
      }
    }
    if (!text_source.empty()) {
      // The text is read now and prepared into OUT/data, so train_setup's check of the outputs against the data
      // sees the prepared shards, not the text: a --trace of the text replaced it once the run had read it.
      OutputFiles files;
      files.protect(text_source, "the --data text, which the run reads");
      for (const auto& [flag, path] : trace_outputs(o)) files.claim(flag, path);
      {
        // A stop while the text is read (seconds for gigabytes, or an endless --data /dev/zero) ends the command as
        // one while its prepare runs does: a line, 128 + the signal, nothing written. Unhandled, it was a silent kill.
        text_signals.emplace(std::initializer_list<int>{SIGINT, SIGTERM, SIGHUP}, &read_stop,
                             /*keep_ignored=*/std::initializer_list<int>{SIGHUP});
        try {
          text = read_file_text(text_source, "data", &read_stop, /*stop_at_nul=*/true);
        } catch (const Error&) {
          if (read_stop == 0) {
            if (ranks.world) text_signals.reset();  // the ranks' agreement on the error waits with stops live
            throw;
          }
        }
        if (ranks.world) text_signals.reset();
        if (read_stop != 0) {
          TS_CHECK(!ranks.world, "interrupted while reading ", text_source);  // the ranks agree on an error
          return;
        }
        if (fault_injected("train-stop-after-read")) ::raise(SIGINT);  // tests: a stop in the checks after the read
      }
      size_t bad = 0;
      TS_CHECK(is_utf8_text(text, &bad), "data ", text_source, " is neither a token shard (magic ", kShardMagic,
               ") nor plain text (", not_text_at(text, bad), "); tessera prepare turns text into shards");
      const size_t need = static_cast<size_t>(o.batch) * o.world_size * o.seq + 1;
      // The text's train split, as prepare will cut it: checked now, before anything is written (a --force whose
      // new text is too short leaves the old run as it was).
      const size_t n_train = prepare_split_sizes(text.size()).first;
      TS_CHECK(n_train >= need, "data ", text_source, ": its train split holds ",
               counted(n_train, "token"), ", fewer than batch x ", o.world_size > 1 ? "ranks x " : "",
               "seq + 1 = ", need);
    } else {
      setup.options.data = o.data;
      if (lead) lock_data(data_lock, o.data, o.out);
      train_open_data(setup);
    }

    // 4. The sample after training. Asked for where it cannot be drawn, it is an error now, not a sample left out
    // without a word after the run; by default a line then says why there is none.
    no_sample = byte_sample_refusal(o.model.vocab, setup.train_data ? setup.train_data->max_token() : -1);
    if (a.has("sample-tokens") && sample_flag > 0)
      TS_CHECK(no_sample.empty(), "--sample-tokens ", sample_flag, ": no sample can be drawn: ", no_sample);
    TS_CHECK(!a.has("prompt") || sample_flag > 0,
             "--prompt is for the sample after training, which --sample-tokens 0 turns off");
    TS_CHECK(!a.has("prompt") || no_sample.empty(), "--prompt: no sample can be drawn: ", no_sample);

    // 5. The output directory: one run each. A resumed run continues in the directory of its checkpoint; written
    // anywhere else that holds a run (--out B, or --resume RUN/best into RUN, whose checkpoint/ is later), it
    // would replace that run's checkpoint and cut its metrics back, silently.
    if (!o.resume.empty() && holds_run(o.out)) {
      const fs::path ck_dir = resume_dir(o.resume);
      std::error_code ec;
      const bool own = fs::equivalent(ck_dir.has_parent_path() ? ck_dir.parent_path() : fs::path("."), o.out, ec) &&
                       (ck_dir.filename() == "checkpoint" || ck_dir.filename() == "checkpoint.old");
      TS_CHECK(own, "--resume ", a.str("resume"), ": output directory ", o.out, " already holds a run, which this "
               "would replace (its checkpoint/, and metrics.jsonl cut back to this checkpoint's step): continue it "
               "with --resume ", (fs::path(o.out) / "checkpoint").string(), ", or give --out a new directory");
    }
    // A directory that holds no run but other files (`--out /`, a home or project directory) would get the run's
    // metrics.jsonl, checkpoint/, best/ and data/ mixed into what is there. --force replaces a run, so it does not
    // lift this: there is no run to replace.
    TS_CHECK(!fs::exists(o.out) || fs::is_directory(o.out), "output path ", o.out, " is not a directory");
    if (!holds_run(o.out) && fs::is_directory(o.out)) {
      const std::vector<std::string> other = foreign_entries(o.out);
      TS_CHECK(other.empty(), "output directory ", o.out, " holds no tessera run but other files (", first_names(other),
               "), which the run's metrics.jsonl, checkpoint/, best/ and data/ would be mixed into: give --out a new "
               "or empty directory");
    }
    // Train's text goes to OUT/data: a data/ that holds other files than shards (a run's directory whose data/
    // someone filled by hand) belongs to something else, not to the run. A killed prepare's hidden files are the
    // run's own, and the prepare removes them.
    if (!text_source.empty() && fs::is_directory(fs::path(o.out) / "data")) {
      std::vector<std::string> shards;
      for (const auto& e : fs::directory_iterator(fs::path(o.out) / "data")) {
        const std::string name = e.path().filename().string();
        const bool shard = e.is_regular_file() && e.path().extension() == ".bin" &&
                           (name.starts_with("train_") || name.starts_with("val_"));
        TS_CHECK(shard || is_prepare_leftover(name), "output directory ", o.out, ": its data/ holds ", name,
                 ", not a shard train writes; train prepares the text into OUT/data: give another --out");
        if (shard) shards.push_back(name);
      }
      // Shards with no run beside them were prepared by hand (tessera prepare --out OUT/data): replaced without a
      // word, they were lost. A run's own shards go with the run, which --force replaces. All of them are named
      // (the first few): one name read as if the others were not at stake.
      std::sort(shards.begin(), shards.end());
      TS_CHECK(shards.empty() || holds_run(o.out) || a.has("force"), "output directory ", o.out, " holds no run, "
               "but its data/ holds shards (", first_names(shards), ") that train would replace with those of ",
               text_source, ": train on them with --data ", (fs::path(o.out) / "data").string(),
               ", give another --out, or --force to replace them");
    }
    if (o.resume.empty() && holds_run(o.out) && !a.has("force")) {
      for (const char* ck : {"checkpoint", "checkpoint.old"})
        if (fs::is_directory(fs::path(o.out) / ck))
          TS_THROW("output directory ", o.out, " already holds a run: continue it with --resume ",
                   (fs::path(o.out) / ck).string(), ", or replace it with --force");
      // A run stopped while it wrote its first checkpoint still has its best/ when it validated.
      const fs::path best = fs::path(o.out) / "best";
      const bool best_resumable = holds_train_state(best.string());
      TS_THROW("output directory ", o.out, " already holds a run with no checkpoint to resume",
               best_resumable ? ", only its best/: continue that as a new run with --resume " + best.string() +
                                    " --out NEW," : ":",
               " replace it with --force, or choose another --out");
    }
  });
  if (read_stop != 0) {
    std::fprintf(stderr, "tessera: %s while reading %s: nothing written\n", stop_word(read_stop), text_source.c_str());
    return 128 + read_stop;
  }

  // The gradient communicator (MPI for a CPU model, NCCL for a GPU one) joins every rank: a collective. Then the
  // ranks must agree on the run (options, data, world size; the text that rank 0 will tokenize), before anything
  // is written.
  std::unique_ptr<DataParallelRun> parallel;
  if (ranks.world) {
    parallel = std::make_unique<DataParallelRun>(*ranks.world, *setup.context, dist);
    setup.parallel = parallel.get();
    Fnv fingerprint{run_fingerprint(o)};
    fingerprint.add(text.data(), text.size());
    parallel->check_consistent(fingerprint.h, "the training options, the data and the world size");
  }

  // Checks done: from here on files are written, by rank 0 alone.
  const fs::path out(o.out);
  CreatedDirs created;
  SignalFlag prepare_stop = 0;  // a stop while train prepares its text (the training's handlers come later)
  int prepare_interrupted = 0;  // the signal that undid the prepare
  ranks.agree([&] {
    if (!lead) return;
    created.create(o.out);
    if (!out_lock) {
      // --out did not exist when the checks above ran, so they were made unlocked: another run started at the same
      // moment may hold it now, or may have trained in it and ended. Either way it is that one's.
      try {
        out_lock.emplace(o.out, "output directory", kOutBusy);
      } catch (const DirectoryInUse&) {
        created.keep();
        throw;
      }
      if (!fs::is_empty(o.out)) {
        created.keep();
        TS_THROW("output directory ", o.out, " already holds a run, made by another tessera process started at the "
                 "same time: choose another --out");
      }
    }
    if (!text_source.empty()) {
      // prepare_shards replaces OUT/data's shards all or nothing (checked above: data/ holds nothing else). A stop
      // while it writes undoes it: killed there, it left a hidden temporary shard in OUT/data, which the next run
      // refused as a file that is not a shard.
      const std::string data_dir = (out / "data").string();
      created.create(data_dir);
      // Held exclusively while the text is prepared, then shared on the same descriptor for the run: released in
      // between, a prepare into OUT/data could replace the new shards before the run took its fingerprint.
      data_lock.emplace(data_dir, "data directory",
                        "(a train reads its shards, or a prepare writes them): wait for it to end, or choose another "
                        "--out");
      if (fault_injected("train-stop-before-prepare")) ::raise(SIGINT);  // tests: a stop after the checks
      PrepareReport prepared;
      try {
        const ScopedSignals stop({SIGINT, SIGTERM, SIGHUP}, &prepare_stop, /*keep_ignored=*/{SIGHUP});
        // A stop since the checks above (the scope starts its flag at 0): the prepare ends at once, undone.
        if (read_stop != 0) prepare_stop = read_stop;
        PrepareProgress bar(text.size(), o.progress && lead);
        prepared = prepare_shards(text, data_dir, {.stop = &prepare_stop, .progress = bar.callback(), .lock = false});
      } catch (const PrepareInterrupted& e) {
        // One process: it exits 128 + the signal below. Ranks: an error they agree on (the others wait for rank 0).
        TS_CHECK(!ranks.world, "interrupted while preparing ", text_source, " into ", data_dir, ": ", o.out,
                 " left as it was");
        prepare_interrupted = e.signal();
        return;
      }
      // A signal after the last shard was written: the training stops at its first step boundary, as if it had come
      // a moment later.
      if (prepare_stop != 0) {
        g_stop_ns.store(monotonic_ns());  // a repeat of it (timeout's second) is the same stop
        g_stop = prepare_stop;
      }
      if (fault_injected("train-stop-after-prepare")) ::raise(SIGINT);  // tests: a stop before the training's handlers
      const size_t n_train = prepared.n_train, n_val = prepared.n_val;
      std::error_code ec;
      // The source as the user would type it from here (the bundled corpus's path is absolute at build time).
      const fs::path shown = fs::proximate(text_source, ec);
      std::printf("prepared %s: %zu train / %s in %s\n", (ec ? text_source : shown.string()).c_str(), n_train,
                  counted(n_val, "val token").c_str(), data_dir.c_str());
      setup.options.data = data_dir;
      data_lock->share();
      train_open_data(setup);
    }
    // The run that --force replaces goes only once the new one's data has been checked. Its <dir>.old too (a swap
    // cut short): the loaders read RUN/checkpoint.old while RUN/checkpoint is missing, so until the new run's first
    // save (never, with --no-checkpoint; best/ only with validation) the old run's model stood in for the new one's.
    if (a.has("force")) {
      for (const char* name : {"metrics.jsonl", "checkpoint", "checkpoint.old", "best", "best.old"})
        fs::remove_all(out / name);
    }
  });
  if (prepare_interrupted != 0) {  // `created` removes the directories this run made
    std::fprintf(stderr, "tessera: %s while preparing %s: %s left as it was\n", stop_word(prepare_interrupted),
                 text_source.c_str(), o.out.c_str());
    return 128 + prepare_interrupted;
  }
  // The other ranks read the shards that rank 0 has just prepared (one file system, or a shared one).
  ranks.agree([&] {
    if (lead || text_source.empty()) return;
    setup.options.data = (out / "data").string();
    train_open_data(setup);
  });

  const int64_t params = o.model.num_params();
  const std::string what = o.resume.empty() ? o.model.preset + " (" + human_count(static_cast<double>(params)) + " params)"
                                            : "from checkpoint " + o.resume;
  // The precision line: 16-bit parameters with f32 master weights, or without them and what that saves.
  std::string precision(dtype_name(setup.dtype));
  if (setup.dtype != DType::F32) {
    precision += o.master_weights
                     ? " with f32 master weights"
                     : " without master weights (LightSeq's mode: " +
                           human_bytes(4.0 * static_cast<double>(o.model.num_params())) + " of f32 masters saved)";
    if (o.loss_scaling) precision += " and dynamic loss scaling";
  }
  const std::string where = setup.context->is_cuda() ? setup.context->gpu().name + " (" +
                                                           setup.context->device().str() + ") in " + precision
                                                     : std::string("the CPU");
  if (lead) {
    // A resume runs the steps after its checkpoint's: "for 50 steps" beside "done: 10 steps" read as a contradiction.
    // --stop-after ends this call at its step (checked to be one this run takes): "for steps 5 to 10" under
    // --stop-after 5 promised five steps and ran one.
    const bool resumed = !o.resume.empty() && setup.model;
    const int64_t first = resumed ? setup.state.step + 1 : 1;
    const int64_t last = o.stop_after > 0 ? o.stop_after : o.steps;
    std::string span = !resumed && last == o.steps ? "for " + counted(o.steps, "step")
                       : first == last             ? "for step " + std::to_string(last)  // not "for steps 2 to 2"
                                       : "for steps " + std::to_string(first) + " to " + std::to_string(last);
    if (last != o.steps) span += " of " + std::to_string(o.steps) + " (--stop-after " + std::to_string(last) + ")";
    std::printf("training %s on %s %s -> %s\n", what.c_str(), where.c_str(), span.c_str(),
                o.out.c_str());
    const std::string no_graph = train_cuda_graph_refusal(o, *setup.context);
    if (no_graph.empty())
      std::printf("step: CUDA graphs (one a step: forward, backward and AdamW; the first step%s runs eagerly)\n",
                  o.trace.empty() ? "" : " and the --trace step");
    else
      std::printf("step: eager (%s)\n", no_graph.c_str());
    if (!setup.no_validation.empty()) std::printf("validation: none (%s)\n", setup.no_validation.c_str());
    if (ranks.world) {
      std::printf("data parallel: %s x batch %d = %s a micro-step, %s\n", counted(ranks.size(), "rank").c_str(),
                  o.batch, counted(ranks.size() * o.batch, "sequence").c_str(),
                  dist.zero ? "ZeRO-1 (gradients reduce-scattered, optimizer state sharded)"
                            : ("--ddp " + std::string(ddp_mode_name(dist.ddp)) +
                               (dist.ddp == DdpMode::Bucket ? " (" + a.str("bucket-mb", "25") + " MB buckets)" : ""))
                                  .c_str());
    }
    std::fflush(stdout);
  }

  // The optimizer memory of each rank: all of AdamW's m and v with DDP, about 1/N of them under ZeRO-1.
  auto on_start = [&](size_t state_bytes, size_t unsharded) {
    if (!lead || !ranks.world) return;
    const std::string mine = human_bytes(static_cast<double>(state_bytes));
    const std::string all = human_bytes(static_cast<double>(unsharded));
    if (dist.zero)
      std::printf("optimizer: AdamW m+v %s on rank 0 (ZeRO-1: its 1/%d of %s)\n", mine.c_str(), ranks.size(),
                  all.c_str());
    else
      std::printf("optimizer: AdamW m+v %s on each rank (unsharded)\n", mine.c_str());
    std::fflush(stdout);
  };
  TrainResult r;
  {
    // SIGINT, SIGTERM, SIGHUP (the terminal closed) and SIGPIPE (the output pipe closed) set g_stop while training
    // runs: the run stops at the next step boundary with a checkpoint, where their default action killed it with
    // none. SIGHUP and SIGPIPE ignored by whoever started us (nohup ignores SIGHUP; systemd, SIGPIPE) stay
    // ignored. The previous handlers come back afterwards.
    g_stop_note = !lead ? nullptr : o.checkpoints ? kStopNoteCheckpoint : kStopNoteNone;
    g_stop_note_len = !lead ? 0 : o.checkpoints ? sizeof kStopNoteCheckpoint - 1 : sizeof kStopNoteNone - 1;
    // The note's leading newline ends a bar drawn in place; with none (--no-progress, or stderr not a terminal,
    // where the bar prints whole lines) it was an empty line.
    if (g_stop_note && !(o.progress && ::isatty(STDERR_FILENO))) {
      ++g_stop_note;
      --g_stop_note_len;
    }
    // Nested in text_signals (one process with a --data text), which stays until these are undone: a reset of it
    // first left a moment with the default action in force, and a stop recorded after the last look at read_stop.
    const ScopedSignals signals({SIGINT, SIGTERM, SIGHUP, SIGPIPE}, on_stop_signal,
                                /*keep_ignored=*/{SIGHUP, SIGPIPE});
    // A stop since the read (text_signals recorded it) or during the prepare's last renames stops the training at
    // its first step boundary, and is said now, as a stop during the training is: unsaid, a second Ctrl-C later
    // abandoned the checkpoint.
    if (g_stop == 0 && read_stop != 0) {
      on_stop_signal(read_stop);
    } else if (g_stop != 0 && g_stop_note != nullptr) {
      std::fflush(stdout);
      std::fwrite(g_stop_note, 1, g_stop_note_len, stderr);
    }
    try {
      r = train(std::move(setup),
                {.stop = &g_stop, .on_checkpoint = {}, .on_start = on_start, .before_optimizer_step = {},
                 .before_grad_sync = {}});
    } catch (...) {
      // A run that fails before its first step (out of memory making the model, say) leaves nothing behind; one
      // that fails later keeps its metrics and checkpoints (a diverged run's metrics say how it went).
      std::error_code ec, ec2;
      const auto metrics = fs::file_size(out / "metrics.jsonl", ec);  // uintmax_t(-1) and ec set when missing
      const bool checkpoint = fs::exists(out / "checkpoint", ec2);
      if ((!ec && metrics > 0) || checkpoint) created.keep();
      // An empty metrics.jsonl (a new run's, or a branch's into --out NEW) in a directory that was there before
      // would make it a run: the same command was then refused as one into a run, with nothing in it.
      else if (!ec && lead) fs::remove(out / "metrics.jsonl", ec);
      throw;
    }
  }
  text_signals.reset();  // after the training's handlers (the reverse order): the sample takes the default again
  created.keep();
  if (!lead) return g_stop != 0 ? 128 + g_stop : r.interrupted ? 128 + SIGTERM : 0;
  // A data-parallel run resumes at its world size, with its form of gradient reduction.
  const std::string launcher = ranks.world ? "mpirun -np " + std::to_string(ranks.size()) + " " : "";
  const std::string dist_flags = !ranks.world ? ""
                                 : dist.zero  ? " --zero 1"
                                              : " --ddp " + std::string(ddp_mode_name(dist.ddp)) +
                                                    (a.has("bucket-mb") ? " --bucket-mb " + a.str("bucket-mb") : "");
  // Precision, master weights and the loss-scale interval are not saved with a run (a checkpoint resumes on any
  // device): the command repeats the ones given, so that an f16 run resumes in f16 with its scaler state.
  std::string precision_flags;
  if (a.has("precision")) precision_flags.append(" --precision ").append(a.str("precision"));
  if (a.has("master-weights")) precision_flags.append(" --master-weights ").append(a.str("master-weights"));
  if (a.has("loss-scale-interval"))
    precision_flags.append(" --loss-scale-interval ").append(a.str("loss-scale-interval"));
  const std::string resume_cmd = launcher + shell_quote(argv[0]) + " train --resume " + shell_quote(r.checkpoint) +
                                 (fs::path(r.checkpoint).parent_path() == out ? "" : " --out " + shell_quote(o.out)) +
                                 dist_flags + precision_flags;
  // The --trace / --memory-timeline files, or why there are none: they were written without a word, and a run
  // stopped before its --trace-step left none, silently too.
  const bool wants_trace = !o.trace.empty() || !o.memory_timeline.empty();
  std::string traced;
  for (const std::string& f : r.traced) traced += (traced.empty() ? "" : ", ") + f;
  const std::string no_trace = "no --trace / --memory-timeline file: the run stopped before step " +
                               std::to_string(o.trace_step) + ", the one they record";
  if (r.interrupted && wants_trace && traced.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: %s\n", no_trace.c_str());
  }
  if (r.interrupted && r.checkpoint.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: %s at step %lld: --no-checkpoint, so nothing was written to resume from\n",
                 stop_word(g_stop), static_cast<long long>(r.last_step));
    return 128 + g_stop;
  }
  if (r.interrupted) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: %s at step %lld: checkpoint written to %s; continue the run with: %s\n",
                 stop_word(g_stop), static_cast<long long>(r.last_step),
                 r.checkpoint.c_str(), resume_cmd.c_str());
    return 128 + g_stop;
  }
  std::printf("done: %s in %.1fs, loss %.4f -> %.4f", counted(r.steps, "step").c_str(), r.seconds, r.first_loss,
              r.last_loss);
  if (r.loss_scale > 0)
    std::printf(", %lld skipped (f16 overflow), loss scale %g", static_cast<long long>(r.skipped_steps), r.loss_scale);
  if (r.last_val_loss > 0) std::printf(", val loss %.4f", r.last_val_loss);
  std::printf("\ncheckpoint: %s\n", r.checkpoint.empty() ? "none (--no-checkpoint)" : r.checkpoint.c_str());
  // A resume with --no-checkpoint keeps the run's best/ as it was: said, since a better validation loss of this
  // run (printed above) did not replace it.
  if (r.best_step > 0)
    std::printf("best:       %s (step %lld, val loss %.4f%s)\n", r.best_checkpoint.c_str(),
                static_cast<long long>(r.best_step), r.best_val_loss,
                r.checkpoint.empty() ? "; as it was: --no-checkpoint writes none" : "");
  std::printf("metrics:    %s\n", (fs::path(o.out) / "metrics.jsonl").c_str());  // "--out run/": one slash
  if (wants_trace)
    std::printf("trace:      %s\n", traced.empty() ? no_trace.c_str()
                                                 : (traced + " (step " + std::to_string(o.trace_step) + ")").c_str());
  if (r.peak_device_bytes > 0)
    std::printf("memory:     peak %s on the GPU after a step (the driver's count: tessera's buffers and the CUDA "
                "context)\n", human_bytes(static_cast<double>(r.peak_device_bytes)).c_str());
  if (r.last_step < o.steps && !r.checkpoint.empty())
    std::printf("stopped after step %lld; continue with: %s\n", static_cast<long long>(r.last_step), resume_cmd.c_str());
  if (g_stop != 0) return 128 + g_stop;  // a signal after the last step: the run is complete, skip the sample

  // Sample from the model still in memory (it equals the checkpoint just written) rather than reloading it.
  int sample_tokens = sample_flag;
  if (!a.has("sample-tokens") && !r.model->context().is_cuda() && r.model->config().num_params() > kSampleMaxParams) {
    sample_tokens = 0;
    // generate's default checkpoint is runs/tiny's, another model: the hint names this run's.
    const std::string gen = r.checkpoint.empty() ? "" : ", or run " + shell_quote(argv[0]) + " generate --checkpoint " +
                                                         shell_quote(r.checkpoint);
    std::printf("\nno sample: %s parameters is too slow to sample on the CPU (ask with --sample-tokens N%s)\n",
                human_count(static_cast<double>(r.model->config().num_params())).c_str(), gen.c_str());
  }
  if (sample_tokens > 0 && !no_sample.empty()) {
    sample_tokens = 0;
    std::printf("\nno sample: %s\n", no_sample.c_str());
  }
  if (sample_tokens > 0) {
    const std::string prompt = a.str("prompt", "The ");
    std::printf("\nsample (temperature 0.7, top-k 40):\n");
    try {
      generate_streamed(*r.model, encode_prompt(prompt, r.model->config().vocab), sample_tokens,
                        {.temperature = 0.7f, .top_k = 40, .seed = o.seed});
    } catch (const OutputLost& e) {
      // The first write that reaches the output is the sample's, after the run is saved.
      TS_THROW(e.what(), kOutputLostNote);
    }
  }
  return 0;
}

// Prints a rank's one-line error, as main() would, before the job is aborted (naming the rank unless the message
// does: the communicators' errors start with it).
void print_rank_error(int rank, int size, std::string msg) {
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  if (!msg.starts_with("rank ")) msg = "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " + msg;
  std::fflush(stdout);
  std::fprintf(stderr, "tessera: error: %s\n", msg.c_str());
  std::fflush(stderr);
}

}  // namespace

int cmd_train(int argc, char** argv) {
  if (!MpiWorld::launched_by_mpi()) return train_command(argc, argv, Ranks{});
  MpiWorld world;
  try {
    MpiCommunicator launch(world);
    return train_command(argc, argv, Ranks{.world = &world, .launch = &launch});
  } catch (const CollectiveError& e) {
    // Every rank raised it at the same point: one line (from one rank), and the job ends cleanly.
    if (!e.quiet()) {
      std::fflush(stdout);
      std::string msg = e.what();
      for (char& c : msg)
        if (c == '\n' || c == '\r') c = ' ';
      std::fprintf(stderr, "tessera: error: %s\n", msg.c_str());
    }
    return 2;
  } catch (const std::bad_alloc&) {
    print_rank_error(world.rank(), world.size(), std::string("out of memory (") + kTrainMemoryHint + ")");
    world.abort(2);
  } catch (const std::exception& e) {
    // This rank alone failed (a collective timed out, a peer died, a write failed): the others may be waiting in
    // a collective for it, so the whole job ends now.
    print_rank_error(world.rank(), world.size(), e.what());
    world.abort(2);
  }
}

}  // namespace tessera::cli
