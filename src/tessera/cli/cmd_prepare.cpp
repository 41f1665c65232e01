// tessera prepare: a text (byte-level) or a corpus of text and JSON Lines (through a BPE tokenizer) into shards.
#include <signal.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/signals.h"
#include "tessera/core/units.h"
#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/formats.h"
#include "tessera/train/corpus.h"
#include "tessera/train/data.h"
#include "tessera/train/pair_data.h"
#include "tessera/train/text.h"

namespace tessera::cli {

namespace fs = std::filesystem;

namespace {

// Set while prepare runs by SIGINT and SIGTERM (ScopedSignals): prepare polls it, undoes its work and exits 128 +
// the signal, so neither leaves temporary files or half the new shards.
SignalFlag g_prepare_stop = 0;

int prepare_interrupted(int sig, const std::string& out) {
  std::fprintf(stderr, "tessera: %s: %s left as it was\n", stop_word(sig), out.c_str());
  return 128 + sig;
}

// A run's own data, a run's directory or a checkpoint is refused without --force: prepare would replace RUN/data's
// shards without a word, and the run could no longer be resumed (its --resume checks a fingerprint of them); into
// a run or a checkpoint it would mix shards in with them.
void check_out_dir(const std::string& out) {
  if (!fs::is_directory(out)) return;
  const fs::path normal = fs::path(out).lexically_normal();
  const fs::path dir = normal.has_filename() ? normal : normal.parent_path();  // "run/data/": run/data
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  TS_CHECK(!holds_run(dir), "--out ", out,
           " holds a training run (metrics.jsonl, checkpoint/): give the shards a "
           "directory of their own, or --force");
  TS_CHECK(!fs::exists(dir / "model.safetensors"), "--out ", out,
           " is a checkpoint: give the shards a directory "
           "of their own, or --force");
  TS_CHECK(!(dir.filename() == "data" && holds_run(parent)), "--out ", out, " holds the data of the training run in ",
           parent.string(),
           ", which that run's --resume checks: replaced, the run could not be resumed; give another "
           "--out, or --force to replace them");
}

// The tokenizer's Hugging Face tokenizer.json, as the shard directory keeps it: the file itself where it was one
// (byte for byte), else the model written in that format (GPT-2's or tiktoken's files, converted).
std::string tokenizer_json_text(const LoadedTokenizer& t) {
  if (t.format == TokenizerFormat::HuggingFace) return read_file_text(t.path, "tokenizer");
  const fs::path tmp = fs::temp_directory_path() /
                       ("tessera_prepare_tokenizer_" + std::to_string(::getpid()) + ".json");
  write_hf_tokenizer_json(t.model, tmp.string());
  std::string text = read_file_text(tmp.string(), "tokenizer");
  std::error_code ec;
  fs::remove(tmp, ec);
  return text;
}

// What prepare prints: "wrote 900 train and 100 val tokens to DIR (removed 2 earlier shards: ...)".
void print_report(const PrepareReport& r, const std::string& out) {
  // The earlier shards it removed, by name (train would have read them with the new ones): a few, then a count.
  std::string removed;
  for (size_t i = 0; i < r.removed.size() && i < 4; ++i) removed += (i ? ", " : "") + r.removed[i];
  if (r.removed.size() > 4) removed += ", and " + std::to_string(r.removed.size() - 4) + " more";
  const std::string shards = counted(r.removed.size(), "earlier shard");
  // A count of 1 (a tiny text) gets its own noun: "1 train and 1 val tokens" would read as one token too many.
  const std::string counts = r.n_train != 1 && r.n_val != 1
                                 ? std::to_string(r.n_train) + " train and " + counted(r.n_val, "val token")
                                 : counted(r.n_train, "train token") + " and " + counted(r.n_val, "val token");
  std::printf("wrote %s to %s%s\n", counts.c_str(), out.c_str(),
              r.removed.empty() ? "" : (" (removed " + shards + ": " + removed + ")").c_str());
}

// Every value of --text in argv, in order (Flags keeps the last alone): --tokenizer takes several files.
std::vector<std::string> text_flags(int argc, char** argv) {
  std::vector<std::string> texts;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--text" && i + 1 < argc) texts.emplace_back(argv[++i]);
    else if (arg.starts_with("--text=")) texts.emplace_back(arg.substr(7));
  }
  return texts;
}

// prepare --tokenizer: the corpus through the tokenizer (train/corpus.h), into shards that name it.
PrepareReport prepare_with_tokenizer(const Flags& a, const std::vector<std::string>& texts, const std::string& out,
                                     double val_fraction) {
  std::vector<std::string> specials;
  if (a.has("tiktoken-special")) specials.push_back(a.str("tiktoken-special"));
  const LoadedTokenizer loaded = load_tokenizer(a.str("tokenizer"), specials);
  TS_CHECK(specials.empty() || loaded.format == TokenizerFormat::Tiktoken,
           "--tiktoken-special is for a .tiktoken "
           "file; ",
           loaded.path, " is ", tokenizer_format_name(loaded.format), ", which names its special tokens itself");
  const BpeTokenizer tok(loaded.model, loaded.path);
  const int threads = a.integer("threads", 0);
  TS_CHECK(threads >= 0, "--threads must be >= 0 (0: every core), got ", threads);
  size_t bytes = 0;
  for (const std::string& text : texts) {
    std::error_code ec;
    TS_CHECK(fs::exists(text, ec), "text ", text, " does not exist", dangling_link_note(text));
    TS_CHECK(!fs::is_directory(text, ec), "text ", text, " is a directory (give a .txt or .jsonl file)");
    if (fs::is_regular_file(text, ec)) bytes += static_cast<size_t>(fs::file_size(text, ec));
  }
  PrepareProgress bar(bytes, !a.has("no-progress"), /*rate=*/true);
  const auto progress = bar.callback();
  CorpusParams cp{.files = texts,
                  .text_field = a.str("text-field", "text"),
                  .threads = threads > 0 ? threads
                                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                  .stop = &g_prepare_stop,
                  .progress = progress ? [&](size_t done) { progress(std::min(done, bytes), bytes); }
                                       : std::function<void(size_t)>()};
  TS_CHECK(!cp.text_field.empty(), "--text-field is empty");
  const TokenSource source = [&](const TokenSink& sink) { encode_corpus(tok, cp, sink); };
  return prepare_token_shards(source, out, {.val_fraction = val_fraction, .stop = &g_prepare_stop},
                              {.vocab = static_cast<int64_t>(tok.vocab_size()),
                               .tokenizer_json = tokenizer_json_text(loaded)});
}

// prepare without --tokenizer: the text's bytes, one token each.
PrepareReport prepare_bytes(const Flags& a, const std::string& out, double val_fraction) {
  std::string text;
  // A FIFO: waits for its writer, as cat does. An interrupted wait is PrepareInterrupted, as a stopped write.
  try {
    text = read_file_text(a.str("text"), "text", &g_prepare_stop, /*stop_at_nul=*/true);
  } catch (const Error&) {
    if (g_prepare_stop != 0) throw PrepareInterrupted(g_prepare_stop);
    throw;
  }
  size_t bad = 0;
  TS_CHECK(is_utf8_text(text, &bad), "text ", a.str("text"), " is not plain text (", not_text_at(text, bad),
           "); tessera prepare tokenizes text files only");
  TS_CHECK(text.size() >= 2, "text ", a.str("text"), " has ", counted(text.size(), "byte"),
           "; at least 2 are needed (a train token and a val token)");
  if (g_prepare_stop != 0) throw PrepareInterrupted(g_prepare_stop);
  PrepareProgress bar(text.size(), !a.has("no-progress"));
  return prepare_shards(text, out, {.val_fraction = val_fraction, .stop = &g_prepare_stop, .progress = bar.callback()});
}

// prepare --source/--target or --pairs: parallel text into paired shards (train/pair_data.h), through the tokenizer
// or bytes.
int prepare_pairs(const Flags& a, const std::string& out, double val_fraction) {
  TS_CHECK(!a.has("text"), "--text is for token shards; paired shards take --source and --target, or --pairs");
  TS_CHECK(!(a.has("pairs") && (a.has("source") || a.has("target"))),
           "give --pairs FILE.tsv, or --source and --target, not both");
  TS_CHECK(a.has("pairs") || (a.has("source") && a.has("target")), "--", a.has("source") ? "source" : "target",
           " needs --", a.has("source") ? "target" : "source", " FILE: the two files pair line by line");
  for (const char* f : {"text-field", "threads"})
    TS_CHECK(!a.has(f), "--", f, " is for a prepare of --text files; paired shards read one sentence a line");
  const int max_positions = a.integer("max-positions", 0);
  TS_CHECK(!a.has("max-positions") || max_positions >= 2, "--max-positions must be at least 2, got ",
           a.str("max-positions"));
  const PairLines lines = a.has("pairs") ? read_pairs_tsv(a.str("pairs"))
                                         : read_parallel_files(a.str("source"), a.str("target"));
  PairPrepareParams params{.val_fraction = val_fraction, .max_positions = max_positions, .stop = &g_prepare_stop};
  std::optional<BpeTokenizer> tok;
  LineEncoder encode = [](std::string_view line, std::vector<int32_t>& ids) {
    for (const unsigned char c : line) ids.push_back(c);
  };
  if (a.has("tokenizer")) {
    std::vector<std::string> specials;
    if (a.has("tiktoken-special")) specials.push_back(a.str("tiktoken-special"));
    const LoadedTokenizer loaded = load_tokenizer(a.str("tokenizer"), specials);
    tok.emplace(loaded.model, loaded.path);
    params.vocab = static_cast<int64_t>(tok->vocab_size());
    params.tokenizer_json = tokenizer_json_text(loaded);
    encode = [&tok, state = std::make_shared<BpeEncodeState>()](std::string_view line, std::vector<int32_t>& ids) {
      tok->encode(line, allow_all_specials(), ids, *state);
    };
  }
  PairPrepareReport r;
  try {
    r = prepare_pair_shards(lines, encode, out, params);
  } catch (const PrepareInterrupted& e) {
    return prepare_interrupted(e.signal(), out);
  }
  std::printf("wrote %zu train and %s to %s (%s, %s)\n", r.n_train, counted(r.n_val, "val pair").c_str(), out.c_str(),
              counted(r.source_tokens, "source token").c_str(), counted(r.target_tokens, "target token").c_str());
  return 0;
}

}  // namespace

int cmd_prepare(int argc, char** argv) {
  Flags a("prepare",
          "Turns text into llm.c-format token shards, or parallel text (--source/--target, --pairs) into paired "
          "shards: byte-level, or through a BPE tokenizer.");
  a.add("text", "FILE",
        "the text: UTF-8 (one document), or with --tokenizer a .jsonl file (one JSON document a "
        "line); with --tokenizer, repeat it for more files, in order");
  a.add("tokenizer", "PATH",
        "encode with this BPE tokenizer (tokenizer.json, vocab.json + merges.txt, a .tiktoken "
        "file, or a directory holding one), copied into --out as tokenizer.json; <|endoftext|>, where it has it, "
        "goes between documents (default: bytes, vocab 256)");
  a.add("source", "FILE", "paired shards: the source sentences, one a line (with --target)");
  a.add("target", "FILE", "paired shards: the target sentences, line i the translation of --source's line i");
  a.add("pairs", "FILE",
        "paired shards from one TSV file, source<TAB>target a line (tessera make-task writes one); --out then "
        "gets train_000000.pairs and val_000000.pairs");
  a.add("max-positions", "N",
        "paired shards: refuse a source longer than N tokens, or a target longer than N - 1 (the decoder reads it "
        "after its start token)");
  a.add("tiktoken-special", "TEXT", "for a .tiktoken --tokenizer: a special token, given the id after the ranks");
  a.add("text-field", "NAME", "the field of a .jsonl record that holds its text (default text)");
  a.add("threads", "N", "threads that encode with --tokenizer (default: every core)");
  a.add("out", "DIR",
        "where to write train_000000.bin and val_000000.bin (other train_*.bin and val_*.bin shards "
        "there are removed, so that train --data DIR reads these alone)");
  a.add("val-fraction", "X",
        "share of the text held out for validation, in (0, 1): 1 KiB blocks (with --tokenizer, "
        "blocks of 1024 tokens; of paired shards, pairs) spread evenly through it, X of them to within one block "
        "(default 0.1: every 10th block)");
  a.add_switch("no-progress", "no progress bar on stderr (shown for a text of 16 MiB or more)");
  a.add_switch("force",
               "replace the shards of a training run's own data (RUN/data, which the run's --resume then "
               "refuses), or write into a directory that holds a run or a checkpoint");
  if (!a.parse(argc, argv, 2)) return 0;
  const bool paired = a.has("source") || a.has("target") || a.has("pairs");
  TS_CHECK(paired || a.has("text"),
           "--text FILE is required (or --source and --target, or --pairs, for paired shards)");
  TS_CHECK(a.has("out"), "--out DIR is required");
  TS_CHECK(!a.str("out").empty(), "--out is empty");
  const double val_fraction = a.number("val-fraction", 0.1);
  TS_CHECK(val_fraction > 0 && val_fraction < 1, "--val-fraction must be in (0, 1), got ", a.str("val-fraction"));
  TS_CHECK(paired || !a.has("max-positions"), "--max-positions is for paired shards (--source/--target, --pairs)");
  if (paired) {
    if (!a.has("force")) check_out_dir(a.str("out"));
    const ScopedSignals signals({SIGINT, SIGTERM}, &g_prepare_stop);
    return prepare_pairs(a, a.str("out"), val_fraction);
  }
  const bool bpe = a.has("tokenizer");
  for (const char* f : {"tiktoken-special", "text-field", "threads"})
    TS_CHECK(bpe || !a.has(f), "--", f,
             " is for a prepare with --tokenizer; without one the text's bytes are its "
             "tokens");
  const std::vector<std::string> texts = text_flags(argc, argv);
  TS_CHECK(bpe || texts.size() <= 1,
           "several --text files are for a prepare with --tokenizer (each file a document, "
           "or a .jsonl of them); a byte-level prepare reads one text");
  const std::string out = a.str("out");
  if (!a.has("force")) check_out_dir(out);
  const ScopedSignals signals({SIGINT, SIGTERM}, &g_prepare_stop);  // the previous handlers come back after
  PrepareReport r;
  try {
    r = bpe ? prepare_with_tokenizer(a, texts, out, val_fraction) : prepare_bytes(a, out, val_fraction);
  } catch (const PrepareInterrupted& e) {
    return prepare_interrupted(e.signal(), out);
  }
  print_report(r, out);
  // A signal held off while the shards were renamed into place: the work is done (and said so above), but a script
  // that was interrupted stops, as it would have a moment earlier.
  if (r.stopped != 0) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: %s after the shards were in place\n", stop_word(r.stopped));
    return 128 + r.stopped;
  }
  return 0;
}

}  // namespace tessera::cli
