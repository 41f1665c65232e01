// tessera tokenizer train: trains a byte-level BPE vocabulary on text files by CS336's rules
// (tokenizer/bpe_train.h) and writes it as GPT-2's vocab.json + merges.txt.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe_train.h"
#include "tessera/tokenizer/unicode_classes.h"
#include "tessera/train/progress.h"

namespace tessera::cli {
namespace {

// GPT-2's bytes_to_unicode: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the other
// 68 take U+0100.. in byte order; the files hold each token as the UTF-8 of its bytes so mapped.
std::string gpt2_chars(std::string_view bytes) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = printable ? b : next++;
      t[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                       : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    return t;
  }();
  std::string out;
  for (unsigned char c : bytes) out += table[c];
  return out;
}

// vocab.json (token -> id, in id order; a special token as its text, as GPT-2's "<|endoftext|>") and merges.txt
// ("#version: 0.2", then one "left right" a line in rank order), each written atomically.
void write_gpt2_files(const BpeModel& m, const std::filesystem::path& dir) {
  std::vector<bool> special(m.tokens.size(), false);
  for (int32_t id : m.special_ids) special[id] = true;
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t id = 0; id < m.tokens.size(); ++id)
    vocab[special[id] ? m.tokens[id] : gpt2_chars(m.tokens[id])] = id;
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : m.merges) merges += gpt2_chars(m.tokens[a]) + " " + gpt2_chars(m.tokens[b]) + "\n";
  write_file_atomic((dir / "vocab.json").string(), vocab.dump() + "\n");
  write_file_atomic((dir / "merges.txt").string(), merges);
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
  a.add("out", "DIR", "where to write vocab.json and merges.txt (GPT-2's format; created if missing) (required)");
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
  for (const char* name : {"vocab.json", "merges.txt"}) {
    outputs.claim("out", (dir / name).string());
    check_file_writable((dir / name).string(), "--out");
  }

  const bool show = !a.has("no-progress");
  const int threads = params.threads > 0 ? params.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
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
      const int64_t total = counting ? static_cast<int64_t>((p.total + (1 << 20) - 1) >> 20) : static_cast<int64_t>(p.total);
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
  write_gpt2_files(model, dir);
  std::printf("%zu tokens (%zu merges) in %.2f s (counting %.2f s, merging %.2f s); wrote %s and %s\n",
              model.tokens.size(), model.merges.size(), total_s, count_s, total_s - count_s,
              (dir / "vocab.json").string().c_str(), (dir / "merges.txt").string().c_str());
  if (static_cast<int>(model.tokens.size()) < params.vocab_size)
    std::printf("note: the text ran out of pairs to merge at %zu of the %d tokens asked for\n", model.tokens.size(),
                params.vocab_size);
  return 0;
}

}  // namespace tessera::cli
