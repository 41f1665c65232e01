// tessera/train/data.h — token shards in llm.c's format, byte-level text ingestion, and the batch stream.
//
// Shard: a header of 256 int32 (magic 20240520, version, token count, then zeros), then count tokens:
//   version 1 (llm.c's): uint16 tokens, for a vocab of at most 65536;
//   version 2 (tessera's, for a wider vocab): header[3] = 4, the bytes of a token, then uint32 tokens.
#pragma once
#include <csignal>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/mmap_file.h"

namespace tessera {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;     // uint16 tokens
constexpr int32_t kShardVersionU32 = 2;  // uint32 tokens
constexpr int kShardHeaderInts = 256;
// The widest vocab whose ids all fit a version-1 shard's uint16.
constexpr int64_t kShardU16Vocab = 65536;
// The bytes of one token in the shards of a tokenizer with `vocab` tokens: 2 (version 1) or 4 (version 2).
inline int shard_token_bytes(int64_t vocab) { return vocab <= kShardU16Vocab ? 2 : 4; }

// Reads and validates a shard: missing file, short header, bad magic or version, and a size that does not
// match the token count are one-line errors naming the file. Token ids >= vocab are rejected when vocab > 0.
// (A copy of the tokens, for tools and tests; training maps the shards through TokenStream instead.)
// read_shard reads version 1 only (a version-2 shard is an error saying so); read_shard_tokens reads both.
std::vector<uint16_t> read_shard(const std::string& path, int vocab = 0);
std::vector<int32_t> read_shard_tokens(const std::string& path, int vocab = 0);
// Writes a shard atomically: write_shard in version 1; write_shard_tokens in the version shard_token_bytes(vocab)
// gives (every id must be in [0, vocab)).
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);
void write_shard_tokens(const std::string& path, std::span<const int32_t> tokens, int64_t vocab);

// The byte-level tokenizer: one token per byte, vocab 256.
constexpr int kByteVocab = 256;
std::vector<uint16_t> byte_encode(const std::string& text);
// Ids 0..255 become their bytes. An id outside them (a model with a wider vocab, or one trained on another
// tokenizer's shards) is no byte: it is written "<id 50256>", visibly, never masked to a byte that reads as text.
std::string byte_decode(const std::vector<int32_t>& tokens);

// `tessera prepare`: splits text into train and val and writes <out>/train_000000.bin and <out>/val_000000.bin.
//
// Split: the text is cut into 1 KiB blocks, and block i goes to val when ⌊(i+1)·f⌋ > ⌊i·f⌋ (f = val_fraction),
// so the first n blocks hold ⌊n·f⌋ val blocks, spread evenly: val samples the whole text, not its end, and its
// share is f to within one block. (For f = 0.1 that is every 10th block, 9, 19, 29, ...) A text whose whole blocks
// give no val block (fewer than 1/f of them) holds out its last ⌊size·f⌋ bytes instead, at least one.
//
// All or nothing: both shards are written as hidden temporary files beside their names, encoded a chunk at a time,
// and only when both are complete and on disk are they renamed into place, with SIGINT and SIGTERM held off
// during the renames. The earlier train shard stays under a hidden name until the val shard is in place, and is
// put back if that second rename fails, so that a new train shard never stands beside an old val shard. The
// directory's other train_*.bin and val_*.bin shards, which train --data would read beside the new ones, are removed
// with those renames; a directory holding other shards that train would read (llm.c's fineweb_train_000001.bin) is
// refused before anything is written. A prepare that fails or is stopped removes its temporary files and the
// directories it created, leaving the output directory as it was.
struct PrepareParams {
  double val_fraction = 0.1;
  // Polled while the shards are written: once it is nonzero (a signal number, set by a handler), the prepare is
  // undone as a failed one is, and PrepareInterrupted is thrown. Read once more after the renames, into
  // PrepareReport::stopped: a signal held off during them lands there.
  const volatile std::sig_atomic_t* stop = nullptr;
  // Called with the signals held off, just before the renames (tests raise a signal or block a rename there).
  std::function<void()> before_renames = nullptr;
  // Called as the shards are written, a chunk (1 Mi tokens) at a time: the text's bytes written so far, of
  // text.size() in all (train's and val's together; the last call has done == total). For a progress bar.
  std::function<void(size_t done, size_t total)> progress = nullptr;
  // Holds an exclusive lock (DirectoryLock) on out_dir while it reads and writes it, so that a prepare into a
  // directory that a train reads its shards from (holding it shared) is refused instead of replacing them under it.
  // false: the caller holds it (train, which keeps it, shared, for the run).
  bool lock = true;
};
struct PrepareReport {
  size_t n_train = 0, n_val = 0;
  std::vector<std::string> removed;  // the earlier shards removed (file names, sorted)
  // *stop after the renames: a signal that came while they were held off, or after. The shards are in place; the
  // caller stops as the signal asked (tessera prepare exits 128 + it, train stops before its first step).
  int stopped = 0;
};
class PrepareInterrupted : public std::exception {
 public:
  explicit PrepareInterrupted(int sig) : signal_(sig) {}
  int signal() const { return signal_; }
  const char* what() const noexcept override { return "prepare interrupted"; }

 private:
  int signal_;
};
// A byte-level prepare also removes a tokenizer.json in out_dir (an earlier prepare's): the shards hold bytes now.
PrepareReport prepare_shards(const std::string& text, const std::string& out_dir, const PrepareParams& params);

// prepare_shards for the ids of a tokenizer, which `source` produces: it calls its sink with them a chunk at a
// time, in order, and the sink writes each chunk out at once (the whole corpus's ids are never held).
// Split: as prepare_shards splits a text's bytes, with 1 Ki-token blocks of the id stream in place of 1 KiB blocks
// of text (and, for a stream with no whole val block, its last ⌊n·f⌋ ids, at least one). The shards are version 1
// or 2 by shard_token_bytes(vocab); tokenizer_json (the tokenizer's Hugging Face file) is written as
// out_dir/tokenizer.json with the same all-or-nothing renames, so that the directory names the tokenizer its ids
// are of.
// params.progress is not called: the source knows how much of its input it has read, and reports that itself.
// At least 2 ids are needed (a train and a val token).
struct TokenShardParams {
  int64_t vocab = 0;
  std::string tokenizer_json;
};
using TokenSink = std::function<void(std::span<const int32_t> ids)>;
using TokenSource = std::function<void(const TokenSink& sink)>;
PrepareReport prepare_token_shards(const TokenSource& source, const std::string& out_dir, const PrepareParams& params,
                                   const TokenShardParams& tokens);
// The name of the tokenizer file in a shard directory and in a checkpoint.
constexpr const char* kTokenizerFile = "tokenizer.json";

// Whether `name` is one of prepare's hidden working files (".train_000000.bin.tmp.<pid>", ".val_000000.bin.tmp.<pid>",
// ".tokenizer.json.tmp.<pid>", ".train_000000.bin.old.<pid>"). A prepare killed outright (SIGKILL, power loss)
// leaves them; the next prepare into that directory removes those whose process is gone, and train --text accepts
// them in OUT/data.
bool is_prepare_leftover(std::string_view name);
// Whether `path` is a shard by its header's magic: a regular file that begins with it. Reads its first 4 bytes
// only, and nothing of what is not a regular file (a FIFO's first bytes would be taken from its reader). Throws
// Error "data: cannot read <path>: <reason>" for a regular file it cannot open.
bool is_shard_file(const std::string& path);
// The token counts {train, val} that prepare_shards would write for a text of `text_bytes` bytes: known before
// anything is written, so a caller can check them first.
std::pair<size_t, size_t> prepare_split_sizes(size_t text_bytes, double val_fraction = 0.1);
// prepare_shards, returning the token counts {train, val}.
std::pair<size_t, size_t> prepare_text(const std::string& text, const std::string& out_dir, double val_fraction = 0.1);

// Lists the shards of a split in `data`, which is a directory or one file. In a directory, the shards are the
// .bin files, sorted, whose name has the split as a whole '_'-separated word: train_000000.bin, and llm.c's
// fineweb_train_000001.bin; never interval_000.bin for "val". An entry with a shard's name that is not a regular
// file (a dangling symlink, a directory, a FIFO) is refused by name: skipped, it left the run on fewer shards without
// a word. find_shards refuses a split with no shards; list_shards returns it empty.
std::vector<std::string> find_shards(const std::string& data, const std::string& split);
std::vector<std::string> list_shards(const std::string& data, const std::string& split);

// Consecutive (B, T) batches over the concatenated shards. Batch k takes B*T + 1 tokens starting at the
// position, inputs are tokens[0 .. B*T), targets tokens[1 .. B*T]; the position then advances by B*T and
// wraps to 0 when the next batch would run past the end. The position is the resumable data state.
//
// The shards are memory-mapped, not read into memory: a batch is copied from the mappings (across a shard
// boundary where it spans one), so a corpus larger than RAM streams from disk. Every shard is validated
// when the stream opens (header, size, and every token id below vocab), in one pass over the mapping.
class TokenStream {
 public:
  TokenStream(const std::vector<std::string>& shards, int vocab);
  void next_batch(int B, int T, int32_t* inputs, int32_t* targets);
  uint64_t position() const { return pos_; }
  void set_position(uint64_t pos);
  size_t size() const { return size_; }
  // The largest token id in the shards (-1 when they hold none): below 256 for byte-level text.
  int max_token() const { return max_token_; }

 private:
  struct Shard {
    MappedFile file;
    const unsigned char* tokens = nullptr;  // inside the mapping, after the header
    int width = 2;                          // bytes a token: 2 (uint16, version 1) or 4 (uint32, version 2)
    uint64_t end = 0;                       // position one past this shard's last token in the concatenation
  };
  std::vector<Shard> shards_;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
  int max_token_ = -1;
  std::string name_;
};

}  // namespace tessera
