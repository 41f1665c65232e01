// tessera/tokenizer/bpe_train.h — byte-level BPE training by the rules of Stanford CS336's assignment 1.
//
// Two stages:
// 1. Counting (bpe_train_count.cpp). The text is cut at the special tokens, each piece is cut into GPT-2 pre-tokens
//    (pretokenize.h), and each distinct pre-token is counted once. The text is streamed in blocks and the pieces of
//    a block are counted by several threads, each into its own table; memory is bounded by the distinct pre-tokens
//    (times the threads) plus two blocks, never by the corpus.
// 2. Merging (bpe_train.cpp). Each distinct pre-token is a word of byte symbols with its count. The pair counts
//    (count of (x, y) = Σ over words of word count × occurrences of x y in it) are computed once; each merge then
//    updates only the pairs of the words that hold the merged pair (an index pair -> words), and the best pair is
//    taken from a max-heap whose stale entries are skipped when popped (lazy deletion).
//
// The rules:
// - merges never cross a pre-token boundary or a special token (the specials are cut out before pre-tokenizing);
// - the pair with the highest count merges first; a tie goes to the greater (bytes(left), bytes(right)) tuple,
//   compared as Python compares bytes (unsigned, a prefix first), as CS336's reference does;
// - within a word, occurrences merge left to right without overlap ("a a a" -> "aa a");
// - a merge whose bytes are already an ordinary token (a+bc after ab+c) reuses that token's id and adds no token,
//   as Hugging Face's trainer does: every ordinary token's bytes are then distinct, which the vocab.json and
//   tokenizer.json maps need. Training stops when the vocabulary holds vocab_size tokens (256 bytes + the specials
//   + the merged tokens), or earlier when no pair is left; merges.size() exceeds the merged tokens only by such
//   reuses.
// - the special tokens take ids 256.. after the bytes (or 0.. before them with special_first), then the merged
//   tokens follow in merge order; a special token never takes part in a merge, even where its bytes equal an
//   ordinary token's.
// The result depends only on the multiset of pre-tokens: not on the thread count, the block size, the order of the
// files' pieces or any hash table's order (the counts are summed, then sorted by bytes).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/tokenizer/bpe_model.h"

namespace tessera {

// A distinct pre-token and how often it occurs.
struct WordCount {
  std::string bytes;
  int64_t count = 0;
};

struct BpeTrainProgress {
  enum class Stage { Counting, Merging };
  Stage stage = Stage::Counting;
  // Counting: bytes of text read and the sum of the files' sizes (0 when unknown: a pipe). Merging: tokens made
  // so far and the tokens to make (vocab_size - 256 - specials).
  uint64_t done = 0, total = 0;
};

struct BpeTrainParams {
  int vocab_size = 0;  // >= 256 + special_tokens.size()
  std::vector<std::string> special_tokens;
  bool special_first = false;
  int threads = 0;                        // counting threads; 0: std::thread::hardware_concurrency()
  size_t block_bytes = size_t{32} << 20;  // bytes read per block (a block grows past it only while it has no cut)
  // Called from the calling thread, at most every ~1/1000 of a stage and at its end.
  std::function<void(const BpeTrainProgress&)> progress;
};

// Throws Error naming the parameter for an impossible vocab_size, an empty or repeated special token, threads < 0,
// block_bytes 0.
void bpe_train_check_params(const BpeTrainParams& params);

// Stage 1 over files: every file is a text of its own (no pre-token spans two files). Counts sorted by bytes.
// Throws Error "cannot read <path>: <reason>" for a file that cannot be read.
std::vector<WordCount> bpe_count_files(const std::vector<std::string>& paths, const BpeTrainParams& params);
// Stage 1 over one text in memory, by the same blocks and threads as the files (the tests cut it into tiny blocks).
std::vector<WordCount> bpe_count_text(std::string_view text, const BpeTrainParams& params);

// Stage 2: the merges over given pre-token counts (any order; a pre-token given twice counts twice; counts > 0).
// special_tokens only take their ids: the words must not hold them.
BpeModel bpe_train_counts(std::vector<WordCount> words, const BpeTrainParams& params);

// Both stages.
BpeModel bpe_train_files(const std::vector<std::string>& paths, const BpeTrainParams& params);
BpeModel bpe_train_text(std::string_view text, const BpeTrainParams& params);

}  // namespace tessera
