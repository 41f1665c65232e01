// tessera bench model end to end on the CPU (tiny preset, B 2, T 16, two timed runs): the table's rows and their
// figures (memory against a model built here, tokens/s and MFU against the times the JSON reports), OOM marking
// against a --max-memory limit with the sweep going on, the JSON and CSV agreeing, the Chrome trace of one step
// (phase ranges once, the memory counter equal to the plan), the memory timeline (the CSV equal to the plan,
// the PNG decoded by Python's zlib), and bad flags as one-line errors that write nothing. No timing is asserted.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run.h"
#include "tessera/bench/memory_timeline.h"
#include "tessera/core/file_io.h"
#include "tessera/core/memory.h"
#include "tessera/models/config.h"
#include "tessera/models/gpt.h"
#include "tessera/models/gpt_plan.h"
#include "tessera/train/optimizer.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kB = 2, kT = 16;
// The sweep every successful run here makes: one size that fits and one planned above the limit.
const std::string kCommon = "bench model --device cpu --batch 2 --seq 16 --warmup 0 --steps 2";

using test::table_rows;

std::vector<std::vector<std::string>> read_csv(const fs::path& p) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(read_file_text(p.string()));
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    size_t i = 0;
    for (size_t j; (j = line.find(',', i)) != std::string::npos; i = j + 1) f.push_back(line.substr(i, j - i));
    f.push_back(line.substr(i));
    rows.push_back(f);
  }
  return rows;
}

// What the tiny model holds on the CPU in f32, from a model and an optimizer built here: the bench plans the
// gradients with the activations, so the arena holds them.
struct TinyBytes {
  size_t params = 0, arena = 0, adam = 0;
};
TinyBytes tiny_bytes() {
  Gpt model(model_preset("tiny"));
  model.set_grad_memory(GradMemory::Planned);
  model.reserve(kB, kT);
  AdamW opt(model.params(), {}, model.context());
  return {model.params().size() * 4, model.activation_peak(), opt.state_bytes()};
}

class BenchModel : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("tessera_bench_model_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    // One thread: on a loaded 2-core CI machine OpenMP's barriers make tiny steps 20x slower, not more exact.
    ::setenv("OMP_NUM_THREADS", "1", 1);
  }
  void TearDown() override { fs::remove_all(dir); }

  // Each of `lines` on stderr, in this order, and on stdout none of what says how the run went (the bar, a size's
  // line, a file written): stdout is the report.
  static void expect_status_on_stderr(const test::CliRun& r, const std::vector<std::string>& lines) {
    size_t at = 0;
    for (const std::string& l : lines) {
      const size_t found = r.err.find(l, at);
      ASSERT_NE(found, std::string::npos) << "'" << l << "' (in this order) not in stderr:\n" << r.err;
      at = found + l.size();
    }
    for (const char* status : {"] part ", "done in ", "OOM (", "wrote ", "peer: bench/peers/model.py ("})
      EXPECT_EQ(r.out.find(status), std::string::npos) << status << " on stdout:\n" << r.out;
  }

  void expect_usage_error(const std::string& args, const std::string& names) {
    const test::CliRun r = test::run("bench model " + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("tessera: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(names), std::string::npos) << args << ": " << r.err;
  }
};

// bench model and bench compare time each size for minutes on a GPU (seconds to minutes on the CPU), and said
// nothing meanwhile; their lines about each size ("done in", "wrote") went to stdout, into a table redirected to a
// file. Now a bar on stderr shows the part being timed, and the sizes' lines go to stderr, before and without it.
TEST_F(BenchModel, ProgressAndStatusGoToStderrAndTheReportToStdout) {
  for (const char* cmd : {"bench model", "bench compare"}) {
    SCOPED_TRACE(cmd);
    const fs::path md = dir / "p.md";
    // compare's peer: a python that does not exist, so that it is a note at once.
    const std::string only_model = " --mode step --trace " + (dir / "t.json").string();
    const std::string args = std::string(cmd) + kCommon.substr(std::string("bench model").size()) +
                             " --sizes gpt2-124m,tiny --max-memory 64MiB --out " + md.string() +
                             (cmd == std::string("bench compare") ? "" : only_model);
    const std::string env = "TESSERA_PYTHON=" + (dir / "no-such-python").string() + " ";
    const test::CliRun r = test::run_after(env, args);
    ASSERT_EQ(r.code, 0) << r.err;
    const bool model = cmd == std::string("bench model");
    // model: --mode step's region and --trace's recorded step; compare: its three regions. The OOM size jumps over
    // its parts.
    const int parts = model ? 2 : 3;
    std::vector<std::string> want;
    const std::string total = "/" + std::to_string(2 * parts) + " | ";
    const auto part = [&](int k, const std::string& what) {
      return "] part " + std::to_string(k) + total + what + " | ";
    };
    want.push_back(part(parts, "gpt2-124m done"));
    want.push_back("  gpt2-124m: OOM (planned ");
    if (model) {
      want.push_back(part(parts, "tiny step"));
      want.push_back(part(parts + 1, "tiny recorded step"));
    } else {
      want.push_back(part(parts, "tiny fwd"));
      want.push_back(part(parts + 1, "tiny fwd+bwd"));
      want.push_back(part(parts + 2, "tiny step"));
    }
    want.push_back("] part " + std::to_string(2 * parts) + total + "tiny done | ");
    want.push_back("  tiny: done in ");
    if (model) want.push_back("  wrote " + (dir / "t.tiny.json").string() + "\n");  // FILE.<size>.json
    want.push_back("wrote " + md.string() + "\n");
    expect_status_on_stderr(r, want);
    // Without the bar, the sizes' lines alone, and stdout as before.
    const test::CliRun quiet = test::run_after(env, args + " --no-progress");
    ASSERT_EQ(quiet.code, 0) << quiet.err;
    EXPECT_EQ(quiet.err.find("] part "), std::string::npos) << quiet.err;
    EXPECT_NE(quiet.err.find("  tiny: done in "), std::string::npos) << quiet.err;
    EXPECT_EQ(test::without_numbers(quiet.out), test::without_numbers(r.out));
  }
}

TEST_F(BenchModel, TableJsonCsvAndOomOnTheCpu) {
  const fs::path md = dir / "m.md", js = dir / "m.json", csv = dir / "m.csv";
  // gpt2-124m plans ~1.5 GiB of f32 parameters, gradients and moments: far above 64 MiB, so it is marked OOM
  // without being built, and the sweep goes on to the tiny after it.
  const test::CliRun r = test::run(kCommon + " --sizes gpt2-124m,tiny --max-memory 64MiB --out " + md.string() +
                                   " --json " + js.string() + " --csv " + csv.string());
  ASSERT_EQ(r.code, 0) << r.err;
  expect_status_on_stderr(r, {"  gpt2-124m: OOM (planned ", "  tiny: done in ", "wrote " + md.string() + "\n",
                              "wrote " + js.string() + "\n", "wrote " + csv.string() + "\n"});

  std::vector<std::string> header;
  const auto rows = table_rows(read_file_text(md.string()), "size", &header);
  ASSERT_EQ(header, (std::vector<std::string>{"size", "d_model", "d_ff", "layers", "heads", "params", "fwd ms",
                                              "fwd+bwd ms", "step ms", "fwd mem", "train mem", "tokens/s", "MFU"}));
  ASSERT_EQ(rows.size(), 2u);
  const auto& tiny = rows.at("tiny");
  EXPECT_EQ(std::vector<std::string>(tiny.begin() + 1, tiny.begin() + 6),
            (std::vector<std::string>{"128", "512", "4", "4", "834.3k"}));
  for (int c = 6; c <= 8; ++c) {  // "median ±std"
    const std::string& cell = tiny.at(c);
    ASSERT_NE(cell.find(" ±"), std::string::npos) << header[c] << ": " << cell;
    EXPECT_GT(std::stod(cell), 0.0) << header[c];
  }
  const auto& gpt2 = rows.at("gpt2-124m");
  EXPECT_EQ(gpt2.at(1), "768");
  for (int c = 6; c < 13; ++c) EXPECT_EQ(gpt2.at(c), "OOM") << header[c];
  EXPECT_NE(r.out.find("gpt2-124m: OOM"), std::string::npos) << r.out;

  const json j = json::parse(read_file_text(js.string()));
  EXPECT_EQ(j.at("batch"), kB);
  EXPECT_EQ(j.at("seq"), kT);
  EXPECT_EQ(j.at("memory"), "planned");
  EXPECT_EQ(j.at("precision"), "f32");
  EXPECT_TRUE(j.at("loss_scaling").is_null()) << "f32 steps without loss scaling";
  const double gemm_flops = j.at("gemm").at("tflops").get<double>() * 1e12;
  EXPECT_GT(gemm_flops, 0);
  ASSERT_EQ(j.at("rows").size(), 2u);
  const json& g = j.at("rows")[0];
  EXPECT_EQ(g.at("size"), "gpt2-124m");
  EXPECT_TRUE(g.at("oom").get<bool>());
  // Each figure in the unit that fits it: the 64 MiB read "0.06 GiB", and a 1KiB limit "0.00 GiB".
  EXPECT_NE(g.at("oom_reason").get<std::string>().find(" GiB > 64.00 MiB (--max-memory)"), std::string::npos)
      << g.at("oom_reason");
  EXPECT_TRUE(g.at("step").is_null());
  const json& t = j.at("rows")[1];
  EXPECT_EQ(t.at("size"), "tiny");
  EXPECT_FALSE(t.at("oom").get<bool>());
  EXPECT_EQ(t.at("params"), model_preset("tiny").num_params());
  EXPECT_TRUE(t.at("loss_scale").is_null());
  // Memory: what a tiny model and its AdamW hold, built here.
  const TinyBytes tb = tiny_bytes();
  EXPECT_EQ(t.at("mem_fwd_bytes").get<size_t>(), tb.params + tb.arena);
  EXPECT_EQ(t.at("mem_train_bytes").get<size_t>(), tb.params + tb.arena + tb.adam);
  // FLOPs of one forward, by hand: GEMMs 2·N·L·(4C² + 2CF), attention 4·N·T·C per layer, the head 2·N·C·V.
  const double N = kB * kT, C = 128, F = 512, L = 4, V = 256;
  const double flops = 2 * N * L * (4 * C * C + 2 * C * F) + L * 4 * N * kT * C + 2 * N * C * V;
  EXPECT_DOUBLE_EQ(t.at("flops_fwd").get<double>(), flops);
  // tokens/s and MFU come from the step's median.
  EXPECT_EQ(t.at("rate_region"), "step");
  const json& step = t.at("step");
  const double s = step.at("median_ms").get<double>() * 1e-3;
  EXPECT_LE(step.at("min_ms").get<double>(), step.at("median_ms").get<double>());
  EXPECT_LE(step.at("median_ms").get<double>(), step.at("max_ms").get<double>());
  EXPECT_EQ(step.at("runs"), 2);
  EXPECT_NEAR(t.at("tokens_per_s").get<double>(), N / s, 1e-9 * N / s);
  EXPECT_NEAR(t.at("mfu").get<double>(), 3 * flops / s / gemm_flops, 1e-9);

  const auto c = read_csv(csv);
  ASSERT_EQ(c.size(), 3u);  // header, gpt2-124m, tiny
  const auto& h = c[0];
  ASSERT_EQ(h.size(), c[1].size());
  ASSERT_EQ(h.size(), c[2].size());
  std::map<std::string, std::string> oom_row, tiny_row;
  for (size_t i = 0; i < h.size(); ++i) oom_row[h[i]] = c[1][i], tiny_row[h[i]] = c[2][i];
  EXPECT_EQ(oom_row["status"], "oom");
  EXPECT_EQ(oom_row["step_median_ms"], "");
  EXPECT_EQ(tiny_row["status"], "ok");
  EXPECT_EQ(tiny_row["params"], "834304");
  EXPECT_EQ(tiny_row["precision"], "f32");
  EXPECT_EQ(tiny_row["loss_scale"], "");
  EXPECT_EQ(tiny_row["skipped_steps"], "");
  EXPECT_NEAR(std::stod(tiny_row["step_median_ms"]), step.at("median_ms").get<double>(),
              1e-5 * step.at("median_ms").get<double>());
  EXPECT_NEAR(std::stod(tiny_row["fwd_std_ms"]), t.at("fwd").at("std_ms").get<double>(),
              1e-5 * std::max(1e-9, t.at("fwd").at("std_ms").get<double>()) + 1e-12);
  EXPECT_EQ(tiny_row["mem_train_bytes"], std::to_string(tb.params + tb.arena + tb.adam));
}

// An allocation that fails although MemAvailable allowed it (here under ulimit -v) said "out of host memory: ...",
// which bench model did not take for an allocation failure: the sweep ended with that error instead of marking the
// size OOM and going on.
TEST_F(BenchModel, AnAllocationTheSystemRefusesIsAnOomRow) {
  TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY();
  // gpt2-124m plans ~1.5 GiB: with less available, it is marked OOM by its plan, before any allocation.
  if (available_host_memory() < (size_t{2} << 30)) GTEST_SKIP() << "under 2 GiB of host memory available";
  const fs::path js = dir / "m.json";
  // Its parameters alone, 475 MiB, are past a 256 MiB address space; the tiny fits in it.
  const test::CliRun r = test::run_with_address_limit(256, kCommon + " --sizes gpt2-124m,tiny --json " + js.string());
  ASSERT_EQ(r.code, 0) << r.err;
  expect_status_on_stderr(r, {"  gpt2-124m: OOM (out of memory: ", "  tiny: done in "});
  const json j = json::parse(read_file_text(js.string()));
  ASSERT_EQ(j.at("rows").size(), 2u);
  const json& g = j.at("rows")[0];
  EXPECT_TRUE(g.at("oom").get<bool>());
  const std::string reason = g.at("oom_reason").get<std::string>();
  EXPECT_EQ(reason.rfind("out of memory: parameters needs ", 0), 0u) << reason;
  EXPECT_NE(reason.find("allocating it failed"), std::string::npos) << reason;
  EXPECT_FALSE(j.at("rows")[1].at("oom").get<bool>());
}

TEST_F(BenchModel, ModeFwdTimesOnlyTheForward) {
  const fs::path js = dir / "f.json";
  const test::CliRun r = test::run(kCommon + " --preset tiny --mode fwd --json " + js.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json t = json::parse(read_file_text(js.string())).at("rows")[0];
  EXPECT_FALSE(t.at("fwd").is_null());
  EXPECT_TRUE(t.at("fwd_bwd").is_null());
  EXPECT_TRUE(t.at("step").is_null());
  EXPECT_TRUE(t.at("mem_train_bytes").is_null());
  EXPECT_EQ(t.at("rate_region"), "fwd");
  EXPECT_NEAR(t.at("tokens_per_s").get<double>(), kB * kT / (t.at("fwd").at("median_ms").get<double>() * 1e-3),
              1e-6 * t.at("tokens_per_s").get<double>());
  // MFU's reference GEMM is timed 10 times whatever --steps (2 here): with --steps 2 one slow run on a loaded
  // machine halved the rate and MFU read 120%.
  EXPECT_NE(r.out.find(" ms (median of 10), "), std::string::npos) << r.out;
}

TEST_F(BenchModel, TraceOfOneStep) {
  const fs::path tr = dir / "t.json";
  const test::CliRun r = test::run(kCommon + " --preset tiny --mode step --trace " + tr.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(read_file_text(tr.string()));
  std::map<std::string, int> count;
  std::map<std::string, std::pair<double, double>> span;  // name -> [start, end] of its last slice
  std::vector<double> live;
  for (const json& e : j.at("traceEvents")) {
    if (e.at("ph") == "X") {
      const std::string name = e.at("name");
      const double ts = e.at("ts"), dur = e.at("dur");
      EXPECT_GE(dur, 0.0) << name;
      ++count[name];
      span[name] = {ts, ts + dur};
    } else if (e.at("ph") == "C" && e.at("name") == "activations live (planned)") {
      live.push_back(e.at("args").at("value"));
    }
  }
  // One step: each phase once, each layer once per phase, and the optimizer after the backward.
  EXPECT_EQ(count["FWD_STEP"], 1);
  EXPECT_EQ(count["BWD_STEP"], 1);
  EXPECT_EQ(count["OPTIM_STEP"], 1);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(count["layer " + std::to_string(l)], 2) << l;
  EXPECT_EQ(count["qkv"], 4);
  EXPECT_LE(span["FWD_STEP"].second, span["BWD_STEP"].first);
  EXPECT_LE(span["BWD_STEP"].second, span["OPTIM_STEP"].first);
  // The memory counter at each op is the plan's live set (every event but the end of the step).
  const std::vector<size_t> plan =
      Gpt::activation_plan(model_preset("tiny"), kB, kT, DType::F32, {}, GradMemory::Planned).live_bytes();
  ASSERT_EQ(live.size() + 1, plan.size());
  for (size_t i = 0; i < live.size(); ++i) EXPECT_EQ(live[i], static_cast<double>(plan[i])) << i;
}

TEST_F(BenchModel, MemoryTimelineCsvIsThePlanAndThePngDecodes) {
  const fs::path png = dir / "mem.png";
  // Two sizes: files named per size; the OOM one writes none.
  const test::CliRun r =
      test::run(kCommon + " --sizes tiny,gpt2-124m --max-memory 64MiB --mode fwd --memory-timeline " + png.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(png));
  EXPECT_FALSE(fs::exists(dir / "mem.gpt2-124m.png"));
  const fs::path tiny_png = dir / "mem.tiny.png", tiny_csv = dir / "mem.tiny.csv";
  ASSERT_TRUE(fs::exists(tiny_png));
  ASSERT_TRUE(fs::exists(tiny_csv));

  const ModelConfig cfg = model_preset("tiny");
  const std::vector<size_t> live = Gpt::activation_plan(cfg, kB, kT, DType::F32, {}, GradMemory::Planned).live_bytes();
  const TinyBytes tb = tiny_bytes();
  const auto c = read_csv(tiny_csv);
  ASSERT_EQ(c.at(0), (std::vector<std::string>{"event", "phase", "op", "activations_live_bytes", "static_bytes",
                                               "planned_total_bytes", "allocated_bytes", "measured_bytes"}));
  const int events = step_num_events(cfg.n_layers);
  ASSERT_EQ(static_cast<int>(c.size()), 1 + events);
  const int bwd0 = step_event(cfg.n_layers, StepOp::LossBwd), end = step_event(cfg.n_layers, StepOp::End);
  for (int e = 0; e < events; ++e) {
    const auto& row = c[1 + e];
    ASSERT_EQ(row.size(), 8u) << e;
    EXPECT_EQ(row[0], std::to_string(e));
    EXPECT_EQ(row[1], e < bwd0 ? "forward" : e < end ? "backward" : "optimizer") << e;
    EXPECT_EQ(row[2], step_event_name(cfg.n_layers, e));
    EXPECT_EQ(row[3], std::to_string(live[e])) << e;
    EXPECT_EQ(row[4], std::to_string(tb.params + tb.adam)) << e;
    EXPECT_EQ(row[5], std::to_string(tb.params + tb.adam + live[e])) << e;
    EXPECT_EQ(row[6], std::to_string(tb.params + tb.adam + tb.arena)) << e;
    EXPECT_EQ(row[7], "") << "no measurement on the CPU";
  }

  // Python's zlib decodes the PNG; the phases, the static area and the planned line are all drawn.
  const fs::path out = dir / "png.json";
  const std::string cmd = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR + "/tests/tools/check_png.py " +
                          tiny_png.string() + " > " + out.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json p = json::parse(read_file_text(out.string()));
  ASSERT_TRUE(p.at("ok").get<bool>()) << p.dump();
  const json& colors = p.at("colors");
  auto pixels = [&](Rgb c) {
    const std::string k = std::to_string(c.r) + "," + std::to_string(c.g) + "," + std::to_string(c.b);
    return colors.contains(k) ? colors.at(k).get<int>() : 0;
  };
  EXPECT_GT(pixels(kColorForward), 1000);
  EXPECT_GT(pixels(kColorBackward), 1000);
  EXPECT_GT(pixels(kColorOptimizer), 100);
  EXPECT_GT(pixels(kColorStatic), 1000);
  EXPECT_GT(pixels(kColorPlanned), 1000);
  EXPECT_GT(pixels(kColorAllocated), 500);
}

TEST_F(BenchModel, BadFlagsAreOneLineErrorsThatWriteNothing) {
  const std::string js = " --json " + (dir / "x.json").string();
  expect_usage_error("--device cpu --mode sideways" + js, "--mode");
  expect_usage_error("--device cpu --precision f16" + js, "--precision f16 needs a GPU");
  expect_usage_error("--device cpu --precision f16 --peer" + js, "--peer with --precision f16");
  expect_usage_error("--device cpu --precision bf16" + js, "--precision bf16");
  expect_usage_error("--device cpu --precision f8" + js, "--precision");
  expect_usage_error("--device cpu --preset tiny --sizes tiny" + js, "--preset or --sizes");
  expect_usage_error("--device cpu --sizes tiny,,tiny" + js, "--sizes");
  expect_usage_error("--device cpu --sizes tiny,huge" + js, "huge");
  expect_usage_error("--device cpu --preset tiny --seq 65" + js, "max_seq 64");
  expect_usage_error("--device cpu --batch 0" + js, "--batch");
  expect_usage_error("--device cpu --steps 0" + js, "--steps");
  expect_usage_error("--device cpu --warmup -1" + js, "--warmup");
  expect_usage_error("--device cpu --max-memory 12XB" + js, "--max-memory");
  expect_usage_error("--device cpu --max-memory 0" + js, "--max-memory");
  expect_usage_error("--device cpu --stepz 2" + js, "did you mean --steps");
  expect_usage_error("--device cpu --memory-timeline " + (dir / "m.jpg").string() + js, ".png");
  expect_usage_error("--device cpu --csv " + (dir / "missing" / "x.csv").string() + js, "--csv");
  expect_usage_error("--device cpu --trace " + dir.string() + js, "is a directory");
  expect_usage_error("--device tpu" + js, "tpu");
  // Every file of the sweep before its first step: each plot's CSV, and the per-size names of several sizes.
  fs::create_directory(dir / "m.csv");
  expect_usage_error("--device cpu --memory-timeline " + (dir / "m.png").string() + js, "m.csv is a directory");
  fs::remove(dir / "m.csv");
  fs::create_directory(dir / "m.tiny.png");
  expect_usage_error("--device cpu --sizes tiny,gpt2-124m --memory-timeline " + (dir / "m.png").string() + js,
                     "m.tiny.png is a directory");
  fs::create_directory(dir / "t.tiny.json");
  expect_usage_error("--device cpu --sizes tiny,gpt2-124m --trace " + (dir / "t.json").string() + js,
                     "t.tiny.json is a directory");
  fs::remove(dir / "m.tiny.png");
  fs::remove(dir / "t.tiny.json");
  EXPECT_FALSE(fs::exists(dir / "x.json"));
  EXPECT_TRUE(fs::is_empty(dir));
}

}  // namespace
}  // namespace tessera
