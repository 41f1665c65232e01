// tessera tokenizer encode | decode | info | convert and bench tokenizer --no-peer, through the binary: the same ids
// as the library, byte-exact round trips through files and stdin, and bad input as one line with exit code 2.
#include "cli/cli_run.h"
#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/formats.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::run;

BpeModel cli_model() {
  BpeModel m;
  for (int b = 0; b < 256; ++b) m.tokens.emplace_back(1, static_cast<char>(b));
  m.tokens.push_back(" t");
  m.merges.emplace_back(' ', 't');
  m.tokens.push_back("he");
  m.merges.emplace_back('h', 'e');
  m.tokens.push_back(" the");
  m.merges.emplace_back(256, 257);
  m.special_ids = {static_cast<int32_t>(m.tokens.size())};
  m.tokens.push_back("<|endoftext|>");
  return m;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s + "\n";
}

void expect_error(const test::CliRun& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(TokenizerCli, EncodeDecodeInfoConvert) {
  const fs::path d = test::temp_dir("tok_cli");
  const std::string tj = (d / "tokenizer.json").string();
  write_hf_tokenizer_json(cli_model(), tj);
  const BpeTokenizer tok(cli_model());
  const std::string text = "in the then<|endoftext|> the\n";
  write_file_atomic((d / "t.txt").string(), text);
  auto r = run("tokenizer encode --tokenizer " + tj + " --text " + (d / "t.txt").string() + " --allow-special all");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, join_ids(tok.encode(text, allow_all_specials())));
  r = run("tokenizer encode --tokenizer " + tj + " --text " + (d / "t.txt").string() + " --ordinary");
  EXPECT_EQ(r.out, join_ids(tok.encode_ordinary(text)));
  expect_error(run("tokenizer encode --tokenizer " + tj + " --text " + (d / "t.txt").string()),
               "special token '<|endoftext|>' at byte 11, which is not allowed");

  // Any bytes, through files and through stdin and stdout.
  std::mt19937_64 rng(test::test_seed());
  std::string bytes(5000, '\0');
  for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
  write_file_atomic((d / "r.bin").string(), bytes);
  r = run("tokenizer encode --tokenizer " + tj + " --ordinary --text " + (d / "r.bin").string() + " --out " +
          (d / "ids.txt").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string cmd = test::binary() + " tokenizer decode --tokenizer " + tj + " < " + (d / "ids.txt").string() +
                          " > " + (d / "back.bin").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(read_file_text((d / "back.bin").string()), bytes);
  write_file_atomic((d / "ids2.txt").string(), "[256, 258,\n 259]");
  r = run("tokenizer decode --tokenizer " + tj + " --ids " + (d / "ids2.txt").string());
  EXPECT_EQ(r.out, " t the<|endoftext|>");

  r = run("tokenizer info --tokenizer " + tj);
  EXPECT_NE(r.out.find("format      huggingface"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vocab size  260"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("259       <|endoftext|>"), std::string::npos) << r.out;
  r = run("tokenizer convert --tokenizer " + tj + " --to gpt2 --out " + (d / "g").string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("tokenizer encode --tokenizer " + (d / "g").string() + " --text " + (d / "t.txt").string() +
          " --allow-special '<|endoftext|>'");
  EXPECT_EQ(r.out, join_ids(tok.encode(text, allow_all_specials())));
  r = run("tokenizer convert --tokenizer " + tj + " --to tiktoken --out " + (d / "m.tiktoken").string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("tokenizer info --tokenizer " + (d / "m.tiktoken").string() + " --tiktoken-special '<|endoftext|>'");
  EXPECT_NE(r.out.find("259       <|endoftext|>"), std::string::npos) << r.out;

  expect_error(run("tokenizer decode --tokenizer " + tj + " --ids " + (d / "t.txt").string()), "is not a token id");
  write_file_atomic((d / "big.txt").string(), "1 2 260");
  expect_error(run("tokenizer decode --tokenizer " + tj + " --ids " + (d / "big.txt").string()),
               "token id 260 (item 2) is outside the vocab of 260");
  expect_error(run("tokenizer info"), "--tokenizer PATH is required");
  expect_error(run("tokenizer info --tokenizer " + (d / "t.txt").string()), "cannot tell its format");
  expect_error(run("tokenizer info --tokenizer " + tj + " --tiktoken-special x"), "is for a .tiktoken file");
  expect_error(run("tokenizer encod"), "did you mean encode?");
  expect_error(run("tokenizer encode --tokenizer " + tj + " --allow-special '<|x|>'"), "is not a special token");
  fs::remove_all(d);
}

TEST(TokenizerCli, BenchWithoutPeers) {
  const fs::path d = test::temp_dir("tok_bench");
  const std::string tj = (d / "tokenizer.json").string();
  write_hf_tokenizer_json(cli_model(), tj);
  const auto r = run("bench tokenizer --no-peer --tokenizer " + tj +
                     " --mb 0.2 --doc-kb 4 --threads 2 --repeat 1 --out " + (d / "b.md").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| tessera | 1 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| tessera | 2 |"), std::string::npos) << r.out;
  EXPECT_NE(read_file_text((d / "b.md").string()).find("of linear"), std::string::npos);
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
