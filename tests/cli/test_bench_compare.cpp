// tessera bench compare end to end on the CPU (tiny preset, B 2, T 16, two timed runs), with a shell stand-in for
// python (TESSERA_PYTHON) that prints canned records of bench/peers/model.py: every speedup cell (fwd, fwd+bwd,
// step; per peer mode) is the peer's ms over the tessera ms the run's own JSON reports, in the markdown, the JSON
// and the CSV; the chart decodes (Python's zlib) at the chart's size with a bar per series. A peer that cannot run
// is one note, "–" in its cells, and the command still writes every file and exits 0. Bad flags are one-line
// errors that write nothing. No timing is asserted.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
#include "tessera/bench/bar_chart.h"
#include "tessera/core/file_io.h"
#include "tessera/models/config.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::md_table;
using test::speedup_cell;
using test::trim;

const std::string kRun = "bench compare --device cpu --preset tiny --batch 2 --seq 16 --warmup 0 --steps 2";

// header -> cell of each CSV line after the header.
std::vector<std::map<std::string, std::string>> read_csv(const fs::path& p) {
  std::istringstream in(read_file_text(p.string()));
  std::string header;
  std::getline(in, header);
  std::vector<std::map<std::string, std::string>> rows;
  for (std::string line; std::getline(in, line);) {
    std::map<std::string, std::string> cells;
    std::istringstream hs(header), ls(line + ",");
    for (std::string h, v; std::getline(hs, h, ',') && std::getline(ls, v, ',');) cells[h] = v;
    rows.push_back(cells);
  }
  return rows;
}

class BenchCompare : public test::PeerStandIn {
 protected:
  // `echo '<record>'` of the peer for tiny in `mode`.
  static std::string record(const std::string& mode, double fwd, double fwd_bwd, double step, double train_gib) {
    const json j = {{"size", "tiny"},
                    {"mode", mode},
                    {"params", model_preset("tiny").num_params()},
                    {"fwd_ms", fwd},
                    {"fwd_bwd_ms", fwd_bwd},
                    {"step_ms", step},
                    {"train_mem_gib", train_gib},
                    {"torch", "2.9.1"},
                    {"transformers", "4.57.0"},
                    {"device", "cpu"}};
    return "echo '" + j.dump() + "'";
  }
  // The chart decoded by tests/tools/check_png.py: {"ok", "width", "height", "colors": {"r,g,b": count}}.
  json decode_png(const fs::path& png) const {
    const fs::path out = dir / "png.json";
    const std::string cmd = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR + "/tests/tools/check_png.py " +
                            png.string() + " > " + out.string();
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return json::parse(read_file_text(out.string()));
  }
  static int pixels(const json& p, Rgb c) {
    const std::string k = std::to_string(c.r) + "," + std::to_string(c.g) + "," + std::to_string(c.b);
    return p.at("colors").contains(k) ? p.at("colors").at(k).get<int>() : 0;
  }
  void expect_usage_error(const std::string& args, const std::string& names) {
    const test::CliRun r = test::run("bench compare " + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("tessera: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(names), std::string::npos) << args << ": " << r.err;
  }
};

TEST_F(BenchCompare, SpeedupIsThePeersMsOverTesserasPerRegionAndMode) {
  // Peer figures far from tessera's, different per region and mode, so that a speedup taken from the wrong
  // column or the wrong mode (or inverted) cannot match.
  stand_in("echo 'loading the models'\n" + record("eager", 111.0, 222.0, 333.0, 1.5) + "\n" +
           record("compile", 44.0, 55.0, 66.0, 1.25));
  const fs::path md = dir / "c.md", js = dir / "c.json", csv = dir / "c.csv", png = dir / "c.png";
  const test::CliRun r = test::run(kRun + " --out " + md.string() + " --json " + js.string() + " --csv " +
                                   csv.string() + " --chart " + png.string());
  ASSERT_EQ(r.code, 0) << r.err;

  const json j = json::parse(read_file_text(js.string()));
  ASSERT_EQ(j.at("rows").size(), 2u);
  EXPECT_EQ(j.at("peer").at("note"), nullptr);
  EXPECT_EQ(j.at("peer").at("torch"), "2.9.1");
  const std::map<std::string, std::map<std::string, double>> peer_ms = {
      {"eager", {{"fwd", 111.0}, {"fwd_bwd", 222.0}, {"step", 333.0}}},
      {"compile", {{"fwd", 44.0}, {"fwd_bwd", 55.0}, {"step", 66.0}}}};
  std::map<std::string, double> tessera_ms;
  for (const char* key : {"fwd", "fwd_bwd", "step"}) {
    tessera_ms[key] = j.at("rows")[0].at(key).at("tessera_ms").get<double>();
    ASSERT_GT(tessera_ms[key], 0) << key;
    EXPECT_EQ(j.at("rows")[1].at(key).at("tessera_ms").get<double>(), tessera_ms[key]) << "one tessera run per size";
  }

  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("- date: "), std::string::npos);
  EXPECT_NE(text.find("- commit: "), std::string::npos);
  EXPECT_NE(text.find("- device: cpu (CPU)"), std::string::npos) << text;
  EXPECT_NE(text.find("torch 2.9.1, transformers 4.57.0"), std::string::npos) << text;
  EXPECT_NE(r.out.find("| size | peer mode |"), std::string::npos) << r.out;  // printed as well as written
  const auto t = md_table(text, "| size |");
  ASSERT_EQ(t.size(), 3u) << text;
  EXPECT_EQ(t[0],
            (std::vector<std::string>{"size", "peer mode", "tessera fwd ms", "peer fwd ms", "fwd speedup",
                                      "tessera fwd+bwd ms", "peer fwd+bwd ms", "fwd+bwd speedup", "tessera step ms",
                                      "peer step ms", "step speedup", "tessera train mem", "peer train mem"}));
  const auto csv_rows = read_csv(csv);
  ASSERT_EQ(csv_rows.size(), 2u);
  const char* keys[] = {"fwd", "fwd_bwd", "step"};
  for (int row = 0; row < 2; ++row) {
    const std::string mode = row == 0 ? "eager" : "compile";
    const std::vector<std::string>& cells = t[1 + row];
    EXPECT_EQ(cells[0], "tiny");
    EXPECT_EQ(cells[1], mode);
    const json& jr = j.at("rows")[row];
    EXPECT_EQ(jr.at("mode"), mode);
    EXPECT_EQ(jr.at("peer_status"), "ok");
    EXPECT_EQ(csv_rows[row].at("mode"), mode);
    for (int g = 0; g < 3; ++g) {
      const double p = peer_ms.at(mode).at(keys[g]), x = p / tessera_ms[keys[g]];
      EXPECT_NEAR(std::stod(cells[2 + 3 * g]), tessera_ms[keys[g]], 0.01 * tessera_ms[keys[g]] + 1e-3) << keys[g];
      EXPECT_EQ(std::stod(cells[3 + 3 * g]), p) << mode << " " << keys[g];
      EXPECT_EQ(cells[4 + 3 * g], speedup_cell(x)) << mode << " " << keys[g];
      EXPECT_EQ(jr.at(keys[g]).at("peer_ms").get<double>(), p);
      EXPECT_NEAR(jr.at(keys[g]).at("speedup").get<double>(), x, 1e-9 * x) << mode << " " << keys[g];
      EXPECT_NEAR(std::stod(csv_rows[row].at(std::string(keys[g]) + "_speedup")), x, 1e-5 * x) << keys[g];
    }
    EXPECT_NE(cells[11], "–");  // tessera's planned training bytes
    EXPECT_EQ(cells[12], row == 0 ? "1.50 GiB" : "1.25 GiB");
  }

  const json p = decode_png(png);
  ASSERT_TRUE(p.at("ok").get<bool>()) << p.dump();
  EXPECT_EQ(p.at("width").get<int>(), kBarChartWidth);
  EXPECT_EQ(p.at("height").get<int>(), kBarChartHeight);
  // The peer's step ms (333, 66) dwarf tessera's: its bar is at least the legend's square; theirs are tall.
  EXPECT_GE(pixels(p, kColorTessera), 18 * 14);
  EXPECT_GT(pixels(p, kColorTorchEager), 5000);
  EXPECT_GT(pixels(p, kColorTorchCompile), 1000);
  EXPECT_GT(pixels(p, kColorTorchEager), pixels(p, kColorTorchCompile));  // 333 ms against 66 ms
}

TEST_F(BenchCompare, APeerThatCannotRunIsANoteAndEveryFileIsWritten) {
  stand_in("echo \"ModuleNotFoundError: No module named 'torch'\"\nexit 1");
  const fs::path md = dir / "c.md", js = dir / "c.json", csv = dir / "c.csv", png = dir / "c.png";
  const test::CliRun r = test::run(kRun + " --peer-mode eager --out " + md.string() + " --json " + js.string() +
                                   " --csv " + csv.string() + " --chart " + png.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string note = "peer skipped: ModuleNotFoundError: No module named 'torch'";
  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("\n- peer (bench/peers/model.py): " + note + "\n"), std::string::npos) << text;
  const auto t = md_table(text, "| size |");
  ASSERT_EQ(t.size(), 2u) << text;  // one mode asked for: one row
  const std::vector<std::string>& row = t[1];
  EXPECT_EQ(row[1], "eager");
  for (int g = 0; g < 3; ++g) {
    EXPECT_NE(row[2 + 3 * g], "–") << "tessera's own time is there";
    EXPECT_EQ(row[3 + 3 * g], "–");
    EXPECT_EQ(row[4 + 3 * g], "–");
  }
  EXPECT_EQ(row[12], "–");

  const json j = json::parse(read_file_text(js.string()));
  EXPECT_EQ(j.at("peer").at("note"), note);
  EXPECT_EQ(j.at("rows")[0].at("peer_status"), "missing");
  EXPECT_EQ(j.at("rows")[0].at("step").at("speedup"), nullptr);
  EXPECT_GT(j.at("rows")[0].at("step").at("tessera_ms").get<double>(), 0);
  const auto c = read_csv(csv);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].at("peer_status"), "missing");
  EXPECT_EQ(c[0].at("step_speedup"), "");

  const json p = decode_png(png);
  ASSERT_TRUE(p.at("ok").get<bool>()) << p.dump();
  EXPECT_EQ(p.at("width").get<int>(), kBarChartWidth);
  EXPECT_EQ(p.at("height").get<int>(), kBarChartHeight);
  EXPECT_GT(pixels(p, kColorTessera), 5000);        // the only bar: the whole height of the plot
  EXPECT_EQ(pixels(p, kColorTorchEager), 18 * 14);  // the legend's square only
  EXPECT_EQ(pixels(p, kColorTorchCompile), 0);      // not asked for

  // No interpreter at all: a note too.
  ::setenv("TESSERA_PYTHON", (dir / "no-such-python").c_str(), 1);
  const test::CliRun r2 = test::run(kRun + " --out " + md.string());
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_NE(r2.out.find("peer skipped: " + (dir / "no-such-python").string() + " not found"), std::string::npos)
      << r2.out;
}

TEST_F(BenchCompare, BadFlagsAreOneLineErrorsThatWriteNothing) {
  stand_in("exit 3");
  const std::string js = " --json " + (dir / "x.json").string();
  expect_usage_error("--device cpu --peer-mode fast" + js, "--peer-mode");
  expect_usage_error("--device cpu --chart " + (dir / "c.jpg").string() + js, ".png");
  expect_usage_error("--device cpu --chart " + (dir / "missing" / "c.png").string() + js, "--chart");
  expect_usage_error("--device cpu --precision bf16" + js, "--precision bf16");
  expect_usage_error("--device cpu --precision f16" + js, "the PyTorch peer times f32 and bf16 only");
  expect_usage_error("--device cpu --preset tiny --sizes tiny" + js, "--preset or --sizes");
  expect_usage_error("--device cpu --sizes tiny,huge" + js, "huge");
  expect_usage_error("--device cpu --preset tiny --seq 65" + js, "max_seq 64");
  expect_usage_error("--device cpu --steps 0" + js, "--steps");
  expect_usage_error("--device cpu --max-memory 12XB" + js, "bench compare: --max-memory");
  expect_usage_error("--device cpu --cuda-graph maybe" + js, "--cuda-graph");
  expect_usage_error("--device cpu --stepz 2" + js, "did you mean --steps");
  expect_usage_error("--device tpu" + js, "tpu");
  EXPECT_FALSE(fs::exists(dir / "x.json"));
  EXPECT_FALSE(fs::exists(dir / "args.txt"));
}

}  // namespace
}  // namespace tessera
