// tessera/tokenizer/bpe_model.h — a byte-level BPE vocabulary: what a trainer makes, the file formats hold and the
// encoder runs. Shared by the trainer (bpe_train.h), the encoder (bpe.h) and the readers and writers (formats).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct BpeModel {
  // id -> the token's bytes; ids are dense, 0 .. tokens.size() - 1. Each of the 256 single bytes is a token (the
  // base vocabulary, anywhere in the id range), and each special token is one too.
  std::vector<std::string> tokens;
  // The merges in rank order: merges[r] = (left id, right id); tokens[left] + tokens[right] is a token of `tokens`.
  // A merge of lower rank applies first.
  std::vector<std::pair<int32_t, int32_t>> merges;
  // The ids of the special tokens (their text is tokens[id]); they are never split, merged or pre-tokenized.
  std::vector<int32_t> special_ids;
};

}  // namespace tessera
