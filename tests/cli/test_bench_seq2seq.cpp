// tessera bench seq2seq on the CPU (--size small): every row it runs is in the table with positive figures, --out
// holds the same table, the peer (bench/peers/seq2seq.py on this machine's torch) fills the cells it can run on a
// CPU and names the modes it cannot, its records land under the keys the table reads, and bad flags are one line
// with exit 2.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_run.h"
#include "tessera/bench/seq2seq.h"
#include "tessera/core/file_io.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

test::CliRun bench(const std::string& args) {
  return test::run_after("OMP_NUM_THREADS=1 TESSERA_PYTHON='" + std::string(TESSERA_PYTHON) + "' ",
                         "bench seq2seq --device cpu --size small --no-progress --warmup 0 --iters 1 " + args);
}

// The table's lines after its header, cells each.
std::vector<std::vector<std::string>> lines(const std::string& md) {
  auto t = test::md_table(md, "| row | measure | tessera | unit |");
  EXPECT_FALSE(t.empty()) << md;
  if (!t.empty()) t.erase(t.begin());
  return t;
}

bool positive_number(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return end != s.c_str() && (*end == '\0' || std::string(end) == "×") && v > 0;
}

TEST(BenchSeq2seq, EveryRowHasPositiveFiguresAndOutHoldsTheTable) {
  const fs::path md = fs::temp_directory_path() / ("tessera_bench_seq2seq_" + std::to_string(::getpid()) + ".md");
  const test::CliRun r = bench("--sentences 2 --out '" + md.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::string, int> count;
  for (const auto& cells : lines(r.out)) {
    ASSERT_EQ(cells.size(), 4u) << r.out;
    ++count[cells[0]];
    EXPECT_TRUE(positive_number(cells[2])) << cells[1] << ": " << cells[2];
  }
  // train: step ms and tokens/s at each of the two batch sizes (memory on a GPU only); translate: sentences/s and
  // ms per sentence at batch 2 and 1; cross-kv: forward and backward, batched, separate and their ratio.
  EXPECT_EQ(count, (std::map<std::string, int>{{"train", 4}, {"translate", 4}, {"cross-kv", 6}})) << r.out;
  for (const char* s : {"- commit: ", "- device: cpu, f32", "d_model 64"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  // The file: the title, then what stdout shows.
  EXPECT_EQ(read_file_text(md.string()), "# tessera bench seq2seq\n\n" + r.out);
  fs::remove(md);
}

TEST(BenchSeq2seq, PeerRunsWhatTheCpuCanAndNamesTheRest) {
  const test::CliRun r = bench("--rows train,translate --train-tokens 16 --sentences 2 --batches 2 --peer");
  ASSERT_EQ(r.code, 0) << r.err;
  if (r.out.find("- peer skipped: ") != std::string::npos) {
    EXPECT_EQ(r.out.find("| HF"), std::string::npos) << "a skipped peer fills no cell";
    GTEST_SKIP() << "no torch and transformers for the peer: " << r.out;
  }
  std::map<std::string, std::string> figure;  // "<measure> <peer>" -> the peer's figure
  for (const auto& cells : lines(r.out)) {
    ASSERT_EQ(cells.size(), 7u) << r.out;
    figure[cells[1] + " | " + cells[4]] = cells[5];
    if (cells[5] != "–") {
      EXPECT_TRUE(positive_number(cells[6])) << cells[1] << ": " << cells[6];
    }
  }
  // Eager training and eager generate run on any CPU torch; torch.compile and the static cache are either figures
  // or named as unsupported in one line.
  EXPECT_TRUE(positive_number(figure["step, 2 x (8 + 8) | HF BART eager"])) << r.out;
  EXPECT_TRUE(positive_number(figure["target tokens/s, 2 x (8 + 8) | HF BART eager"])) << r.out;
  EXPECT_TRUE(positive_number(figure["sentences/s, beam 4, batch 2 | HF generate eager"])) << r.out;
  EXPECT_TRUE(positive_number(figure["per sentence, beam 4, batch 2 | HF generate eager"])) << r.out;
  const bool compiled = positive_number(figure["step, 2 x (8 + 8) | HF BART torch.compile"]);
  EXPECT_TRUE(compiled || r.out.find("- peer train compile: unsupported (") != std::string::npos) << r.out;
  const bool statik = positive_number(figure["sentences/s, beam 4, batch 2 | HF generate static cache"]);
  EXPECT_TRUE(statik || r.out.find("- peer translate static: unsupported (") != std::string::npos) << r.out;
  EXPECT_NE(r.out.find("- peer: torch "), std::string::npos) << "the peer's versions in the header";
  EXPECT_EQ(r.out.find("peer error"), std::string::npos) << r.out;
}

// Every figure the peer prints lands under the key the table's line asks for, and the ratio's direction follows the
// unit (time: peer / tessera; rate: tessera / peer).
TEST(BenchSeq2seq, PeerRecordsFillTheirLines) {
  Seq2SeqPeerFigures f;
  EXPECT_TRUE(seq2seq_peer_take(nlohmann::json::parse(R"({"what":"train","mode":"eager","n":4096,"ms":20,
                                                           "tok/s":204800,"MiB":900})"),
                                f));
  EXPECT_TRUE(
      seq2seq_peer_take(nlohmann::json::parse(R"({"what":"translate","mode":"eager","n":64,"sent/s":50,"ms":20})"), f));
  EXPECT_TRUE(seq2seq_peer_take(nlohmann::json::parse(R"({"what":"translate","mode":"static","n":1,
                                                           "unsupported":"ValueError: no"})"),
                                f));
  EXPECT_FALSE(seq2seq_peer_take(nlohmann::json::parse(R"({"what":"versions","text":"torch 9"})"), f));
  EXPECT_EQ(f.versions, "torch 9");
  EXPECT_EQ(f.unsupported.at("translate static"), "ValueError: no");
  Seq2SeqBenchResult r;
  const auto key = [](const char* row, int n, const char* unit) { return seq2seq_peer_key(row, "eager", n, unit); };
  r.lines = {{"train", "step", 10, "ms", false, {{"p", key("train", 4096, "ms")}}},
             {"train", "tok/s", 409600, "tok/s", true, {{"p", key("train", 4096, "tok/s")}}},
             {"train", "memory", 450, "MiB", false, {{"p", key("train", 4096, "MiB")}}},
             {"translate", "rate", 100, "sent/s", true, {{"p", key("translate", 64, "sent/s")}}},
             {"translate", "each", 10, "ms", false, {{"p", key("translate", 64, "ms")}}}};
  const auto t = lines(seq2seq_bench_table(r, f, true));
  ASSERT_EQ(t.size(), 5u);
  for (const auto& cells : t) EXPECT_EQ(cells[6], "2.000×") << cells[1];
}

TEST(BenchSeq2seq, BadFlagsAreOneLineAndExit2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--rows train,nope", "--rows: unknown row 'nope'"},
      {"--train-tokens 12", "--train-tokens 12 is not a positive multiple of --tgt-len 8"},
      {"--batches 2,x", "--batches: 'x' is not an integer"},
      {"--precision bf16", "--precision bf16: the CPU computes in f32"},
      {"--size huge", "--size must be small or full"},
      {"--beams 0", "--beams must be in [1, 32]"},
      {"--src-len 100", "--src-len 100 is outside [1, 64]"},
      {"--iters 0", "--iters must be >= 1"},
      {"--nope", "--nope"}};
  for (const auto& [args, msg] : cases) {
    const test::CliRun r = bench(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(msg), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

}  // namespace
}  // namespace tessera
