#include "tessera/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "tessera/core/cuda_graph.h"
#include "tessera/bench/memory_timeline.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/fnv.h"
#include "tessera/core/json_fields.h"
#include "tessera/core/memory.h"
#include "tessera/core/trace.h"
#include "tessera/core/units.h"
#include "tessera/models/gpt.h"
#include "tessera/ops/optim/adamw.h"
#include "tessera/train/optimizer.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/graph_step.h"
#include "tessera/train/loss_scaler.h"
#include "tessera/train/progress.h"

namespace tessera {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path resume_dir(const std::string& resume) {
  const fs::path ck = fs::path(resume).lexically_normal();
  fs::path dir = ck.has_filename() ? ck : ck.parent_path();  // "run/checkpoint/": run/checkpoint
  std::error_code ec;
  const fs::path real = fs::canonical(dir, ec);
  if (ec) return dir;  // missing: train_setup says so
  const auto parent_of = [](const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); };
  if (real.filename() == dir.filename() && fs::equivalent(parent_of(dir), real.parent_path(), ec)) return dir;
  // The links to the checkpoint, one at a time ("latest" -> RUN/checkpoint -> ../arch/step2): the first run's own
  // checkpoint/ met on the way names the run.
  fs::path p = dir;
  for (int hop = 0; hop < 40; ++hop) {
    const bool own_name = p.filename() == "checkpoint" || p.filename() == "checkpoint.old";
    if (own_name && fs::exists(parent_of(p) / "metrics.jsonl", ec)) return p;
    if (!fs::is_symlink(p, ec)) break;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = (target.is_absolute() ? target : parent_of(p) / target).lexically_normal();
  }
  return real;
}

json train_options_to_json(const TrainOptions& o) {
  // "data": absolute (what an older tessera, which knows no "data_in_run", reads); "data_in_run": the same path
  // relative to the run directory when it lies inside it.
  std::string data = o.data, in_run;
  if (!data.empty()) {
    const fs::path abs = fs::absolute(o.data).lexically_normal();
    const auto inside = [](const fs::path& rel) { return !rel.empty() && *rel.begin() != ".." && rel != "."; };
    fs::path rel = abs.lexically_relative(fs::absolute(o.out).lexically_normal());
    // As the file system resolves them too: a run under a symbolic link (home/x -> /scratch/x) compared its data's
    // resolved path with the link's, found it outside, and lost data_in_run (a moved run then sought the old data).
    std::error_code e1, e2;
    const fs::path real_data = fs::weakly_canonical(abs, e1), real_out = fs::weakly_canonical(fs::absolute(o.out), e2);
    if (!inside(rel) && !e1 && !e2) rel = real_data.lexically_relative(real_out);
    if (inside(rel)) in_run = rel.string();
    data = abs.string();
  }
  json j = {{"model", model_config_to_json(o.model)}, {"data", data},
          {"data_fingerprint", o.data_fingerprint}, {"batch", o.batch}, {"seq", o.seq},
          {"accum", o.accum}, {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio}, {"warmup", o.warmup},
          {"weight_decay", o.weight_decay}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"adam_eps", o.adam_eps}, {"grad_clip", o.grad_clip},
          {"label_smoothing", o.label_smoothing}, {"seed", o.seed}, {"val_every", o.val_every},
          {"val_batches", o.val_batches}, {"ckpt_every", o.ckpt_every}, {"ckpt_minutes", o.ckpt_minutes},
          {"steps", o.steps}, {"world_size", o.world_size}};
  if (!in_run.empty()) j["data_in_run"] = in_run;
  return j;
}

void train_options_from_json(const json& j, TrainOptions& o) {
  // Each field checked by type and named when missing or mistyped; the keys added over time have defaults.
  constexpr std::string_view kWhere = "training options";
  // Named apart from model.safetensors's tessera_config, whose errors say "config: ...".
  o.model = model_config_from_json(json_field(j, "model", kWhere), "training options: model");
  o.data = json_string(j, "data", kWhere);  // resolved against the run directory by train_setup ("data_base")
  // Absent in checkpoints written before it was saved.
  o.data_fingerprint = j.contains("data_fingerprint") ? json_u64(j, "data_fingerprint", kWhere) : 0;
  o.batch = json_int(j, "batch", kWhere);
  o.seq = json_int(j, "seq", kWhere);
  o.accum = json_int(j, "accum", kWhere);
  o.lr = static_cast<float>(json_number(j, "lr", kWhere));
  o.min_lr_ratio = static_cast<float>(json_number(j, "min_lr_ratio", kWhere));
  o.warmup = json_int(j, "warmup", kWhere);
  o.weight_decay = static_cast<float>(json_number(j, "weight_decay", kWhere));
  o.beta1 = static_cast<float>(json_number(j, "beta1", kWhere));
  o.beta2 = static_cast<float>(json_number(j, "beta2", kWhere));
  // Absent in checkpoints written before it was saved.
  o.adam_eps = j.contains("adam_eps") ? static_cast<float>(json_number(j, "adam_eps", kWhere)) : 1e-8f;
  o.grad_clip = static_cast<float>(json_number(j, "grad_clip", kWhere));
  o.label_smoothing = static_cast<float>(json_number(j, "label_smoothing", kWhere));
  o.seed = json_u64(j, "seed", kWhere);
  o.val_every = json_int(j, "val_every", kWhere);
  o.val_batches = json_int(j, "val_batches", kWhere);
  o.ckpt_every = json_int(j, "ckpt_every", kWhere);
  // Absent in checkpoints written before it existed.
  o.ckpt_minutes = j.contains("ckpt_minutes") ? json_number(j, "ckpt_minutes", kWhere) : 10.0;
  o.steps = json_int(j, "steps", kWhere);
  // Absent in checkpoints of single-process runs before it existed.
  o.world_size = j.contains("world_size") ? json_int(j, "world_size", kWhere) : 1;
}

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

namespace {

LossScalerConfig loss_scaler_config(const TrainOptions& o) {
  return {.init_scale = o.loss_scale_init, .growth_interval = o.loss_scale_interval};
}

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

// Keeps the metrics records of steps <= `keep_step` (all when resuming at the end of them), drops the rest.
// Returns the lowest val_loss kept and its step ({0, 0} when none). Steps missing after the first one kept (a file
// cut short or edited; not those before it, which a run branched with --out NEW never had) and unreadable lines
// before the last readable one get a warning on stderr: the resumed run's metrics then skip them. The warning is
// given once: the kept record of the highest step notes how many steps were missing then ("missing_steps"), and a
// later resume warns only when more are (it counts the steps, not which: a gap filled and another opened of no more
// steps goes unsaid).
// expect_from: the run resumes in the directory of its checkpoint, whose metrics should hold every step from
// expect_from (TrainState::metrics_from) to keep_step; with none at all (the file deleted or emptied) that is said
// too. 0: a run branched into a new --out, which has none yet; so has a branch that stopped in its first step and
// is resumed in place (expect_from = keep_step + 1).
std::pair<double, int64_t> trim_metrics(const std::string& path, int64_t keep_step, int64_t expect_from) {
  std::vector<std::string> kept;
  double best = 0;
  int64_t best_step = 0, acknowledged = 0;
  std::vector<int64_t> steps;
  size_t unreadable = 0, torn = 0;  // torn: unreadable lines with no readable one after them yet
  size_t last = 0;                  // the kept record of the highest step
  if (keep_step > 0 && fs::exists(path)) {
    std::istringstream in(read_file_text(path, "metrics"));
    std::string line;
    while (std::getline(in, line)) {
      try {
        const json rec = json::parse(line);
        const int64_t step = rec.at("step").get<int64_t>();
        if (step > keep_step) continue;
        // Fields a hand edit may have made other than numbers are ignored, not taken for damage: the line is kept.
        const auto number = [&](const char* key) { return rec.contains(key) && rec[key].is_number(); };
        if (kept.empty() || step >= steps[last]) last = kept.size();
        kept.push_back(line);
        steps.push_back(step);
        unreadable += torn;
        torn = 0;
        if (number("missing_steps"))
          acknowledged = std::max(acknowledged, static_cast<int64_t>(rec["missing_steps"].get<double>()));
        if (number("val_loss") && (best_step == 0 || rec["val_loss"].get<double>() < best)) {
          best = rec["val_loss"].get<double>();
          best_step = step;
        }
      } catch (const json::exception&) {
        ++torn;  // dropped: at the end, the torn last line of a run killed mid-write (no warning); else damage
      }
    }
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  const int64_t missing =
      steps.empty() ? 0 : keep_step - steps.front() + 1 - static_cast<int64_t>(steps.size());
  if (expect_from >= 1 && expect_from <= keep_step && steps.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: warning: %s: no record of steps %lld to %lld (the file is %s); the resumed run's "
                 "records follow step %lld without them\n", path.c_str(), static_cast<long long>(expect_from),
                 static_cast<long long>(keep_step), !fs::exists(path) ? "missing" : torn ? "unreadable" : "empty",
                 static_cast<long long>(keep_step));
  }
  if (missing > acknowledged || unreadable > 0) {
    std::string what = unreadable ? counted(unreadable, "unreadable line") + " dropped" : "cut short or edited";
    if (missing > 0) {
      int64_t first = keep_step;  // the first missing step: where the run of consecutive steps breaks
      for (size_t i = 1; i <= steps.size(); ++i)
        if (i == steps.size() || steps[i] != steps[i - 1] + 1) {
          first = steps[i - 1] + 1;
          break;
        }
      what = "no record of " + std::to_string(missing) + " of steps " + std::to_string(steps.front()) + " to " +
             std::to_string(keep_step) + ", the first missing step " + std::to_string(first) + "; " + what;
    }
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: warning: %s: %s; the resumed run's records follow step %lld without them\n",
                 path.c_str(), what.c_str(), static_cast<long long>(keep_step));
    if (missing > acknowledged) {
      nlohmann::ordered_json rec = nlohmann::ordered_json::parse(kept[last]);  // the writer's key order
      rec["missing_steps"] = missing;
      kept[last] = rec.dump();
    }
  }
  std::string text;
  for (const std::string& line : kept) text += line + "\n";
  write_file_atomic(path, text);
  return {best, best_step};
}

}  // namespace

std::pair<double, double> validation_loss_share(Gpt& model, TokenStream& val, int B, int T, int max_batches, int rank,
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

double validation_loss(Gpt& model, TokenStream& val, int B, int T, int max_batches) {
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

namespace {
// Adds a split's shards to f: names, sizes, and their first and last 64 KiB (a missing split as such).
void add_split(Fnv& f, const std::string& data, const char* split) {
  std::vector<std::string> shards;
  try {
    shards = find_shards(data, split);
  } catch (const Error&) {
    f.add(std::string("no ") + split);
    return;
  }
  constexpr size_t kEdge = 64 * 1024;
  std::vector<char> buf(kEdge);
  for (const std::string& path : shards) {
    f.add(fs::path(path).filename().string());
    std::FILE* in = std::fopen(path.c_str(), "rb");
    TS_CHECK(in, "data: cannot read ", path);
    std::fseek(in, 0, SEEK_END);
    const long size = std::ftell(in);
    f.add(&size, sizeof size);
    for (const long at : {0L, std::max(0L, size - static_cast<long>(kEdge))}) {
      std::fseek(in, at, SEEK_SET);
      f.add(buf.data(), std::fread(buf.data(), 1, kEdge, in));
    }
    std::fclose(in);
  }
}
}  // namespace

uint64_t data_fingerprint(const std::string& data) {
  Fnv f;
  add_split(f, data, "train");
  return f.h;
}

uint64_t run_fingerprint(const TrainOptions& o) {
  Fnv f;
  // Everything that shapes the run's numbers (the device does not: ranks own different GPUs). The data counts by
  // its shards' names and contents (add_split below), not by its path: ranks started in different working
  // directories with a relative --data hold different absolute paths to the same shards, and were refused as
  // disagreeing. --out and --resume still count as given (the other ranks read a --text run's OUT/data).
  json options = train_options_to_json(o);
  options.erase("data");
  options.erase("data_in_run");
  f.add(options.dump());
  f.add(o.out);
  f.add(o.resume);
  f.add(o.precision);
  f.add(std::to_string(o.stop_after));
  for (const char* split : {"train", "val"}) {  // a missing split is part of what must agree
    if (split == std::string("val") && !fs::is_directory(o.data)) continue;
    add_split(f, o.data, split);
  }
  return f.h;
}

std::vector<std::pair<const char*, std::string>> trace_outputs(const TrainOptions& o) {
  // The plot's CSV too: a directory named FILE.csv failed only after the training, beside the PNG it had written.
  const std::string timeline_csv =
      o.memory_timeline.empty() ? "" : fs::path(o.memory_timeline).replace_extension(".csv").string();
  return {{"--trace", o.trace}, {"--memory-timeline", o.memory_timeline}, {"--memory-timeline's CSV", timeline_csv}};
}

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
    // "nothing to do for --steps 7" named a flag the user had not typed when --steps was the saved run's.
    TS_CHECK(s.state.step < o.steps, "--resume: the checkpoint is at step ", s.state.step,
             steps > 0 ? ", nothing to do for --steps " + std::to_string(o.steps)
                       : ", the last of the run's " + std::to_string(o.steps) + " steps",
             ": give --steps above ", s.state.step, " to train on");
    TS_CHECK(s.model->config().num_params() == o.model.num_params(), "checkpoint ", o.resume,
             ": its model and its saved training options disagree");
  }
  if (o.seq == 0) o.seq = o.model.max_seq;
  validate(o);
  const int64_t first_step = s.model ? s.state.step + 1 : 1;  // the first step this run takes
  const auto check_step = [&](const char* flag, int64_t step, int64_t last) {
    TS_CHECK(step >= first_step && step <= last, flag, " ", step, " is not a step this run takes (", first_step,
             " to ", last, ")");
  };
  if (o.stop_after > 0) check_step("--stop-after", o.stop_after, o.steps);
  // A trace step after --stop-after was never reached, and no trace written, without a word.
  const int64_t last_step = o.stop_after > 0 ? o.stop_after : o.steps;
  if (o.trace_step == 0) o.trace_step = static_cast<int>(std::min(first_step + 1, last_step));
  if (!o.trace.empty() || !o.memory_timeline.empty()) check_step("--trace-step", o.trace_step, last_step);
  // None of them may be a file the run itself writes or reads: a --trace of OUT/metrics.jsonl replaced the
  // metrics, one of a data shard replaced the shard (both "succeeded").
  // A resumed run's metrics are read, cut back and appended to: one that is not a readable file (a directory made
  // in its place) failed only after the run's startup lines.
  const std::string metrics = (fs::path(o.out) / "metrics.jsonl").string();
  if (s.model && fs::exists(metrics)) {
    TS_CHECK(fs::is_regular_file(metrics), "output directory ", o.out, ": its metrics.jsonl is not a file: move it "
             "away to resume the run");
    // Read, then replaced whole (write_file_atomic): a read-only file in a writable directory resumes.
    TS_CHECK(::access(metrics.c_str(), R_OK) == 0, "output directory ", o.out, ": cannot read its metrics.jsonl: ",
             std::strerror(errno));
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
  TS_CHECK(o.master_weights || (gpu && s.dtype != DType::F32), "--master-weights off applies to bf16 or f16 "
           "parameters on a GPU (", prec, gpu ? " parameters are their own master" : " on the CPU", ")");
  // f16's range (6e-8 to 65504) loses small gradients without a loss scale; bf16 has f32's range.
  if (s.dtype == DType::F16) o.loss_scaling = true;
  if (o.loss_scaling) LossScaler{loss_scaler_config(o)};  // checks the flags now, before anything is written
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
  need += gpu ? 4 * P : (grads == GradMemory::Planned ? 12 : 16) * P + Gpt::activation_bytes(o.model, o.batch, o.seq,
                                                                                            DType::F32, grads);
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
  TS_CHECK(!s.model || s.options.data_fingerprint == 0 || s.options.data_fingerprint == fingerprint, "--resume: ",
           o.data, " no longer holds the data this run trained on (its train shards differ in name, size or content)");
  s.train_data = std::make_unique<TokenStream>(train_shards, o.model.vocab);
  s.val_data.reset();
  // A directory with train shards alone trains without validation, as one shard file does (it was refused).
  const std::vector<std::string> val =
      fs::is_directory(o.data) ? list_shards(o.data, "val") : std::vector<std::string>{};
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

TrainResult train(TrainOptions o) { return train(train_setup(std::move(o))); }

TrainResult train(TrainSetup setup, const TrainControl& control) {
  TrainOptions& o = setup.options;
  TrainState& state = setup.state;
  DataParallel* dp = setup.parallel;
  const int rank = dp ? dp->rank() : 0, world = dp ? dp->world_size() : 1;
  const bool lead = rank == 0;  // the one rank that writes files and prints
  TS_CHECK(o.world_size == world, "internal: options for ", o.world_size, " ranks, run on ", world);
  const bool resuming = setup.model != nullptr;
  if (!setup.train_data) train_open_data(setup);
  TokenStream& train_data = *setup.train_data;
  TokenStream* val_data = setup.val_data.get();
  // Before anything is written: every rank must be training the same run.
  if (dp) dp->check_consistent(run_fingerprint(o), "the training options, the data and the world size");
  if (lead) ensure_writable_dir(o.out);
  if (!setup.context) setup.context = std::make_unique<Context>(Device::cpu());
  Context& ctx = *setup.context;
  // What the device holds before the model: --memory-timeline's measured series is the memory in use above it.
  const size_t memory_baseline = ctx.is_cuda() ? ctx.device_memory_used() : 0;
  // The model on the run's device: a resumed model (loaded on the CPU) moves there through its f32 values.
  std::unique_ptr<Gpt> model = std::move(setup.model);
  if (!model || !ctx.device().is_cpu() || setup.dtype != DType::F32) {
    auto on_device = std::make_unique<Gpt>(o.model, ctx, setup.dtype,
                                           o.master_weights ? MasterWeights::On : MasterWeights::Off);
    if (model) on_device->params().write_f32(model->params().read_f32(model->context()), ctx);
    model = std::move(on_device);
  }
  if (!resuming) {
    model->init_weights(o.seed);
    state.rng = RngState{o.seed * 0x9E3779B97F4A7C15ull + 1, 0};
  }
  // Without accumulation the gradients share the memory of activations that die before them (models/gpt.h).
  model->set_grad_memory(train_grad_memory(o.accum));
  if (dp) dp->attach(*model);
  const AdamWConfig adam{.beta1 = o.beta1, .beta2 = o.beta2, .eps = o.adam_eps, .weight_decay = o.weight_decay,
                         .grad_clip = o.grad_clip};
  std::unique_ptr<Optimizer> optimizer =
      dp ? dp->make_optimizer(*model, adam) : std::make_unique<AdamW>(model->params(), adam, ctx);
  if (!resuming) state.optimizer_step = 0;
  if (state.optimizer_step < 0) state.optimizer_step = state.step;
  if (resuming) {
    train_data.set_position(state.data_pos);
    optimizer->load_state(state.adam_m, state.adam_v, state.optimizer_step);
  }
  // Loss scaling: the scale of a resumed scaled run, else the initial one.
  StepLossScaling scaling = o.loss_scaling ? StepLossScaling(loss_scaler_config(o)) : StepLossScaling();
  if (o.loss_scaling && resuming && state.loss_scale > 0)
    scaling.scaler().set_state(state.loss_scale, state.loss_scale_good_steps);
  if (!o.loss_scaling) state.loss_scale = 0;
  if (scaling.on()) {  // a checkpoint before the first step (an abandoned one) carries the scale it starts from
    state.loss_scale = scaling.scale();
    state.loss_scale_good_steps = scaling.scaler().good_steps();
  }
  if (control.on_start) control.on_start(optimizer->state_bytes(), 8 * model->params().size());
  const std::string metrics_path = (fs::path(o.out) / "metrics.jsonl").string();
  const std::string ckpt_dir = (fs::path(o.out) / "checkpoint").string();
  const std::string best_dir = (fs::path(o.out) / "best").string();
  int64_t saved_step = -1;  // the step <out>/checkpoint holds, -1 if unknown or none
  if (resuming) {
    std::error_code ec;
    if (fs::equivalent(o.resume, ckpt_dir, ec)) saved_step = state.step;
  }
  // A checkpoint carries the moments as host vectors, read from the optimizer when one is written (a sharded
  // optimizer gathers them to rank 0, which writes).
  auto save = [&](const std::string& dir) {
    optimizer->read_state(model->params(), state.adam_m, state.adam_v);
    if (lead) save_checkpoint(dir, *model, &state);
    if (dir == ckpt_dir) saved_step = state.step;
  };
  state.options_json = train_options_to_json(o).dump();
  TrainResult result;
  std::FILE* metrics = nullptr;
  bool seed_best = false;  // the branch's starting model becomes its best/ (below)
  if (lead) {
    // The best so far of a resumed run is in its metrics (best/ was written at that step). Where they hold none
    // (metrics.jsonl deleted, or only damaged lines), best/ records its own loss: without it the first validation
    // after the resume replaced best/, however much worse it was.
    std::error_code ec;  // a checkpoint of this run: its directory is in --out (RUN/checkpoint, RUN/checkpoint.old)
    const fs::path run_dir = resuming ? resume_dir(o.resume).parent_path() : fs::path();
    const bool in_place = resuming && fs::equivalent(run_dir.empty() ? "." : run_dir, o.out, ec);
    // A branch into a new --out records its steps from its first on; a resume in place keeps its checkpoint's.
    if (resuming && !in_place) state.metrics_from = state.step + 1;
    std::tie(result.best_val_loss, result.best_step) =
        trim_metrics(metrics_path, resuming ? state.step : 0, in_place ? state.metrics_from : 0);
    if (resuming && result.best_step == 0 && fs::exists(fs::path(best_dir) / "model.safetensors")) {
      const auto record = best_record(best_dir);
      if (record && record->second <= state.step) {
        std::tie(result.best_val_loss, result.best_step) = *record;
      } else if (!record) {
        std::fflush(stdout);
        std::fprintf(stderr, "tessera: warning: %s holds no validation record and %s does not record its loss: the "
                     "resumed run's first validation will replace it\n", metrics_path.c_str(), best_dir.c_str());
      }
    }
    // A branch from a best/ that records its loss (--resume RUN/best --out NEW): that model, validated at the step
    // it starts from, is the new run's best so far, and its best/ starts as that model. Before, the branch's first
    // validation became its best/ however much worse it was (a new user's trial: step 7 at 4.2515 over the step-6
    // model at 4.0943 that the branch began with). Without checkpoints there is no best/ to start.
    if (resuming && !in_place && result.best_step == 0 && o.checkpoints) {
      const auto record = best_record(o.resume);
      if (record && record->second == state.step) {
        std::tie(result.best_val_loss, result.best_step) = *record;
        seed_best = true;
      }
    }
    metrics = std::fopen(metrics_path.c_str(), "ab");
    TS_CHECK(metrics, "cannot write ", metrics_path);
  }
  if (dp) {  // the other ranks learn rank 0's best so far, which decides when best/ is written
    std::vector<double> best{result.best_val_loss, static_cast<double>(result.best_step), seed_best ? 1.0 : 0.0};
    dp->sum_host(best);
    result.best_val_loss = best[0];
    result.best_step = static_cast<int64_t>(best[1]);
    seed_best = best[2] > 0;
  }
  if (seed_best) {  // on every rank: ZeRO-1 gathers the optimizer state to rank 0 for the save
    state.val_loss = result.best_val_loss;  // recorded in best/ alone
    save(best_dir);
    state.val_loss = std::numeric_limits<double>::quiet_NaN();
  }
  if (result.best_step > 0) result.best_checkpoint = best_dir;
  struct Closer {
    std::FILE* f;
    ~Closer() {
      if (f) std::fclose(f);
    }
  } closer{metrics};

  std::vector<int32_t> x(static_cast<size_t>(o.batch) * o.seq), y(x.size());
  ProgressBar bar(o.steps, state.step, o.progress && lead);
  const auto t_start = std::chrono::steady_clock::now();
  auto last_ckpt = t_start;
  // Each rank draws its own dropout masks: rank r's Philox seed is offset by r (rank 0 keeps the run's seed, so a
  // single process is unchanged), while the stream counter advances alike on every rank and is what is saved.
  RngState rank_rng = state.rng;
  rank_rng.seed += static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull;
  // The micro-steps' mean losses of one step, on the device (the loss's stat dtype: f32, or f64 for an f64 model).
  const size_t loss_bytes = model->dtype() == DType::F64 ? sizeof(double) : sizeof(float);
  const Buffer step_losses(static_cast<size_t>(o.accum) * loss_bytes, ctx.device(), "the step's micro-batch losses");
  // The step as CUDA graphs where it can be (train/graph_step.h): the same launches, replayed, so the same bits.
  std::unique_ptr<GraphStep> graph;
  // The test hooks that run on the host before the optimizer; without them the step is one graph.
  const bool host_hooks = control.before_grad_sync || control.before_optimizer_step;
  if (train_cuda_graph_refusal(o, ctx).empty() && !model->plan_debug().poison_dead)
    graph = std::make_unique<GraphStep>(*model, optimizer.get(),
                                        GraphStepConfig{.B = o.batch, .T = o.seq, .accum = o.accum,
                                                        .losses = step_losses.data(),
                                                        .label_smoothing = o.label_smoothing,
                                                        .skip_nonfinite = scaling.on(),
                                                        .host_between = host_hooks,
                                                        .in_capture = control.in_graph_capture});
  // A failed capture's batches (this rank's share of each micro-step), which that step then runs eagerly.
  std::vector<int32_t> fallback_x, fallback_y;
  for (int64_t step = state.step + 1; step <= o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const float lr = lr_at(step, o.steps, o);
    // --trace: this step's ranges and counters into a Chrome trace (rank 0's; written after the step).
    std::unique_ptr<Tracer> tracer;
    if (!o.trace.empty() && step == o.trace_step && lead) {
      tracer = std::make_unique<Tracer>(ctx);
      model->set_tracer(tracer.get());
    }
    const double scale = scaling.scale();
    // --memory-timeline on a GPU also measures the device memory at the end of the step's forward, backward and
    // optimizer (a synchronize each, in this one step, which runs eagerly for it).
    std::vector<size_t> measured;
    const bool measure = !o.memory_timeline.empty() && step == o.trace_step && lead && ctx.is_cuda();
    auto sample = [&] {
      if (!measure) return;
      ctx.synchronize();
      const size_t used = ctx.device_memory_used();
      measured.push_back(used > memory_baseline ? used - memory_baseline : 0);
    };
    TS_CHECK(optimizer->step_count() == state.optimizer_step, "internal: optimizer at step ", optimizer->step_count(),
             ", the run's count of applied steps ", state.optimizer_step);
    bool stepped = false;
    if (graph && !tracer && !measure) {
      // The batches go straight into the graph's pinned staging, checked there; the graph copies them in.
      for (int micro = 0; micro < o.accum; ++micro) {
        next_batch_share(train_data, o.batch, o.seq, rank, world, graph->tokens(micro), graph->targets(micro));
        model->check_tokens(graph->tokens(micro), o.batch, o.seq);
      }
      rank_rng.next_stream = state.rng.next_stream;
      try {
        std::function<void()> between;
        if (host_hooks)
          between = [&] {
            // World size 1: the last micro-step's backward is done and there is no reduction.
            if (control.before_grad_sync) control.before_grad_sync(step, *model);
            if (control.before_optimizer_step) control.before_optimizer_step(step, *model);
          };
        graph->run(lr, scale, &rank_rng, between);
        state.rng.next_stream = rank_rng.next_stream;
        stepped = true;
      } catch (const CudaGraphCaptureError& e) {
        // A capture fails before anything of the step is queued, so the step can still run eagerly, on the batches
        // already drawn. With --cuda-graph on the graph was asked for: stop with the error instead.
        if (o.cuda_graph == CudaGraphMode::On) throw;
        if (lead)
          std::fprintf(stderr, "tessera: warning: %s; stepping eagerly from step %lld\n", e.what(),
                       static_cast<long long>(step));
        const size_t n = x.size();
        fallback_x.resize(n * o.accum);
        fallback_y.resize(n * o.accum);
        for (int micro = 0; micro < o.accum; ++micro) {
          std::memcpy(fallback_x.data() + micro * n, graph->tokens(micro), n * sizeof(int32_t));
          std::memcpy(fallback_y.data() + micro * n, graph->targets(micro), n * sizeof(int32_t));
        }
        result.graph_steps = graph->replays();
        result.graph_captures = graph->captures();
        result.graphs_per_step = graph->graphs_per_step();
        graph.reset();
      }
    }
    bool abandoned = false;
    if (!stepped) {
      model->zero_grad();
      const uint64_t rng_at_start = state.rng.next_stream;
      for (int micro = 0; micro < o.accum; ++micro) {
        // A stop asked for between the micro-batches of a step (a long one: --accum) abandons it, so that an
        // interrupt is prompt: nothing of it has been applied, and the checkpoint is the last whole step's. A
        // data-parallel step runs to its end (its ranks must issue the same collectives).
        if (micro > 0 && !dp && control.stop && *control.stop != 0) {
          state.rng.next_stream = rng_at_start;
          abandoned = true;
          break;
        }
        if (fallback_x.empty()) {
          next_batch_share(train_data, o.batch, o.seq, rank, world, x.data(), y.data());
        } else {
          std::memcpy(x.data(), fallback_x.data() + micro * x.size(), x.size() * sizeof(int32_t));
          std::memcpy(y.data(), fallback_y.data() + micro * y.size(), y.size() * sizeof(int32_t));
        }
        rank_rng.next_stream = state.rng.next_stream;
        // The forward also writes the loss gradient (one pass over the logits fewer); backward continues from it.
        model->forward_async(x.data(), y.data(), o.batch, o.seq,
                             {.training = true, .label_smoothing = o.label_smoothing, .rng = &rank_rng,
                              .loss_grad_scale = scale / o.accum});
        if (micro == 0) sample();  // after the forward
        state.rng.next_stream = rank_rng.next_stream;
        // Each micro-step's mean loss stays on the device until the step's one read, after the optimizer.
        copy_bytes(static_cast<char*>(step_losses.data()) + micro * loss_bytes, ctx.device(), model->loss().data(),
                   ctx.device(), loss_bytes, ctx);
        // Only the last micro-step of a step communicates: the accumulated gradient is reduced once.
        const bool sync = micro == o.accum - 1;
        if (dp) dp->begin_backward(*model, sync);
        // With loss scaling the gradients accumulate as S * g; the optimizer divides S out again.
        model->backward(scale / o.accum);
        if (sync && control.before_grad_sync) control.before_grad_sync(step, *model);
        if (dp) dp->end_backward(*model, sync);
      }
      fallback_x.clear();  // later steps draw their batches again
      if (abandoned) {
        if (tracer) model->set_tracer(nullptr);
        if (o.checkpoints && saved_step != state.step) {  // not when <out>/checkpoint already holds that step
          save(ckpt_dir);
          if (control.on_checkpoint) control.on_checkpoint(state.step);
        }
        result.interrupted = true;
        result.last_step = state.step;
        break;
      }
      sample();  // after the backward (and the gradients' reduction)
      if (control.before_optimizer_step) control.before_optimizer_step(step, *model);
      {
        const TraceScope optim(tracer.get(), "OPTIM_STEP");
        optimizer->step(model->params(), lr, scaling.grad_scaling());
      }
      sample();  // after the optimizer
    }
    if (tracer) {
      model->set_tracer(nullptr);
      ctx.synchronize();
      tracer->write_chrome_json(o.trace, step);
      if (lead) result.traced.push_back(o.trace);
    }
    if (!o.memory_timeline.empty() && step == o.trace_step && lead) {
      // The plan's memory per op: the same for a graph step as for an eager one (the plan fixes every address); on a
      // GPU with the measured memory at the end of each phase.
      fs::path csv = o.memory_timeline;
      csv.replace_extension(".csv");
      write_memory_timeline(o.memory_timeline, csv.string(),
                            memory_timeline_points(*model, optimizer->state_bytes(), measured),
                            o.model.preset + ", B " + std::to_string(o.batch) + " x T " + std::to_string(o.seq) +
                                ", step " + std::to_string(step) +
                                (measured.empty() ? " (planned)" : " (planned; measured at the phase ends)"));
      result.traced.push_back(o.memory_timeline);
      result.traced.push_back(csv.string());
    }
    // The one read of the step: its norm, and with it whether an overflow made the optimizer skip it.
    const StepReport report = optimizer->read_step();
    const double norm = report.grad_norm;
    // A non-finite gradient that was not skipped (no loss scaling) has been applied: the parameters are NaN now.
    // Stop before anything is saved over the last good checkpoint.
    // What is left: a run with no checkpoint keeps its metrics (the losses up to here), so that the same command
    // is then refused as one into a run; the line says how to train there again.
    const auto left = [&] {
      if (saved_step >= 0) return std::string("; the last checkpoint was not overwritten)");
      if (resuming) return "; no checkpoint was written, and " + o.resume + " is as it was)";
      if (state.step == 0) return std::string("; no checkpoint was written)");  // nor a line of metrics
      return "; no checkpoint was written; " + metrics_path + " keeps the losses: train into " + o.out +
             " again with --force)";
    };
    TS_CHECK(report.skipped || std::isfinite(norm), "training diverged: the gradient norm is ", norm,
             " at step ", step, " (try a lower --lr", left());
    // The micro-steps' losses: the stream is idle after read_step, so this copy waits for nothing.
    double loss = 0;
    {
      std::vector<unsigned char> raw(static_cast<size_t>(o.accum) * loss_bytes);
      copy_bytes(raw.data(), Device::cpu(), step_losses.data(), ctx.device(), raw.size(), ctx);
      std::vector<double> each(static_cast<size_t>(o.accum));
      for (int micro = 0; micro < o.accum; ++micro) {
        if (loss_bytes == sizeof(double)) std::memcpy(&each[micro], raw.data() + micro * sizeof(double), sizeof(double));
        else {
          float f = 0;
          std::memcpy(&f, raw.data() + micro * sizeof(float), sizeof(float));
          each[micro] = f;
        }
        TS_CHECK(std::isfinite(each[micro]), "training diverged: loss is ", each[micro], " at step ", step,
                 " (try a lower --lr", left());
        loss += each[micro] / o.accum;
      }
    }
    scaling.update(report, step);
    if (scaling.on()) {
      state.loss_scale = scaling.scale();
      state.loss_scale_good_steps = scaling.scaler().good_steps();
    }
    if (report.skipped) result.skipped_steps++;
    state.optimizer_step = optimizer->step_count();
    state.step = step;
    state.data_pos = train_data.position();
    result.peak_device_bytes = std::max(result.peak_device_bytes, ctx.device_memory_used());
    const auto t1 = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(t1 - t0).count();
    const double tps = static_cast<double>(o.batch) * world * o.seq * o.accum / std::max(dt, 1e-9);

    bool stop = control.stop && *control.stop != 0;
    // Rank 0's clock decides the wall-time checkpoints, so that every rank takes part in the same ones.
    bool time_due = o.ckpt_every < 0 && std::chrono::duration<double>(t1 - last_ckpt).count() >= o.ckpt_minutes * 60;
    if (dp) {  // the global mean loss, and a stop or checkpoint that any rank asks for holds for all
      std::vector<double> agree{loss, stop ? 1.0 : 0.0, lead && time_due ? 1.0 : 0.0};
      dp->sum_host(agree);
      loss = agree[0] / world;
      stop = agree[1] > 0;
      time_due = agree[2] > 0;
    }
    nlohmann::ordered_json rec = {{"step", step}, {"loss", loss}, {"lr", lr}};
    if (std::isfinite(norm)) rec["grad_norm"] = norm;
    else rec["grad_norm"] = nullptr;  // an overflow (JSON has no inf)
    if (o.loss_scaling) {
      rec["loss_scale"] = scale;  // the scale this step's backward used
      rec["skipped"] = report.skipped;
    }
    rec["tokens_per_s"] = tps;
    // --stop-after stops as an interrupt does: a checkpoint, and no validation of its own (one at its step put a
    // val_loss into metrics.jsonl, and maybe a best/, that the uninterrupted run does not have).
    const bool end = step == o.steps;
    const bool last = end || stop || step == o.stop_after;  // an interrupt skips the end-of-run validation
    bool new_best = false;
    if (val_data && ((o.val_every > 0 && step % o.val_every == 0) || end)) {
      std::vector<double> v(2);
      std::tie(v[0], v[1]) = validation_loss_share(*model, *val_data, o.batch, o.seq, o.val_batches, rank, world);
      if (dp) dp->sum_host(v);
      result.last_val_loss = v[0] / v[1];
      rec["val_loss"] = result.last_val_loss;
      new_best = result.best_step == 0 || result.last_val_loss < result.best_val_loss;
    }
    if (lead) {
      const std::string line = rec.dump() + "\n";
      TS_CHECK(std::fwrite(line.data(), 1, line.size(), metrics) == line.size() && std::fflush(metrics) == 0,
               "cannot write ", metrics_path);
    }
    if (new_best && o.checkpoints) {
      state.val_loss = result.last_val_loss;  // recorded in best/ alone
      save(best_dir);
      state.val_loss = std::numeric_limits<double>::quiet_NaN();
      result.best_val_loss = result.last_val_loss;
      result.best_step = step;
      result.best_checkpoint = best_dir;
    }
    const bool periodic = (o.ckpt_every > 0 && step % o.ckpt_every == 0) || time_due;
    if (o.checkpoints && (periodic || last)) {
      save(ckpt_dir);
      last_ckpt = std::chrono::steady_clock::now();
      if (control.on_checkpoint) control.on_checkpoint(step);
    }

    if (result.steps == 0) result.first_loss = loss;
    result.steps++;
    result.last_step = step;
    result.last_loss = loss;
    char fields[160];
    // Below 100 tokens a second (a big model on the CPU) "0.0k" said nothing: those are shown whole.
    const int len = tps < 100 ? std::snprintf(fields, sizeof fields, "loss %.4f | lr %.2e | %.3g tok/s", loss, lr, tps)
                              : std::snprintf(fields, sizeof fields, "loss %.4f | lr %.2e | %.1fk tok/s", loss, lr,
                                              tps / 1000);
    if (o.loss_scaling && len > 0 && static_cast<size_t>(len) < sizeof fields)
      std::snprintf(fields + len, sizeof fields - len, " | scale %g | %lld skipped", scaling.scale(),
                    static_cast<long long>(result.skipped_steps));
    bar.update(step, fields);
    if (stop) {
      result.interrupted = true;
      break;
    }
    if (step == o.stop_after) break;
  }
  bar.finish();
  result.loss_scale = scaling.on() ? scaling.scale() : 0.0;
  if (graph) {
    result.graph_steps = graph->replays();
    result.graph_captures = graph->captures();
    result.graphs_per_step = graph->graphs_per_step();
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  result.checkpoint = o.checkpoints ? ckpt_dir : "";
  result.model = std::move(model);
  result.context = std::move(setup.context);
  return result;
}

}  // namespace tessera
