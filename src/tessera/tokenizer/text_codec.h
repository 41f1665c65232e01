// tessera/tokenizer/text_codec.h — text in and out of a model: its checkpoint's tokenizer, or bytes where it has none.
//
// generate encodes the prompt and prints the ids it draws through one TextCodec:
//   - a checkpoint with tokenizer.json (train writes it where its data named a tokenizer) encodes and decodes
//     through that BPE tokenizer;
//   - one without is byte-level: a byte is its id, and an id above 255 (a model with a wider vocab) is no byte and
//     reads "<id N>", visibly, never masked to a byte that reads as text.
// Either way an id the tokenizer has no token for (a model vocab padded past the tokenizer's) reads "<id N>".
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/tokenizer/bpe.h"

namespace tessera {

class TextCodec {
 public:
  // The codec of the checkpoint in `dir` for a model of `vocab` tokens: its tokenizer.json, or bytes when it has
  // none. A tokenizer.json that does not load, or whose vocab is wider than the model's, is an Error naming it.
  static TextCodec for_checkpoint(const std::string& dir, int vocab);
  static TextCodec bytes(int vocab);
  TextCodec(BpeTokenizer tok, int vocab, std::string source);

  bool byte_level() const { return byte_level_; }
  int vocab() const { return vocab_; }
  // Where the tokenizer came from ("runs/x/checkpoint/tokenizer.json"), or "bytes".
  const std::string& source() const { return source_; }

  // The ids of a prompt. Special tokens' texts ("<|endoftext|>") are those tokens: a prompt that starts a new
  // document writes it, as a training corpus had it. Byte-level: one id a byte. An id at or past the model's vocab
  // is an Error.
  std::vector<int32_t> encode(std::string_view text) const;
  // The text of ids, whole (decode(encode(x)) == x).
  std::string decode(std::span<const int32_t> ids) const;

  // Decodes ids as they are drawn, handing out only whole UTF-8 characters: the bytes of a character cut between
  // tokens wait for the rest. A byte that can begin no valid character is handed out as it is once that is known,
  // so that everything push() and flush() return, concatenated, is decode(ids).
  class Stream {
   public:
    explicit Stream(const TextCodec& codec) : codec_(&codec), dec_(*codec.tok_) {}
    std::string push(int32_t id);
    // What is held back (an incomplete character at the end), as it is.
    std::string flush() { return dec_.finish(); }

   private:
    const TextCodec* codec_;
    StreamDecoder dec_;
  };
  Stream stream() const { return Stream(*this); }

 private:
  // Whether the tokenizer has a token for id.
  bool known(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < tok_->vocab_size(); }

  std::shared_ptr<const BpeTokenizer> tok_;  // byte-level: the 256 bytes, no merges
  int vocab_;
  bool byte_level_;
  std::string source_;
};

}  // namespace tessera
