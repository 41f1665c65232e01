// tessera/tokenizer/bpe.h — byte-level BPE encoding and decoding, as GPT-2 defines it.
//
// encode: special tokens are cut out first (the longest one that starts at a position wins; they are never split
// or merged); the text between them is cut into pre-tokens by GPT-2's pattern (pretokenize.h); each pre-token
// starts as its bytes' ids and the adjacent pair of lowest merge rank is merged until no pair has a merge.
// decode is the concatenation of the tokens' bytes, so decode(encode(x)) == x for every byte string.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/tokenizer/bpe_model.h"

namespace tessera {

// Which special tokens encode() matches as themselves. A special token's text that is not allowed is an Error
// (as tiktoken's allowed_special / disallowed_special="all" makes it); encode_ordinary() reads it as plain text.
struct AllowedSpecial {
  bool all = false;
  std::vector<std::string> texts;  // the allowed ones, by text, where !all
};
inline AllowedSpecial allow_all_specials() {
  AllowedSpecial a;
  a.all = true;
  return a;
}

// What one thread needs to encode: the pre-token cache and the scratch of the merge loop. Not shared between
// threads; reused across calls, so a long run allocates only while the cache grows.
class BpeEncodeState {
 public:
  BpeEncodeState();
  ~BpeEncodeState();
  BpeEncodeState(const BpeEncodeState&) = delete;
  BpeEncodeState& operator=(const BpeEncodeState&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  Impl* impl_;
};

class BpeTokenizer {
 public:
  // Checks the model (every byte a token, merges of known tokens whose concatenation is a token, special ids in
  // range and distinct) and builds the lookup tables. Throws Error naming `source` and what is wrong.
  explicit BpeTokenizer(BpeModel model, const std::string& source = "tokenizer");
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  const BpeModel& model() const { return model_; }
  size_t vocab_size() const { return model_.tokens.size(); }
  // The id of the special token with this text, or -1.
  int32_t special_id(std::string_view text) const;

  // Appends the ids of `text` to `out`. Throws Error when the text holds a special token that `allowed` does not
  // allow.
  void encode(std::string_view text, const AllowedSpecial& allowed, std::vector<int32_t>& out,
              BpeEncodeState& state) const;
  std::vector<int32_t> encode(std::string_view text, const AllowedSpecial& allowed = {}) const;
  // Special tokens' texts are ordinary text here.
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out, BpeEncodeState& state) const;
  std::vector<int32_t> encode_ordinary(std::string_view text) const;

  // The bytes of the tokens, concatenated. Throws Error for an id outside [0, vocab_size).
  std::string decode(std::span<const int32_t> ids) const;
  void decode_append(int32_t id, std::string& out) const;

 private:
  struct Tables;
  // The ids of one pre-token (no special token inside it), appended to out.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, BpeEncodeState& state) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out, BpeEncodeState& state) const;

  BpeModel model_;
  Tables* tables_ = nullptr;
};

// Decodes ids one at a time and hands out only whole UTF-8 characters, for printing as tokens come: the bytes of a
// character cut between tokens wait for the rest. A byte that cannot be part of a valid character is handed out
// as it is once that is known, so the concatenation of everything push() and finish() return is decode(ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const BpeTokenizer& tok) : tok_(&tok) {}
  // The text that is complete after this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is held back (an incomplete character at the end), as it is.
  std::string finish();

 private:
  const BpeTokenizer* tok_;
  std::string pending_;
};

}  // namespace tessera
