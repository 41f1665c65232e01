// tessera bench tokenizer-train: BPE training (tokenizer/bpe_train.h) timed beside Hugging Face tokenizers'
// BpeTrainer on the same file, with the same threads and the same pre-tokenization (ByteLevel, GPT-2's regex), in
// the same run (bench/peers/bpe_train.py); time, text rate and peak memory (getrusage's maxrss) of each.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tessera/bench/peer.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe_train.h"
#include "tessera/train/progress.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif

namespace tessera::cli {
namespace {

double peak_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

// A word of the shell, single-quoted.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string h;
  for (unsigned char c : bytes) h += {digits[c >> 4], digits[c & 15]};
  return h;
}

struct PeerRun {
  double seconds = 0, rss_before = 0, peak_rss = 0;
  int64_t vocab = 0;
  std::string name, note;
  std::vector<std::pair<std::string, std::string>> merges;  // hex bytes
  bool ok = false;
};

}  // namespace

int cmd_bench_tokenizer_train(int argc, char** argv) {
  Flags a(
      "bench tokenizer-train",
      "Times BPE training beside Hugging Face tokenizers' BpeTrainer on the same text: seconds, MB/s, peak memory.");
  a.add("text", "FILE", "the training text (required)");
  a.add("vocab-size", "N", "tokens in the vocabulary (default 10000)");
  a.add("special", "TEXT", "the one special token (default <|endoftext|>)");
  a.add("threads", "N", "threads for both trainers (default: every core)");
  a.add("peer-timeout", "S", "stop the peer after S seconds (default 1800)");
  a.add_switch("no-peer", "time tessera alone");
  a.add("out", "FILE", "also write the table as markdown to FILE");
  a.add_switch("no-progress", "no progress bar on stderr");
  if (!a.parse(argc, argv, 3)) return 0;
  TS_CHECK(a.has("text"), "bench tokenizer-train: --text FILE is required");
  const std::string text = a.str("text");
  ::close(open_for_reading(text, "--text"));
  struct stat st {};
  TS_CHECK(::stat(text.c_str(), &st) == 0 && S_ISREG(st.st_mode), "bench tokenizer-train: --text ", text,
           " is not a regular file (the peer reads it again)");
  BpeTrainParams params;
  params.vocab_size = a.integer("vocab-size", 10000);
  params.special_tokens = {a.str("special", "<|endoftext|>")};
  params.threads = a.integer("threads", 0);
  TS_CHECK(params.threads >= 0, "bench tokenizer-train: --threads must be >= 0 (0: every core), got ", params.threads);
  if (params.threads == 0) params.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bpe_train_check_params(params);
  const double peer_timeout = a.number("peer-timeout", 1800);
  TS_CHECK(peer_timeout > 0, "--peer-timeout must be > 0, got ", peer_timeout);
  const std::string out = a.str("out");
  if (a.has("out")) check_output_path("out", out);
  const double mb = static_cast<double>(st.st_size) / 1e6;

  std::printf("tessera bench tokenizer-train: %s (%.1f MB), vocab %d, %d thread%s\n", text.c_str(), mb,
              params.vocab_size, params.threads, params.threads == 1 ? "" : "s");
  std::fflush(stdout);
  ProgressBar bar(1000, 0, !a.has("no-progress"), {.unit = "permille", .eta = false});
  params.progress = [&](const BpeTrainProgress& p) {
    const bool counting = p.stage == BpeTrainProgress::Stage::Counting;
    const int64_t part = p.total > 0 ? static_cast<int64_t>(500.0 * static_cast<double>(p.done) / p.total) : 0;
    bar.update(counting ? part : 500 + part, counting ? "tessera: counting" : "tessera: merging");
  };
  const double rss_before = peak_rss_mib();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<WordCount> counts = bpe_count_files({text}, params);
  const size_t distinct = counts.size();
  const auto t1 = std::chrono::steady_clock::now();
  const BpeModel model = bpe_train_counts(std::move(counts), params);
  const auto t2 = std::chrono::steady_clock::now();
  const double rss_peak = peak_rss_mib();
  bar.finish();
  const double count_s = std::chrono::duration<double>(t1 - t0).count();
  const double merge_s = std::chrono::duration<double>(t2 - t1).count();

  PeerRun peer;
  if (a.has("no-peer")) {
    peer.note = "peer not run (--no-peer)";
  } else {
    std::fprintf(stderr, "running the peer (Hugging Face tokenizers)...\n");
    const std::string args = shell_quote(TESSERA_PEERS_DIR "/bpe_train.py") + " --text " + shell_quote(text) +
                             " --vocab-size " + std::to_string(params.vocab_size) + " --threads " +
                             std::to_string(params.threads) + " --special " + shell_quote(params.special_tokens[0]);
    peer.note = run_peer_script(
        args, "bpe_train.py",
        [&](const nlohmann::json& j) {
          if (!j.contains("seconds") || !j["seconds"].is_number()) return false;
          peer.ok = true;
          peer.seconds = j["seconds"].get<double>();
          peer.rss_before = j.value("rss_before_mib", 0.0);
          peer.peak_rss = j.value("peak_rss_mib", 0.0);
          peer.name = j.value("peer", std::string("tokenizers"));
          peer.vocab = j.value("vocab", int64_t{0});
          for (const auto& m : j.value("merges", nlohmann::json::array()))
            peer.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
          return true;
        },
        peer_timeout);
  }
  size_t agree = 0;
  while (agree < model.merges.size() && agree < peer.merges.size() &&
         hex(model.tokens[model.merges[agree].first]) == peer.merges[agree].first &&
         hex(model.tokens[model.merges[agree].second]) == peer.merges[agree].second)
    ++agree;

  std::string md = "# tessera bench tokenizer-train\n\n";
  md += "- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) + "\n- text: " + text + " (" +
        fmt("%.1f", mb) + " MB), " + std::to_string(distinct) + " distinct pre-tokens\n- vocab " +
        std::to_string(params.vocab_size) + " (special " + params.special_tokens[0] + "), " +
        std::to_string(params.threads) + " threads (tessera's counting threads; the peer's RAYON_NUM_THREADS)\n";
  md += "- peak RSS: getrusage's maxrss of each process after training; \"before\" is that before it began\n";
  if (!peer.note.empty()) md += "- " + peer.note + "\n";
  md += "\n| trainer | seconds | MB/s | counting s | merging s | peak RSS MiB | RSS before MiB | tokens |\n";
  md += "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  // Seconds to the millisecond: CS336's case takes a few.
  md += "| tessera | " + fmt("%.3f", count_s + merge_s) + " | " + fmt("%.1f", mb / (count_s + merge_s)) + " | " +
        fmt("%.3f", count_s) + " | " + fmt("%.3f", merge_s) + " | " + fmt("%.0f", rss_peak) + " | " +
        fmt("%.0f", rss_before) + " | " + std::to_string(model.tokens.size()) + " |\n";
  if (peer.ok) {
    md += "| " + peer.name + " BpeTrainer | " + fmt("%.3f", peer.seconds) + " | " + fmt("%.1f", mb / peer.seconds) +
          " | – | – | " + fmt("%.0f", peer.peak_rss) + " | " + fmt("%.0f", peer.rss_before) + " | " +
          std::to_string(peer.vocab) + " |\n";
    md += "\ntessera is " + fmt("%.2f", peer.seconds / (count_s + merge_s)) + "x as fast; the first " +
          std::to_string(agree) + " of " + std::to_string(std::min(model.merges.size(), peer.merges.size())) +
          " merges agree (Hugging Face reads the file line by line and breaks ties in its own order)\n";
  }
  print_bench_markdown(md, out);
  return 0;
}

}  // namespace tessera::cli
