// Tokenizer files (tokenizer/formats.h): bytes_to_unicode, round trips through each format, and a malformed file of
// each kind giving one line that names the file and what is wrong.
#include <fstream>

#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/formats.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::error_of;

// 256 bytes, merges "a b" -> "ab", "ab c" -> "abc", "  " (two spaces), and specials after them.
BpeModel small_model(const std::vector<std::string>& specials = {"<|endoftext|>"}) {
  BpeModel m;
  for (int b = 0; b < 256; ++b) m.tokens.emplace_back(1, static_cast<char>(b));
  m.tokens.push_back("ab");
  m.merges.emplace_back('a', 'b');
  m.tokens.push_back("abc");
  m.merges.emplace_back(256, 'c');
  m.tokens.push_back("  ");
  m.merges.emplace_back(' ', ' ');
  for (const auto& s : specials) {
    m.special_ids.push_back(static_cast<int32_t>(m.tokens.size()));
    m.tokens.push_back(s);
  }
  return m;
}

void expect_same(const BpeModel& a, const BpeModel& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.special_ids, b.special_ids);
}

// One line, naming the file and holding `what`.
void expect_one_line(const std::string& msg, const std::string& path, const std::string& what) {
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(TokenizerFormats, BytesToUnicodeIsGpt2s) {
  const auto& m = gpt2_byte_to_code_point();
  EXPECT_EQ(m['!'], uint32_t('!'));
  EXPECT_EQ(m[' '], 0x120u);   // Ġ
  EXPECT_EQ(m['\n'], 0x10Au);  // Ċ
  EXPECT_EQ(m[0], 0x100u);
  EXPECT_EQ(m[0xAD], 0x143u);  // the soft hyphen, the last of the 68 unprintable bytes
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::string back;
  ASSERT_TRUE(gpt2_unicode_to_bytes(gpt2_bytes_to_unicode(all), &back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(gpt2_unicode_to_bytes("\xC5\x84", &back));  // U+0144: past the mapping
  EXPECT_FALSE(gpt2_unicode_to_bytes(" ", &back));         // a space stands for no byte
}

TEST(TokenizerFormats, RoundTripEachFormat) {
  const fs::path d = test::temp_dir("tok_formats");
  const BpeModel m = small_model({"<|endoftext|>", "<|pad|>"});
  write_hf_tokenizer_json(m, (d / "tokenizer.json").string());
  expect_same(read_hf_tokenizer_json((d / "tokenizer.json").string()), m);
  fs::create_directories(d / "g");
  write_gpt2_vocab_merges(m, (d / "g" / "vocab.json").string(), (d / "g" / "merges.txt").string());
  const LoadedTokenizer g = load_tokenizer((d / "g").string());
  EXPECT_EQ(g.format, TokenizerFormat::Gpt2);
  expect_same(g.model, m);
  write_tiktoken(m, (d / "m.tiktoken").string());
  const LoadedTokenizer t = load_tokenizer((d / "m.tiktoken").string(), {"<|endoftext|>", "<|pad|>"});
  EXPECT_EQ(t.format, TokenizerFormat::Tiktoken);
  expect_same(t.model, m);
  // A directory: tokenizer.json first.
  EXPECT_EQ(load_tokenizer(d.string()).format, TokenizerFormat::HuggingFace);
  // Merges as ["a", "b"] pairs read as "a b" strings do.
  auto j = nlohmann::json::parse(read_file_text((d / "tokenizer.json").string()));
  for (auto& e : j["model"]["merges"]) {
    const std::string s = e.get<std::string>();
    e = nlohmann::json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  write_file_atomic((d / "pairs.json").string(), j.dump());
  expect_same(read_hf_tokenizer_json((d / "pairs.json").string()), m);
  // Specials among the ordinary ids cannot be a .tiktoken file.
  BpeModel first = small_model({});
  first.tokens.insert(first.tokens.begin(), "<|s|>");
  for (auto& [l, r] : first.merges) ++l, ++r;
  first.special_ids = {0};
  EXPECT_NE(error_of([&] { write_tiktoken(first, (d / "x.tiktoken").string()); }).find("among the ordinary tokens"),
            std::string::npos);
  fs::remove_all(d);
}

// A tokenizer.json with `vocab` and `merges` (as JSON) in an otherwise good file.
std::string hf_json(const nlohmann::json& vocab, const nlohmann::json& merges, const std::string& model_type = "BPE") {
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", nlohmann::json::array()},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                      {"decoder", {{"type", "ByteLevel"}}}};
  j["model"] = {{"type", model_type}, {"vocab", vocab}, {"merges", merges}};
  return j.dump();
}

nlohmann::json byte_vocab() {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) v[gpt2_bytes_to_unicode(std::string(1, static_cast<char>(b)))] = b;
  return v;
}

TEST(TokenizerFormats, MalformedFilesSayWhatIsWrong) {
  const fs::path d = test::temp_dir("tok_bad");
  const auto write = [&](const std::string& name, const std::string& text) {
    const std::string p = (d / name).string();
    write_file_atomic(p, text);
    return p;
  };
  nlohmann::json v = byte_vocab();
  v["ab"] = 256;
  std::string p = write("unknown_merge.json", hf_json(v, {"a b", "ab zz"}));
  expect_one_line(error_of([&] { read_hf_tokenizer_json(p); }), p, "merges 'zz', which is not in the vocab");
  v = byte_vocab();
  v["ab"] = 255;
  p = write("dup.json", hf_json(v, {"a b"}));
  expect_one_line(error_of([&] { read_hf_tokenizer_json(p); }), p, "a duplicate id");
  v = byte_vocab();
  v["ab"] = 257;
  p = write("gap.json", hf_json(v, {"a b"}));
  expect_one_line(error_of([&] { read_hf_tokenizer_json(p); }), p, "a gap in the ids: no token has id 256");
  v = byte_vocab();
  v.erase(gpt2_bytes_to_unicode("\x07"));
  v["ab"] = 7;
  p = write("nobyte.json", hf_json(v, {"a b"}));
  expect_one_line(error_of([&] { read_hf_tokenizer_json(p); }), p, "byte 0x07 is missing from the base vocab");
  p = write("wordpiece.json", hf_json(byte_vocab(), nlohmann::json::array(), "WordPiece"));
  expect_one_line(error_of([&] { read_hf_tokenizer_json(p); }), p, "the model is WordPiece, not BPE");
  p = write("notjson.json", "#version: 0.2\na b\n");
  expect_one_line(error_of([&] { read_hf_tokenizer_json(p); }), p, "not JSON");
  p = write("nomodel.json", "{\"a\": 1}");
  expect_one_line(error_of([&] { read_hf_tokenizer_json(p); }), p, "not a Hugging Face tokenizer.json");
  auto j = nlohmann::json::parse(hf_json(byte_vocab(), nlohmann::json::array()));
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  p = write("whitespace.json", j.dump());
  expect_one_line(error_of([&] { read_hf_tokenizer_json(p); }), p, "Whitespace, not ByteLevel");

  // GPT-2's pair of files.
  v = byte_vocab();
  v["ab"] = 256;
  const std::string vp = write("vocab.json", v.dump());
  p = write("merges.txt", "#version: 0.2\na b c\n");
  expect_one_line(error_of([&] { read_gpt2_vocab_merges(vp, p); }), p, "line 2 is 'a b c', not two tokens");
  p = write("merges.txt", "#version: 0.2\na q\n");
  expect_one_line(error_of([&] { read_gpt2_vocab_merges(vp, p); }), vp,
                  "merge 0 makes 'aq', which is not in the vocab");
  p = write("bad_vocab.json", "[1, 2]");
  expect_one_line(error_of([&] { read_gpt2_vocab_merges(p, (d / "merges.txt").string()); }), p,
                  "not an object of token -> id");

  // .tiktoken files.
  write_tiktoken(small_model({}), (d / "good.tiktoken").string());
  const std::string good = read_file_text((d / "good.tiktoken").string());
  p = write("json.tiktoken", "{\"model\": {}}\n");
  expect_one_line(error_of([&] { read_tiktoken(p); }), p, "line 1 is '{\"model\": {}}', not '<base64 bytes> <rank>'");
  p = write("dup.tiktoken", good + "YWI= 5\n");
  expect_one_line(error_of([&] { read_tiktoken(p); }), p, "a duplicate id: rank 5");
  p = write("gap.tiktoken", good + "eHl6 300\n");
  expect_one_line(error_of([&] { read_tiktoken(p); }), p, "a gap in the ids: no token has rank 259");
  p = write("nobyte.tiktoken", "eHl6 0\n" + good.substr(good.find('\n') + 1));  // "xyz" in byte 0's place
  expect_one_line(error_of([&] { read_tiktoken(p); }), p, "byte 0x00 is missing from the base vocab");
  p = write("unmade.tiktoken", good + "eHl6 259\n");  // "xyz", which no two tokens of lower rank make
  expect_one_line(error_of([&] { read_tiktoken(p); }), p, "token 259");

  // Names.
  expect_one_line(error_of([&] { load_tokenizer((d / "none").string()); }), (d / "none").string(), "does not exist");
  fs::create_directories(d / "empty");
  expect_one_line(error_of([&] { load_tokenizer((d / "empty").string()); }), (d / "empty").string(),
                  "holds no tokenizer");
  p = write("tok.bin", "x");
  expect_one_line(error_of([&] { load_tokenizer(p); }), p, "cannot tell its format");
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
