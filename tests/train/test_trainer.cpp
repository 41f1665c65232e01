// The training loop's run-keeping: validation over the split exactly once, checkpoints by steps or wall time,
// best/ at the lowest validation loss, and a clean stop on request.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/trainer.h"
#include "test_util.h"

namespace tessera {
namespace {

// The mean loss is an f32 scalar reduced on the device (Gpt::loss), so two orders of summation agree to f32
// rounding; a wrapped or double-counted window changes the mean by orders of magnitude more.
constexpr double kLossTol = 1e-6;

namespace fs = std::filesystem;
using test::temp_dir;

ModelConfig small() {
  return test::small_config(/*vocab=*/256, /*d_model=*/16, /*n_layers=*/1, /*n_heads=*/2, /*d_ff=*/24, /*max_seq=*/16);
}

std::vector<uint16_t> random_tokens(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> t(n);
  for (auto& x : t) x = static_cast<uint16_t>(rng() % 256);
  return t;
}

// The mean loss over the windows [k*T, k*T + T] for k < windows, one forward each.
double direct_loss(Model& m, const std::vector<uint16_t>& tokens, int T, size_t windows) {
  double sum = 0;
  std::vector<int32_t> x(T), y(T);
  for (size_t k = 0; k < windows; ++k) {
    for (int i = 0; i < T; ++i) {
      x[i] = tokens[k * T + i];
      y[i] = tokens[k * T + i + 1];
    }
    sum += m.forward(x.data(), y.data(), 1, T, {});
  }
  return sum / static_cast<double>(windows);
}

// A val split of 3.5 batches: 7 windows of B=2 x T=8 plus 3 spare tokens. Asking for 4 batches (8 windows)
// must take the 7 there are, each once, not wrap around to count the first again.
TEST(Validation, CoversTheSplitOnceWithoutWrapping) {
  const fs::path d = temp_dir("val_once");
  constexpr int B = 2, T = 8;
  const auto tokens = random_tokens(7 * T + 1 + 3, test::test_seed());
  write_shard((d / "val_000000.bin").string(), tokens);
  TokenStream val({(d / "val_000000.bin").string()}, 256);
  Gpt m(small());
  m.init_weights(test::test_seed());
  const double all = direct_loss(m, tokens, T, 7);
  EXPECT_NEAR(validation_loss(m, val, B, T, /*max_batches=*/4), all, kLossTol * all);
  EXPECT_NEAR(validation_loss(m, val, B, T, /*max_batches=*/0), all, kLossTol * all);
  EXPECT_NEAR(validation_loss(m, val, B, T, /*max_batches=*/2), direct_loss(m, tokens, T, 4), kLossTol * all);
  EXPECT_NEAR(validation_loss(m, val, 4, T, /*max_batches=*/1), direct_loss(m, tokens, T, 4), kLossTol * all);
  fs::remove_all(d);
}

TrainOptions options(const fs::path& d) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  if (!fs::exists(d / "data")) prepare_text(text, (d / "data").string());
  TrainOptions o;
  o.model = small();
  o.data = (d / "data").string();
  o.out = (d / "out").string();
  o.batch = 2;
  o.seq = 8;
  o.warmup = 1;
  o.progress = false;
  o.steps = 4;
  return o;
}

// The run's own validation equals a direct forward over every val window of the final model: on the old
// loop, 4 batches of 4 x 16 tokens over the 180-token val split wrapped back to token 0 at the third.
TEST(Validation, TrainingRecordsTheWholeSplit) {
  const fs::path d = temp_dir("val_train");
  TrainOptions o = options(d);
  o.val_every = 0;
  o.batch = 4;
  o.seq = 16;
  const TrainResult r = train(o);
  const auto val = read_shard((d / "data" / "val_000000.bin").string());
  const size_t windows = (val.size() - 1) / o.seq;
  ASSERT_LT(windows, static_cast<size_t>(o.val_batches * o.batch)) << "the split must be shorter than 4 batches";
  EXPECT_NEAR(r.last_val_loss, direct_loss(*r.model, val, o.seq, windows), kLossTol * r.last_val_loss);
  fs::remove_all(d);
}

std::vector<int64_t> checkpoint_steps(TrainOptions o) {
  std::vector<int64_t> steps;
  TrainControl c;
  c.on_checkpoint = [&](int64_t step) { steps.push_back(step); };
  fs::remove_all(o.out);
  train(train_setup(o), c);
  return steps;
}

TEST(Checkpoints, ByStepsByWallTimeOrOnlyAtTheEnd) {
  const fs::path d = temp_dir("ckpt_every");
  TrainOptions o = options(d);
  o.val_every = 0;
  o.ckpt_every = 2;
  EXPECT_EQ(checkpoint_steps(o), (std::vector<int64_t>{2, 4}));
  o.ckpt_every = 0;
  EXPECT_EQ(checkpoint_steps(o), (std::vector<int64_t>{4}));
  o.ckpt_every = -1;  // the default: by wall time; any step outlasts a femtosecond
  o.ckpt_minutes = 1e-17;
  EXPECT_EQ(checkpoint_steps(o), (std::vector<int64_t>{1, 2, 3, 4}));
  o.ckpt_minutes = 1e6;
  EXPECT_EQ(checkpoint_steps(o), (std::vector<int64_t>{4}));
  // Steps decide over wall time: the CLI refuses both flags together, but saved options and the API can hold both.
  o.ckpt_every = 0;
  o.ckpt_minutes = 1e-17;
  EXPECT_EQ(checkpoint_steps(o), (std::vector<int64_t>{4}));
  o.ckpt_every = 3;
  EXPECT_EQ(checkpoint_steps(o), (std::vector<int64_t>{3, 4}));
  const TrainOptions defaults;
  EXPECT_EQ(defaults.ckpt_every, -1);
  EXPECT_EQ(defaults.ckpt_minutes, 10);
  fs::remove_all(d);
}

TEST(Checkpoints, StopRequestEndsTheStepWithACheckpoint) {
  const fs::path d = temp_dir("ckpt_stop");
  TrainOptions o = options(d);
  o.ckpt_every = 0;
  volatile std::sig_atomic_t stop = SIGINT;  // already asked: the first step completes, then the loop stops
  TrainControl c;
  c.stop = &stop;
  const TrainResult r = train(train_setup(o), c);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.last_step, 1);
  auto m = load_checkpoint_model(r.checkpoint);
  EXPECT_EQ(load_train_state(r.checkpoint, *m).step, 1);
  fs::remove_all(d);
}

// best/ holds the step of the lowest val_loss in metrics.jsonl. The learning rate is high enough for the
// validation loss to rise again, so that step is not the last.
TEST(Checkpoints, BestHoldsTheLowestValidationLoss) {
  const fs::path d = temp_dir("best");
  TrainOptions o = options(d);
  o.steps = 6;
  o.val_every = 1;
  o.lr = 1.0f;  // far too high: the validation loss jumps about
  o.min_lr_ratio = 1.0f;
  o.warmup = 0;
  const TrainResult r = train(o);
  std::ifstream in(fs::path(o.out) / "metrics.jsonl");
  int64_t best_step = 0;
  double best = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (best_step == 0 || j["val_loss"].get<double>() < best) best = j["val_loss"], best_step = j["step"];
  }
  ASSERT_NE(best_step, o.steps) << "the validation loss must turn up for this test to tell best/ from checkpoint/";
  auto m = load_checkpoint_model(r.best_checkpoint);
  EXPECT_EQ(r.best_checkpoint, (fs::path(o.out) / "best").string());
  EXPECT_EQ(load_train_state(r.best_checkpoint, *m).step, best_step);
  EXPECT_EQ(r.best_step, best_step);
  EXPECT_EQ(r.best_val_loss, best);

  // Interrupted right after the best step and resumed: the resumed run must remember that best (from its metrics),
  // so the later, worse validation losses do not overwrite best/.
  o.stop_after = best_step;
  o.out = (d / "split").string();
  train(o);
  TrainOptions resume;
  resume.resume = (d / "split" / "checkpoint").string();
  resume.out = o.out;
  resume.steps = 0;  // the saved run's
  resume.progress = false;
  const TrainResult rr = train(resume);
  EXPECT_EQ(rr.best_step, best_step);
  EXPECT_EQ(rr.best_val_loss, best);
  auto mr = load_checkpoint_model(rr.best_checkpoint);
  EXPECT_EQ(load_train_state(rr.best_checkpoint, *mr).step, best_step) << "best/ was overwritten after the resume";
  ASSERT_TRUE(best_record(rr.best_checkpoint).has_value());
  EXPECT_EQ(*best_record(rr.best_checkpoint), std::make_pair(best, best_step));
  EXPECT_FALSE(best_record(resume.resume).has_value()) << "only best/ records a validation loss";

  // The same with the metrics gone: best/ records its own loss, and the later, worse losses still do not replace it.
  // A best/ without that record (written before it was kept) is replaced, with a warning.
  for (const bool recorded : {true, false}) {
    o.out = (d / (recorded ? "no_metrics" : "old_best")).string();
    train(o);
    fs::remove(fs::path(o.out) / "metrics.jsonl");
    const std::string best_dir = (fs::path(o.out) / "best").string();
    if (!recorded) {  // rewritten as an older tessera wrote it
      auto bm = load_checkpoint_model(best_dir);
      const TrainState bs = load_train_state(best_dir, *bm);
      save_checkpoint(best_dir, *bm, &bs);
      ASSERT_FALSE(best_record(best_dir).has_value());
    }
    resume.resume = (fs::path(o.out) / "checkpoint").string();
    resume.out = o.out;
    testing::internal::CaptureStderr();
    const TrainResult rn = train(resume);
    const std::string err = testing::internal::GetCapturedStderr();
    auto mn = load_checkpoint_model(rn.best_checkpoint);
    if (recorded) {
      EXPECT_EQ(rn.best_step, best_step);
      EXPECT_EQ(rn.best_val_loss, best);
      EXPECT_EQ(load_train_state(rn.best_checkpoint, *mn).step, best_step) << "best/ replaced without metrics";
      // One warning, of the metrics lost; none of best/.
      EXPECT_NE(err.find("metrics.jsonl: no record of steps 1 to "), std::string::npos) << err;
      EXPECT_EQ(err.find("warning"), err.rfind("warning")) << err;
      EXPECT_EQ(err.find("does not record its loss"), std::string::npos) << err;
    } else {
      EXPECT_GT(rn.best_step, best_step);
      EXPECT_NE(err.find("does not record its loss: the resumed run's first validation will replace it"),
                std::string::npos)
          << err;
    }
  }
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
