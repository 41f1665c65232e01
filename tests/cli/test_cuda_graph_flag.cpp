// --cuda-graph on `train` and `bench model`: the flag's values, the startup line that says whether the step is
// CUDA graphs and why not, and the refusals of "on" where it cannot be (on the CPU: the CUDA side is
// tests/cuda/test_graph_step_cuda.cpp). train_cuda_graph_refusal's reasons, in the order they are checked.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cli_run.h"
#include "tessera/core/context.h"
#include "tessera/train/trainer.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

std::string train_args(const fs::path& out, const std::string& extra) {
  return "train --out " + out.string() + " --batch 2 --seq 16 --d-model 32 --n-layers 2 --n-heads 2 --val-every 0 " +
         "--no-progress --sample-tokens 0 --device cpu --steps 2 --no-checkpoint " + extra;
}

fs::path temp(const char* name) {
  const fs::path d = fs::temp_directory_path() / (std::string(name) + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

TEST(CudaGraphFlag, TrainSaysTheCpuStepsEagerly) {
  const fs::path dir = temp("tessera_graph_flag");
  const test::CliRun r = test::run(train_args(dir / "run", ""));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step: eager (the CPU has no CUDA graphs)\n"), std::string::npos) << r.out;
  const test::CliRun off = test::run(train_args(dir / "off", "--cuda-graph off"));
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_NE(off.out.find("step: eager (--cuda-graph off)\n"), std::string::npos) << off.out;
  fs::remove_all(dir);
}

TEST(CudaGraphFlag, TrainRefusesOnWhereTheStepCannotBeAGraphAndBadValues) {
  const fs::path dir = temp("tessera_graph_refuse");
  const test::CliRun on = test::run(train_args(dir / "on", "--cuda-graph on"));
  EXPECT_EQ(on.code, 2);
  EXPECT_EQ(on.err,
            "tessera: error: --cuda-graph on: the CPU has no CUDA graphs; drop the flag to step eagerly here\n");
  EXPECT_FALSE(fs::exists(dir / "on")) << "a refused run wrote its output directory";
  const test::CliRun bad = test::run(train_args(dir / "bad", "--cuda-graph auto"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "tessera: error: --cuda-graph must be on or off, got 'auto'\n");
  EXPECT_FALSE(fs::exists(dir / "bad"));
  fs::remove_all(dir);
}

TEST(CudaGraphFlag, BenchModelSaysWhetherItsRegionsAreGraphs) {
  const std::string args = "bench model --device cpu --preset tiny --batch 1 --seq 8 --warmup 0 --steps 1 --mode fwd";
  const test::CliRun r = test::run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("regions: eager launches (the CPU has no CUDA graphs)\n"), std::string::npos) << r.out;
  const test::CliRun off = test::run(args + " --cuda-graph off");
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_NE(off.out.find("regions: eager launches (--cuda-graph off)\n"), std::string::npos) << off.out;
  const test::CliRun on = test::run(args + " --cuda-graph on");
  EXPECT_EQ(on.code, 2);
  EXPECT_EQ(on.err, "tessera: error: bench model: --cuda-graph on: the CPU has no CUDA graphs\n");
  const test::CliRun bad = test::run(args + " --cuda-graph yes");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "tessera: error: bench model: --cuda-graph must be on or off, got 'yes'\n");
}

// The reasons in order: the flag, then data parallelism (so a data-parallel CPU run names that), then the device.
TEST(CudaGraphFlag, RefusalReasons) {
  const Context cpu(Device::cpu());
  TrainOptions o;
  EXPECT_EQ(train_cuda_graph_refusal(o, cpu), "the CPU has no CUDA graphs");
  o.world_size = 2;
  EXPECT_EQ(train_cuda_graph_refusal(o, cpu),
            "data-parallel runs step eagerly: their collectives and the ranks' agreement are not captured");
  o.cuda_graph = CudaGraphMode::Off;
  EXPECT_EQ(train_cuda_graph_refusal(o, cpu), "--cuda-graph off");
  EXPECT_EQ(cuda_graph_mode_from_name("on"), CudaGraphMode::On);
  EXPECT_EQ(cuda_graph_mode_from_name("off"), CudaGraphMode::Off);
  EXPECT_THROW(cuda_graph_mode_from_name("1"), Error);
  // train_setup refuses "on" before anything is read or written.
  TrainOptions on;
  on.model = model_preset("tiny");
  on.device = "cpu";
  on.seq = 16;
  on.cuda_graph = CudaGraphMode::On;
  try {
    train_setup(on);
    ADD_FAILURE() << "train_setup accepted --cuda-graph on on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graph on: the CPU has no CUDA graphs"), std::string::npos) << e.what();
  }
}

// On a GPU the graph step stages a whole step's tokens and targets in pinned host memory: accum x B x T x 8
// bytes, 2.2 TB here. The host memory check counts it and refuses the run in one line, before anything is
// written; uncounted, cudaMallocHost failed later as a CUDA error.
TEST(CudaGraphFlag, TrainCountsTheGraphStepsPinnedStagingInTheHostMemoryCheck) {
  if (!probe_gpu().available) GTEST_SKIP() << "no GPU visible";
  const fs::path out = temp("graph_staging");
  const test::CliRun r = test::run("train --out " + out.string() +
                                   " --batch 4096 --seq 64 --accum 1048576 "
                                   "--d-model 32 --n-layers 2 --n-heads 2 --device cuda --steps 1 --no-progress "
                                   "--sample-tokens 0 --no-checkpoint");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("tessera: error: out of memory: training this model needs "), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace tessera
