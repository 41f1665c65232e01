// tessera/train/run_dir.h — a training run's directory (--out): metrics.jsonl, checkpoint/ and best/, and what a
// resumed run finds in them.
//
// <out>/metrics.jsonl   one JSON record per step (rank 0 appends), cut back to the checkpoint's step on a resume
// <out>/checkpoint/     the last checkpoint (train/checkpoint.h), written periodically and at the end
// <out>/best/           the checkpoint of the lowest validation loss so far, which records that loss
//
// Any model's run: GPT's (train/train_loop.cpp) and the encoder-decoder's (train/seq2seq_train.cpp) share it. What
// is the model's own comes in: the options its checkpoints record, and how a checkpoint's files are written
// (CheckpointSource).
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tessera/models/model.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/optimizer.h"
#include "tessera/train/train_options.h"

namespace tessera {

class DataParallel;

// What a checkpoint of the run is written from: the parameters and the optimizer whose moments it carries, and the
// model's files (write: into the directory it is given, with `state`, whose moments are the optimizer's by then).
struct CheckpointSource {
  ParamBuffer& params;
  Optimizer& optimizer;
  std::function<void(const std::string& dir, const TrainState& state)> write;
};

// What end_step did.
struct StepEnd {
  bool new_best = false;  // the step's validation loss was the lowest so far
  bool saved = false;     // checkpoint/ was written
};

class RunDir {
 public:
  // Opens o.out for a run at `state` (the checkpoint's when resuming): rank 0 (`lead`) cuts metrics.jsonl back to
  // the resumed step, finds the best validation so far (in the metrics, else in best/'s own record) and opens the
  // metrics for appending; with `dp` the other ranks learn rank 0's best so far. A branch into a new --out from a
  // best/ that records its loss starts its own best/ as that model: every rank calls start_best() then.
  // Sets state.metrics_from for a branch and state.options_json: `options` (the model's own training options), or
  // where null GPT's (train_options_to_json(o)).
  RunDir(const TrainOptions& o, TrainState& state, bool resuming, bool lead, DataParallel* dp,
         const nlohmann::json* options = nullptr);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  const std::string& metrics_path() const { return metrics_path_; }
  const std::string& checkpoint_dir() const { return ckpt_dir_; }
  const std::string& best_dir() const { return best_dir_; }
  // The step checkpoint/ holds; -1 when unknown or none.
  int64_t saved_step() const { return saved_step_; }
  double best_val_loss() const { return best_val_loss_; }
  int64_t best_step() const { return best_step_; }  // 0: no validation so far

  // Writes model, the optimizer's moments and `state` to checkpoint/ (every rank calls it: a sharded optimizer
  // gathers its state to rank 0, which writes).
  void save(Model& model, Optimizer& optimizer, TrainState& state);
  void save(const CheckpointSource& from, TrainState& state);
  // The same to best/, recording val_loss there (and there alone); the new best so far.
  void save_best(Model& model, Optimizer& optimizer, TrainState& state, double val_loss, int64_t step);
  void save_best(const CheckpointSource& from, TrainState& state, double val_loss, int64_t step);
  // The end of a step, in this order: `rec` appended to the metrics; a val_loss lower than the best so far (or the
  // run's first) becomes the best so far, and with checkpoints best/; then, where `checkpoint` and with checkpoints,
  // checkpoint/. Every rank calls it (a sharded optimizer gathers its state to rank 0, which writes).
  StepEnd end_step(const nlohmann::ordered_json& rec, std::optional<double> val_loss, int64_t step, bool checkpoint,
                   const CheckpointSource& from, TrainState& state);
  // Whether best/ must start as the resumed model (above), and that save, made once.
  bool seeds_best() const { return seed_best_; }
  void start_best(Model& model, Optimizer& optimizer, TrainState& state);
  // A GPT model's checkpoints (train/checkpoint.h: save_checkpoint).
  static CheckpointSource gpt_source(Model& model, Optimizer& optimizer);
  // Appends one record to metrics.jsonl and flushes it (rank 0).
  void append(const nlohmann::ordered_json& rec);
  // What a run that fails now leaves, for its message: "; the last checkpoint was not overwritten)", ...
  std::string failure_note(int64_t step) const;

 private:
  void write(const std::string& dir, const CheckpointSource& from, TrainState& state);

  const TrainOptions& o_;
  bool resuming_, lead_;
  std::string metrics_path_, ckpt_dir_, best_dir_;
  int64_t saved_step_ = -1;
  double best_val_loss_ = 0;
  int64_t best_step_ = 0;
  bool seed_best_ = false;
  std::FILE* metrics_ = nullptr;
};

}  // namespace tessera
