#include "tessera/train/seq2seq_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/json_fields.h"
#include "tessera/train/loss_scaler.h"
#include "tessera/train/optimizer.h"
#include "tessera/train/pair_batch.h"
#include "tessera/train/pair_data.h"
#include "tessera/train/progress.h"
#include "tessera/train/run_dir.h"
#include "tessera/train/safetensors.h"
#include "tessera/train/seq2seq_checkpoint.h"
#include "tessera/train/trainer.h"

namespace tessera {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_pair_data_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kPairShardNames[0], ec);
}

bool is_token_data_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return dir.ends_with(".bin");
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("train_") && name.ends_with(".bin")) return true;
  }
  return false;
}

void check_pair_data_dir(const std::string& data) {
  TS_CHECK(!data.empty(), "--data DIR (paired shards: tessera prepare --pairs) is required");
  TS_CHECK(!is_token_data_dir(data) || is_pair_data_dir(data), "--data ", data,
           " holds GPT token shards (train_*.bin); an encoder-decoder preset trains on paired shards "
           "(tessera prepare --pairs FILE.tsv --out DIR)");
  TS_CHECK(is_pair_data_dir(data), "--data ", data,
           " holds no paired shards (train_000000.pairs: tessera prepare --pairs FILE.tsv --out DIR)");
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kOptionsWhere = "seq2seq training options";

// What a resumed run must continue with: the model and every option that changes the steps' arithmetic or data.
json options_json(const Seq2SeqTrainOptions& s) {
  const TrainOptions& o = s.o;
  return {{"kind", "encoder-decoder"},
          {"model", encdec_config_json(s.model)},
          {"data", fs::absolute(o.data).lexically_normal().string()},
          {"max_tokens", s.max_tokens},
          {"steps", o.steps},
          {"lr", o.lr},
          {"min_lr_ratio", o.min_lr_ratio},
          {"warmup", o.warmup},
          {"weight_decay", o.weight_decay},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"grad_clip", o.grad_clip},
          {"label_smoothing", o.label_smoothing},
          {"seed", o.seed},
          {"val_every", o.val_every},
          {"ckpt_every", o.ckpt_every}};
}

void options_from_json(const json& j, Seq2SeqTrainOptions& s) {
  const char* w = kOptionsWhere;
  TS_CHECK(j.is_object() && j.value("kind", "") == "encoder-decoder", w, ": not an encoder-decoder run's");
  s.model = encdec_config_from_tessera_json(j.at("model"), std::string(w) + ": model");
  TrainOptions& o = s.o;
  o.data = json_string(j, "data", w);
  s.max_tokens = json_int64(j, "max_tokens", w, 1, int64_t{1} << 40);
  o.steps = json_int(j, "steps", w);
  o.lr = static_cast<float>(json_number(j, "lr", w));
  o.min_lr_ratio = static_cast<float>(json_number(j, "min_lr_ratio", w));
  o.warmup = json_int(j, "warmup", w);
  o.weight_decay = static_cast<float>(json_number(j, "weight_decay", w));
  o.beta1 = static_cast<float>(json_number(j, "beta1", w));
  o.beta2 = static_cast<float>(json_number(j, "beta2", w));
  o.grad_clip = static_cast<float>(json_number(j, "grad_clip", w));
  o.label_smoothing = static_cast<float>(json_number(j, "label_smoothing", w));
  o.seed = static_cast<uint64_t>(json_int64(j, "seed", w, 0, std::numeric_limits<int64_t>::max()));
  o.val_every = json_int(j, "val_every", w);
  o.ckpt_every = json_int(j, "ckpt_every", w);
}

Seq2SeqBatch view(const PairBatch& b) {
  return {.B = b.B,
          .Ts = b.S,
          .Tt = b.T,
          .src = b.source.data(),
          .src_lens = b.source_len.data(),
          .tgt_in = b.dec_in.data(),
          .tgt_out = b.dec_out.data(),
          .tgt_lens = b.target_len.data()};
}

PairBatchParams batch_params(const Seq2SeqTrainOptions& s) {
  return {.max_tokens = s.max_tokens,
          .seed = s.o.seed,
          .pad_id = s.model.pad_id,
          .bos_id = s.model.decoder_start_id,
          .eos_id = s.model.eos_id};
}

// Every pair of the shard fits the positions: a source of at most max_seq tokens, a target of at most max_seq - 1
// (the decoder reads its start token first). One line naming the shard and the pair.
void check_lengths(const PairShard& shard, const EncDecConfig& cfg) {
  for (size_t i = 0; i < shard.size(); ++i) {
    TS_CHECK(static_cast<int64_t>(shard.source_len(i)) <= cfg.max_seq, shard.path(), ": pair ", i + 1, "'s source has ",
             shard.source_len(i), " tokens, more than the model's ", cfg.max_seq, " positions");
    TS_CHECK(static_cast<int64_t>(shard.target_len(i)) + 1 <= cfg.max_seq, shard.path(), ": pair ", i + 1,
             "'s target has ", shard.target_len(i), " tokens; the decoder reads at most ", cfg.max_seq - 1, " (its ",
             cfg.max_seq, " positions, one for the start token)");
  }
}

// The run, checked and loaded before anything is written.
struct Run {
  Seq2SeqTrainOptions s;
  std::unique_ptr<Context> ctx;
  DType dtype = DType::F32;
  std::unique_ptr<EncoderDecoder> model;
  std::unique_ptr<PairShard> train, val;
  TrainState state;
  bool resuming = false;
  StepLossScaling scaling;  // on for f16 (or o.loss_scaling), as GPT's runs
};

void open_run(Run& r) {
  TrainOptions& o = r.s.o;
  if (!o.resume.empty()) {
    const std::string dir = resolve_checkpoint_dir(o.resume);
    TS_CHECK(fs::is_directory(dir), "--resume ", o.resume, " does not exist", unfinished_checkpoint_note(o.resume));
    TS_CHECK(is_seq2seq_checkpoint(dir), "--resume ", o.resume, " is not an encoder-decoder's checkpoint");
    o.resume = dir;  // a checkpoint.old left by an interrupted swap: that one, as GPT's runs resume
  }
  check_pair_data_dir(o.data);
  r.train = std::make_unique<PairShard>(open_pair_split(o.data, "train"));
  std::error_code ec;
  if (fs::is_regular_file(fs::path(o.data) / kPairShardNames[1], ec))
    r.val = std::make_unique<PairShard>(open_pair_split(o.data, "val"));
  TS_CHECK(r.train->vocab() <= r.s.model.vocab, o.data, ": the shards' vocab ", r.train->vocab(),
           " is larger than the model's ", r.s.model.vocab);
  check_lengths(*r.train, r.s.model);
  if (r.val) check_lengths(*r.val, r.s.model);
  TS_CHECK(r.s.max_tokens >= 1, "--max-tokens must be at least 1, got ", r.s.max_tokens);
  r.ctx = std::make_unique<Context>(o.device.empty() ? Context::best_available() : Context::from_name(o.device));
  const bool gpu = r.ctx->is_cuda();
  const std::string prec = o.precision.empty() ? (gpu ? "bf16" : "f32") : o.precision;
  if (prec == "f32") r.dtype = DType::F32;
  else if (prec == "bf16") r.dtype = DType::BF16;
  else if (prec == "f16") r.dtype = DType::F16;
  else TS_THROW("--precision: unknown precision '", prec, "' (expected f32, bf16 or f16)");
  TS_CHECK(gpu || r.dtype == DType::F32, "--precision ", prec, " needs a GPU: the CPU reference trains in f32");
  // f16's range (6e-8 to 65504) loses small gradients without a loss scale; bf16 has f32's range.
  if (r.dtype == DType::F16) o.loss_scaling = true;
  if (o.loss_scaling) r.scaling = StepLossScaling(train_loss_scaler_config(o));  // checks the flags too
  if (!o.resume.empty()) {
    r.model = load_seq2seq_checkpoint(o.resume, *r.ctx, r.dtype);
    r.state = load_seq2seq_train_state(o.resume, *r.model);
    r.resuming = true;
  } else {
    r.model = std::make_unique<EncoderDecoder>(r.s.model, *r.ctx, r.dtype);
    r.model->init_weights(r.s.o.seed);
    r.state.rng = {.seed = r.s.o.seed, .next_stream = 0};
  }
}

struct ValResult {
  double loss = 0, accuracy = 0;
};

// Cross-entropy without smoothing and argmax accuracy per target token, over every val batch in a fixed order.
ValResult validate(EncoderDecoder& m, const PairShard& val, const PairBatchParams& params) {
  PairBatchParams p = params;
  p.seed = 0;
  PairBatcher batches(val, p);
  double nll = 0, correct = 0, tokens = 0;
  for (size_t i = 0; i < batches.batches_in_epoch(); ++i) {
    const PairBatch b = batches.next();
    const double loss = m.forward(view(b), {.training = false, .label_smoothing = 0.0f});
    int64_t n = 0;
    for (int r = 0; r < b.B; ++r) {
      for (int t = 0; t < b.target_len[r]; ++t) {
        const std::vector<float> row = m.read_logits_row(r * b.T + t);
        const auto best = std::max_element(row.begin(), row.end()) - row.begin();
        correct += best == b.dec_out[r * b.T + t];
        ++n;
      }
    }
    nll += loss * static_cast<double>(n);
    tokens += static_cast<double>(n);
  }
  return {.loss = tokens > 0 ? nll / tokens : 0, .accuracy = tokens > 0 ? correct / tokens : 0};
}

}  // namespace

Seq2SeqTrainOptions seq2seq_options_from_checkpoint(const std::string& dir) {
  const std::string file = (fs::path(resolve_checkpoint_dir(dir)) / "optimizer.safetensors").string();
  TS_CHECK(fs::exists(file), "checkpoint ", dir, " has no optimizer state (", file, " is missing)");
  const SafetensorsFile st = SafetensorsFile::load(file);
  const auto it = st.metadata().find("options");
  TS_CHECK(it != st.metadata().end(), "checkpoint ", file, ": optimizer state has no 'options' metadata");
  Seq2SeqTrainOptions s;
  json j;
  try {
    j = json::parse(it->second);
  } catch (const json::exception&) {
    TS_THROW("checkpoint ", dir, ": its training options are not JSON");
  }
  options_from_json(j, s);
  return s;
}

namespace {
// The steps of a run, its directory GPT's (RunDir: metrics, best/, checkpoint/).
struct Loop {
  Loop(Run& run, Optimizer& optimizer, PairBatcher& pair_batches, RunDir& run_dir)
      : r(run), opt(optimizer), batches(pair_batches),
        dir(run_dir), source{.params = r.model->params(),
                             .optimizer = opt,
                             .write = [m = r.model.get()](const std::string& to, const TrainState& st) {
                               save_seq2seq_checkpoint(to, *m, &st);
                             }} {}
  Run& r;
  Optimizer& opt;
  PairBatcher& batches;
  RunDir& dir;
  CheckpointSource source;
  Seq2SeqTrainResult res;
  PairBatchParams params;

  double step(int64_t step, nlohmann::ordered_json& rec);
  // The step's validation (where due), its record, best/ and checkpoint/.
  void finish(int64_t step, bool validate_now, bool checkpoint, nlohmann::ordered_json& rec);
};

double Loop::step(int64_t step, nlohmann::ordered_json& rec) {
  EncoderDecoder& m = *r.model;
  const PairBatch b = batches.next();
  const TrainOptions& o = r.s.o;
  m.zero_grad();
  const double loss = m.forward(view(b), {.training = true, .label_smoothing = o.label_smoothing, .rng = &r.state.rng});
  const double scale = r.scaling.scale();
  m.backward(scale);
  const float lr = lr_at(step, o.steps, o);
  opt.step(m.params(), lr, r.scaling.grad_scaling());
  const StepReport report = opt.read_step();
  // A non-finite gradient that was not skipped (no loss scaling) has been applied: the parameters are NaN now.
  TS_CHECK(report.skipped || std::isfinite(report.grad_norm), "training diverged: the gradient norm is ",
           report.grad_norm, " at step ", step, " (try a lower --lr", dir.failure_note(r.state.step));
  r.scaling.update(report, step);
  if (r.scaling.on()) {
    r.state.loss_scale = r.scaling.scale();
    r.state.loss_scale_good_steps = r.scaling.scaler().good_steps();
  }
  r.state.step = step;
  r.state.optimizer_step = opt.step_count();
  r.state.data_pos = (batches.epoch() << 32) | batches.batch_index();
  int64_t tokens = 0;
  for (int i = 0; i < b.B; ++i) tokens += b.target_len[i];
  rec = {{"step", step},
         {"loss", loss},
         {"lr", lr},
         {"grad_norm", opt.read_grad_norm()},
         {"pairs", b.B},
         {"target_tokens", tokens},
         {"padded_tokens", b.padded_tokens()}};
  if (r.scaling.on()) {
    rec["loss_scale"] = scale;  // the scale this step's backward used
    rec["skipped"] = report.skipped;
  }
  return loss;
}

void Loop::finish(int64_t step, bool validate_now, bool checkpoint, nlohmann::ordered_json& rec) {
  std::optional<double> val_loss;
  if (validate_now) {
    const ValResult v = validate(*r.model, *r.val, params);
    rec["val_loss"] = v.loss;
    rec["val_accuracy"] = v.accuracy;
    res.last_val_loss = v.loss;
    res.last_val_accuracy = v.accuracy;
    val_loss = v.loss;
  }
  const StepEnd e = dir.end_step(rec, val_loss, step, checkpoint, source, r.state);
  if (e.new_best) {
    res.best_val_loss = *val_loss;
    res.best_step = step;
    if (r.s.o.checkpoints) res.best_checkpoint = dir.best_dir();
  }
  if (e.saved) res.checkpoint = dir.checkpoint_dir();
}
}  // namespace

Seq2SeqTrainResult train_seq2seq(Seq2SeqTrainOptions opt_in, const volatile std::sig_atomic_t* stop) {
  Run r;
  r.s = std::move(opt_in);
  open_run(r);  // reads only: a failure leaves nothing behind
  TrainOptions& o = r.s.o;
  TS_CHECK(!r.resuming || r.state.step <= o.steps, "--resume: the checkpoint is at step ", r.state.step,
           ", past --steps ", o.steps);
  AdamWConfig acfg{
      .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.adam_eps, .weight_decay = o.weight_decay, .grad_clip = o.grad_clip};
  AdamW adam(r.model->params(), acfg, *r.ctx);
  if (r.resuming)
    adam.load_state(r.state.adam_m, r.state.adam_v, r.state.optimizer_step < 0 ? r.state.step : r.state.optimizer_step);
  r.state.optimizer_step = adam.step_count();
  if (r.scaling.on() && r.resuming && r.state.loss_scale > 0)
    r.scaling.scaler().set_state(r.state.loss_scale, r.state.loss_scale_good_steps);
  if (!r.scaling.on()) r.state.loss_scale = 0;
  if (r.scaling.on()) {  // a checkpoint before the first step carries the scale it starts from
    r.state.loss_scale = r.scaling.scale();
    r.state.loss_scale_good_steps = r.scaling.scaler().good_steps();
  }
  r.state.adam_m.clear();
  r.state.adam_v.clear();
  r.state.tokenizer_json = read_dir_tokenizer(o.data);
  const PairBatchParams params = batch_params(r.s);
  PairBatcher batches(*r.train, params);
  if (r.resuming) batches.set_position(r.state.data_pos >> 32, r.state.data_pos & 0xffffffffu);

  ensure_writable_dir(o.out.empty() ? "." : o.out);
  fs::create_directories(o.out);
  const json options = options_json(r.s);
  RunDir dir(o, r.state, r.resuming, /*lead=*/true, /*dp=*/nullptr, &options);
  Loop L(r, adam, batches, dir);
  L.params = params;
  if (dir.seeds_best()) dir.save_best(L.source, r.state, dir.best_val_loss(), dir.best_step());
  std::tie(L.res.best_val_loss, L.res.best_step) = std::pair(dir.best_val_loss(), dir.best_step());
  if (L.res.best_step > 0 && o.checkpoints) L.res.best_checkpoint = dir.best_dir();
  const int64_t first = r.state.step + 1;
  ProgressBar bar(o.steps, r.state.step, o.progress);
  const auto t0 = Clock::now();
  for (int64_t step = first; step <= o.steps; ++step) {
    nlohmann::ordered_json rec;
    const double loss = L.step(step, rec);
    if (step == first) L.res.first_loss = loss;
    L.res.last_loss = loss;
    L.res.steps++;
    L.res.last_step = step;
    const bool last = step == o.steps;
    // Tests: a stop signal as if Ctrl-C came during step 2 (TESSERA_FAULT_INJECT=seq2seq-stop-step-2).
    if (step == 2 && fault_injected("seq2seq-stop-step-2")) std::raise(SIGINT);
    const bool stopping = (stop && *stop != 0) || (o.stop_after > 0 && step >= o.stop_after);
    const bool periodic = o.ckpt_every > 0 && step % o.ckpt_every == 0;
    L.finish(step, r.val && ((o.val_every > 0 && step % o.val_every == 0) || last), last || stopping || periodic, rec);
    char fields[96];
    std::snprintf(fields, sizeof fields, "loss %.4f", loss);
    bar.update(step, fields);
    if (stopping && !last) {
      L.res.interrupted = true;
      break;
    }
  }
  bar.finish();
  L.res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return L.res;
}

}  // namespace tessera
