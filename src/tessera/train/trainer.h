// tessera/train/trainer.h — the training loop: data, forward/backward with gradient accumulation, clipping,
// AdamW with a cosine schedule, validation, metrics (JSON Lines), checkpoints and exact resume.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tessera/models/gpt.h"

namespace tessera {

struct TrainOptions {
  ModelConfig model;
  std::string data;            // a directory of train_*/val_* shards, or one shard file
  std::string out = "runs/tiny";
  std::string resume;          // a checkpoint directory to continue from
  int steps = 1000;
  int batch = 8;
  int seq = 0;                 // 0: the model's max_seq
  int accum = 1;               // micro-batches per optimizer step
  float lr = 3e-3f;
  float min_lr_ratio = 0.1f;   // the cosine schedule ends at lr * min_lr_ratio
  int warmup = 20;
  float weight_decay = 0.1f;
  float beta1 = 0.9f, beta2 = 0.95f;
  float grad_clip = 1.0f;      // 0: off
  float label_smoothing = 0.0f;
  uint64_t seed = 1337;
  int val_every = 100;         // 0: only at the end
  int val_batches = 4;
  int ckpt_every = 0;          // 0: only at the end
  int stop_after = 0;          // stop (with a checkpoint) after this step, as if interrupted; 0: run to `steps`
  bool progress = true;
};

nlohmann::json train_options_to_json(const TrainOptions& o);
// Fills the options saved in a checkpoint (everything but out, resume, stop_after and progress).
void train_options_from_json(const nlohmann::json& j, TrainOptions& o);

// Learning rate of optimizer step `step` (1-based): linear warm-up to lr over `warmup` steps, then a cosine
// decay to lr * min_lr_ratio at `total`.
float lr_at(int64_t step, int64_t total, const TrainOptions& o);

struct TrainResult {
  int64_t steps = 0;
  double last_loss = 0, last_val_loss = 0, first_loss = 0;
  double seconds = 0;
  std::string checkpoint;
  std::unique_ptr<Gpt> model;  // the trained model, as saved in `checkpoint`
};

// Runs training to o.steps (continuing from o.resume when set). Writes <out>/metrics.jsonl and
// <out>/checkpoint/. Throws Error on bad input.
TrainResult train(TrainOptions o);

}  // namespace tessera
