#include "tessera/train/run_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/fnv.h"
#include "tessera/core/json_fields.h"
#include "tessera/core/units.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/trainer.h"

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
  json j = {{"model", model_config_to_json(o.model)},
            {"data", data},
            {"data_fingerprint", o.data_fingerprint},
            {"batch", o.batch},
            {"seq", o.seq},
            {"accum", o.accum},
            {"lr", o.lr},
            {"min_lr_ratio", o.min_lr_ratio},
            {"warmup", o.warmup},
            {"weight_decay", o.weight_decay},
            {"beta1", o.beta1},
            {"beta2", o.beta2},
            {"adam_eps", o.adam_eps},
            {"grad_clip", o.grad_clip},
            {"label_smoothing", o.label_smoothing},
            {"seed", o.seed},
            {"val_every", o.val_every},
            {"val_batches", o.val_batches},
            {"ckpt_every", o.ckpt_every},
            {"ckpt_minutes", o.ckpt_minutes},
            {"steps", o.steps},
            {"world_size", o.world_size}};
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
  // directories with a relative --data hold different absolute paths to the same shards, and must not be refused as
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

namespace {

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
  const int64_t missing = steps.empty() ? 0 : keep_step - steps.front() + 1 - static_cast<int64_t>(steps.size());
  if (expect_from >= 1 && expect_from <= keep_step && steps.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "tessera: warning: %s: no record of steps %lld to %lld (the file is %s); the resumed run's "
                 "records follow step %lld without them\n",
                 path.c_str(), static_cast<long long>(expect_from), static_cast<long long>(keep_step),
                 !fs::exists(path) ? "missing"
                 : torn            ? "unreadable"
                                   : "empty",
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

RunDir::RunDir(const TrainOptions& o, TrainState& state, bool resuming, bool lead, DataParallel* dp,
               const json* options)
    : o_(o), resuming_(resuming), lead_(lead), metrics_path_((fs::path(o.out) / "metrics.jsonl").string()),
      ckpt_dir_((fs::path(o.out) / "checkpoint").string()), best_dir_((fs::path(o.out) / "best").string()) {
  if (resuming) {
    std::error_code ec;
    if (fs::equivalent(o.resume, ckpt_dir_, ec)) saved_step_ = state.step;
  }
  state.options_json = (options ? *options : train_options_to_json(o)).dump();
  if (lead) {
    // The best so far of a resumed run is in its metrics (best/ was written at that step). Where they hold none
    // (metrics.jsonl deleted, or only damaged lines), best/ records its own loss: without it the first validation
    // after the resume replaced best/, however much worse it was.
    std::error_code ec;  // a checkpoint of this run: its directory is in --out (RUN/checkpoint, RUN/checkpoint.old)
    const fs::path run_dir = resuming ? resume_dir(o.resume).parent_path() : fs::path();
    const bool in_place = resuming && fs::equivalent(run_dir.empty() ? "." : run_dir, o.out, ec);
    // A branch into a new --out records its steps from its first on; a resume in place keeps its checkpoint's.
    if (resuming && !in_place) state.metrics_from = state.step + 1;
    std::tie(best_val_loss_, best_step_) =
        trim_metrics(metrics_path_, resuming ? state.step : 0, in_place ? state.metrics_from : 0);
    if (resuming && best_step_ == 0 && fs::exists(fs::path(best_dir_) / "model.safetensors")) {
      const auto record = best_record(best_dir_);
      if (record && record->second <= state.step) {
        std::tie(best_val_loss_, best_step_) = *record;
      } else if (!record) {
        std::fflush(stdout);
        std::fprintf(stderr,
                     "tessera: warning: %s holds no validation record and %s does not record its loss: the "
                     "resumed run's first validation will replace it\n",
                     metrics_path_.c_str(), best_dir_.c_str());
      }
    }
    // A branch from a best/ that records its loss (--resume RUN/best --out NEW): that model, validated at the step
    // it starts from, is the new run's best so far, and its best/ starts as that model (else the branch's first
    // validation became its best/ however much worse it was). Without checkpoints there is no best/ to start.
    if (resuming && !in_place && best_step_ == 0 && o.checkpoints) {
      const auto record = best_record(o.resume);
      if (record && record->second == state.step) {
        std::tie(best_val_loss_, best_step_) = *record;
        seed_best_ = true;
      }
    }
    metrics_ = std::fopen(metrics_path_.c_str(), "ab");
    TS_CHECK(metrics_, "cannot write ", metrics_path_);
  }
  if (dp) {  // the other ranks learn rank 0's best so far, which decides when best/ is written
    std::vector<double> best{best_val_loss_, static_cast<double>(best_step_), seed_best_ ? 1.0 : 0.0};
    dp->sum_host(best);
    best_val_loss_ = best[0];
    best_step_ = static_cast<int64_t>(best[1]);
    seed_best_ = best[2] > 0;
  }
}

RunDir::~RunDir() {
  if (metrics_) std::fclose(metrics_);
}

CheckpointSource RunDir::gpt_source(Model& model, Optimizer& optimizer) {
  return {.params = model.params(),
          .optimizer = optimizer,
          .write = [&model](const std::string& dir, const TrainState& state) { save_checkpoint(dir, model, &state); }};
}

void RunDir::write(const std::string& dir, const CheckpointSource& from, TrainState& state) {
  // A checkpoint carries the moments as host vectors, read from the optimizer when one is written.
  from.optimizer.read_state(from.params, state.adam_m, state.adam_v);
  if (lead_) from.write(dir, state);
}

void RunDir::save(Model& model, Optimizer& optimizer, TrainState& state) { save(gpt_source(model, optimizer), state); }

void RunDir::save(const CheckpointSource& from, TrainState& state) {
  write(ckpt_dir_, from, state);
  saved_step_ = state.step;
}

void RunDir::save_best(Model& model, Optimizer& optimizer, TrainState& state, double val_loss, int64_t step) {
  save_best(gpt_source(model, optimizer), state, val_loss, step);
}

void RunDir::save_best(const CheckpointSource& from, TrainState& state, double val_loss, int64_t step) {
  state.val_loss = val_loss;  // recorded in best/ alone
  write(best_dir_, from, state);
  state.val_loss = std::numeric_limits<double>::quiet_NaN();
  best_val_loss_ = val_loss;
  best_step_ = step;
}

void RunDir::start_best(Model& model, Optimizer& optimizer, TrainState& state) {
  save_best(model, optimizer, state, best_val_loss_, best_step_);
}

StepEnd RunDir::end_step(const nlohmann::ordered_json& rec, std::optional<double> val_loss, int64_t step,
                         bool checkpoint, const CheckpointSource& from, TrainState& state) {
  StepEnd e;
  append(rec);
  e.new_best = val_loss && (best_step_ == 0 || *val_loss < best_val_loss_);
  if (e.new_best) {
    if (o_.checkpoints) {
      save_best(from, state, *val_loss, step);
    } else {
      best_val_loss_ = *val_loss;
      best_step_ = step;
    }
  }
  if (checkpoint && o_.checkpoints) {
    save(from, state);
    e.saved = true;
  }
  return e;
}

void RunDir::append(const nlohmann::ordered_json& rec) {
  if (!lead_) return;
  const std::string line = rec.dump() + "\n";
  TS_CHECK(std::fwrite(line.data(), 1, line.size(), metrics_) == line.size() && std::fflush(metrics_) == 0,
           "cannot write ", metrics_path_);
}

std::string RunDir::failure_note(int64_t step) const {
  // A run with no checkpoint keeps its metrics (the losses up to here), so that the same command is then refused
  // as one into a run; the note says how to train there again.
  if (saved_step_ >= 0) return "; the last checkpoint was not overwritten)";
  if (resuming_) return "; no checkpoint was written, and " + o_.resume + " is as it was)";
  if (step == 0) return "; no checkpoint was written)";  // nor a line of metrics
  return "; no checkpoint was written; " + metrics_path_ + " keeps the losses: train into " + o_.out +
         " again with --force)";
}

}  // namespace tessera
