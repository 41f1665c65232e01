// `tessera train --no-checkpoint`: a benchmark run that writes its metrics and no checkpoint, and the flags it
// cannot go with.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cli_run.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

std::string train_args(const fs::path& out, const std::string& extra) { return test::small_train_args(out, extra); }

TEST(TrainNoCheckpoint, WritesMetricsAndNoCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_nockpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const test::CliRun r = test::run(train_args(dir / "run", "--no-checkpoint"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "run" / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoint")) << "--no-checkpoint wrote the final checkpoint";
  EXPECT_FALSE(fs::exists(dir / "run" / "best")) << "--no-checkpoint wrote the best checkpoint";
  EXPECT_NE(r.out.find("checkpoint: none (--no-checkpoint)"), std::string::npos) << r.out;
  // Without the flag the same run writes both (so the checks above can fail).
  const test::CliRun with = test::run(train_args(dir / "run2", ""));
  ASSERT_EQ(with.code, 0) << with.err;
  EXPECT_TRUE(fs::exists(dir / "run2" / "checkpoint"));
  EXPECT_TRUE(fs::exists(dir / "run2" / "best"));
  const test::CliRun stop = test::run(train_args(dir / "run3", "--no-checkpoint --stop-after 2"));
  EXPECT_EQ(stop.code, 2);
  EXPECT_NE(stop.err.find("--stop-after stops with a checkpoint to resume from: drop --no-checkpoint"),
            std::string::npos)
      << stop.err;
  EXPECT_FALSE(fs::exists(dir / "run3"));
  // The flags that time checkpoints were silently ignored.
  for (const char* flag : {"--ckpt-every", "--ckpt-minutes"}) {
    const test::CliRun timed = test::run(train_args(dir / "run4", std::string("--no-checkpoint ") + flag + " 1"));
    EXPECT_EQ(timed.code, 2) << timed.out;
    EXPECT_EQ(timed.err,
              std::string("tessera: error: ") + flag + " times checkpoints, and --no-checkpoint writes none\n");
    EXPECT_FALSE(fs::exists(dir / "run4"));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A run stopped early prints the command that continues it; precision is not saved with a run, so the command
// repeats the --precision given (an f16 run must resume in f16, with its loss scaler).
TEST(TrainResumeCommand, RepeatsThePrecisionGiven) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_resume_cmd_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const test::CliRun r = test::run(train_args(dir / "run", "--precision f32 --stop-after 2"));
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.out.find("continue with: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string cmd = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(cmd.find(" train --resume "), std::string::npos) << cmd;
  EXPECT_NE(cmd.find(" --precision f32"), std::string::npos) << cmd;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
