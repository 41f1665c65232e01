// tessera translate: decodes a file of sources, one a line, with an encoder-decoder checkpoint and the seq2seq
// engine (infer/seq2seq_engine.h): greedy or beam search, in batches of sources sorted by length; the outputs are
// written in the input's order, one a line.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/infer/bleu.h"
#include "tessera/infer/seq2seq_engine.h"
#include "tessera/tokenizer/text_codec.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/progress.h"
#include "tessera/train/seq2seq_checkpoint.h"

namespace tessera::cli {

namespace {

void add_translate_flags(Flags& a) {
  a.add("checkpoint", "DIR", "an encoder-decoder checkpoint directory (required)");
  a.add("input", "FILE", "the sources, one a line (required; an empty line is an error)");
  a.add("output", "FILE",
        "where the translations go, one a line in the input's order, a line break inside one written as a space "
        "(default stdout)");
  a.add("batch", "N", "sources per batch, at most (default 64)");
  a.add("max-tokens", "N", "a batch holds at most N source tokens, padding included (default: no limit)");
  a.add("beams", "K", "beam search with K beams, 1..32; 1 = greedy (default 4)");
  a.add("length-penalty", "X", "a finished hypothesis scores sum(logprob) / length^X, as Hugging Face (default 1.0)");
  a.add("max-len-a", "X",
        "the longest target is a * (the batch's longest source) + b tokens, EOS included (default 0)");
  a.add("max-len-b", "N", "see --max-len-a; both capped at the model's positions (default 200)");
  a.add_switch("early-stopping", "a beam entry ends once it holds K finished hypotheses (Hugging Face's true)");
  a.add_repeated("ref", "FILE",
                 "references, one a line as --input: after translating, print to stderr corpus BLEU (sacrebleu's "
                 "default, as tessera eval --bleu) and exact match (repeatable for more references)");
  a.add("device", "cpu|cuda|auto", "where the model runs: auto takes the GPU when there is one (default auto)");
  a.add("precision", "f32|bf16|f16", "the compute dtype: bf16 or f16 on the GPU, f32 on the CPU (default bf16 / f32)");
}

std::vector<std::string> read_sources(const std::string& path) {
  const std::string text = read_file_text(path, "input");
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    TS_CHECK(!line.empty(), "translate: line ", lines.size() + 1, " of ", path, " is empty");
    lines.push_back(std::move(line));
    at = end + 1;
  }
  TS_CHECK(!lines.empty(), "translate: ", path, " holds no sources");
  return lines;
}

// Batches of source indices, sorted by length (ties keep the input's order): at most `batch` sources and
// `max_tokens` padded source tokens each (0: no token limit).
std::vector<std::vector<size_t>> plan_batches(const std::vector<std::vector<int32_t>>& src, int batch,
                                              int64_t max_tokens) {
  std::vector<size_t> order(src.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return src[x].size() < src[y].size(); });
  std::vector<std::vector<size_t>> out;
  for (size_t i : order) {
    const int64_t L = static_cast<int64_t>(src[i].size());
    // Sorted ascending, so the batch's longest source is the newest one.
    if (out.empty() || static_cast<int>(out.back().size()) == batch ||
        (max_tokens > 0 && L * static_cast<int64_t>(out.back().size() + 1) > max_tokens))
      out.emplace_back();
    out.back().push_back(i);
  }
  return out;
}

}  // namespace

int cmd_translate(int argc, char** argv) {
  Flags a("translate",
          "Translates a file of sources, one a line, with an encoder-decoder checkpoint: beam search (or greedy\n"
          "with --beams 1) in batches of sources of similar length. Text goes through the checkpoint's\n"
          "tokenizer.json, or bytes where it has none. The outputs are written one a line, in the input's order.");
  add_translate_flags(a);
  if (!a.parse(argc, argv, 2)) return 0;
  TS_CHECK(a.has("checkpoint"), "translate: --checkpoint DIR is required");
  TS_CHECK(a.has("input"), "translate: --input FILE is required");
  const int batch = a.integer("batch", 64), beams = a.integer("beams", 4);
  const int64_t max_tokens = a.integer("max-tokens", 0);
  TS_CHECK(batch >= 1, "--batch must be >= 1, got ", batch);
  TS_CHECK(max_tokens >= 0, "--max-tokens must be >= 0, got ", max_tokens);
  TS_CHECK(beams >= 1 && beams <= 32, "--beams must be in [1, 32], got ", beams);
  const double len_a = a.number("max-len-a", 0.0);
  const int len_b = a.integer("max-len-b", 200);
  TS_CHECK(std::isfinite(len_a) && len_a >= 0, "--max-len-a must be >= 0, got ", len_a);
  TS_CHECK(len_b >= 0, "--max-len-b must be >= 0, got ", len_b);
  const float length_penalty = a.number_f32("length-penalty", 1.0f);
  TS_CHECK(std::isfinite(length_penalty), "--length-penalty must be finite");
  const InferenceDevice dev = read_inference_device(a);
  const bool gpu = dev.gpu;
  const DType dtype = dev.dtype;
  const std::vector<std::string> texts = read_sources(a.str("input"));
  if (a.has("output")) check_file_writable(a.str("output"), "--output");
  std::vector<std::vector<std::string>> refs;
  for (const std::string& f : a.all("ref")) {
    refs.push_back(read_text_lines("ref", f));
    TS_CHECK(refs.back().size() == texts.size(), "--ref ", f, " has ", refs.back().size(), " lines but --input has ",
             texts.size(), ": one reference line is needed for each source");
  }

  const std::string ckpt = resolve_checkpoint_dir(a.str("checkpoint"));
  TS_CHECK(std::filesystem::exists(ckpt), "checkpoint ", a.str("checkpoint"), " does not exist");
  TS_CHECK(is_seq2seq_checkpoint(ckpt), "translate: ", a.str("checkpoint"),
           " is not an encoder-decoder checkpoint (a decoder-only model continues text with tessera generate)");
  Context ctx(gpu ? Device::cuda(0) : Device::cpu());
  std::unique_ptr<EncoderDecoder> model = load_seq2seq_checkpoint(ckpt, ctx, dtype);
  const EncDecConfig& cfg = model->config();
  const TextCodec codec = TextCodec::for_checkpoint(ckpt, cfg.vocab);
  std::vector<std::vector<int32_t>> src;
  for (size_t i = 0; i < texts.size(); ++i) {
    src.push_back(codec.encode(texts[i]));
    TS_CHECK(!src.back().empty(), "translate: line ", i + 1, " has no tokens");
    TS_CHECK(static_cast<int>(src.back().size()) <= cfg.max_seq, "translate: line ", i + 1, " has ", src.back().size(),
             " tokens, more than the model's ", cfg.max_seq, " positions");
  }
  // fairseq's rule: max target length = a * (the batch's longest source) + b, here EOS included and at most the
  // model's positions.
  const auto max_len = [&](size_t L) {
    const double m = std::floor(len_a * static_cast<double>(L)) + len_b;
    return static_cast<int>(std::clamp(m, 1.0, static_cast<double>(cfg.max_seq)));
  };
  const std::vector<std::vector<size_t>> batches = plan_batches(src, batch, max_tokens);
  int widest = 0, longest = 0;
  for (const auto& b : batches) {
    widest = std::max(widest, static_cast<int>(b.size()));
    longest = std::max(longest, max_len(src[b.back()].size()));
  }
  Seq2SeqEngine engine(*model, {.batch = widest, .beams = beams, .max_src = cfg.max_seq, .max_tgt = longest});
  std::vector<std::vector<int32_t>> out(src.size());
  ProgressBar bar(static_cast<int64_t>(src.size()), 0, ::isatty(2) != 0, {.unit = "sentence", .eta = true});
  int64_t done = 0;
  for (const auto& b : batches) {
    std::vector<std::vector<int32_t>> part;
    for (size_t i : b) part.push_back(src[i]);
    const int limit = max_len(part.back().size());
    if (beams == 1) {
      const auto got = seq2seq_greedy(engine, part, std::vector<int>(part.size(), limit));
      for (size_t j = 0; j < b.size(); ++j) out[b[j]] = got[j];
    } else {
      const auto got = seq2seq_beam(engine, part,
                                    {.beams = beams,
                                     .max_new_tokens = limit,
                                     .eos_id = cfg.eos_id,
                                     .pad_id = cfg.pad_id,
                                     .length_penalty = length_penalty,
                                     .early_stopping = a.has("early-stopping") ? beam::EarlyStopping::True
                                                                               : beam::EarlyStopping::False});
      for (size_t j = 0; j < b.size(); ++j) {
        std::vector<int32_t> t = got[j].front().tokens;
        if (!t.empty() && t.back() == cfg.eos_id) t.pop_back();
        out[b[j]] = std::move(t);
      }
    }
    done += static_cast<int64_t>(b.size());
    bar.update(done, "");
  }
  bar.finish();
  std::string text;
  std::vector<std::string> hyps;
  for (const auto& t : out) {
    // One translation a line: a line break the model writes inside one becomes a space.
    std::string line = codec.decode(t);
    std::replace_if(
        line.begin(), line.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
    text += line + "\n";
    hyps.push_back(std::move(line));
  }
  if (a.has("output")) write_file_atomic(a.str("output"), text);
  else std::fwrite(text.data(), 1, text.size(), stdout);
  if (!refs.empty()) {  // after the translations, on stderr, as fairseq-generate ends with its BLEU line
    std::fflush(stdout);
    for (size_t i = 0; i < hyps.size(); ++i)
      if (const size_t bad = bleu::invalid_utf8_at(hyps[i]); bad != 0) {
        // sacrebleu reads text: a byte-level model's stray bytes leave nothing to score (the translations stand).
        std::fprintf(stderr, "translate: no BLEU: translation %zu is not valid UTF-8 (byte %zu)\n", i + 1, bad);
        return 0;
      }
    const bleu::Score s = bleu::corpus_bleu(hyps, refs);
    const bleu::ExactMatch em = bleu::exact_match(hyps, refs);
    std::fprintf(stderr, "%s\nexact match = %.2f%% (%lld of %lld lines)\n",
                 bleu::format_score(s, bleu::signature({}, s.nrefs)).c_str(), 100.0 * em.share(),
                 static_cast<long long>(em.matched), static_cast<long long>(em.lines));
  }
  return 0;
}

}  // namespace tessera::cli
