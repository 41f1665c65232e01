// Data-parallel training through the real trainer, against a single process trained on the same global batch.
//
// N ranks with --batch B each train on the rows of a global batch of B·N sequences; one process with --batch B·N
// trains on the same rows. Their gradients differ only by the order of f32 sums, so after K steps the parameters
// must agree to kParamTol relative (each rank computes the single-process reference itself). Where the gradient
// clip is on, it is active (the first norms are about 3 > 1), so ZeRO-1's global norm is checked too.
//
// AdamW's ε is raised to kAdamEps for these runs. With the default 1e-8, an element whose gradient is a sum that
// cancels to within a few ulps of its terms (a key bias, whose exact gradient is zero; an LM-head row of a rare
// token) gets g / (√v + ε) from rounding noise, of either sign and up to lr in size: any two runs that sum in
// another order, the single process included, then differ there by a good fraction of lr, which no relative bound
// of 1e-6 survives. With ε = 1e-3, far above that noise and near the clipped gradients' size, the update is
// well conditioned, and it is no longer invariant to the gradient's scale, so a sum that should have been an
// average shows (Adam with a tiny ε would hide it).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>
#include <sstream>

#include "dist_test_util.h"
#include "tessera/core/file_io.h"
#include "tessera/dist/data_parallel.h"
#include "tessera/dist/zero.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/trainer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::Backend;

// The bound: after K steps, parameters within 1e-6 relative of the single process, in f32 (over the
// whole buffer); and every tensor alone within 1e-5 (see compare).
constexpr double kParamTol = 1e-6;
constexpr double kTensorTol = 1e-5;
constexpr int kSteps = 3;
constexpr int kBatch = 2;  // per rank
constexpr int kVocab = 64;
constexpr float kAdamEps = 1e-3f;

ModelConfig gpt2_style() {
  return test::small_config(kVocab, /*d_model=*/16, /*n_layers=*/2, /*n_heads=*/2, /*d_ff=*/32, /*max_seq=*/8);
}

ModelConfig llama_style() { return test::llama_shaped(gpt2_style()); }

// Relative errors ‖a − b‖ / ‖b‖: over the whole buffer (the bound, kParamTol), and the largest over any
// one tensor, and which (kTensorTol). A tensor that is small and a sum with much cancellation (a bias, summed
// over every token) carries f32 rounding of a few 1e-7 of itself between two orders of summation; a real fault
// (a range left unreduced, a sum where an average belongs) is off by far more than either bound.
struct Errors {
  double whole = 0, tensor = 0;
  std::string worst;
};
Errors compare(const ParamBuffer& layout, const std::vector<float>& a, const std::vector<float>& b) {
  Errors e{.whole = test::rel_error(a, b), .tensor = 0, .worst = ""};
  for (const ParamSegment& s : layout.segments()) {
    const double t = test::rel_error(std::vector<float>(a.begin() + s.offset, a.begin() + s.offset + s.numel),
                                     std::vector<float>(b.begin() + s.offset, b.begin() + s.offset + s.numel));
    if (!(t <= e.tensor)) e = {e.whole, t, s.name};
  }
  return e;
}

#define EXPECT_PARAMS_NEAR(layout, got, want, what) \
  do { \
    const Errors e_ = compare(layout, got, want); \
    EXPECT_LE(e_.whole, kParamTol) << what << " (whole buffer)"; \
    EXPECT_LE(e_.tensor, kTensorTol) << what << ": worst tensor " << e_.worst; \
  } while (0)

struct DistRun {
  TrainResult result;
  std::vector<float> params;
  CommStats grad_stats;
  size_t buckets = 0;
  size_t state_bytes = 0;
};

// (loss, grad_norm) of every step in a run's metrics.jsonl.
std::vector<std::pair<double, double>> read_metrics(const fs::path& out) {
  std::vector<std::pair<double, double>> m;
  std::istringstream in(read_file_text((out / "metrics.jsonl").string()));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    m.emplace_back(j.at("loss").get<double>(), j.at("grad_norm").get<double>());
  }
  return m;
}

class Training : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    const std::string why = test::backend_unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
    control_ = std::make_unique<MpiCommunicator>(test::world(), test::kTestTimeout);
    dir_ = test::shared_dir(::testing::UnitTest::GetInstance()->current_test_info()->name(), *control_);
    if (rank() == 0) {
      std::mt19937_64 rng(test::shared_seed(*control_));
      auto tokens = [&](size_t n) {
        std::vector<uint16_t> t(n);
        for (auto& x : t) x = static_cast<uint16_t>(rng() % kVocab);
        return t;
      };
      fs::create_directories(dir_ / "data");
      write_shard((dir_ / "data" / "train_000000.bin").string(), tokens(3000));
      write_shard((dir_ / "data" / "val_000000.bin").string(), tokens(200));
    } else {
      test::shared_seed(*control_);
    }
    control_->barrier();
  }
  void TearDown() override {
    if (!control_) return;
    control_->barrier();
    if (rank() == 0) fs::remove_all(dir_);
  }

  int rank() const { return control_->rank(); }
  int N() const { return control_->size(); }

  TrainOptions base(const ModelConfig& model) const {
    TrainOptions o;
    o.model = model;
    o.data = (dir_ / "data").string();
    o.batch = kBatch;
    o.seq = 8;
    o.steps = kSteps;
    o.warmup = 1;
    o.lr = 1e-3f;
    o.grad_clip = 1.0f;
    o.adam_eps = kAdamEps;
    o.val_every = 0;
    o.ckpt_every = 0;
    o.progress = false;
    o.device = GetParam() == Backend::Mpi ? "cpu" : test::backend_device(GetParam()).str();
    o.precision = "f32";
    return o;
  }

  // One process on the global batch (each rank trains its own copy, in a directory of its own).
  std::vector<float> single(TrainOptions o, const std::string& tag) {
    o.batch *= N();
    o.world_size = 1;
    o.out = (dir_ / ("single_" + tag + "_rank" + std::to_string(rank()))).string();
    TrainResult r = train(train_setup(o));
    return r.model->params().read_f32(r.model->context());
  }

  // The same run on every rank, data parallel.
  DistRun parallel(TrainOptions o, const DataParallelOptions& d, const std::string& tag,
                   std::function<void(int64_t, Model&)> before_optimizer_step = {},
                   std::function<void(int64_t, Model&)> before_grad_sync = {}) {
    o.world_size = N();
    o.out = (dir_ / tag).string();
    TrainSetup setup = train_setup(o);
    DataParallelRun dp(test::world(), *setup.context,
                       {.ddp = d.ddp, .bucket_mb = d.bucket_mb, .zero = d.zero, .timeout_s = test::kTestTimeout});
    setup.parallel = &dp;
    DistRun run;
    TrainControl control;
    control.on_start = [&](size_t state_bytes, size_t) { run.state_bytes = state_bytes; };
    control.before_optimizer_step = std::move(before_optimizer_step);
    control.before_grad_sync = std::move(before_grad_sync);
    run.result = train(std::move(setup), control);
    run.params = run.result.model->params().read_f32(run.result.model->context());
    run.grad_stats = dp.gradients().stats();
    run.buckets = dp.buckets().size();
    return run;
  }

  // On rank 0: the loss and gradient norm of every step of a data-parallel run (its metrics, the global mean
  // loss and the norm of the averaged gradient) against the single process's. A gradient that is summed instead of
  // averaged, or a range left unreduced, changes the norm even where Adam's scale invariance hides it in the
  // parameters.
  void expect_same_metrics(const std::string& run, const std::string& single_tag, const std::string& what) {
    if (rank() != 0) return;
    const auto got = read_metrics(dir_ / run);
    const auto want = read_metrics(dir_ / ("single_" + single_tag + "_rank0"));
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_NEAR(got[k].first, want[k].first, kParamTol * want[k].first) << what << ": loss of step " << k + 1;
      EXPECT_NEAR(got[k].second, want[k].second, kParamTol * want[k].second)
          << what << ": gradient norm of step " << k + 1;
    }
  }

  // True on every rank when every rank holds the same bits.
  bool same_on_all_ranks(const std::vector<float>& v) {
    uint64_t h = 0xcbf29ce484222325ull;
    const auto* b = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    std::vector<uint64_t> all(N());
    control_->all_gather(Tensor(&h, DType::U8, {8}), Tensor(all.data(), DType::U8, {8 * N()}));
    for (uint64_t x : all)
      if (x != all[0]) return false;
    return true;
  }

  std::unique_ptr<MpiCommunicator> control_;
  fs::path dir_;
};

// The averaged gradient itself, after end_backward, against the gradient of the whole global batch in one
// process, over two accumulation micro-steps: well conditioned (no Adam in between), so a gradient summed instead
// of averaged, a bucket or parameter left out, or a range reduced twice fails here directly.
TEST_P(Training, EveryDdpFormAveragesTheGradientOfTheGlobalBatch) {
  constexpr int T = 8;
  const int B = kBatch, G = kBatch * N();
  Context ctx(test::backend_device(GetParam()));
  std::mt19937_64 rng(test::shared_seed(*control_));
  std::vector<std::vector<int32_t>> x(2), y(2);  // two global micro-batches, the same on every rank
  for (int k = 0; k < 2; ++k) {
    x[k] = test::randint(static_cast<size_t>(G) * T, kVocab, rng);
    y[k] = test::randint(static_cast<size_t>(G) * T, kVocab, rng);
  }
  for (const ModelConfig& model : {gpt2_style(), llama_style()}) {
    Gpt ref(model, ctx, DType::F32);
    ref.init_weights(7);
    ref.zero_grad();
    for (int k = 0; k < 2; ++k) {
      ref.forward(x[k].data(), y[k].data(), G, T, {});
      ref.backward(0.5);
    }
    const std::vector<float> want = ref.params().read_grad_f32(ctx);
    for (const auto& [mode, bucket_mb] :
         {std::pair{DdpMode::Naive, 25.0}, std::pair{DdpMode::Flat, 25.0}, std::pair{DdpMode::Overlap, 25.0},
          std::pair{DdpMode::Bucket, 0.002}, std::pair{DdpMode::Bucket, 25.0}}) {
      Gpt m(model, ctx, DType::F32);
      m.init_weights(rank() == 0 ? 7 : 8);  // attach() must make every rank's parameters rank 0's
      DataParallelRun dp(test::world(), ctx, {.ddp = mode, .bucket_mb = bucket_mb, .timeout_s = test::kTestTimeout});
      dp.attach(m);
      m.zero_grad();
      for (int k = 0; k < 2; ++k) {
        const size_t row0 = static_cast<size_t>(rank()) * B * T;
        m.forward(x[k].data() + row0, y[k].data() + row0, B, T, {});
        dp.begin_backward(m, /*sync=*/k == 1);
        m.backward(0.5);
        dp.end_backward(m, /*sync=*/k == 1);
      }
      const std::vector<float> got = m.params().read_grad_f32(ctx);
      const std::string what = std::string(model.tied ? "gpt2 " : "llama ") + ddp_mode_name(mode) + " " +
                               std::to_string(bucket_mb) + " MB";
      EXPECT_PARAMS_NEAR(m.params(), got, want, what + " gradient");
    }
  }
}

// Loss scaling under DDP: the gradients are reduced scaled (S·g averaged is S times the average), every rank
// unscales alike, and an overflow skips the same step on every rank with the same halving, so the ranks stay
// identical. The hook runs after the reduction, so the inf is planted on every rank, as an overflow in one rank's
// backward arrives everywhere through the all-reduce (inf and NaN survive a sum). (ZeRO-1 refuses loss scaling:
// its sharded clip has no skip.)
TEST_P(Training, LossScalingSkipsTheSameStepOnEveryRank) {
  TrainOptions o = base(gpt2_style());
  o.loss_scaling = true;
  o.loss_scale_init = 1024;
  o.loss_scale_interval = 1000;
  auto plant = [&](int64_t step, Model& m) {
    if (step != 2) return;
    const float inf = std::numeric_limits<float>::infinity();
    const size_t at = m.params().segments().back().offset;
    copy_bytes(static_cast<float*>(m.params().grad().data()) + at, m.params().device(), &inf, Device::cpu(), sizeof inf,
               m.context());
    m.context().synchronize();
  };
  for (const DdpMode mode : {DdpMode::Naive, DdpMode::Bucket}) {
    const std::string tag = std::string("scaled_") + ddp_mode_name(mode);
    const DistRun run = parallel(o, {.ddp = mode, .bucket_mb = 0.002}, tag, plant);
    EXPECT_EQ(run.result.skipped_steps, 1) << tag << " on rank " << rank();
    EXPECT_EQ(run.result.loss_scale, 512.0) << tag << " on rank " << rank();
    EXPECT_TRUE(same_on_all_ranks(run.params)) << tag;
    if (rank() == 0) {
      std::ifstream in(dir_ / tag / "metrics.jsonl");
      int64_t step = 0;
      for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        ++step;
        EXPECT_EQ(j.at("skipped").get<bool>(), step == 2) << tag << " step " << step;
        EXPECT_EQ(j.at("loss_scale").get<double>(), step <= 2 ? 1024.0 : 512.0) << tag << " step " << step;
      }
      EXPECT_EQ(step, kSteps) << tag;
    }
  }
}

// An overflow in one rank's backward alone: the reduction carries the inf to every rank (inf survives a sum), and
// every rank skips that step with the same halving, so the ranks stay identical.
TEST_P(Training, OneRanksOverflowSkipsTheStepOnEveryRank) {
  TrainOptions o = base(gpt2_style());
  o.loss_scaling = true;
  o.loss_scale_init = 1024;
  o.loss_scale_interval = 1000;
  auto plant_on_last_rank = [&](int64_t step, Model& m) {
    if (step != 2 || rank() != N() - 1) return;
    const float inf = std::numeric_limits<float>::infinity();
    const size_t at = m.params().segments().back().offset;
    copy_bytes(static_cast<float*>(m.params().grad().data()) + at, m.params().device(), &inf, Device::cpu(), sizeof inf,
               m.context());
    m.context().synchronize();
  };
  for (const DdpMode mode : {DdpMode::Naive, DdpMode::Flat}) {
    const std::string tag = std::string("one_rank_inf_") + ddp_mode_name(mode);
    const DistRun run = parallel(o, {.ddp = mode}, tag, {}, plant_on_last_rank);
    EXPECT_EQ(run.result.skipped_steps, 1) << tag << " on rank " << rank();
    EXPECT_EQ(run.result.loss_scale, 512.0) << tag << " on rank " << rank();
    EXPECT_TRUE(same_on_all_ranks(run.params)) << tag;
  }
}

TEST_P(Training, EveryDdpFormEqualsOneProcessOnTheGlobalBatch) {
  for (const ModelConfig& model : {gpt2_style(), llama_style()}) {
    const std::string family = model.tied ? "gpt2" : "llama";
    // No clipping here: a clipped update is blind to the gradient's scale (a sum where an average belongs would be
    // clipped back to the same step); ZeRO-1's test below keeps it on for the global norm.
    TrainOptions o = base(model);
    o.grad_clip = 0;
    const std::vector<float> want = single(o, family);
    struct Form {
      DdpMode mode;
      double bucket_mb;
      const char* name;
    };
    // 0.002 MB buckets cut the tiny model's 29 kB of gradients into many; 25 MB is one bucket.
    for (const Form f :
         {Form{DdpMode::Naive, 25, "naive"}, Form{DdpMode::Flat, 25, "flat"}, Form{DdpMode::Overlap, 25, "overlap"},
          Form{DdpMode::Bucket, 0.002, "bucket-small"}, Form{DdpMode::Bucket, 25, "bucket-25"}}) {
      const DistRun run = parallel(o, {.ddp = f.mode, .bucket_mb = f.bucket_mb}, family + "_" + f.name);
      const std::string what = family + " --ddp " + f.name;
      EXPECT_PARAMS_NEAR(run.result.model->params(), run.params, want, what);
      EXPECT_TRUE(same_on_all_ranks(run.params)) << what << ": the ranks' parameters drifted apart";
      expect_same_metrics(family + "_" + f.name, family, what);
      if (f.bucket_mb < 1) {
        EXPECT_GE(run.buckets, 4u) << what;
      } else if (f.mode == DdpMode::Bucket) {
        EXPECT_EQ(run.buckets, 1u) << what;
      }
    }
  }
}

TEST_P(Training, Zero1EqualsOneProcessAndDdpAndShardsTheOptimizerState) {
  // One more position row than the sequences use makes the flat buffer an odd number of 16-element units, so that
  // at 2 and 4 ranks a tail is left past the equal blocks: it takes the all-reduce and the broadcast from the last
  // rank, which a buffer of whole blocks never exercises.
  ModelConfig model = gpt2_style();
  model.max_seq = 9;
  const TrainOptions o = base(model);
  const std::vector<float> want = single(o, "ref");
  const DistRun ddp = parallel(o, {.ddp = DdpMode::Flat}, "ddp");
  const DistRun zero = parallel(o, {.zero = 1}, "zero");
  const ParamBuffer& layout = zero.result.model->params();
  const ZeroLayout z = zero_layout(layout.size(), N());
  ASSERT_GT(z.total - z.tail_begin(), 0u) << "no tail past the equal blocks at " << N() << " ranks";
  EXPECT_PARAMS_NEAR(layout, zero.params, want, "ZeRO-1 against one process");
  EXPECT_PARAMS_NEAR(layout, zero.params, ddp.params, "ZeRO-1 against DDP");
  EXPECT_TRUE(same_on_all_ranks(zero.params));
  expect_same_metrics("zero", "ref", "ZeRO-1");

  // Memory: the ranks' moments partition the buffer (8 bytes an element in all), each 1/N of it to within the
  // tail of fewer than 16 N elements.
  const size_t total = layout.size(), unsharded = 8 * total;
  std::vector<double> bytes{static_cast<double>(zero.state_bytes)};
  std::vector<double> all(N());
  control_->all_gather(Tensor(bytes.data(), DType::F64, {1}), Tensor(all.data(), DType::F64, {N()}));
  double sum = 0;
  for (double b : all) sum += b;
  EXPECT_EQ(sum, static_cast<double>(unsharded));
  EXPECT_LE(std::abs(static_cast<double>(zero.state_bytes) - static_cast<double>(unsharded) / N()), 8.0 * 16 * N());
  EXPECT_EQ(ddp.state_bytes, unsharded);

  // The checkpoints: ZeRO's, gathered to rank 0, loads in a single process and holds DDP's moments.
  control_->barrier();
  auto moments = [&](const std::string& run) {
    const std::string ck = (dir_ / run / "checkpoint").string();
    auto model = load_checkpoint_model(ck);
    TrainState st = load_train_state(ck, *model);
    return std::make_tuple(model->params().read_f32(model->context()), st.adam_m, st.adam_v, st.step);
  };
  const auto [zp, zm, zv, zstep] = moments("zero");
  const auto [dp, dm, dv, dstep] = moments("ddp");
  EXPECT_EQ(zstep, kSteps);
  EXPECT_TRUE(zp == zero.params) << "the ZeRO checkpoint holds other parameters than the run";
  EXPECT_PARAMS_NEAR(layout, zm, dm, "ZeRO checkpoint m against DDP's");
  EXPECT_PARAMS_NEAR(layout, zv, dv, "ZeRO checkpoint v against DDP's");
}

// A 16-bit model keeps f32 master weights, of which ZeRO-1 updates only its range; read_state must make them whole,
// since rank 0 writes every parameter of a checkpoint from its masters. (GPU only: the CPU trains in f32.) ZeRO
// clips 16-bit gradients in memory where DDP clips in registers, so the two agree to bf16's rounding, not f32's;
// masters left stale outside a rank's range would be off by whole updates.
TEST_P(Training, Zero1MakesTheMasterWeightsOfA16BitModelWholeForCheckpoints) {
  if (GetParam() == Backend::Mpi) GTEST_SKIP() << "16-bit models train on GPUs only";
  constexpr double kBf16Tol = 1e-3;
  TrainOptions o = base(gpt2_style());
  o.precision = "bf16";
  const DistRun ddp = parallel(o, {.ddp = DdpMode::Flat}, "ddp16");
  const DistRun zero = parallel(o, {.zero = 1}, "zero16");
  EXPECT_LE(test::rel_error(zero.params, ddp.params), kBf16Tol) << "ZeRO-1's f32 masters against DDP's";
  control_->barrier();
  auto model = load_checkpoint_model((dir_ / "zero16" / "checkpoint").string());
  const std::vector<float> saved = model->params().read_f32(model->context());
  EXPECT_LE(test::rel_error(saved, ddp.params), kBf16Tol) << "the ZeRO-1 checkpoint's parameters against DDP's";
}

TEST_P(Training, AccumulationEqualsALargerBatchAndCommunicatesOncePerStep) {
  TrainOptions o = base(gpt2_style());
  TrainOptions big = o;
  big.batch = 2 * o.batch;
  const std::vector<float> want = single(big, "big");
  o.accum = 2;
  for (const auto& [d, name] : {std::pair{DataParallelOptions{.ddp = DdpMode::Bucket, .bucket_mb = 0.002}, "bucket"},
                                std::pair{DataParallelOptions{.ddp = DdpMode::Overlap}, "overlap"},
                                std::pair{DataParallelOptions{.zero = 1}, "zero"}}) {
    const DistRun acc = parallel(o, d, std::string("accum2_") + name);
    EXPECT_PARAMS_NEAR(acc.result.model->params(), acc.params, want, std::string(name) + " with --accum 2");
    expect_same_metrics(std::string("accum2_") + name, "big", std::string(name) + " with --accum 2");
    // The gradients travel once per optimizer step, whatever the number of micro-steps.
    TrainOptions one = o, three = o;
    one.accum = 1;
    three.accum = 3;
    const DistRun r1 = parallel(one, d, std::string("accum1_") + name);
    const DistRun r3 = parallel(three, d, std::string("accum3_") + name);
    EXPECT_GT(r1.grad_stats.ops, kSteps) << name;
    EXPECT_EQ(r3.grad_stats.ops, r1.grad_stats.ops) << name << ": accumulation micro-steps communicated";
    EXPECT_EQ(r3.grad_stats.bytes, r1.grad_stats.bytes) << name;
  }
}

TEST_P(Training, Zero1ResumesBitExactlyAtTheSameWorldSizeOnly) {
  TrainOptions o = base(gpt2_style());
  o.steps = 4;
  const DistRun straight = parallel(o, {.zero = 1}, "straight");
  TrainOptions first = o;
  first.stop_after = 2;
  parallel(first, {.zero = 1}, "resumed");
  control_->barrier();
  TrainOptions again;
  again.resume = (dir_ / "resumed" / "checkpoint").string();
  again.out = (dir_ / "resumed").string();
  again.steps = 0;  // the saved run's
  again.progress = false;
  again.device = o.device;
  again.precision = "f32";
  again.world_size = N();
  TrainSetup setup = train_setup(again);
  EXPECT_EQ(setup.state.step, 2);
  DataParallelRun dp(test::world(), *setup.context, {.zero = 1, .timeout_s = test::kTestTimeout});
  setup.parallel = &dp;
  TrainResult r = train(std::move(setup));
  EXPECT_EQ(r.last_step, 4);
  EXPECT_TRUE(r.model->params().read_f32(r.model->context()) == straight.params)
      << "a ZeRO-1 run resumed at step 2 differs from one that never stopped";

  // At another world size the global batch, and so the run, would change: refused with the size to use.
  control_->barrier();
  again.world_size = 1;
  const std::string err = test::error_of([&] { train_setup(again); });
  EXPECT_NE(err.find("written by a run of " + std::to_string(N()) + " ranks"), std::string::npos) << err;
  EXPECT_NE(err.find("mpirun -np " + std::to_string(N())), std::string::npos) << err;
}

TEST_P(Training, RanksThatDisagreeAreRefusedBeforeAnythingIsWritten) {
  TrainOptions o = base(gpt2_style());
  if (rank() == 1) o.lr *= 2;
  o.world_size = N();
  o.out = (dir_ / "mismatch").string();
  TrainSetup setup = train_setup(o);
  DataParallelRun dp(test::world(), *setup.context, {.timeout_s = test::kTestTimeout});
  setup.parallel = &dp;
  bool collective = false, quiet = true;
  std::string msg;
  try {
    train(std::move(setup));
  } catch (const CollectiveError& e) {
    collective = true;
    quiet = e.quiet();
    msg = e.what();
  }
  EXPECT_TRUE(collective) << "rank " << rank() << " trained despite the mismatch";
  EXPECT_EQ(quiet, rank() != 0);
  if (rank() == 0) {
    EXPECT_NE(msg.find("the ranks disagree on the training options"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1 differs from rank 0"), std::string::npos) << msg;
  }
  control_->barrier();
  EXPECT_FALSE(fs::exists(dir_ / "mismatch"));
}

INSTANTIATE_TEST_SUITE_P(Backends, Training, ::testing::Values(Backend::Mpi, Backend::Nccl), test::backend_name);

}  // namespace
}  // namespace tessera
