// tessera bench decode on the CPU (tiny shapes): every row it runs is in the table with a positive figure, --rows
// picks them, --out holds the same table, bad input is one line with exit 2; and the peer's records are read into
// the figures the table sets beside tessera's.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_run.h"
#include "tessera/bench/decode.h"
#include "tessera/core/context.h"
#include "tessera/core/file_io.h"
#include "tessera/models/model.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class BenchDecode : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("tessera_bench_decode_test_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  static test::CliRun bench(const std::string& args) {
    return test::run_after("OMP_NUM_THREADS=1 ", "bench decode --device cpu --model tiny --no-progress " + args);
  }

  // The table's rows: (row, measure, tessera, unit) cells each.
  static std::vector<std::vector<std::string>> rows(const std::string& md) {
    auto t = test::md_table(md, "| row | measure | tessera | unit |");
    EXPECT_FALSE(t.empty()) << md;
    if (!t.empty()) t.erase(t.begin());
    return t;
  }

  void expect_one_line_error(const std::string& args, const std::string& names) {
    const test::CliRun r = bench(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("tessera: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(names), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
};

TEST_F(BenchDecode, EveryRowHasPositiveFiguresAndOutHoldsTheTable) {
  const fs::path md = dir / "decode.md";
  const test::CliRun r = bench("--new-tokens 4 --iters 1 --batch 3 --out '" + md.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto t = rows(r.out);
  std::set<std::string> seen;
  for (const auto& cells : t) {
    ASSERT_EQ(cells.size(), 4u) << r.out;
    seen.insert(cells[0]);
    char* end = nullptr;
    const double v = std::strtod(cells[2].c_str(), &end);
    EXPECT_TRUE(end != cells[2].c_str() && *end == '\0' && v > 0) << cells[1] << ": " << cells[2];
    EXPECT_FALSE(cells[3].empty()) << cells[1];
  }
  const auto& names = decode_row_names();
  EXPECT_EQ(seen, std::set<std::string>(names.begin(), names.end())) << r.out;
  // The lines each row claims: both timings of greedy, per step and per token of the batch, both sides of prefill.
  const auto count = [&](const std::string& row) {
    return std::count_if(t.begin(), t.end(), [&](const auto& c) { return c[0] == row; });
  };
  EXPECT_EQ(count("greedy"), 2);
  EXPECT_EQ(count("batch"), 3);
  EXPECT_EQ(count("prefill"), 2);
  EXPECT_EQ(count("bandwidth"), 2);  // no copy bandwidth on the CPU: no fraction of it
  EXPECT_NE(r.out.find("batch 3, greedy, 4 new tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("candidates per row after the retrieve"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("peer"), std::string::npos) << "no peer asked for:\n" << r.out;
  // The file is the printed table under its title.
  ASSERT_TRUE(fs::exists(md));
  const std::string file = read_file_text(md.string());
  EXPECT_EQ(file.rfind("# tessera bench decode\n", 0), 0u) << file;
  EXPECT_NE(file.find(r.out.substr(r.out.find("| row |"))), std::string::npos);
}

TEST_F(BenchDecode, RowsPicksTheRowsAndPeerOnTheCpuIsSkipped) {
  // --pdl off is taken on the CPU too (it changes only how GPU kernels launch).
  const test::CliRun r = bench("--rows topk,greedy --new-tokens 2 --iters 1 --peer --pdl off");
  ASSERT_EQ(r.code, 0) << r.err;
  std::set<std::string> seen;
  for (const auto& cells : rows(r.out)) seen.insert(cells.at(0));
  EXPECT_EQ(seen, (std::set<std::string>{"greedy", "topk"})) << r.out;
  EXPECT_NE(r.out.find("peer skipped: the PyTorch peers run on a GPU only"), std::string::npos) << r.out;
}

TEST_F(BenchDecode, BadInputIsOneLineWithExitTwo) {
  expect_one_line_error("--rows greedy,nope", "--rows: unknown row 'nope'");
  expect_one_line_error("--rows greedy,", "--rows: empty item");
  expect_one_line_error("--new-tokens 0", "--new-tokens must be at least 1");
  expect_one_line_error("--new-tokens 100", "lower --new-tokens to 45");
  expect_one_line_error("--prompt 1", "--prompt must be at least 2");
  expect_one_line_error("--iters 0", "--iters must be >= 1");
  expect_one_line_error("--dtype bf16", "the CPU engine computes in f32");
  expect_one_line_error("--beams 0", "--beams must be 1 to 16");
  expect_one_line_error("--pdl maybe", "--pdl must be on or off, got 'maybe'");
  expect_one_line_error("--model nope", "unknown preset 'nope'");
  expect_one_line_error("--out '" + (dir / "missing" / "x.md").string() + "'", "--out");
  if (!probe_gpu().available) {
    const test::CliRun r = test::run("bench decode --device cuda --rows topk");
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
  }
}

// A decode step reads one row of the position table, and of the embedding table where the head does not read it all.
TEST(BenchDecodeBytes, WeightBytesLeaveOutTheTablesAStepReadsARowOf) {
  const ModelConfig gpt = model_preset("tiny");                 // tied, learned positions
  const ModelConfig llama = llama_style(model_preset("tiny"));  // untied, rotary
  ASSERT_TRUE(gpt.tied && gpt.positions == PositionKind::Learned && !llama.tied);
  const int64_t C = gpt.d_model;
  EXPECT_DOUBLE_EQ(decode_weight_bytes(*make_model(gpt)), 4.0 * (gpt.num_params() - gpt.max_seq * C + C));
  EXPECT_DOUBLE_EQ(decode_weight_bytes(*make_model(llama)), 4.0 * (llama.num_params() - llama.vocab * C + C));
}

TEST(BenchDecodePeer, RecordsBecomeFiguresInMs) {
  DecodePeerFigures f;
  const auto take = [&](const char* s) { return decode_peer_take(nlohmann::json::parse(s), f); };
  EXPECT_TRUE(take(R"({"what": "copy", "bytes": 2147483648, "gbps": 3000.5})"));
  EXPECT_TRUE(take(R"({"what": "generate", "model": "gpt2-124m", "mode": "static", "batch": 16, "beams": 1,
                      "new_tokens": 128, "ms_per_token": 2.45, "total_ms": 313.6})"));
  EXPECT_TRUE(take(R"({"what": "generate", "model": "gpt2-124m", "mode": "eager", "batch": 1, "beams": 4,
                      "error": "RuntimeError: no"})"));
  EXPECT_TRUE(take(R"({"what": "prefill", "model": "gpt2-124m", "tokens": 1024, "ms": 9.5})"));
  EXPECT_TRUE(take(R"({"what": "topk", "rows": 32, "cols": 201028, "k": 8, "us": 160.0})"));
  EXPECT_TRUE(take(R"({"what": "first token", "model": "gpt2-124m", "s": 1.25})"));
  EXPECT_FALSE(take(R"({"peer": "no CUDA device"})"));
  EXPECT_FALSE(take(R"({"what": "prefill", "tokens": 1024})"));
  ASSERT_TRUE(f.copy_gbs.has_value());
  EXPECT_DOUBLE_EQ(*f.copy_gbs, 3000.5);
  EXPECT_DOUBLE_EQ(f.ms.at(decode_peer_key("static", 16, 1)), 2.45);
  EXPECT_DOUBLE_EQ(f.ms.at(decode_peer_prefill_key(1024)), 9.5);
  EXPECT_DOUBLE_EQ(f.ms.at(decode_peer_topk_key(32, 4 * 50257, 8)), 0.16);
  EXPECT_DOUBLE_EQ(f.ms.at("first token"), 1250.0);
  EXPECT_EQ(f.ms.count(decode_peer_key("eager", 1, 4)), 0u);
  ASSERT_EQ(f.errors.size(), 1u);
  EXPECT_EQ(f.errors[0], decode_peer_key("eager", 1, 4) + ": RuntimeError: no");
  EXPECT_EQ(f.ms.size(), 4u);
}

// The peer's figure sits beside each line in the line's unit, with peer / tessera; a figure the peer did not give
// is –, and a line without peers has – in every peer cell.
TEST(BenchDecodePeer, TableSetsThePeerBesideTesseraInTheLinesUnit) {
  DecodeBenchResult r;
  r.lines.push_back(
      {.row = "batch",
       .measure = "per token",
       .value = 0.05,
       .unit = "ms/token",
       .peer_factor = 1.0 / 16,
       .peers = {{"HF static", decode_peer_key("static", 16, 1)}, {"HF eager", decode_peer_key("eager", 16, 1)}}});
  r.lines.push_back({.row = "topk",
                     .measure = "k 8",
                     .value = 40,
                     .unit = "µs",
                     .peer_factor = 1e3,
                     .peers = {{"torch.topk", decode_peer_topk_key(32, 8, 8)}}});
  r.lines.push_back(
      {.row = "bandwidth", .measure = "GB/s", .value = 2500, .unit = "GB/s", .peer_factor = 1, .peers = {}});
  DecodePeerFigures f;
  f.ms[decode_peer_key("static", 16, 1)] = 2.4;  // ms per step of 16 tokens: 0.15 ms/token, 3x tessera's 0.05
  f.ms[decode_peer_topk_key(32, 8, 8)] = 0.16;   // 160 µs, 4x tessera's 40
  const auto t = test::md_table(decode_bench_table(r, f, /*with_peer=*/true), "| row |");
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[0],
            (std::vector<std::string>{"row", "measure", "tessera", "unit", "peer", "peer's figure", "peer / tessera"}));
  EXPECT_EQ(t[1],
            (std::vector<std::string>{"batch", "per token", "0.0500", "ms/token", "HF static", "0.1500", "3.00×"}));
  EXPECT_EQ(t[2], (std::vector<std::string>{"batch", "per token", "0.0500", "ms/token", "HF eager", "–", "–"}));
  EXPECT_EQ(t[3], (std::vector<std::string>{"topk", "k 8", "40.000", "µs", "torch.topk", "160.0", "4.00×"}));
  EXPECT_EQ(t[4], (std::vector<std::string>{"bandwidth", "GB/s", "2500.0", "GB/s", "–", "–", "–"}));
  const auto plain = test::md_table(decode_bench_table(r, f, /*with_peer=*/false), "| row |");
  ASSERT_EQ(plain.size(), 4u);
  EXPECT_EQ(plain[1].size(), 4u);
}

}  // namespace
}  // namespace tessera
