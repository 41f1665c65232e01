// tessera/train/checkpoint.h — model and training checkpoints in safetensors.
//
// A checkpoint is a directory:
//   model.safetensors   the parameters. Where the config matches GPT2LMHeadModel or LlamaForCausalLM the tensors
//                       carry Hugging Face's names and layouts (GPT-2's Conv1D weights transposed to (in, out),
//                       Llama's q/k/v and gate/up split out of tessera's fused matrices), metadata "format": "pt"
//                       and the tessera config, so `transformers` loads the directory as it is.
//   config.json         the Hugging Face config (GPT-2 / Llama), or tessera's own config otherwise.
//   tokenizer.json      (where the run's data named its tokenizer) the tokenizer of the model's ids, in Hugging
//                       Face's format, so that AutoTokenizer.from_pretrained(dir) loads it beside the model.
//   optimizer.safetensors  (training checkpoints) Adam moments m and v, and in metadata the step (and the
//                       optimizer's, when loss scaling skipped steps), the RNG state, the data position, the loss
//                       scaler's state (f16 runs) and the training options, so a resumed run continues exactly.
// The directory is written as <dir>.tmp, every file synced, then swapped with <dir> in one step
// (renameat2 RENAME_EXCHANGE) and the previous checkpoint removed; the parent directory is synced after every
// rename. Where the file system cannot exchange, <dir> is renamed to <dir>.old before <dir>.tmp takes its
// place, and the loaders read <dir>.old while <dir> is missing. Either way a crash at any moment leaves a
// whole checkpoint to resume from.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/philox.h"
#include "tessera/models/hf_naming.h"
#include "tessera/models/model.h"

namespace tessera {

// The tensors a model's checkpoint holds: model.hf_tensors() (models/hf_naming.h names them).
std::vector<ExportTensor> checkpoint_layout(const Model& model);

struct TrainState {
  int64_t step = 0;
  // Optimizer steps applied: fewer than `step` when loss scaling skipped some (their bias correction did not
  // advance). -1: the same as step (checkpoints written before skipping existed).
  int64_t optimizer_step = -1;
  // The dynamic loss scaler after `step` (f16 runs, loss_scaler.h); loss_scale 0: the run had no loss scaling.
  double loss_scale = 0;
  int64_t loss_scale_good_steps = 0;
  RngState rng;
  uint64_t data_pos = 0;
  // The first step whose record the run's own metrics.jsonl holds: 1, or for a run branched into a new --out, the
  // step after its branch point (a resume in place keeps it). A branch that stopped in its first step has a
  // checkpoint and no records, and is missing none. Absent in older checkpoints: 1.
  int64_t metrics_from = 1;
  std::string options_json;  // the training options, for resuming with the same run
  std::vector<float> adam_m, adam_v;
  // Written to a run's best/ only: the validation loss that made it the best (NaN: none, as in every other
  // checkpoint and in a best/ written before it was kept there). Not loaded back (best_record reads it), so that a
  // run resumed from best/ does not copy it into its own checkpoints.
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  // The text of the tokenizer.json that save_checkpoint writes beside config.json; empty: none (byte-level). Not
  // part of optimizer.safetensors: a run takes it from its data's directory (or the checkpoint it starts from).
  std::string tokenizer_json;
};

// The validation loss and step a best/ checkpoint records (read from its optimizer state's header, not the
// tensors); nullopt where `dir` holds no train state or no recorded loss.
std::optional<std::pair<double, int64_t>> best_record(const std::string& dir);

// Writes <dir>/model.safetensors and <dir>/config.json, plus optimizer.safetensors when state is given, and
// tokenizer.json where the state holds one.
void save_checkpoint(const std::string& dir, const Model& model, const TrainState* state);
// The directory swap above, for any model's files: write_files fills the fresh directory it is given (<dir>.tmp)
// with files written whole; it is then synced and put in place of <dir>. An Error from write_files leaves no
// <dir>.tmp and <dir> as it was.
void write_checkpoint_dir(const std::string& dir, const std::function<void(const std::string& tmp)>& write_files);
// <dir>/optimizer.safetensors holding `state` for a model of n_params parameters, and <dir>/tokenizer.json where
// the state holds one (the files of a training checkpoint beside its model's).
void write_train_state_files(const std::string& dir, const TrainState& state, int64_t n_params);
// For tests: whether TESSERA_FAULT_INJECT (a comma list) names `point`. save_checkpoint dies by SIGKILL at its
// points, as a crash would; train raises a stop signal at its own (cmd_train.cpp).
bool fault_injected(const char* point);

// The extra host memory save_checkpoint needs beyond the model and the TrainState it is given: its largest
// temporary (a transposed GPT-2 weight; 0 for other namings, whose tensors stream from the parameters).
size_t checkpoint_save_host_bytes(const ModelConfig& cfg);

// Whether `dir` holds the files a resume reads (model.safetensors and optimizer.safetensors): a run's best/ that
// can be continued when its checkpoint/ is missing.
bool holds_train_state(const std::string& dir);

// What to add to "<path> does not exist" when a stop cut short a run's first checkpoint there (a second Ctrl-C while
// it was written leaves <path>.tmp and no <path>): ": the run was stopped while writing it (<path>.tmp is
// incomplete)"; else "".
std::string unfinished_checkpoint_note(const std::string& path);

// The directory a loader reads for checkpoint `path`: `path` itself, or <path>.old when `path` is missing and
// <path>.old holds a checkpoint (a save interrupted between its two renames). A training run's directory (no
// model.safetensors, a checkpoint/ that has one) is an Error naming the checkpoints in it.
std::string resolve_checkpoint_dir(const std::string& path);

// The end-of-sequence ids that Hugging Face's generate() stops at by default for the checkpoint at `path`: for a
// directory that save_pretrained wrote, generation_config.json's eos_token_id where that file exists, else
// config.json's (an integer, a list of them, or null); ids outside [0, vocab) are left out, as they cannot be drawn.
// Empty for tessera's own checkpoints, whose config.json names a placeholder id for transformers only.
std::vector<int32_t> checkpoint_eos_ids(const std::string& path, int vocab);

// Reads the model config stored in a checkpoint directory (or a model.safetensors path).
ModelConfig load_checkpoint_config(const std::string& path);
// load_checkpoint_config, after checking what load_checkpoint_weights will: every tensor the config needs is there
// with its shape, as a float, and no other; without building the model or reading the weights (tessera info).
ModelConfig check_checkpoint_model(const std::string& path);
// Loads parameters into a model built from load_checkpoint_config. Every tensor must be present with the
// expected shape, and no unknown tensor may be there.
void load_checkpoint_weights(const std::string& path, Model& model);
// Builds the model and loads its weights, reading model.safetensors once.
std::unique_ptr<Model> load_checkpoint_model(const std::string& path);
// The same model on ctx's device in `dtype` (a checkpoint holds f32: a 16-bit model gets f32 master weights from it).
std::unique_ptr<Model> load_checkpoint_model(const std::string& path, Context& ctx, DType dtype);
// The model of a checkpoint for inference: on ctx's device in `dtype`, without master weights. The file's weights
// go through one f32 host copy into the device buffer; no CPU model, and no training state, is made. non_finite
// counts the weights that are NaN or infinite, which the caller refuses, naming the path its user gave.
struct InferenceModel {
  std::unique_ptr<Model> model;
  size_t non_finite = 0;
};
InferenceModel load_inference_model(const std::string& path, Context& ctx, DType dtype);
// Loads the training state; fails if the checkpoint has none or it does not fit the model. Its tokenizer_json is
// the checkpoint's tokenizer.json, where it has one.
TrainState load_train_state(const std::string& dir, const Model& model);
// The same for any model of n_params parameters (the moments must have that length).
TrainState read_train_state(const std::string& dir, int64_t n_params);
// The text of <dir>/tokenizer.json (a checkpoint's, or a shard directory's), checked to be a tokenizer that loads;
// "" where dir is no directory or holds none. *vocab (when given) is its vocab size, 0 for none.
std::string read_dir_tokenizer(const std::string& dir, int64_t* vocab = nullptr);

}  // namespace tessera
