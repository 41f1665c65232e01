// tessera/tokenizer/formats.h — the tokenizer files the ecosystem uses, read into a BpeModel and written from one.
//
// - Hugging Face tokenizer.json: a BPE model with a ByteLevel pre-tokenizer and decoder; merges as "a b" strings
//   or ["a", "b"] pairs; added tokens become special tokens (matched before pre-tokenization, never split).
// - GPT-2's vocab.json + merges.txt (the same files are named encoder.json + vocab.bpe). A token of vocab.json that
//   is neither a single byte nor made by a merge (GPT-2's <|endoftext|>) is a special token.
// - tiktoken's .tiktoken: one "<base64 bytes> <rank>" a line, the rank being the id. The merges are those the
//   ranks imply: each token of two or more bytes is what byte-pair merging of its bytes by lower ranks ends in two
//   parts of, and the merge of those two parts has the token's place. Special tokens are not in the file: they are
//   given by the caller and take the ids after the ranks.
// In tokenizer.json and GPT-2's files a token's bytes are written as text through GPT-2's bytes_to_unicode: each
// byte is one printable code point.
//
// Every reader checks what it reads; anything malformed is an Error of one line that names the file and what is
// wrong. Every writer writes atomically.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/tokenizer/bpe_model.h"

namespace tessera {

// GPT-2's bytes_to_unicode: byte b -> the code point that stands for it (printable bytes stand for themselves,
// the other 68 for U+0100..U+0143 in byte order).
const std::array<uint32_t, 256>& gpt2_byte_to_code_point();
// The text that stands for `bytes` (UTF-8).
std::string gpt2_bytes_to_unicode(std::string_view bytes);
// The bytes that `text` stands for; false (out untouched) where `text` is not UTF-8 of mapped code points only.
bool gpt2_unicode_to_bytes(std::string_view text, std::string* out);

enum class TokenizerFormat { HuggingFace, Gpt2, Tiktoken };
const char* tokenizer_format_name(TokenizerFormat f);  // "huggingface", "gpt2", "tiktoken"

BpeModel read_hf_tokenizer_json(const std::string& path);
BpeModel read_gpt2_vocab_merges(const std::string& vocab_path, const std::string& merges_path);
// specials: the special tokens' texts, given the ids after the file's ranks in this order.
BpeModel read_tiktoken(const std::string& path, const std::vector<std::string>& specials = {});

void write_hf_tokenizer_json(const BpeModel& model, const std::string& path);
void write_gpt2_vocab_merges(const BpeModel& model, const std::string& vocab_path, const std::string& merges_path);
// The special tokens must have the ids after all ordinary tokens (a .tiktoken file holds ranks 0..K-1 only).
void write_tiktoken(const BpeModel& model, const std::string& path);

struct LoadedTokenizer {
  BpeModel model;
  TokenizerFormat format;
  std::string path;  // what was read: the file, or the two files joined by " + "
};
// Reads a tokenizer from a file or a directory, by its name:
//   a directory: its tokenizer.json, else vocab.json + merges.txt, else encoder.json + vocab.bpe, else its one
//   .tiktoken file;
//   a file: *.tiktoken; vocab.json / encoder.json (merges.txt / vocab.bpe beside it) or merges.txt / vocab.bpe
//   (the vocab beside it); any other .json as tokenizer.json.
// tiktoken_specials is used for a .tiktoken file only. The model is checked as BpeTokenizer checks it, the
// message naming the path.
LoadedTokenizer load_tokenizer(const std::string& path, const std::vector<std::string>& tiktoken_specials = {});

}  // namespace tessera
