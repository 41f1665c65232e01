// The training step as CUDA graphs (train/graph_step.h) against the eager step: the same losses, gradient norms,
// loss-scale decisions and final parameters, bit for bit, over several steps, with what a graph would freeze
// changing every step (the lr in warm-up, AdamW's t, the dropout streams), with --accum 2, and in f16 with a planted
// overflow that is skipped and halves the loss scale (the step graph is captured again); a failed capture falls
// back to eager steps; a Llama-style (RoPE) model; bench model's regions as graphs, f16 with train's loss scaling
// among them. And CudaGraph itself: an illegal call inside a capture ends the capture with a clear Error and leaves
// the stream usable.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "cuda_train_util.h"
#include "tessera/bench/memory_timeline.h"
#include "tessera/bench/model.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/trainer.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<json> metrics(const std::string& out) {
  std::vector<json> recs;
  std::ifstream f(fs::path(out) / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) recs.push_back(json::parse(line));
  return recs;
}

bool graphs_here() { return probe_gpu().available && cuda_graph_capture_supported(); }

struct Runs {
  TrainResult eager, graph;
  std::vector<json> eager_recs, graph_recs;
};

// The run `o` twice into d/eager and d/graph, with --cuda-graph off and on, each with the control `c`.
Runs train_both(const fs::path& d, const TrainOptions& o, const TrainControl& c = {}) {
  Runs r;
  TrainOptions e = o, g = o;
  e.out = (d / "eager").string();
  e.cuda_graph = CudaGraphMode::Off;
  g.out = (d / "graph").string();
  g.cuda_graph = CudaGraphMode::On;
  r.eager = train(train_setup(e), c);
  r.graph = train(train_setup(g), c);
  r.eager_recs = metrics(e.out);
  r.graph_recs = metrics(g.out);
  return r;
}

// Step for step: loss, lr, grad_norm (null on a skipped step), and with loss scaling the scale and the skip; then
// every parameter (the f32 master weights of a 16-bit model).
void expect_identical(const Runs& r, int steps) {
  ASSERT_EQ(r.eager_recs.size(), static_cast<size_t>(steps));
  ASSERT_EQ(r.graph_recs.size(), static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    const json &e = r.eager_recs[i], &g = r.graph_recs[i];
    EXPECT_EQ(g["loss"], e["loss"]) << "step " << i + 1;
    EXPECT_EQ(g["lr"], e["lr"]) << "step " << i + 1;
    EXPECT_EQ(g["grad_norm"], e["grad_norm"]) << "step " << i + 1;
    EXPECT_EQ(g.value("loss_scale", json()), e.value("loss_scale", json())) << "step " << i + 1;
    EXPECT_EQ(g.value("skipped", json()), e.value("skipped", json())) << "step " << i + 1;
  }
  EXPECT_TRUE(r.eager.model->params().read_f32(*r.eager.context) == r.graph.model->params().read_f32(*r.graph.context))
      << "the final parameters differ";
  EXPECT_EQ(r.eager.graph_steps, 0);
}

// `tiny` with dropout and attention dropout 0.1 (gpt2-124m's) and the lr in warm-up over the whole run, so that the
// lr, AdamW's t and the dropout streams all change every step.
TrainOptions changing_every_step(const fs::path& d, const std::string& precision, int steps) {
  TrainOptions o = tiny_run(d, "unused", "cuda", precision, steps);
  o.model.dropout = 0.1f;
  o.model.attn_dropout = 0.1f;
  o.warmup = 100;
  return o;
}

TEST(CudaGraphStep, Bf16DropoutWarmupMatchesEagerBitForBit) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  const fs::path d = temp_dir("cuda_graph_bf16");
  prepare_text(bundled_corpus(), (d / "data").string());
  constexpr int kSteps = 8;
  TrainOptions o = changing_every_step(d, "bf16", kSteps);
  // An eager step in the middle (the traced one) between replays: the graph must pick up where it left off.
  o.trace = (d / "trace.json").string();
  o.trace_step = 4;
  const Runs r = train_both(d, o);
  expect_identical(r, kSteps);
  EXPECT_EQ(r.graph.graph_steps, kSteps - 2) << "step 1 (eager set-up) and the traced step 4 run eagerly";
  EXPECT_EQ(r.graph.graph_captures, 1);
  EXPECT_EQ(r.graph.graphs_per_step, 1) << "forward, backward and AdamW in one graph";
  // Each dropout is live: the same run without it takes other losses (else the test could not see a frozen stream).
  for (const char* off : {"dropout", "attn_dropout"}) {
    TrainOptions plain = o;
    (std::string(off) == "dropout" ? plain.model.dropout : plain.model.attn_dropout) = 0.0f;
    plain.out = (d / (std::string("no_") + off)).string();
    plain.trace.clear();
    train(train_setup(plain));
    EXPECT_NE(metrics(plain.out)[2]["loss"], r.graph_recs[2]["loss"]) << "without " << off;
  }
  fs::remove_all(d);
}

// A Llama-style `tiny` (RoPE; 4 heads of 32, a width the flash backward rotates dQ and dK back in): the RoPE table
// the first (eager) step makes is the one the graph replays read.
TEST(CudaGraphStep, Bf16RopeMatchesEagerBitForBit) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  const fs::path d = temp_dir("cuda_graph_rope");
  prepare_text(bundled_corpus(), (d / "data").string());
  constexpr int kSteps = 4;
  TrainOptions o = changing_every_step(d, "bf16", kSteps);
  o.model = llama_style(o.model);
  ASSERT_EQ(o.model.head_dim(), 32);
  const Runs r = train_both(d, o);
  expect_identical(r, kSteps);
  EXPECT_EQ(r.graph.graph_steps, kSteps - 1);
  fs::remove_all(d);
}

TEST(CudaGraphStep, F32Accum2DropoutMatchesEagerBitForBit) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  const fs::path d = temp_dir("cuda_graph_accum");
  prepare_text(bundled_corpus(), (d / "data").string());
  constexpr int kSteps = 6;
  TrainOptions o = changing_every_step(d, "f32", kSteps);
  o.accum = 2;
  o.label_smoothing = 0.1f;
  const Runs r = train_both(d, o);
  expect_identical(r, kSteps);
  EXPECT_EQ(r.graph.graph_steps, kSteps - 1);
  // The checkpoints agree on the RNG stream and the data position, so a resumed run continues the same way.
  auto ce = load_checkpoint_model(r.eager.checkpoint), cg = load_checkpoint_model(r.graph.checkpoint);
  const TrainState se = load_train_state(r.eager.checkpoint, *ce), sg = load_train_state(r.graph.checkpoint, *cg);
  EXPECT_EQ(sg.rng.next_stream, se.rng.next_stream);
  EXPECT_EQ(sg.data_pos, se.data_pos);
  EXPECT_EQ(sg.optimizer_step, se.optimizer_step);
  fs::remove_all(d);
}

// f16 with dynamic loss scaling: an overflow planted at step 4 (replayed, between the step graph and the
// optimizer's) is skipped as in the eager run, the scale halves, the step graph is captured again for the new scale,
// and every later step still matches.
TEST(CudaGraphStep, F16PlantedOverflowSkipsAndRecapturesLikeEager) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  const fs::path d = temp_dir("cuda_graph_f16");
  prepare_text(bundled_corpus(), (d / "data").string());
  constexpr int kSteps = 10, kPlant = 4;
  TrainOptions o = changing_every_step(d, "f16", kSteps);
  o.loss_scale_init = 1024.0;  // the tiny model does not overflow by itself there (test_loss_scaling_cuda.cpp)
  TrainControl c;
  c.before_optimizer_step = [&](int64_t step, Model& m) {
    if (step == kPlant) plant_inf_f16(m);
  };
  const Runs r = train_both(d, o, c);
  expect_identical(r, kSteps);
  for (int i = 0; i < kSteps; ++i)
    EXPECT_EQ(r.graph_recs[i]["skipped"].get<bool>(), i + 1 == kPlant) << "step " << i + 1;
  EXPECT_EQ(r.graph_recs[kPlant]["loss_scale"].get<double>(), 512.0);
  EXPECT_EQ(r.graph.skipped_steps, 1);
  EXPECT_EQ(r.graph.graph_steps, kSteps - 1);
  EXPECT_EQ(r.graph.graph_captures, 2) << "the new loss scale needs a new capture of the backward";
  EXPECT_EQ(r.graph.graphs_per_step, 2) << "the hook runs on the host between the backward's graph and AdamW's";
  fs::remove_all(d);
}

// A capture that fails (here: the test hook throws inside it, as an illegal call would end it) in the default
// --cuda-graph mode: a warning, and that step and every later one run eagerly on the same batches, so the run is
// bit for bit the eager run. With --cuda-graph on the same failure stops the run with the capture's error.
TEST(CudaGraphStep, FailedCaptureFallsBackToEagerStepsUnlessAskedFor) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  const fs::path d = temp_dir("cuda_graph_fallback");
  prepare_text(bundled_corpus(), (d / "data").string());
  constexpr int kSteps = 5;
  TrainOptions o = changing_every_step(d, "bf16", kSteps);
  o.accum = 2;  // the failed step's two micro-batches must both be the ones drawn for it
  int attempts = 0;
  TrainControl c;
  c.in_graph_capture = [&] {
    attempts++;
    TS_THROW("planted capture failure");
  };
  Runs r;
  TrainOptions e = o, a = o;
  e.out = (d / "eager").string();
  e.cuda_graph = CudaGraphMode::Off;
  a.out = (d / "auto").string();
  a.cuda_graph = CudaGraphMode::Auto;
  r.eager = train(train_setup(e));
  r.graph = train(train_setup(a), c);
  r.eager_recs = metrics(e.out);
  r.graph_recs = metrics(a.out);
  expect_identical(r, kSteps);
  EXPECT_EQ(attempts, 1) << "step 2 tries the capture once; after it fails no step tries again";
  EXPECT_EQ(r.graph.graph_steps, 0);
  EXPECT_EQ(r.graph.graph_captures, 0);
  // Asked for: the run stops at the failed capture, with its error.
  TrainOptions on = o;
  on.out = (d / "on").string();
  on.cuda_graph = CudaGraphMode::On;
  try {
    train(train_setup(on), c);
    ADD_FAILURE() << "--cuda-graph on trained past a failed capture";
  } catch (const CudaGraphCaptureError& err) {
    EXPECT_NE(std::string(err.what()).find("planted capture failure"), std::string::npos) << err.what();
  }
  fs::remove_all(d);
}

// `bench model`'s regions as graph replays (the default on a GPU), with dropout on: they run, say so, and take
// time; with cuda_graph off the same rows are eager.
// --memory-timeline on a GPU measures its step at the end of the forward, the backward and the optimizer: that
// step runs eagerly between replays (bit for bit as the eager run), and every line of the CSV carries the
// measurement of its phase, at least the bytes tessera allocated (static + arena) and within the CUDA libraries'
// own allocations above them.
TEST(CudaGraphStep, MemoryTimelineMeasuresItsStepEagerly) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  const fs::path d = temp_dir("cuda_graph_memory_timeline");
  prepare_text(bundled_corpus(), (d / "data").string());
  constexpr int kSteps = 5;
  TrainOptions o = changing_every_step(d, "bf16", kSteps);
  o.memory_timeline = (d / "m.png").string();
  o.trace_step = 3;
  TrainControl c;
  c.on_memory_timeline = [&](const std::vector<MemoryTimelinePoint>& points, const std::string& title) {
    write_memory_timeline(o.memory_timeline, (d / "m.csv").string(), points, title);
  };
  const Runs r = train_both(d, o, c);
  expect_identical(r, kSteps);
  EXPECT_EQ(r.graph.graph_steps, kSteps - 2) << "step 1 (eager set-up) and the measured step 3 run eagerly";
  std::ifstream csv(d / "m.csv");
  std::string line;
  std::getline(csv, line);
  ASSERT_EQ(line,
            "event,phase,op,activations_live_bytes,static_bytes,planned_total_bytes,allocated_bytes,"
            "measured_bytes");
  std::map<std::string, long long> by_phase;
  int rows = 0;
  while (std::getline(csv, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    ASSERT_EQ(f.size(), 8u) << line;
    const long long allocated = std::stoll(f[6]), measured = std::stoll(f[7]);
    EXPECT_GE(measured, allocated) << line;
    EXPECT_LE(measured, allocated + (1ll << 30)) << line;
    by_phase[f[1]] = measured;
    ++rows;
  }
  EXPECT_EQ(rows, step_num_events(o.model.n_layers));
  EXPECT_EQ(by_phase.size(), 3u) << "forward, backward and optimizer each measured";
  fs::remove_all(d);
}

TEST(CudaGraphStep, BenchModelTimesGraphReplays) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  Context ctx(Device::cuda(0));
  ModelConfig cfg = model_preset("tiny");
  cfg.dropout = 0.1f;
  ModelBenchConfig bc{.batch = 2, .seq = 64, .dtype = DType::BF16, .warmup = 1, .steps = 2};
  const ModelBenchRow graph = bench_model(cfg, bc, ctx, 0.0);
  EXPECT_TRUE(graph.cuda_graph);
  ASSERT_TRUE(graph.fwd && graph.fwd_bwd && graph.step);
  EXPECT_GT(graph.step->t.median_ms, 0.0);
  bc.cuda_graph = false;
  const ModelBenchRow eager = bench_model(cfg, bc, ctx, 0.0);
  EXPECT_FALSE(eager.cuda_graph);
  ASSERT_TRUE(eager.step);
}

// `bench model --precision f16`: the step with train's loss scaling, as graph replays and eagerly, with dropout.
// Started at 2^24, the f16 backward overflows by itself (the loss gradient alone is 2^24 / (B·T) = 131072 > 65504):
// those steps are skipped, leaving the parameters alone, and each halves the scale (the step graph is captured again)
// until the gradients fit. Both paths take the same decisions and reach the same parameters, bit for bit (the step
// region alone: the other regions draw dropout streams as often as they run, which differs between the two). Then an
// overflow planted at step 3 of a run of every region at 1024 skips that step alone and halves the scale.
TEST(CudaGraphStep, BenchModelF16StepsWithTrainsLossScaling) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  Context ctx(Device::cuda(0));
  ModelConfig cfg = model_preset("tiny");
  cfg.dropout = 0.1f;
  struct Run {
    ModelBenchRow row;
    std::map<int64_t, std::vector<float>> params;  // before each optimizer step
    std::map<int64_t, double> loss;
  };
  auto run = [&](bool graph, double init, int64_t plant_at, bool step_only) {
    Run r;
    ModelBenchConfig bc{.batch = 2, .seq = 64, .dtype = DType::F16, .warmup = 2, .steps = 6, .cuda_graph = graph};
    bc.fwd = bc.fwd_bwd = !step_only;
    bc.loss_scaler = {.init_scale = init, .growth_interval = 1000};
    bc.before_optimizer_step = [&r, plant_at](int64_t step, Model& m) {
      r.params[step] = m.params().read_f32(m.context());
      r.loss[step] = m.read_loss();
      if (step == plant_at) plant_inf_f16(m);
    };
    r.row = bench_model(cfg, bc, ctx, 0.0);
    return r;
  };
  const double top = 16777216.0;  // 2^24, LossScalerConfig's max_scale
  const Run graph = run(true, top, 0, /*step_only=*/true), eager = run(false, top, 0, /*step_only=*/true);
  EXPECT_TRUE(graph.row.cuda_graph);
  EXPECT_FALSE(eager.row.cuda_graph);
  ASSERT_TRUE(graph.row.step && graph.row.loss_scale);
  ASSERT_TRUE(eager.row.step && eager.row.loss_scale);
  // Graphs: an eager and a capturing run before the warm-up; eagerly, the warm-up and the timed runs alone.
  EXPECT_EQ(graph.row.optimizer_steps, 2 + 2 + 6);
  EXPECT_EQ(eager.row.optimizer_steps, 2 + 6);
  const int64_t skipped = eager.row.skipped_steps;
  EXPECT_GE(skipped, 1) << "2^24 should overflow the f16 backward";
  EXPECT_LT(skipped, 8) << "the scale should come down to one the gradients fit";
  EXPECT_EQ(*eager.row.loss_scale, std::ldexp(top, -static_cast<int>(skipped)));
  EXPECT_EQ(graph.row.skipped_steps, skipped);
  EXPECT_EQ(*graph.row.loss_scale, *eager.row.loss_scale);
  for (int64_t step = 1; step <= 8; ++step) {
    EXPECT_EQ(graph.params.at(step), eager.params.at(step)) << "the parameters step " << step << " starts from";
    EXPECT_EQ(graph.loss.at(step), eager.loss.at(step)) << "step " << step;
    EXPECT_TRUE(std::isfinite(eager.loss.at(step))) << "step " << step;
    if (step == 1) continue;
    // The skipped steps are the first ones: the parameters stay at their start through them, then move.
    if (step <= skipped + 1) {
      EXPECT_EQ(eager.params.at(step), eager.params.at(1)) << "step " << step - 1 << " was applied";
    } else {
      EXPECT_NE(eager.params.at(step), eager.params.at(step - 1)) << "step " << step - 1 << " changed nothing";
    }
  }

  const Run planted = run(true, 1024.0, 3, /*step_only=*/false);
  ASSERT_TRUE(planted.row.fwd && planted.row.fwd_bwd && planted.row.step && planted.row.loss_scale);
  EXPECT_EQ(planted.row.skipped_steps, 1);
  EXPECT_EQ(*planted.row.loss_scale, 512.0);
  EXPECT_NE(planted.params.at(3), planted.params.at(2));
  EXPECT_EQ(planted.params.at(4), planted.params.at(3)) << "step 3 overflowed: it must leave the parameters alone";
  EXPECT_NE(planted.params.at(5), planted.params.at(4));
}

// A synchronize inside a capture is illegal: the capture ends, the Error says so, and the stream works after it
// (a second capture and its replay give the right bytes).
TEST(CudaGraph, IllegalCallEndsTheCaptureCleanly) {
  if (!graphs_here()) GTEST_SKIP() << "no GPU visible, or a Debug build (no captures)";
  Context ctx(Device::cuda(0));
  Buffer buf(256, ctx.device(), "test");
  CudaGraph g;
  try {
    g.capture(ctx, "a test", [&] {
      fill_bytes(buf.view(DType::U8, {256}), 1, ctx);
      ctx.synchronize();
    });
    ADD_FAILURE() << "a capture with a synchronize inside succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graph capture of a test failed"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(g.ready());
  g.capture(ctx, "a fill", [&] { fill_bytes(buf.view(DType::U8, {256}), 7, ctx); });
  ASSERT_TRUE(g.ready());
  fill_bytes(buf.view(DType::U8, {256}), 0, ctx);
  g.launch(ctx);
  std::vector<unsigned char> host(256);
  copy_bytes(host.data(), Device::cpu(), buf.data(), ctx.device(), host.size(), ctx);
  EXPECT_EQ(host, std::vector<unsigned char>(256, 7));
  // The scratch cannot grow inside a capture: a clear Error, not an invalidated stream.
  const size_t big = 1 << 20;
  try {
    g.capture(ctx, "a scratch growth", [&] { ctx.scratch(big); });
    ADD_FAILURE() << "the scratch grew inside a capture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("during a CUDA graph capture"), std::string::npos) << e.what();
  }
  ctx.synchronize();
}

}  // namespace
}  // namespace tessera::test
