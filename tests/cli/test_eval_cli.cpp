// tessera eval --bleu through the binary: the score line with its signature, exact match, --json, and each bad input
// one line with exit code 2.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_run.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::run;

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

void expect_error(const test::CliRun& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(EvalCli, PrintsScoreSignatureAndExactMatch) {
  const fs::path d = test::temp_dir("eval_cli");
  write_text(d / "hyp", "The cat sat.\nexactly this\n");
  write_text(d / "ref1", "The cat sat on the mat.\nnot this\n");
  write_text(d / "ref2", "A cat sat.\nexactly this\n");
  const std::string files = " --hyp " + (d / "hyp").string() + " --ref " + (d / "ref1").string();
  auto r = run("eval --bleu" + files);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3 = "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("exact match = 0.00% (0 of 2 lines)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the sacrebleu package did not run"), std::string::npos) << r.out;

  r = run("eval --bleu --json --lowercase --tokenize intl" + files + " --ref " + (d / "ref2").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["signature"], "nrefs:2|case:lc|eff:no|tok:intl|smooth:exp|version:2.4.3");
  EXPECT_EQ(j["exact_match"]["matched"], 1);
  EXPECT_EQ(j["exact_match"]["lines"], 2);
  EXPECT_GT(j["score"].get<double>(), 0.0);
  fs::remove_all(d);
}

TEST(EvalCli, BadInputIsOneLineAndExitTwo) {
  const fs::path d = test::temp_dir("eval_cli_bad");
  write_text(d / "hyp", "a b\nc d\n");
  write_text(d / "short", "a b\n");
  write_text(d / "bad_utf8", "a b\nc \xff d\n");
  write_text(d / "nul", std::string("a b\nc\0d\n", 8));
  write_text(d / "empty", "");
  const std::string hyp = " --hyp " + (d / "hyp").string();
  expect_error(run("eval --bleu" + hyp + " --ref " + (d / "short").string()), "has 1 lines but --hyp");
  expect_error(run("eval --bleu" + hyp + " --ref " + (d / "bad_utf8").string()), "line 2 is not valid UTF-8 (byte 3)");
  expect_error(run("eval --bleu" + hyp + " --ref " + (d / "nul").string()), "line 2 holds a NUL byte");
  expect_error(run("eval --bleu --hyp " + (d / "empty").string() + " --ref " + (d / "short").string()), "has no lines");
  expect_error(run("eval --bleu" + hyp + " --ref " + (d / "missing").string()), "missing");
  expect_error(run("eval --bleu" + hyp), "--ref FILE is required");
  expect_error(run("eval --bleu --ref " + (d / "hyp").string()), "--hyp FILE is required");
  expect_error(run("eval" + hyp + " --ref " + (d / "hyp").string()), "--bleu");
  expect_error(run("eval --bleu --tokenize zh" + hyp + " --ref " + (d / "hyp").string()), "unknown tokenizer 'zh'");
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// translate --ref scores its own output as eval --bleu does (the same two lines, on stderr after the
// translations); references of another line count are one line and exit 2, before anything is written.
TEST(EvalCli, TranslateRefPrintsWhatEvalPrints) {
  const fs::path d = test::temp_dir("translate_ref");
  auto at = [&](const char* n) { return (d / n).string(); };
  ASSERT_EQ(run("make-task --task reverse --pairs 200 --seed 1 --out " + at("train.tsv")).code, 0);
  ASSERT_EQ(run("prepare --pairs " + at("train.tsv") + " --out " + at("data")).code, 0);
  const auto t = run("train --preset tiny --data " + at("data") + " --out " + at("run") + " --steps 60 --no-progress");
  ASSERT_EQ(t.code, 0) << t.err;
  write_text(d / "src", "a b c\nx y\nq r s t\n");
  write_text(d / "ref", "c b a\ny x\nt s r q\n");
  const std::string base = "translate --checkpoint " + at("run/checkpoint") + " --input " + at("src") +
                           " --beams 2 --max-len-b 12 --output " + at("out") + " --ref " + at("ref");
  const auto r = run(base);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto e = run("eval --bleu --hyp " + at("out") + " --ref " + at("ref"));
  ASSERT_EQ(e.code, 0) << e.err;
  const std::string want = e.out.substr(0, e.out.find("\n(tessera's"));
  EXPECT_NE(want.find("exact match = "), std::string::npos) << e.out;
  EXPECT_NE(r.err.find(want + "\n"), std::string::npos) << r.err << "\nwant:\n" << want;

  write_text(d / "short", "c b a\n");
  fs::remove(d / "out");
  const auto bad = run("translate --checkpoint " + at("run/checkpoint") + " --input " + at("src") + " --output " +
                       at("out") + " --ref " + at("short"));
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--ref " + at("short") + " has 1 lines but --input has 3"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(d / "out"));
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
