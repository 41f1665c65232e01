#include "tessera/tokenizer/text_codec.h"

#include <filesystem>
#include <utility>

#include "tessera/core/error.h"
#include "tessera/tokenizer/formats.h"

namespace tessera {

namespace {
// The byte-level tokenizer as BPE: the 256 bytes, in byte order, and no merges, so a byte's id is the byte.
BpeTokenizer byte_tokenizer() {
  BpeModel m;
  for (int b = 0; b < 256; ++b) m.tokens.emplace_back(1, static_cast<char>(b));
  return BpeTokenizer(std::move(m), "bytes");
}

std::string id_marker(int32_t id) { return "<id " + std::to_string(id) + ">"; }
}  // namespace

TextCodec::TextCodec(BpeTokenizer tok, int vocab, std::string source)
    : tok_(std::make_shared<const BpeTokenizer>(std::move(tok))), vocab_(vocab), byte_level_(false),
      source_(std::move(source)) {
  TS_CHECK(vocab > 0, "text codec: a model vocab of ", vocab);
  TS_CHECK(tok_->vocab_size() <= static_cast<size_t>(vocab), source_, ": the tokenizer has ", tok_->vocab_size(),
           " tokens, more than the model's vocab of ", vocab, " (the model was not trained on its ids)");
}

TextCodec TextCodec::bytes(int vocab) {
  TS_CHECK(vocab > 0, "text codec: a model vocab of ", vocab);
  TextCodec c(byte_tokenizer(), 256, "bytes");
  c.vocab_ = vocab;  // narrower than the bytes is allowed: such a prompt's bytes are refused one by one
  c.byte_level_ = true;
  return c;
}

TextCodec TextCodec::for_checkpoint(const std::string& dir, int vocab) {
  const std::filesystem::path file = std::filesystem::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return bytes(vocab);
  return TextCodec(BpeTokenizer(read_hf_tokenizer_json(file.string()), file.string()), vocab, file.string());
}

std::vector<int32_t> TextCodec::encode(std::string_view text) const {
  std::vector<int32_t> ids = tok_->encode(text, allow_all_specials());
  for (const int32_t id : ids) {
    if (id < vocab_) continue;
    if (byte_level_) TS_THROW("the prompt holds byte ", id, ", outside the model's vocab ", vocab_);
    TS_THROW("the prompt holds token ", id, ", outside the model's vocab ", vocab_);
  }
  return ids;
}

std::string TextCodec::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (known(id)) tok_->decode_append(id, out);
    else out += id_marker(id);
  }
  return out;
}

std::string TextCodec::Stream::push(int32_t id) {
  if (codec_->known(id)) return dec_.push(id);
  return dec_.finish() + id_marker(id);
}

}  // namespace tessera
