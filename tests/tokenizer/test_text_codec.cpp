// TextCodec: a checkpoint's tokenizer.json, or bytes; prompts encoded with special tokens, and streamed output that
// hands out whole UTF-8 characters and concatenates to the whole decode.
#include <gtest/gtest.h>

#include <random>

#include "tessera/tokenizer/formats.h"
#include "tessera/tokenizer/text_codec.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::temp_dir;

// Bytes plus merges that cut "é" (c3 a9) and "日" (e6 97 a5) across tokens: " \xc3" and "\xa9x" are tokens.
BpeModel split_char_model() {
  BpeModel m;
  for (int b = 0; b < 256; ++b) m.tokens.emplace_back(1, static_cast<char>(b));
  m.tokens.push_back(" \xc3");
  m.merges.emplace_back(' ', 0xc3);
  m.tokens.push_back("\xa9x");
  m.merges.emplace_back(0xa9, 'x');
  m.tokens.push_back("\xe6\x97");
  m.merges.emplace_back(0xe6, 0x97);
  m.special_ids = {static_cast<int32_t>(m.tokens.size())};
  m.tokens.push_back("<|endoftext|>");
  return m;
}

std::string streamed(const TextCodec& c, const std::vector<int32_t>& ids, std::vector<std::string>* parts = nullptr) {
  TextCodec::Stream s = c.stream();
  std::string out;
  for (int32_t id : ids) {
    const std::string p = s.push(id);
    if (parts) parts->push_back(p);
    out += p;
  }
  const std::string rest = s.flush();
  if (parts) parts->push_back(rest);
  return out + rest;
}

TEST(TextCodec, CheckpointWithoutTokenizerIsBytes) {
  const fs::path d = temp_dir("codec_bytes");
  const TextCodec c = TextCodec::for_checkpoint(d.string(), 300);
  EXPECT_TRUE(c.byte_level());
  EXPECT_EQ(c.encode("h\xc3\xa9<|endoftext|>"),
            (std::vector<int32_t>{'h', 0xc3, 0xa9, '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>'}));
  EXPECT_EQ(c.decode(std::vector<int32_t>{'a', 299, 'b'}), "a<id 299>b");
  std::vector<std::string> parts;
  EXPECT_EQ(streamed(c, {'a', 0xc3, 0xa9, 0xe6, 299, 'z'}, &parts), "a\xc3\xa9\xe6<id 299>z");
  EXPECT_EQ(parts, (std::vector<std::string>{"a", "", "\xc3\xa9", "", "\xe6<id 299>", "z", ""}));
  // A model narrower than the bytes: a prompt byte past its vocab is refused, as generate's byte-level prompt was.
  EXPECT_NE(error_of([&] { TextCodec::bytes(50).encode("a"); })
                .find("the prompt holds byte 97, outside the model's "
                      "vocab 50"),
            std::string::npos);
}

TEST(TextCodec, CheckpointTokenizerEncodesAndStreamsWholeCharacters) {
  const fs::path d = temp_dir("codec_bpe");
  write_hf_tokenizer_json(split_char_model(), (d / "tokenizer.json").string());
  const TextCodec c = TextCodec::for_checkpoint(d.string(), 262);
  EXPECT_FALSE(c.byte_level());
  EXPECT_EQ(c.source(), (d / "tokenizer.json").string());
  // Specials are allowed in a prompt: "<|endoftext|>" is its id, not 13 bytes.
  const std::vector<int32_t> ids = c.encode("a \xc3\xa9x<|endoftext|>\xe6\x97\xa5");
  EXPECT_EQ(ids, (std::vector<int32_t>{'a', 256, 257, 259, 258, 0xa5}));
  EXPECT_EQ(c.decode(ids), "a \xc3\xa9x<|endoftext|>\xe6\x97\xa5");
  std::vector<std::string> parts;
  EXPECT_EQ(streamed(c, ids, &parts), c.decode(ids));
  // " \xc3" holds back its lead byte until "\xa9x" completes "é"; "日" waits for its third byte.
  EXPECT_EQ(parts, (std::vector<std::string>{"a", " ", "\xc3\xa9x", "<|endoftext|>", "", "\xe6\x97\xa5", ""}));
  // An id past the tokenizer's vocab but inside the model's (a padded vocab) is no token.
  EXPECT_EQ(streamed(c, {256, 261}), " \xc3<id 261>");
  // A tokenizer wider than the model cannot be its tokenizer.
  EXPECT_NE(error_of([&] {
              TextCodec::for_checkpoint(d.string(), 256);
            }).find("the tokenizer has 260 tokens, more than the model's vocab of 256"),
            std::string::npos);
}

// Whatever ids come, what the stream hands out concatenates to decode(ids), and each part but the last is whole
// UTF-8 wherever the ids' bytes were.
TEST(TextCodec, StreamConcatenatesToDecodeOnRandomIds) {
  const fs::path d = temp_dir("codec_random");
  write_hf_tokenizer_json(split_char_model(), (d / "tokenizer.json").string());
  const TextCodec bpe = TextCodec::for_checkpoint(d.string(), 270);
  const TextCodec bytes = TextCodec::bytes(270);
  std::mt19937 rng(7);
  for (const TextCodec* c : {&bpe, &bytes}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int32_t> ids(rng() % 12);
      for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 270);
      EXPECT_EQ(streamed(*c, ids), c->decode(ids));
    }
  }
}

}  // namespace
}  // namespace tessera
