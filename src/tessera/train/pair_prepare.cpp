// prepare's paired side (pair_data.h): parallel text in, checked line by line, encoded, split and written as paired
// shards all or nothing.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/train/data.h"
#include "tessera/train/hold_signals.h"
#include "tessera/train/pair_data.h"
#include "tessera/train/text.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {
// The text of a file that must be UTF-8 ("source a.txt", "pairs p.tsv" in errors).
std::string read_text_file(const std::string& path, const char* what) {
  std::error_code ec;
  TS_CHECK(fs::exists(path, ec), what, " ", path, " does not exist", dangling_link_note(path));
  TS_CHECK(!fs::is_directory(path, ec), what, " ", path, " is a directory (give a text file, one sentence a line)");
  std::string text = read_file_text(path, what, nullptr, /*stop_at_nul=*/true);
  size_t bad = 0;
  TS_CHECK(is_utf8_text(text, &bad), what, " ", path, " is not plain text (", not_text_at(text, bad), ")");
  TS_CHECK(!text.empty(), what, " ", path, " is empty");
  return text;
}

// The lines of a text: each ends at "\n", a "\r" before it dropped; a last line without "\n" counts.
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    size_t stop = end;
    if (stop > at && text[stop - 1] == '\r') --stop;
    lines.emplace_back(text, at, stop - at);
    at = end + 1;
  }
  return lines;
}

void check_no_empty_line(const std::vector<std::string>& lines, const char* what, const std::string& path) {
  for (size_t i = 0; i < lines.size(); ++i)
    TS_CHECK(!lines[i].empty(), what, " ", path, ": line ", i + 1,
             " is empty (every line is a sentence, and a pair needs both sides)");
}

// ⌊n·f⌋: the val pairs among the first n (the margin keeps exact multiples exact where f is stored below its value,
// as data.cpp's split does).
size_t val_pairs_in(size_t n, double f) { return static_cast<size_t>(std::floor(static_cast<double>(n) * f + 1e-9)); }

// Refuses a directory that holds token shards: the tokenizer.json written beside the paired shards would then name
// the wrong tokenizer for them.
void check_no_token_shards(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return;
  for (const char* split : {"train", "val"}) {
    const std::vector<std::string> shards = list_shards(out_dir, split);
    TS_CHECK(shards.empty(), "prepare: ", out_dir, " holds token shards (",
             fs::path(shards.front()).filename().string(),
             "), whose tokenizer.json paired shards would replace: give the paired shards a directory of their own");
  }
}

void throw_if_stopped(const volatile std::sig_atomic_t* stop) {
  if (stop && *stop != 0) throw PrepareInterrupted(*stop);
}

// The temporaries of a prepare and the directories it made, removed unless done() (the directories only when
// empty, innermost first).
class PairUndo {
 public:
  ~PairUndo() {
    std::error_code ec;
    for (const std::string& t : temps_) fs::remove(t, ec);
    if (done_) return;
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) fs::remove(*it, ec);
  }
  std::vector<fs::path> created_;
  std::vector<std::string> temps_;
  bool done_ = false;
};

// Writes `pairs` to the hidden temporary `tmp`, flushed to disk.
void write_temp_shard(const std::string& tmp, const std::string& shown, const PairTokens& pairs, int64_t vocab) {
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TS_CHECK(f, "cannot write ", shown, ": ", std::strerror(errno));
  try {
    write_pair_shard_to(f, shown, pairs, vocab);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  const bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int e = errno;
  TS_CHECK(std::fclose(f) == 0 && ok, "cannot write ", shown, ": ", std::strerror(e));
}

// Encodes the lines into the train and val splits (pair_data.h), checking each against max_positions.
void encode_pairs(const PairLines& lines, const LineEncoder& encode, const PairPrepareParams& params,
                  PairTokens (&split)[2]) {
  const size_t n = lines.source.size();
  const bool tail_val = val_pairs_in(n, params.val_fraction) == 0;  // too few for one: the last pair is val
  const int mp = params.max_positions;
  std::vector<int32_t> src, tgt;
  for (size_t i = 0; i < n; ++i) {
    if (i % 4096 == 0) throw_if_stopped(params.stop);
    src.clear();
    tgt.clear();
    encode(lines.source[i], src);
    encode(lines.target[i], tgt);
    TS_CHECK(mp <= 0 || src.size() <= static_cast<size_t>(mp), lines.source_name, ": line ", i + 1, " is ",
             counted(src.size(), "token"), " long, more than --max-positions ", mp);
    TS_CHECK(mp <= 0 || tgt.size() + 1 <= static_cast<size_t>(mp), lines.target_name, ": line ", i + 1, " is ",
             counted(tgt.size(), "token"), " long; with the decoder's start token that is ", tgt.size() + 1,
             ", more than --max-positions ", mp);
    TS_CHECK(!src.empty() && !tgt.empty(), lines.source_name, ": line ", i + 1, " encodes to no tokens");
    const bool val = tail_val ? i + 1 == n
                              : val_pairs_in(i + 1, params.val_fraction) > val_pairs_in(i, params.val_fraction);
    PairTokens& out = split[val ? 1 : 0];
    TS_CHECK(out.source.size() + src.size() <= INT32_MAX && out.target.size() + tgt.size() <= INT32_MAX,
             "prepare: more tokens than a paired shard's header can count (", INT32_MAX, "); split the set");
    out.add(src, tgt);
  }
}

// A hidden working file of this process in dir: ".<name>.tmp.<pid>".
std::string hidden_temp(const fs::path& dir, const std::string& name) {
  return (dir / ("." + name + ".tmp." + std::to_string(::getpid()))).string();
}
}  // namespace

PairLines read_parallel_files(const std::string& source_path, const std::string& target_path) {
  PairLines p{.source = split_lines(read_text_file(source_path, "source")),
              .target = split_lines(read_text_file(target_path, "target")),
              .source_name = "source " + source_path,
              .target_name = "target " + target_path};
  TS_CHECK(p.source.size() == p.target.size(), "source ", source_path, " has ", counted(p.source.size(), "line"),
           " and target ", target_path, " has ", p.target.size(), ": the files pair line by line");
  check_no_empty_line(p.source, "source", source_path);
  check_no_empty_line(p.target, "target", target_path);
  return p;
}

PairLines read_pairs_tsv(const std::string& path) {
  const std::vector<std::string> lines = split_lines(read_text_file(path, "pairs"));
  PairLines p{.source_name = "pairs " + path, .target_name = "pairs " + path};
  p.source.reserve(lines.size());
  p.target.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const size_t tabs = static_cast<size_t>(std::count(line.begin(), line.end(), '\t'));
    TS_CHECK(!line.empty(), "pairs ", path, ": line ", i + 1, " is empty (every line is source<TAB>target)");
    TS_CHECK(tabs == 1, "pairs ", path, ": line ", i + 1, " has ", counted(tabs, "tab"),
             " (expected exactly one: source<TAB>target)");
    const size_t tab = line.find('\t');
    TS_CHECK(tab > 0, "pairs ", path, ": line ", i + 1, " has an empty source");
    TS_CHECK(tab + 1 < line.size(), "pairs ", path, ": line ", i + 1, " has an empty target");
    p.source.push_back(line.substr(0, tab));
    p.target.push_back(line.substr(tab + 1));
  }
  return p;
}

PairPrepareReport prepare_pair_shards(const PairLines& lines, const LineEncoder& encode, const std::string& out_dir,
                                      const PairPrepareParams& params) {
  TS_CHECK(lines.source.size() >= 2, lines.source_name, " has ", counted(lines.source.size(), "pair"),
           "; at least 2 are needed (a train pair and a val pair)");
  PairTokens split[2];
  encode_pairs(lines, encode, params, split);
  check_no_token_shards(out_dir);
  throw_if_stopped(params.stop);

  PairUndo undo;
  undo.created_ = create_dirs_recorded(out_dir);
  const DirectoryLock lock(out_dir, "shard directory",
                           "(a train that reads shards there, or another prepare): wait for it to end, or prepare into "
                           "another directory");
  const fs::path dir(out_dir);
  std::string temps[2];
  for (int k = 0; k < 2; ++k) {
    temps[k] = hidden_temp(dir, kPairShardNames[k]);
    undo.temps_.push_back(temps[k]);
    write_temp_shard(temps[k], (dir / kPairShardNames[k]).string(), split[k], params.vocab);
    throw_if_stopped(params.stop);
  }
  const std::string tokenizer = (dir / kTokenizerFile).string();
  std::string tok_temp;
  if (!params.tokenizer_json.empty()) {
    tok_temp = hidden_temp(dir, kTokenizerFile);
    undo.temps_.push_back(tok_temp);
    write_file_atomic(tok_temp, params.tokenizer_json);
  }
  {
    const HoldSignals hold;
    for (int k = 0; k < 2; ++k) {
      const std::string shard = (dir / kPairShardNames[k]).string();
      TS_CHECK(std::rename(temps[k].c_str(), shard.c_str()) == 0, "cannot write ", shard, ": ", std::strerror(errno));
    }
    // The tokenizer after the shards; a byte-level set removes an earlier one, which would name another tokenizer.
    std::error_code ec;
    if (!tok_temp.empty())
      TS_CHECK(std::rename(tok_temp.c_str(), tokenizer.c_str()) == 0, "cannot write ", tokenizer, ": ",
               std::strerror(errno));
    else fs::remove(tokenizer, ec);
    fsync_dir(out_dir);
  }
  undo.done_ = true;
  return {.n_train = split[0].size(),
          .n_val = split[1].size(),
          .source_tokens = split[0].source.size() + split[1].source.size(),
          .target_tokens = split[0].target.size() + split[1].target.size()};
}

}  // namespace tessera
