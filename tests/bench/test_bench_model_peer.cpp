// tessera bench model --peer on the CPU (tiny preset, B 2, T 16, two timed runs), with a shell stand-in for python
// (TESSERA_PYTHON) that records the arguments it was given and prints canned records of bench/peers/model.py: the
// peer table shows the peer's step ms and memory per mode and the speedup (peer ms / tessera ms) against the times
// tessera's own JSON reports; OOM, failed and mismatched records become cells and notes; a peer that prints no
// figures is one note and the bench still succeeds; without --peer the outputs keep their format. The real script
// is checked too: its argument checks without torch, and, where torch and transformers import, one eager CPU run
// of the tiny model whose parameter count must equal tessera's. No timing is asserted.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench/peer_stand_in.h"
#include "cli/cli_run.h"
#include "tessera/bench/model.h"
#include "tessera/core/file_io.h"
#include "tessera/models/config.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::md_table;
using test::speedup_cell;
using test::trim;

const std::string kRun = "bench model --device cpu --preset tiny --batch 2 --seq 16 --warmup 0 --steps 2";

class BenchModelPeer : public test::PeerStandIn {
 protected:
  // `echo '<record>'` of the peer for tiny in `mode` with the given step ms and train memory (GiB).
  static std::string record(const std::string& mode, double step_ms, double train_gib, int64_t params) {
    json j = {{"size", "tiny"},
              {"mode", mode},
              {"params", params},
              {"fwd_ms", step_ms / 3},
              {"fwd_bwd_ms", step_ms * 0.9},
              {"step_ms", step_ms},
              {"fwd_mem_gib", 0.25},
              {"train_mem_gib", train_gib},
              {"torch", "2.9.1"},
              {"transformers", "4.57.0"},
              {"device", "NVIDIA H200"}};
    std::string line = "echo '";
    line += j.dump();
    line += "'";
    return line;
  }
  std::vector<std::string> args_given() const {
    std::vector<std::string> a;
    std::istringstream in(read_file_text((dir / "args.txt").string()));
    for (std::string s; std::getline(in, s);) a.push_back(s);
    return a;
  }
  // The value after `flag` in the arguments the stand-in was given.
  std::string arg(const std::string& flag) const {
    const std::vector<std::string> a = args_given();
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i] == flag) return a[i + 1];
    return "<absent>";
  }
};

TEST_F(BenchModelPeer, ShowsThePeerPerModeWithTheSpeedup) {
  const int64_t params = model_preset("tiny").num_params();
  stand_in("echo 'loading the models'\n" + record("eager", 1234.5, 1.5, params) + "\n" +
           record("compile", 617.25, 1.25, params) + "\n");
  const fs::path md = dir / "m.md", js = dir / "m.json", csv = dir / "m.csv";
  const test::CliRun r =
      test::run(kRun + " --peer --out " + md.string() + " --json " + js.string() + " --csv " + csv.string());
  ASSERT_EQ(r.code, 0) << r.err;

  // What the peer was asked for: the run's sizes, shapes, regions, runs and device.
  EXPECT_NE(args_given().at(0).find("bench/peers/model.py"), std::string::npos) << args_given().at(0);
  EXPECT_EQ(arg("--sizes"), "tiny");
  EXPECT_EQ(arg("--modes"), "eager,compile");
  EXPECT_EQ(arg("--regions"), "fwd,fwd-bwd,step");
  EXPECT_EQ(arg("--batch"), "2");
  EXPECT_EQ(arg("--seq"), "16");
  EXPECT_EQ(arg("--precision"), "f32");
  EXPECT_EQ(arg("--warmup"), "0");
  EXPECT_EQ(arg("--steps"), "2");
  EXPECT_EQ(arg("--device"), "cpu");

  const json j = json::parse(read_file_text(js.string()));
  const double tessera_ms = j.at("rows")[0].at("step").at("median_ms").get<double>();
  ASSERT_GT(tessera_ms, 0);
  const double eager_x = 1234.5 / tessera_ms, compile_x = 617.25 / tessera_ms;

  const std::string text = read_file_text(md.string());
  EXPECT_NE(r.out.find("## PyTorch peer (same run)"), std::string::npos) << r.out;  // printed as well as written
  const auto t = md_table(text, "| size | tessera step ms");
  ASSERT_EQ(t.size(), 2u) << text;
  EXPECT_EQ(t[0], (std::vector<std::string>{"size", "tessera step ms", "tessera train mem", "torch eager step ms",
                                            "torch eager train mem", "speedup vs eager", "torch compile step ms",
                                            "torch compile train mem", "speedup vs compile"}));
  const std::vector<std::string>& row = t[1];
  EXPECT_EQ(row[0], "tiny");
  EXPECT_NEAR(std::stod(row[1]), tessera_ms, 0.01 * tessera_ms + 1e-3);
  EXPECT_EQ(row[3], "1234.50");
  EXPECT_EQ(row[4], "1.50 GiB");
  EXPECT_EQ(row[5], speedup_cell(eager_x));
  EXPECT_EQ(row[6], "617.25");
  EXPECT_EQ(row[7], "1.25 GiB");
  EXPECT_EQ(row[8], speedup_cell(compile_x));
  EXPECT_NE(text.find("torch 2.9.1, transformers 4.57.0, on NVIDIA H200"), std::string::npos) << text;
  EXPECT_EQ(text.find("parameters, tessera's"), std::string::npos) << text;  // the counts agree: no note
  // The main table is still there, unchanged in its columns.
  EXPECT_EQ(md_table(text, "| size | d_model").at(0).size(), 13u);

  const json& pe = j.at("rows")[0].at("peer").at("eager");
  EXPECT_EQ(pe.at("step_ms").get<double>(), 1234.5);
  EXPECT_EQ(pe.at("train_mem_bytes").get<double>(), 1.5 * 1024 * 1024 * 1024);
  EXPECT_NEAR(pe.at("speedup").get<double>(), eager_x, 1e-9 * eager_x);
  EXPECT_NEAR(j.at("rows")[0].at("peer").at("compile").at("speedup").get<double>(), compile_x, 1e-9 * compile_x);
  EXPECT_EQ(j.at("peer").at("note"), nullptr);
  EXPECT_EQ(j.at("peer").at("region"), "step");

  // CSV: the peer's columns after tessera's, the speedup among them.
  std::istringstream in(read_file_text(csv.string()));
  std::string header, line;
  std::getline(in, header);
  std::getline(in, line);
  std::map<std::string, std::string> cells;
  std::istringstream hs(header), ls(line);
  for (std::string h, v; std::getline(hs, h, ',') && std::getline(ls, v, ',');) cells[h] = v;
  EXPECT_EQ(cells.at("torch_eager_status"), "ok");
  EXPECT_EQ(cells.at("torch_compile_step_ms"), "617.25");
  EXPECT_NEAR(std::stod(cells.at("torch_eager_speedup")), eager_x, 1e-5 * eager_x);
  EXPECT_EQ(std::stod(cells.at("torch_eager_train_mem_bytes")), 1.5 * 1024 * 1024 * 1024);
}

TEST_F(BenchModelPeer, OomFailuresAndMismatchesAreCellsAndNotes) {
  const int64_t params = model_preset("tiny").num_params();
  stand_in(record("eager", 10.0, 0.5, params + 1) + "\n" +
           "echo '{\"size\": \"tiny\", \"mode\": \"compile\", \"oom\": true, \"error\": \"OutOfMemoryError: CUDA out "
           "of memory\"}'\n");
  const fs::path md = dir / "m.md";
  const test::CliRun r = test::run(kRun + " --peer --mode fwd-bwd --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(arg("--regions"), "fwd-bwd");
  const std::string text = read_file_text(md.string());
  // --mode fwd-bwd: the peer is compared over that region, at its fwd_bwd_ms (0.9 x 10).
  const auto t = md_table(text, "| size | tessera fwd+bwd ms");
  ASSERT_EQ(t.size(), 2u) << text;
  EXPECT_EQ(t[1][3], "9.000");
  EXPECT_NE(t[1][5], "–");
  EXPECT_EQ(t[1][6], "OOM");
  EXPECT_EQ(t[1][7], "OOM");
  EXPECT_EQ(t[1][8], "–");
  EXPECT_NE(text.find("- torch compile tiny: OOM: OutOfMemoryError: CUDA out of memory"), std::string::npos) << text;
  EXPECT_NE(text.find("- torch eager tiny: the Hugging Face model has " + std::to_string(params + 1) +
                      " parameters, tessera's " + std::to_string(params)),
            std::string::npos)
      << text;
}

TEST_F(BenchModelPeer, PeerModeEagerAsksForEagerOnly) {
  stand_in(record("eager", 10.0, 0.5, model_preset("tiny").num_params()));
  const fs::path md = dir / "m.md";
  const test::CliRun r = test::run(kRun + " --peer --peer-mode eager --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(arg("--modes"), "eager");
  const auto t = md_table(read_file_text(md.string()), "| size | tessera step ms");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].size(), 6u);
  EXPECT_EQ(t[0].back(), "speedup vs eager");
}

TEST_F(BenchModelPeer, APeerThatFailsIsOneNoteAndTheBenchSucceeds) {
  stand_in("echo 'peer: no GPU visible to torch' >&2\nexit 1");
  const fs::path md = dir / "m.md", js = dir / "m.json";
  const test::CliRun r = test::run(kRun + " --peer --out " + md.string() + " --json " + js.string());
  ASSERT_EQ(r.code, 0) << r.err;
  // Said once: it was "peer: peer skipped: peer: no GPU visible to torch".
  EXPECT_NE(r.err.find("\n  peer skipped: no GPU visible to torch\n"), std::string::npos) << r.err;
  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("\n- peer (bench/peers/model.py): peer skipped: no GPU visible to torch\n"), std::string::npos)
      << text;
  EXPECT_TRUE(md_table(text, "| size | tessera step ms").empty()) << text;
  EXPECT_EQ(md_table(text, "| size | d_model").size(), 2u);
  const json j = json::parse(read_file_text(js.string()));
  EXPECT_EQ(j.at("peer").at("note"), "peer skipped: no GPU visible to torch");
  EXPECT_EQ(j.at("rows")[0].at("peer").at("eager"), nullptr);

  // A missing interpreter is a note too.
  ::setenv("TESSERA_PYTHON", (dir / "no-such-python").c_str(), 1);
  const test::CliRun r2 = test::run(kRun + " --peer --out " + md.string());
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_NE(read_file_text(md.string()).find("peer skipped: " + (dir / "no-such-python").string() + " not found"),
            std::string::npos);
}

TEST_F(BenchModelPeer, WithoutPeerTheOutputsKeepTheirFormat) {
  stand_in("exit 3");  // must not run
  const fs::path md = dir / "m.md", js = dir / "m.json", csv = dir / "m.csv";
  const test::CliRun r =
      test::run(kRun + " --out " + md.string() + " --json " + js.string() + " --csv " + csv.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir / "args.txt"));
  EXPECT_EQ(read_file_text(md.string()).find("peer"), std::string::npos);
  const json j = json::parse(read_file_text(js.string()));
  EXPECT_FALSE(j.contains("peer"));
  EXPECT_FALSE(j.at("rows")[0].contains("peer"));
  const std::string c = read_file_text(csv.string());
  EXPECT_EQ(c.substr(0, c.find('\n')).substr(c.find("mem_fwd_bytes")),
            "mem_fwd_bytes,mem_train_bytes,tokens_per_s,mfu");
}

TEST_F(BenchModelPeer, BadPeerFlagsAreOneLineErrors) {
  for (const std::string& args : {std::string(" --peer --peer-mode fast"), std::string(" --peer-mode eager")}) {
    const test::CliRun r = test::run(kRun + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("--peer-mode"), std::string::npos) << r.err;
  }
  for (const std::string& args : {std::string(" --peer --peer-timeout -1"), std::string(" --peer --peer-timeout soon"),
                                  std::string(" --peer-timeout 60")}) {
    const test::CliRun r = test::run(kRun + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("--peer-timeout"), std::string::npos) << r.err;
  }
  // 1e18 s overflowed the deadline into the past: the peer was stopped at once, as if it had run out of time.
  const test::CliRun huge = test::run(kRun + " --peer --peer-timeout 1e18");
  EXPECT_EQ(huge.code, 2) << huge.err;
  EXPECT_NE(huge.err.find("--peer-timeout 1e18 is out of range (at most a year"), std::string::npos) << huge.err;
}

// A peer that runs past --peer-timeout (torch.compile of many sizes): stopped there, its eager figure kept in the
// table, the compile cells –, the note in the file, and the bench succeeds with every output written.
TEST_F(BenchModelPeer, APeerPastItsTimeoutKeepsWhatItPrinted) {
  stand_in(record("eager", 10.0, 0.5, model_preset("tiny").num_params()) + "\nsleep 60\n" +
           record("compile", 5.0, 0.5, model_preset("tiny").num_params()));
  const fs::path md = dir / "m.md", js = dir / "m.json";
  const test::CliRun r = test::run(kRun + " --peer --peer-timeout 2 --out " + md.string() + " --json " + js.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("peer stopped at --peer-timeout 2 s: the cells it had not reached are –"), std::string::npos)
      << text;
  const json j = json::parse(read_file_text(js.string()));
  EXPECT_EQ(j.at("rows")[0].at("peer").at("eager").at("step_ms"), 10.0) << j.dump();
  EXPECT_EQ(j.at("rows")[0].at("peer").at("compile"), nullptr) << j.dump();
}

TEST(ModelPeerFigures, ParsesRecordsAndRejectsBadFigures) {
  EXPECT_FALSE(model_peer_figures_from_json(json{{"kernel", "x"}}));
  const auto f = model_peer_figures_from_json(
      json{{"size", "tiny"}, {"mode", "eager"}, {"step_ms", 4.0}, {"fwd_ms", nullptr}, {"train_mem_gib", 2.0}});
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->ran());
  EXPECT_EQ(f->region_ms("step"), 4.0);
  EXPECT_FALSE(f->region_ms("fwd"));
  EXPECT_EQ(f->train_mem_bytes, 2.0 * 1024 * 1024 * 1024);
  EXPECT_THROW(model_peer_figures_from_json(json{{"size", "tiny"}, {"mode", "eager"}, {"step_ms", "4"}}), Error);

  ModelBenchRow row;
  row.rate_region = "step";
  row.step = RegionTiming{.t = {.median_ms = 2.0}};
  EXPECT_EQ(model_peer_speedup(row, *f), 2.0);
  ModelPeerFigures oom = *f;
  oom.oom = true;
  EXPECT_FALSE(model_peer_speedup(row, oom));
}

// The real script: its checks need no torch, so they run wherever tests run.
TEST_F(BenchModelPeer, ScriptRefusesBadArgumentsInOneLine) {
  const std::string script = std::string(TESSERA_SOURCE_DIR) + "/bench/peers/model.py";
  auto run_script = [&](const std::string& args, int* code) {
    const std::string out = (dir / "out.txt").string();
    const int status =
        std::system((std::string(TESSERA_PYTHON) + " '" + script + "' " + args + " >'" + out + "' 2>&1").c_str());
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return read_file_text(out);
  };
  int code = 0;
  EXPECT_EQ(run_script("--sizes tiny,nope --device cpu --precision f32", &code),
            "peer: unknown size 'nope' (known: tiny, gpt2-124m, cs336-small, cs336-medium, cs336-large, cs336-xl, "
            "cs336-2.7b)\n");
  EXPECT_EQ(code, 1);
  EXPECT_EQ(run_script("--sizes tiny --seq 65 --device cpu --precision f32", &code),
            "peer: --seq 65 exceeds max_seq of tiny\n");
  EXPECT_EQ(code, 1);
  EXPECT_EQ(run_script("--sizes tiny --modes eager,jit --device cpu", &code),
            "peer: unknown mode 'jit' (known: eager, compile)\n");
}

// Where torch and transformers import (CI's .venv), the real peer times the tiny model on the CPU in eager mode:
// its Hugging Face model must have tessera's parameter count (no mismatch note) and give a speedup.
TEST_F(BenchModelPeer, RealScriptOnTheCpuWhereTransformersImports) {
  const std::string probe = std::string(TESSERA_PYTHON) + " -c 'import torch, transformers' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) GTEST_SKIP() << "torch or transformers is not importable by " << TESSERA_PYTHON;
  ::setenv("TESSERA_PYTHON", TESSERA_PYTHON, 1);
  const fs::path js = dir / "m.json", md = dir / "m.md";
  const test::CliRun r = test::run(kRun + " --peer --peer-mode eager --json " + js.string() + " --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(read_file_text(js.string()));
  EXPECT_EQ(j.at("peer").at("note"), nullptr) << read_file_text(md.string());
  const json& pe = j.at("rows")[0].at("peer").at("eager");
  ASSERT_TRUE(pe.is_object()) << read_file_text(md.string());
  EXPECT_EQ(pe.at("params").get<int64_t>(), model_preset("tiny").num_params());
  EXPECT_GT(pe.at("step_ms").get<double>(), 0);
  EXPECT_GT(pe.at("speedup").get<double>(), 0);
  EXPECT_EQ(pe.at("train_mem_bytes"), nullptr);  // the CPU peer measures no memory
}

}  // namespace
}  // namespace tessera
