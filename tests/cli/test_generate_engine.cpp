// The CLI of the inference engine: info --inference reports what the engine allocates, and generate's new flags
// refuse impossible settings with one line and exit code 2.
#include <gtest/gtest.h>

#include <string>

#include "cli/cli_run.h"
#include "tessera/infer/engine.h"
#include "tessera/models/config.h"

namespace tessera {
namespace {

// The number in "(N bytes)" on the line that starts with `what` (after the indent).
size_t bytes_of(const std::string& out, const std::string& what) {
  const size_t at = out.find(" " + what + " ");
  if (at == std::string::npos) return 0;
  const size_t open = out.find('(', at);
  return std::stoull(out.substr(open + 1));
}

TEST(GenerateEngineCli, InfoInferenceReportsTheEnginesBytes) {
  const test::CliRun r = test::run("info --preset tiny --inference --batch 3 --beams 2 --seq 40 --precision bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  const EngineMemory m =
      Engine::memory(model_preset("tiny"), DType::BF16, {.batch = 3, .beams = 2, .max_prompt = 40, .max_seq = 40});
  EXPECT_EQ(bytes_of(r.out, "weights"), m.weights) << r.out;
  EXPECT_EQ(bytes_of(r.out, "KV cache"), m.cache) << r.out;
  EXPECT_EQ(bytes_of(r.out, "buffers"), m.buffers) << r.out;
  EXPECT_EQ(bytes_of(r.out, "total"), m.weights + m.cache + m.buffers) << r.out;
  EXPECT_NE(r.out.find("6 cache slots"), std::string::npos) << r.out;
}

TEST(GenerateEngineCli, RefusesImpossibleSettingsWithOneLine) {
  const char* cases[][2] = {
      {"generate --device tpu", "--device must be cpu, cuda or auto"},
      {"generate --device cpu --precision bf16", "the CPU computes in f32"},
      {"generate --precision f8 --device cpu", "unknown precision 'f8'"},
      {"generate --tokens 3 --max-new-tokens 3", "give one of them"},
      {"generate --max-new-tokens -1", "--max-new-tokens must be >= 0"},
      {"info --preset tiny --beams 2", "--beams applies to --inference"},
      {"info --preset tiny --inference --beams 0", "--beams must be >= 1"},
      {"info --preset tiny --inference --plan", "--plan is a figure of training"},
      {"info --preset tiny --inference --positions sinusoidal", "not sinusoidal"},
  };
  for (const auto& [args, said] : cases) {
    const test::CliRun r = test::run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(said), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace tessera
