// tessera train for an encoder-decoder preset (train/seq2seq_train.h): its flags, the default reverse data, the
// stop signals and the summary.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>

#include "tessera/cli/cmd_train.h"
#include "tessera/cli/common.h"
#include "tessera/core/error.h"
#include "tessera/core/signals.h"
#include "tessera/models/encdec_config.h"
#include "tessera/train/pair_data.h"
#include "tessera/train/seq2seq_checkpoint.h"
#include "tessera/train/seq2seq_train.h"
#include "tessera/train/synthetic_task.h"

namespace tessera::cli {

namespace fs = std::filesystem;

namespace {

// The default data of an encoder-decoder run without --data: make-task reverse (byte-level), prepared into
// <out>/data as `tessera make-task --task reverse --pairs N | tessera prepare --pairs` would.
constexpr uint64_t kDefaultReversePairs = 4000;

void make_reverse_data(const std::string& dir, uint64_t seed, int max_positions) {
  SyntheticTaskParams p{.task = SyntheticTask::Reverse, .pairs = kDefaultReversePairs, .seed = seed};
  PairLines lines;
  for (auto& [src, tgt] : make_synthetic_pairs(p)) {
    lines.source.push_back(std::move(src));
    lines.target.push_back(std::move(tgt));
  }
  lines.source_name = lines.target_name = "make-task reverse";
  const LineEncoder bytes = [](std::string_view line, std::vector<int32_t>& out) {
    for (unsigned char c : line) out.push_back(c);
  };
  prepare_pair_shards(lines, bytes, dir, {.val_fraction = 0.05, .max_positions = max_positions});
}

// GPT's flags that an encoder-decoder run has no use for: refused rather than ignored.
constexpr const char* kGptOnlyFlags[] = {"batch",         "seq",    "accum",     "init-from",       "cuda-graph",
                                         "sample-tokens", "prompt", "trace",     "memory-timeline", "val-batches",
                                         "ddp",           "zero",   "bucket-mb", "master-weights",  "ckpt-minutes"};

// A resumed run continues the saved run, as GPT's does (cmd_train_flags.cpp): a model or setting flag would be
// silently ignored (the checkpoint's wins), so each is refused; --steps may extend the run, --out branch it.
void refuse_on_resume(const Flags& a) {
  for (const auto& f : model_flag_names())
    TS_CHECK(!a.has(f), "--", f, " cannot be combined with --resume (the checkpoint fixes the model)");
  for (const char* f : {"data", "lr", "warmup", "min-lr-ratio", "weight-decay", "grad-clip", "label-smoothing", "seed",
                        "val-every", "ckpt-every", "max-tokens"})
    TS_CHECK(!a.has(f), "--", f, " cannot be combined with --resume (the checkpoint records the run's settings)");
  TS_CHECK(!a.has("force"), "--force cannot be combined with --resume (a resumed run continues its directory)");
}

// The preset's shape as --d-model, --n-layers (each side), --n-heads, --n-kv-heads, --d-ff, --max-seq, --dropout and
// --attn-dropout override it; the other GPT config flags have no encoder-decoder meaning and are refused.
void override_shape(const Flags& a, EncDecConfig& c) {
  c.d_model = a.integer("d-model", c.d_model);
  c.enc_layers = c.dec_layers = a.integer("n-layers", c.enc_layers);
  c.n_heads = a.integer("n-heads", c.n_heads);
  c.n_kv_heads = a.integer("n-kv-heads", c.n_kv_heads);
  c.d_ff = a.integer("d-ff", c.d_ff);
  c.max_seq = a.integer("max-seq", c.max_seq);
  c.dropout = a.number_f32("dropout", c.dropout);
  c.attn_dropout = a.number_f32("attn-dropout", c.attn_dropout);
  for (const char* f :
       {"vocab", "norm", "mlp", "positions", "bias", "tied", "emb-scale", "padding-id", "norm-eps", "rope-theta"})
    TS_CHECK(!a.has(f), "--", f, " does not apply to an encoder-decoder preset");
  if (c.d_model != encdec_preset(c.preset).d_model || c.enc_layers != encdec_preset(c.preset).enc_layers ||
      c.n_heads != encdec_preset(c.preset).n_heads || c.d_ff != encdec_preset(c.preset).d_ff ||
      c.max_seq != encdec_preset(c.preset).max_seq || c.n_kv_heads != encdec_preset(c.preset).n_kv_heads)
    c.preset = "custom";
  c.validate();
}

}  // namespace

bool TrainCommand::is_seq2seq_run() const {
  if (a.has("resume")) return is_seq2seq_checkpoint(a.str("resume"));
  const std::string preset = a.str("preset", "");
  for (const std::string& n : encdec_preset_names())
    if (n == preset && n != "tiny") return true;  // "tiny" names GPT's too: encdec with paired --data only
  return (preset.empty() || preset == "tiny") && a.has("data") && is_pair_data_dir(a.str("data"));
}

int TrainCommand::run_seq2seq() {
  TS_CHECK(!ranks.world, "data-parallel training of an encoder-decoder is not built: run one process");
  for (const char* f : kGptOnlyFlags) TS_CHECK(!a.has(f), "--", f, " does not apply to an encoder-decoder preset");
  Seq2SeqTrainOptions s;
  if (a.has("resume")) {
    refuse_on_resume(a);
    s = seq2seq_options_from_checkpoint(a.str("resume"));
    s.o.resume = a.str("resume");
    const fs::path parent = resume_dir(s.o.resume).parent_path();
    s.o.out = a.str("out", parent.empty() ? "." : parent.string());
    s.o.steps = a.integer("steps", s.o.steps);
  } else {
    s.model = encdec_preset(a.str("preset", "tiny"));
    override_shape(a, s.model);
    // Defaults under which the tiny preset learns make-task reverse (4000 pairs) to every held-out pair exact, with
    // a margin of a few hundred steps, in a couple of minutes of one core.
    s.o.steps = a.integer("steps", 1000);
    s.o.lr = a.number_f32("lr", 2e-3f);
    s.o.warmup = a.integer("warmup", 100);
    s.o.label_smoothing = a.number_f32("label-smoothing", 0.1f);
    s.o.min_lr_ratio = a.number_f32("min-lr-ratio", 0.1f);
    s.o.weight_decay = a.number_f32("weight-decay", 0.01f);
    s.o.grad_clip = a.number_f32("grad-clip", 1.0f);
    s.o.beta2 = 0.98f;  // fairseq's Transformer
    s.o.seed = a.u64("seed", 1337);
    s.o.val_every = a.integer("val-every", 250);
    s.o.ckpt_every = a.integer("ckpt-every", 0);
    s.max_tokens = a.integer("max-tokens", 1024);
    s.o.out = a.str("out", "runs/" + s.model.preset);
    TS_CHECK(s.o.label_smoothing >= 0 && s.o.label_smoothing < 1, "--label-smoothing must be in [0, 1), got ",
             a.str("label-smoothing"));
    TS_CHECK(s.max_tokens >= 1, "--max-tokens must be at least 1, got ", s.max_tokens);
    TS_CHECK(!fs::exists(fs::path(s.o.out) / "metrics.jsonl") || a.has("force"), s.o.out,
             " already holds a run: --resume ", (fs::path(s.o.out) / "checkpoint").string(),
             " continues it, --force replaces it");
    s.o.data = a.str("data", "");
  }
  TS_CHECK(s.o.steps >= 1, "--steps must be at least 1, got ", s.o.steps);
  s.o.stop_after = a.integer("stop-after", 0);
  s.o.progress = !a.has("no-progress");
  s.o.checkpoints = !a.has("no-checkpoint");
  s.o.device = a.str("device", "");
  s.o.precision = a.str("precision", "");
  // As GPT's: the loss scaler's flags apply to f16, which trains with dynamic loss scaling.
  s.o.loss_scale_init = a.number("loss-scale-init", s.o.loss_scale_init);
  s.o.loss_scale_interval = a.integer("loss-scale-interval", s.o.loss_scale_interval);
  for (const char* f : {"loss-scale-init", "loss-scale-interval"})
    TS_CHECK(!a.has(f) || s.o.precision == "f16", "--", f, " applies to --precision f16 (dynamic loss scaling)");
  if (s.o.resume.empty()) {
    if (s.o.data.empty()) {
      s.o.data = (fs::path(s.o.out) / "data").string();
      if (!is_pair_data_dir(s.o.data)) make_reverse_data(s.o.data, s.o.seed, s.model.max_seq);
    }
    // The preset's vocab gives way to the data's (bytes: 256), which must hold the model's special ids.
    check_pair_data_dir(s.o.data);
    const PairShard train = open_pair_split(s.o.data, "train");
    s.model.vocab = static_cast<int>(std::max<int64_t>(train.vocab(), s.model.vocab));
    s.model.validate();
  }
  set_stop_note(true, s.o.checkpoints, s.o.progress);
  Seq2SeqTrainResult r;
  {
    const ScopedSignals signals({SIGINT, SIGTERM, SIGHUP, SIGPIPE}, on_stop_signal, {SIGHUP, SIGPIPE});
    r = train_seq2seq(s, &g_stop);
  }
  std::printf("trained %s: steps %lld..%lld, loss %.4f -> %.4f", s.model.preset.c_str(),
              static_cast<long long>(r.last_step - r.steps + 1), static_cast<long long>(r.last_step), r.first_loss,
              r.last_loss);
  if (r.best_step > 0)
    std::printf(", val loss %.4f, val token accuracy %.4f (best %.4f at step %lld)", r.last_val_loss,
                r.last_val_accuracy, r.best_val_loss, static_cast<long long>(r.best_step));
  std::printf(", %.1fs\n", r.seconds);
  if (!r.checkpoint.empty()) std::printf("checkpoint: %s\n", r.checkpoint.c_str());
  if (!r.best_checkpoint.empty()) std::printf("best: %s\n", r.best_checkpoint.c_str());
  if (g_stop != 0) return 128 + g_stop;
  return r.interrupted ? 128 + SIGTERM : 0;
}

}  // namespace tessera::cli
