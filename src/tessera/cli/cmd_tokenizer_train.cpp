// tessera tokenizer train: trains a byte-level BPE vocabulary on text files by CS336's rules
// (tokenizer/bpe_train.h) and writes it as Hugging Face's tokenizer.json (tokenizer/formats.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe_train.h"
#include "tessera/tokenizer/formats.h"
#include "tessera/tokenizer/unicode_classes.h"
#include "tessera/train/progress.h"

namespace tessera::cli {
namespace {

// tokenizer.json maps each token's text to its id, a special token's as it is and an ordinary one's through
// bytes_to_unicode: a special token whose text is also an ordinary token's there cannot be written.
void check_specials_apart(const BpeModel& m) {
  std::unordered_set<std::string> ordinary;
  std::vector<bool> special(m.tokens.size(), false);
  for (int32_t id : m.special_ids) special[id] = true;
  for (size_t id = 0; id < m.tokens.size(); ++id)
    if (!special[id]) ordinary.insert(gpt2_bytes_to_unicode(m.tokens[id]));
  for (int32_t id : m.special_ids)
    TS_CHECK(!ordinary.count(m.tokens[id]), "tokenizer train: the special token '", m.tokens[id],
             "' is also the text of an ordinary token (a byte or a merge), which tokenizer.json cannot hold apart");
}

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_decode(p + i, s.size() - i, &cp);
    if (cp == kInvalidCodePoint) return false;
    i += n;
  }
  return true;
}

// --text takes every argument after it up to the next that starts with "--" (and may be repeated); --special takes
// one value and may be repeated. Both are taken out of argv here, since Flags keeps only the last of a flag.
struct ListFlags {
  std::vector<std::string> text, special;
  std::vector<std::string> rest;  // argv[0..] without them, for Flags
};

ListFlags take_list_flags(int argc, char** argv) {
  ListFlags f;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--text") {
      const size_t before = f.text.size();
      while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) f.text.emplace_back(argv[++i]);
      TS_CHECK(f.text.size() > before, "tokenizer train: --text needs at least one FILE");
    } else if (a.rfind("--text=", 0) == 0) {
      f.text.push_back(a.substr(7));
    } else if (a == "--special") {
      TS_CHECK(i + 1 < argc, "tokenizer train: --special needs a value (TEXT)");
      f.special.emplace_back(argv[++i]);
    } else if (a.rfind("--special=", 0) == 0) {
      f.special.push_back(a.substr(10));
    } else {
      f.rest.push_back(a);
    }
  }
  return f;
}

}  // namespace

int tokenizer_train_command(int argc, char** argv) {
  Flags a("tokenizer train",
          "Trains a byte-level BPE vocabulary (GPT-2's pre-tokenization, CS336's merge rules) on text files.");
  a.add("text", "FILE...", "the training text: one or more files, each a text of its own (required)");
  a.add("vocab-size", "N", "tokens in the vocabulary: the 256 bytes, the special tokens and the merges (required)");
  a.add("special", "TEXT", "a special token, never split or merged (repeat for more; e.g. '<|endoftext|>')");
  a.add_switch("special-first", "give the special tokens the first ids, before the bytes (default: after them)");
  a.add("out", "DIR", "where to write tokenizer.json (Hugging Face's format; created if missing) (required)");
  a.add("threads", "N", "threads that count the pre-tokens (default: every core)");
  a.add_switch("no-progress", "no progress bar on stderr");
  ListFlags lists = take_list_flags(argc, argv);
  std::vector<char*> rest;
  for (std::string& s : lists.rest) rest.push_back(s.data());
  if (!a.parse(static_cast<int>(rest.size()), rest.data(), 3)) return 0;

  TS_CHECK(!lists.text.empty(), "tokenizer train: --text FILE... is required");
  TS_CHECK(a.has("vocab-size"), "tokenizer train: --vocab-size N is required");
  TS_CHECK(a.has("out"), "tokenizer train: --out DIR is required");
  BpeTrainParams params;
  params.vocab_size = a.integer("vocab-size", 0);
  params.special_tokens = lists.special;
  params.special_first = a.has("special-first");
  params.threads = a.integer("threads", 0);
  TS_CHECK(params.threads >= 0, "tokenizer train: --threads must be >= 0 (0: every core), got ", params.threads);
  for (const std::string& s : params.special_tokens) {
    TS_CHECK(!s.empty(), "tokenizer train: --special is empty");
    TS_CHECK(valid_utf8(s), "tokenizer train: --special '", s, "' is not valid UTF-8");
  }
  bpe_train_check_params(params);
  {  // the bytes' part of check_specials_apart, before the work
    BpeModel bytes;
    for (int b = 0; b < 256; ++b) bytes.tokens.emplace_back(1, static_cast<char>(b));
    for (const std::string& s : params.special_tokens) {
      bytes.special_ids.push_back(static_cast<int32_t>(bytes.tokens.size()));
      bytes.tokens.push_back(s);
    }
    check_specials_apart(bytes);
  }
  const std::string out = a.str("out");
  TS_CHECK(!out.empty(), "tokenizer train: --out needs a directory name");
  OutputFiles outputs;
  for (const std::string& t : lists.text) {
    ::close(open_for_reading(t, "--text"));  // a missing file fails now, before minutes of counting
    outputs.protect(t, "a --text file");
  }
  const std::filesystem::path dir(out);
  TS_CHECK(!std::filesystem::exists(dir) || std::filesystem::is_directory(dir), "tokenizer train: --out ", out,
           " is not a directory");
  ensure_writable_dir(out);
  const std::string json_path = (dir / "tokenizer.json").string();
  outputs.claim("out", json_path);
  check_file_writable(json_path, "--out");

  const bool show = !a.has("no-progress");
  const int threads = params.threads > 0 ? params.threads
                                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<ProgressBar> bar;
  BpeTrainProgress::Stage stage = BpeTrainProgress::Stage::Counting;
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double count_s = 0;
  params.progress = [&](const BpeTrainProgress& p) {
    const bool counting = p.stage == BpeTrainProgress::Stage::Counting;
    if (!bar || p.stage != stage) {
      if (!counting && stage == BpeTrainProgress::Stage::Counting) count_s = seconds();
      stage = p.stage;
      if (bar) bar->finish();
      const int64_t total = counting ? static_cast<int64_t>((p.total + (1 << 20) - 1) >> 20)
                                     : static_cast<int64_t>(p.total);
      bar = std::make_unique<ProgressBar>(total, 0, show,
                                          ProgressFormat{.unit = counting ? "MiB" : "token", .eta = true});
    }
    if (counting) {
      const int64_t mib = p.done >= p.total ? static_cast<int64_t>((p.total + (1 << 20) - 1) >> 20)
                                            : static_cast<int64_t>(p.done >> 20);
      const double s = seconds();
      bar->update(mib, "counting pre-tokens | " + fmt("%.1f", s > 0 ? p.done / s / 1e6 : 0.0) + " MB/s");
    } else {
      bar->update(static_cast<int64_t>(p.done), "merging");
    }
  };
  std::printf("tessera tokenizer train: %zu file%s, vocab %d, %zu special token%s, %d thread%s\n", lists.text.size(),
              lists.text.size() == 1 ? "" : "s", params.vocab_size, params.special_tokens.size(),
              params.special_tokens.size() == 1 ? "" : "s", threads, threads == 1 ? "" : "s");
  std::fflush(stdout);
  const BpeModel model = bpe_train_files(lists.text, params);
  if (bar) bar->finish();
  const double total_s = seconds();
  check_specials_apart(model);
  write_hf_tokenizer_json(model, json_path);
  std::printf("%zu tokens (%zu merges) in %.2f s (counting %.2f s, merging %.2f s); wrote %s\n", model.tokens.size(),
              model.merges.size(), total_s, count_s, total_s - count_s, json_path.c_str());
  if (static_cast<int>(model.tokens.size()) < params.vocab_size)
    std::printf("note: the text ran out of pairs to merge at %zu of the %d tokens asked for\n", model.tokens.size(),
                params.vocab_size);
  return 0;
}

}  // namespace tessera::cli
