#include "tessera/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "tessera/core/cuda_graph.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/fnv.h"
#include "tessera/core/json_fields.h"
#include "tessera/core/memory.h"
#include "tessera/core/trace.h"
#include "tessera/core/units.h"
#include "tessera/models/model.h"
#include "tessera/ops/optim/adamw.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/graph_step.h"
#include "tessera/train/loss_scaler.h"
#include "tessera/train/memory_record.h"
#include "tessera/train/optimizer.h"
#include "tessera/train/progress.h"
#include "tessera/train/train_step.h"

namespace tessera {

namespace fs = std::filesystem;
using json = nlohmann::json;

float lr_at(int64_t step, int64_t total, const TrainOptions& o) {
  if (o.warmup > 0 && step <= o.warmup) return o.lr * static_cast<float>(step) / static_cast<float>(o.warmup);
  const double span = std::max<int64_t>(1, total - o.warmup);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / span);
  const double min_lr = o.lr * o.min_lr_ratio;
  return static_cast<float>(min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (o.lr - min_lr));
}

CudaGraphMode cuda_graph_mode_from_name(const std::string& name) {
  if (name == "on") return CudaGraphMode::On;
  if (name == "off") return CudaGraphMode::Off;
  if (name == "auto") return CudaGraphMode::Auto;
  TS_THROW("--cuda-graph must be on or off, got '", name, "'");
}

std::string train_cuda_graph_refusal(const TrainOptions& o, const Context& ctx) {
  if (o.cuda_graph == CudaGraphMode::Off) return "--cuda-graph off";
  if (o.world_size > 1)
    return "data-parallel runs step eagerly: their collectives and the ranks' agreement are not captured";
  if (!ctx.is_cuda()) return "the CPU has no CUDA graphs";
  if (!cuda_graph_capture_supported())
    return "a Debug build synchronizes after every kernel launch (TS_CHECK_LAUNCH), which a capture forbids";
  if (plan_debug_from_env().poison_dead)
    return "TESSERA_POISON_DEAD checks the activation buffers on the host inside the step";
  return "";
}

LossScalerConfig train_loss_scaler_config(const TrainOptions& o) {
  return {.init_scale = o.loss_scale_init, .growth_interval = o.loss_scale_interval};
}

namespace {

// `opt` says how the messages name an option: "--" for the flags (--min-lr-ratio), "saved option " for a
// checkpoint's training options (saved option min_lr_ratio): out of range there, "--batch must be positive" named a
// flag the user of --resume never typed.
void validate(const TrainOptions& o, const std::string& opt = "--") {
  const auto n = [&](std::string flag) {
    if (opt == "--") return opt + flag;
    std::replace(flag.begin(), flag.end(), '-', '_');
    return opt + flag;
  };
  o.model.validate();
  TS_CHECK(o.steps > 0, n("steps"), " must be positive, got ", o.steps);
  TS_CHECK(o.batch > 0, n("batch"), " must be positive, got ", o.batch);
  TS_CHECK(o.seq > 0, n("seq"), " must be positive, got ", o.seq);
  TS_CHECK(o.seq <= o.model.max_seq, n("seq"), " ", o.seq, " is longer than the model's max_seq ", o.model.max_seq);
  TS_CHECK(o.accum > 0, n("accum"), " must be positive, got ", o.accum);
  // Each micro-batch keeps its loss on the device until the step's one read: a bound keeps that buffer small.
  TS_CHECK(o.accum <= kMaxAccum, n("accum"), " ", o.accum, " is more than ", kMaxAccum, " micro-batches a step");
  TS_CHECK(o.lr > 0 && std::isfinite(o.lr), n("lr"), " must be a positive number, got ", o.lr);
  TS_CHECK(o.warmup >= 0, n("warmup"), " must be >= 0, got ", o.warmup);
  TS_CHECK(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1, n("min-lr-ratio"), " must be in [0, 1], got ", o.min_lr_ratio);
  TS_CHECK(o.weight_decay >= 0 && std::isfinite(o.weight_decay), n("weight-decay"), " must be >= 0, got ",
           o.weight_decay);
  TS_CHECK(o.adam_eps > 0 && std::isfinite(o.adam_eps), "AdamW eps must be positive, got ", o.adam_eps);
  TS_CHECK(o.grad_clip >= 0 && std::isfinite(o.grad_clip), n("grad-clip"), " must be >= 0, got ", o.grad_clip);
  TS_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1, n("label-smoothing"), " must be in [0, 1), got ",
           o.label_smoothing);
  TS_CHECK(o.val_every >= 0, n("val-every"), " must be >= 0, got ", o.val_every);
  TS_CHECK(o.val_batches >= 0, n("val-batches"), " must be >= 0, got ", o.val_batches);
  TS_CHECK(o.ckpt_every >= -1, n("ckpt-every"), " must be >= 0, got ", o.ckpt_every);
  TS_CHECK(o.ckpt_minutes > 0 && std::isfinite(o.ckpt_minutes), n("ckpt-minutes"), " must be positive, got ",
           o.ckpt_minutes);
  TS_CHECK(o.stop_after >= 0, n("stop-after"), " must be >= 0, got ", o.stop_after);
  TS_CHECK(o.trace_step >= 0, n("trace-step"), " must be >= 1, got ", o.trace_step);  // 0: chosen in the run
  TS_CHECK(o.world_size >= 1,
           opt == "--" ? std::string("internal: world size ") : n("world-size") + " must be >= 1, got ", o.world_size);
}

}  // namespace

std::pair<double, double> validation_loss_share(Model& model, TokenStream& val, int B, int T, int max_batches, int rank,
                                                int world) {
  TS_CHECK(B > 0 && T > 0 && val.size() > static_cast<size_t>(T), "validation: the split holds ",
           counted(val.size(), "token"), ", fewer than one sequence of ", T, " + 1");
  TS_CHECK(world >= 1 && rank >= 0 && rank < world, "internal: validation share of rank ", rank, " of ", world);
  const uint64_t windows = (val.size() - 1) / static_cast<uint64_t>(T);
  const uint64_t G = static_cast<uint64_t>(B) * world;  // windows per global batch
  const uint64_t use = max_batches > 0 ? std::min<uint64_t>(windows, static_cast<uint64_t>(max_batches) * G) : windows;
  std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
  double sum = 0, count = 0;
  // Full global batches, rank r taking its B windows of each, then the windows left over one by one, every
  // world-th to rank r (a smaller B*T reuses the training plan). Window k starts at token k*T.
  uint64_t done = 0;
  for (; done + G <= use; done += G) {
    val.set_position((done + static_cast<uint64_t>(rank) * B) * T);
    val.next_batch(B, T, x.data(), y.data());
    sum += model.forward(x.data(), y.data(), B, T, {}) * B;
    count += B;
  }
  for (uint64_t k = 0; done < use; ++done, ++k) {
    if (k % world != static_cast<uint64_t>(rank)) continue;
    val.set_position(done * T);
    val.next_batch(1, T, x.data(), y.data());
    sum += model.forward(x.data(), y.data(), 1, T, {});
    count += 1;
  }
  return {sum, count};
}

double validation_loss(Model& model, TokenStream& val, int B, int T, int max_batches) {
  const auto [sum, count] = validation_loss_share(model, val, B, T, max_batches, /*rank=*/0, /*world=*/1);
  return sum / count;
}

void next_batch_share(TokenStream& data, int B, int T, int rank, int world, int32_t* inputs, int32_t* targets) {
  TS_CHECK(world >= 1 && rank >= 0 && rank < world, "internal: batch share of rank ", rank, " of ", world);
  const uint64_t rows = static_cast<uint64_t>(B) * T;
  const uint64_t need = rows * world + 1;
  TS_CHECK(data.size() >= need, "data: holds ", counted(data.size(), "token"),
           ", fewer than batch x ranks x seq + 1 = ", need);
  // Where next_batch(B*world, T) would start: here, or at 0 when the global batch would run past the end.
  const uint64_t start = data.position() + need > data.size() ? 0 : data.position();
  data.set_position(start + rank * rows);
  data.next_batch(B, T, inputs, targets);
  data.set_position(start + world * rows);
}

std::vector<std::pair<const char*, std::string>> trace_outputs(const TrainOptions& o) {
  // The plot's CSV too: a directory named FILE.csv would fail only after the training, beside the PNG it had
  // written.
  const std::string timeline_csv =
      o.memory_timeline.empty() ? "" : fs::path(o.memory_timeline).replace_extension(".csv").string();
  return {{"--trace", o.trace}, {"--memory-timeline", o.memory_timeline}, {"--memory-timeline's CSV", timeline_csv}};
}

namespace {
// --init-from: the checkpoint's model (tessera's or Hugging Face's), whose config the run takes.
void load_init_model(TrainOptions& o, TrainSetup& s) {
  const std::string given = o.init_from;
  o.init_from = resolve_checkpoint_dir(given);
  TS_CHECK(fs::exists(o.init_from), "--init-from: ", given, " does not exist", dangling_link_note(given),
           unfinished_checkpoint_note(given));
  TS_CHECK(fs::is_directory(o.init_from), "--init-from: ", given, " is not a checkpoint directory");
  s.init_model = load_checkpoint_model(o.init_from);
  o.model = s.init_model->config();
  // Its tokenizer.json is carried into the new run's checkpoints where tessera reads it (a byte-level BPE); another
  // kind (a Llama's SentencePiece-style file) is no reason to refuse the weights, and is left behind.
  try {
    s.state.tokenizer_json = read_dir_tokenizer(o.init_from);
  } catch (const Error&) {
    s.state.tokenizer_json.clear();
  }
}
}  // namespace

TrainSetup train_setup(TrainOptions o) {
  TrainSetup s;
  if (!o.resume.empty()) {
    // A crash between the two renames of a checkpoint swap (on file systems without RENAME_EXCHANGE) leaves the
    // previous checkpoint at <dir>.old: resume from it.
    const std::string given = o.resume;
    o.resume = resolve_checkpoint_dir(o.resume);
    if (!fs::exists(o.resume)) {
      // A stop that interrupted a run's first checkpoint (a second Ctrl-C while it was written) leaves <dir>.tmp and
      // no <dir>: say so, and point to the run's best/, which holds a whole checkpoint when the run validated.
      fs::path p = fs::path(given).lexically_normal();
      if (p.filename().empty()) p = p.parent_path();
      const fs::path best = (p.has_parent_path() ? p.parent_path() : fs::path(".")) / "best";
      std::string why = unfinished_checkpoint_note(given);
      if (p.filename() != "best" && holds_train_state(best.string()))
        why += "; its best checkpoint can be continued as a new run: --resume " + best.string() + " --out NEW";
      TS_THROW("--resume: ", given, " does not exist", dangling_link_note(given), why);
    }
    TS_CHECK(fs::is_directory(o.resume), "--resume: ", given, " is not a checkpoint directory");
    const int steps = o.steps, stop_after = o.stop_after, trace_step = o.trace_step;
    const std::string out = o.out, resume = o.resume, trace = o.trace, memory_timeline = o.memory_timeline;
    const bool progress = o.progress;
    const int world = o.world_size;
    s.model = load_checkpoint_model(o.resume);
    s.state = load_train_state(o.resume, *s.model);
    json saved;
    try {
      saved = json::parse(s.state.options_json);
    } catch (const json::exception&) {
      TS_THROW("checkpoint ", o.resume, ": training options are not valid JSON");
    }
    try {
      train_options_from_json(saved, o);
      // The saved run's options alone (--stop-after and --trace-step are this command's flags, checked below).
      TrainOptions run = o;
      run.stop_after = 0;
      run.trace_step = 1;
      if (run.seq == 0) run.seq = run.model.max_seq;  // 0: the model's max_seq, as below
      validate(run, "saved option ");
    } catch (const Error& e) {
      TS_THROW("checkpoint ", o.resume, ": ", e.what());
    }
    // Data inside the run directory (train's OUT/data) is found beside the checkpoint, wherever the run now lies
    // and whatever the working directory (through a symbolic link to the checkpoint too); other data by its
    // absolute path. (Checkpoints from before "data_in_run" hold the path as typed, from the working directory.)
    if (saved.contains("data_in_run") && saved["data_in_run"].is_string()) {
      const fs::path run = fs::weakly_canonical(fs::absolute(resume_dir(o.resume)).parent_path());
      o.data = (run / saved["data_in_run"].get<std::string>()).lexically_normal().string();
    }
    // The schedule spans the saved run's steps unless the caller extends it.
    if (steps > 0) o.steps = steps;
    o.stop_after = stop_after;
    o.trace = trace;
    o.memory_timeline = memory_timeline;
    o.trace_step = trace_step;
    o.out = out;
    o.resume = resume;
    o.progress = progress;
    // The global batch is batch x ranks, and the data position counts global batches: another world size
    // would continue a different run.
    TS_CHECK(o.world_size == world, "--resume: checkpoint ", o.resume, " was written by a run of ", o.world_size,
             o.world_size == 1 ? " process" : " ranks", "; resume it with ",
             o.world_size == 1 ? "a single process (no mpirun)" : "mpirun -np " + std::to_string(o.world_size),
             ", not ", world == 1 ? std::string("a single process") : std::to_string(world) + " ranks",
             " (the checkpoint loads anywhere as a model: tessera generate)");
    // When --steps is the saved run's, "nothing to do for --steps 7" would name a flag the user had not typed.
    TS_CHECK(s.state.step<o.steps, "--resume: the checkpoint is at step ", s.state.step, steps> 0
                 ? ", nothing to do for --steps " + std::to_string(o.steps)
                 : ", the last of the run's " + std::to_string(o.steps) + " steps",
             ": give --steps above ", s.state.step, " to train on");
    TS_CHECK(s.model->config().num_params() == o.model.num_params(), "checkpoint ", o.resume,
             ": its model and its saved training options disagree");
  }
  if (!o.init_from.empty()) load_init_model(o, s);
  if (o.seq == 0) o.seq = o.model.max_seq;
  validate(o);
  const int64_t first_step = s.model ? s.state.step + 1 : 1;  // the first step this run takes
  const auto check_step = [&](const char* flag, int64_t step, int64_t last) {
    TS_CHECK(step >= first_step && step <= last, flag, " ", step, " is not a step this run takes (", first_step, " to ",
             last, ")");
  };
  if (o.stop_after > 0) check_step("--stop-after", o.stop_after, o.steps);
  // A trace step after --stop-after would never be reached, and no trace written, without a word: refused here.
  const int64_t last_step = o.stop_after > 0 ? o.stop_after : o.steps;
  if (o.trace_step == 0) o.trace_step = static_cast<int>(std::min(first_step + 1, last_step));
  if (!o.trace.empty() || !o.memory_timeline.empty()) check_step("--trace-step", o.trace_step, last_step);
  // None of them may be a file the run itself writes or reads: a --trace of OUT/metrics.jsonl would replace the
  // metrics, one of a data shard the shard, and both would "succeed".
  // A resumed run's metrics are read, cut back and appended to: one that is not a readable file (a directory made
  // in its place) is refused here, not after the run's startup lines.
  const std::string metrics = (fs::path(o.out) / "metrics.jsonl").string();
  if (s.model && fs::exists(metrics)) {
    TS_CHECK(fs::is_regular_file(metrics), "output directory ", o.out,
             ": its metrics.jsonl is not a file: move it "
             "away to resume the run");
    // Read, then replaced whole (write_file_atomic): a read-only file in a writable directory resumes.
    TS_CHECK(::access(metrics.c_str(), R_OK) == 0, "output directory ", o.out,
             ": cannot read its metrics.jsonl: ", std::strerror(errno));
  }
  OutputFiles files;
  files.protect(metrics, "the run's metrics");
  files.protect_dir((fs::path(o.out) / "checkpoint").string(), "the run's checkpoint directory");
  files.protect_dir((fs::path(o.out) / "best").string(), "the run's best-checkpoint directory");
  if (fs::is_directory(o.data)) files.protect_dir(o.data, "the --data directory " + o.data + ", which the run reads");
  else files.protect(o.data, "the --data file, which the run reads");
  for (const auto& [flag, path] : trace_outputs(o)) {
    if (path.empty()) continue;
    files.claim(flag, path);
    const fs::path parent = fs::path(path).parent_path();
    TS_CHECK(parent.empty() || fs::is_directory(parent), flag, ": the directory of ", path, " does not exist",
             dangling_link_note(parent.string()));
    TS_CHECK(!fs::is_directory(path), flag, ": ", path, " is a directory, not a file to write");
    check_file_writable(path, flag);  // not only after the steps up to the traced one
  }
  TS_CHECK(o.memory_timeline.empty() || fs::path(o.memory_timeline).extension() == ".png", "--memory-timeline ",
           o.memory_timeline, " must end in .png (the CSV is written beside it as .csv)");
  s.context = std::make_unique<Context>(o.device.empty() ? Context::best_available() : Context::from_name(o.device));
  const bool gpu = s.context->is_cuda();
  const std::string prec = o.precision.empty() ? (gpu ? "bf16" : "f32") : o.precision;
  if (prec == "f32") s.dtype = DType::F32;
  else if (prec == "bf16") s.dtype = DType::BF16;
  else if (prec == "f16") s.dtype = DType::F16;
  else TS_THROW("--precision: unknown precision '", prec, "' (expected f32, bf16 or f16)");
  TS_CHECK(gpu || s.dtype == DType::F32, "--precision ", prec, " needs a GPU: the CPU reference trains in f32");
  TS_CHECK(o.master_weights || (gpu && s.dtype != DType::F32),
           "--master-weights off applies to bf16 or f16 "
           "parameters on a GPU (",
           prec, gpu ? " parameters are their own master" : " on the CPU", ")");
  // f16's range (6e-8 to 65504) loses small gradients without a loss scale; bf16 has f32's range.
  if (s.dtype == DType::F16) o.loss_scaling = true;
  if (o.loss_scaling) LossScaler{train_loss_scaler_config(o)};  // checks the flags now, before anything is written
  if (o.cuda_graph == CudaGraphMode::On) {
    const std::string why = train_cuda_graph_refusal(o, *s.context);
    TS_CHECK(why.empty(), "--cuda-graph on: ", why, "; drop the flag to step eagerly here");
  }
  // Host memory: on the CPU the f32 params, grads, AdamW m and v and the planned activations; on a GPU the f32
  // host copy that a checkpoint is written from. Both: the host copies of m and v a checkpoint carries
  // (TrainState) and the checkpoint writer's one temporary. (A resumed run already holds some of this: the
  // check is then conservative.)
  const size_t P = static_cast<size_t>(o.model.num_params());
  size_t need = checkpoint_save_host_bytes(o.model) + 8 * P;
  const GradMemory grads = train_grad_memory(o.accum);
  need += gpu ? 4 * P
              : (grads == GradMemory::Planned ? 12 : 16) * P +
                    model_activation_bytes(o.model, o.batch, o.seq, DType::F32, grads);
  // Stepping as CUDA graphs on a GPU, the graph step's pinned staging of a step's tokens and targets (accum
  // micro-batches of B x T, i32): at a large --accum that is gigabytes, and a cudaMallocHost that fails is a CUDA
  // error, not this line.
  if (gpu && train_cuda_graph_refusal(o, *s.context).empty())
    need += 2 * sizeof(int32_t) * static_cast<size_t>(o.accum) * static_cast<size_t>(o.batch) * o.seq;
  check_host_memory(need, "training this model", kTrainMemoryHint);
  s.options = std::move(o);
  return s;
}

void train_open_data(TrainSetup& s) {
  const TrainOptions& o = s.options;
  // A resumed run's data outside its own directory (a branch made with --resume A/checkpoint --out B reads A/data)
  // does not move with it, and --data cannot be given beside --resume: say where the run looks.
  if (s.model && !fs::exists(o.data)) {
    const fs::path run = fs::absolute(resume_dir(o.resume)).parent_path().lexically_normal();
    const fs::path rel = fs::absolute(o.data).lexically_normal().lexically_relative(run);
    const bool inside = !rel.empty() && *rel.begin() != "..";
    TS_THROW("--resume: the run's data, ", o.data, ", does not exist", dangling_link_note(o.data),
             inside ? ": it lay in the run's directory and was moved or removed; put it back there"
                    : " (data outside the run directory is found by its path, not beside the checkpoint): put it back "
                      "there, or link it there");
  }
  const std::vector<std::string> train_shards = find_shards(o.data, "train");
  // A resumed run continues on the data it trained on, or not at all: the same path may hold other data now (a
  // text prepared again into it, a shard set changed), and training on would silently continue another run. Checked
  // first: other data's tokens (ids past the vocab, too few for a batch, a position past the end) are not what is
  // wrong with it.
  const uint64_t fingerprint = data_fingerprint(o.data);
  TS_CHECK(!s.model || s.options.data_fingerprint == 0 || s.options.data_fingerprint == fingerprint,
           "--resume: ", o.data,
           " no longer holds the data this run trained on (its train shards differ in name, size or content)");
  // Shards that name their tokenizer (prepare --tokenizer): the model's vocab must hold all of it, and the run's
  // checkpoints carry it. Checked before the tokens: "token id 300 is not below the vocab 256" says less.
  int64_t tokenizer_vocab = 0;
  const std::string tokenizer = read_dir_tokenizer(o.data, &tokenizer_vocab);
  TS_CHECK(tokenizer_vocab <= o.model.vocab, "data ", o.data, " was prepared with a tokenizer of ", tokenizer_vocab,
           " tokens (its tokenizer.json), more than the model's vocab of ", o.model.vocab,
           s.model || !o.init_from.empty() ? " (the checkpoint fixes the model): give data of a tokenizer that fits"
                                           : ": give --vocab " + std::to_string(tokenizer_vocab) + " or more");
  if (!tokenizer.empty()) s.state.tokenizer_json = tokenizer;
  s.train_data = std::make_unique<TokenStream>(train_shards, o.model.vocab);
  s.val_data.reset();
  // A directory with train shards alone trains without validation, as one shard file does.
  const std::vector<std::string> val = fs::is_directory(o.data) ? list_shards(o.data, "val")
                                                                : std::vector<std::string>{};
  if (!val.empty()) s.val_data = std::make_unique<TokenStream>(val, o.model.vocab);
  const size_t need = static_cast<size_t>(o.batch) * o.world_size * o.seq + 1;
  TS_CHECK(s.train_data->size() >= need, "data ", o.data, ": the train split holds ",
           counted(s.train_data->size(), "token"), ", fewer than batch x seq + 1 = ", need,
           o.world_size > 1 ? " (batch x ranks x seq + 1: --batch is per rank)" : "");
  // Too small for one sequence at this length: no validation. The run says so at its start (no_validation).
  s.no_validation = "";
  if (!s.val_data) {
    s.no_validation = fs::is_directory(o.data) ? "--data " + o.data + " holds no val shards (val_*.bin)"
                                               : "--data " + o.data + " is one shard file, with no val split";
  } else if (s.val_data->size() <= static_cast<size_t>(o.seq)) {
    s.no_validation = "the val split holds " + counted(s.val_data->size(), "token") +
                      ", not more than one sequence of --seq " + std::to_string(o.seq);
    s.val_data.reset();
  }
  if (s.model) s.train_data->set_position(s.state.data_pos);  // checks the resume position
  s.options.data_fingerprint = fingerprint;
}

}  // namespace tessera
