// tessera/train/pair_data.h — paired shards: the source and target token streams of a translation set, for the
// encoder-decoder. `tessera prepare --source/--target` or `--pairs` writes them; train reads them through PairShard.
//
// A paired shard (`<split>_000000.pairs`, little-endian; docs/formats.md):
//   header: 256 int32: magic 20240521, version 1, the bytes of a token (2: uint16, for a vocab of at most 65536;
//           else 4: uint32), the pair count N, the source token count S, the target token count T, the vocab of
//           the tokenizer the ids are of (256 for bytes), then zeros;
//   uint32 source_offsets[N + 1]: pair i's source is tokens [source_offsets[i], source_offsets[i + 1]) of the
//           source stream (source_offsets[0] = 0, source_offsets[N] = S, each pair at least one token);
//   uint32 target_offsets[N + 1]: the same for the target stream;
//   S source tokens, then zero bytes to a multiple of 4; T target tokens, then zero bytes to a multiple of 4.
// The offsets and both streams are 4-byte aligned in the mapping. Only the text's own tokens are stored: the BOS,
// EOS, pad and decoder-start ids are the model's, and the batcher (pair_batch.h) adds them.
// The `.pairs` suffix keeps them out of find_shards' `.bin` shards, so that train never reads them as a token stream.
#pragma once
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/mmap_file.h"

namespace tessera {

constexpr int32_t kPairShardMagic = 20240521;
constexpr int32_t kPairShardVersion = 1;
// The file names of the two splits in a paired shard directory.
constexpr const char* kPairShardNames[2] = {"train_000000.pairs", "val_000000.pairs"};

// Token ids of pairs, in order, as the shard lays them out: pair i is source[source_offsets[i] ..
// source_offsets[i + 1]) and target[target_offsets[i] .. target_offsets[i + 1]).
struct PairTokens {
  std::vector<int32_t> source = {}, target = {};
  std::vector<uint32_t> source_offsets{0}, target_offsets{0};
  size_t size() const { return source_offsets.size() - 1; }
  void add(std::span<const int32_t> src, std::span<const int32_t> tgt);
};

// Writes one paired shard atomically (every id must be in [0, vocab); every pair non-empty on both sides).
void write_pair_shard(const std::string& path, const PairTokens& pairs, int64_t vocab);
// Writes the shard's bytes to an open file, from its start (`shown` names it in errors); the caller syncs it.
void write_pair_shard_to(std::FILE* f, const std::string& shown, const PairTokens& pairs, int64_t vocab);

// A paired shard, memory-mapped and checked when it opens: the header, the size the counts give, the offsets (from
// 0, rising, each pair at least one token a side, ending at the counts) and every token id (below the header's
// vocab, and below `vocab` when > 0). Each problem is one line naming the file.
class PairShard {
 public:
  explicit PairShard(const std::string& path, int64_t vocab = 0);
  size_t size() const { return n_; }
  int64_t vocab() const { return vocab_; }
  int token_bytes() const { return width_; }
  uint32_t source_len(size_t i) const { return src_off_[i + 1] - src_off_[i]; }
  uint32_t target_len(size_t i) const { return tgt_off_[i + 1] - tgt_off_[i]; }
  // Copies pair i's source (source_len(i) ids) or target to `out`.
  void copy_source(size_t i, int32_t* out) const { copy(src_, src_off_[i], source_len(i), out); }
  void copy_target(size_t i, int32_t* out) const { copy(tgt_, tgt_off_[i], target_len(i), out); }
  std::vector<int32_t> source(size_t i) const;
  std::vector<int32_t> target(size_t i) const;
  const std::string& path() const { return path_; }

 private:
  void copy(const unsigned char* stream, uint32_t from, uint32_t n, int32_t* out) const;

  MappedFile file_;
  std::string path_;
  size_t n_ = 0;
  int width_ = 2;
  int64_t vocab_ = 0;
  const uint32_t* src_off_ = nullptr;
  const uint32_t* tgt_off_ = nullptr;
  const unsigned char* src_ = nullptr;
  const unsigned char* tgt_ = nullptr;
};

// The split's shard in a paired shard directory (`dir`/train_000000.pairs or val_000000.pairs); one that is missing
// is an Error that says how to make one.
PairShard open_pair_split(const std::string& dir, const std::string& split, int64_t vocab = 0);

// The lines of a parallel text: source[i] and target[i] are line i + 1 of source_name and target_name (one file, a
// TSV, for both with read_pairs_tsv).
struct PairLines {
  std::vector<std::string> source = {}, target = {};
  std::string source_name = {}, target_name = {};
};
// Reads a source and a target file, one sentence a line. A line ends at "\n" (a "\r" before it is dropped); a last
// line without one counts. One-line Errors, before anything is written: a missing or unreadable file, one that is
// not UTF-8 text, an empty file, an empty line (naming the file and the line), and files of different line counts
// (naming both counts).
PairLines read_parallel_files(const std::string& source_path, const std::string& target_path);
// Reads a TSV file of source<TAB>target lines. The same errors, and a line with no tab or more than one, or with an
// empty side, naming the line.
PairLines read_pairs_tsv(const std::string& path);

// `tessera prepare --source/--target/--pairs`: encodes the lines and writes <out_dir>/train_000000.pairs and
// val_000000.pairs, and tokenizer_json (when not empty) as <out_dir>/tokenizer.json.
//
// Split: pair i goes to val when ⌊(i+1)·f⌋ > ⌊i·f⌋ (f = val_fraction), so val is spread evenly through the set and
// holds ⌊n·f⌋ pairs; a set whose ⌊n·f⌋ is 0 holds out its last pair. At least 2 pairs are needed.
// max_positions > 0: a source of more than max_positions tokens, or a target of more than max_positions - 1 (the
// decoder reads the target after its start token), is an Error naming the file, the line and the length.
// All or nothing: every line is encoded and checked before anything is written; the files are written as hidden
// temporaries and renamed into place together (signals held off meanwhile), and a byte-level prepare (empty
// tokenizer_json) removes an earlier tokenizer.json. A directory holding token shards (train_*.bin, val_*.bin) is
// refused: the tokenizer.json there names their tokenizer.
struct PairPrepareParams {
  double val_fraction = 0.1;
  int max_positions = 0;
  int64_t vocab = 256;
  std::string tokenizer_json = {};  // empty: byte-level
  // Polled between the steps: nonzero (a signal number) undoes the prepare and throws PrepareInterrupted.
  const volatile std::sig_atomic_t* stop = nullptr;
};
struct PairPrepareReport {
  size_t n_train = 0, n_val = 0;
  size_t source_tokens = 0, target_tokens = 0;  // both splits
};
// encode: the ids of one line (appended to `out`).
using LineEncoder = std::function<void(std::string_view line, std::vector<int32_t>& out)>;
PairPrepareReport prepare_pair_shards(const PairLines& lines, const LineEncoder& encode, const std::string& out_dir,
                                      const PairPrepareParams& params);

}  // namespace tessera
