// tessera/train/seq2seq_train.h — training the encoder-decoder on paired shards (train/pair_data.h).
//
// A step: the next PairBatcher batch (--max-tokens padded tokens, pairs of similar length together; sources and
// targets padded, their lengths the attention's key lengths), zero_grad, forward with label-smoothed cross-entropy
// over the target tokens (padding ignored), backward, AdamW at lr_at(step) (train/trainer.h: warm-up, cosine decay)
// over the one ParamBuffer. Validation: over every val batch (no dropout), the cross-entropy without smoothing per
// target token (fairseq's nll_loss; best/ keeps its lowest) and the teacher-forced token accuracy of the argmax.
//
// The run directory is GPT's: <out>/metrics.jsonl (one record a step; cut back to the checkpoint's step on resume),
// <out>/checkpoint/ (train/seq2seq_checkpoint.h; every ckpt_every steps, at a stop and at the end), <out>/best/
// (the lowest validation loss). The TrainState's data_pos is the batcher's position, epoch · 2^32 + batch, and its
// RNG the dropout streams, so a resumed run continues with the same batches and the same dropout: its losses are
// an uninterrupted run's, bit for bit.
#pragma once
#include <csignal>
#include <cstdint>
#include <memory>
#include <string>

#include "tessera/models/encdec_config.h"
#include "tessera/models/encoder_decoder.h"
#include "tessera/train/train_options.h"

namespace tessera {

struct Seq2SeqTrainOptions {
  // The hyperparameters GPT's runs share (out, resume, steps, lr, warmup, min_lr_ratio, weight_decay, betas,
  // grad_clip, label_smoothing, seed, val_every, ckpt_every, stop_after, progress, device, precision, data).
  // o.model is unused: the model is `model`.
  TrainOptions o;
  EncDecConfig model;
  int64_t max_tokens = 1024;
};

// Whether `dir` is a directory of paired shards (it holds train_000000.pairs).
bool is_pair_data_dir(const std::string& dir);
// Whether `dir` holds GPT's token shards (train_*.bin).
bool is_token_data_dir(const std::string& dir);

// One line unless `data` is a directory of paired shards (naming GPT's token shards where it holds those).
void check_pair_data_dir(const std::string& data);

struct Seq2SeqTrainResult {
  int64_t steps = 0, last_step = 0;
  double first_loss = 0, last_loss = 0, last_val_loss = 0, last_val_accuracy = 0;
  double best_val_loss = 0;
  int64_t best_step = 0;
  double seconds = 0;
  bool interrupted = false;
  std::string checkpoint, best_checkpoint;
};

// Checks everything (the data's kind, its vocab against the model's, every pair's length against the positions, a
// resume checkpoint and its options) before writing anything, then trains. stop: polled after every step; nonzero
// writes a checkpoint and returns with `interrupted`.
Seq2SeqTrainResult train_seq2seq(Seq2SeqTrainOptions opt, const volatile std::sig_atomic_t* stop = nullptr);

// The options a checkpoint's run was started with (its optimizer.safetensors' "options"), for --resume.
Seq2SeqTrainOptions seq2seq_options_from_checkpoint(const std::string& dir);

}  // namespace tessera
