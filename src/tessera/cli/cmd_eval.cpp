// tessera eval --bleu: corpus BLEU as sacrebleu computes it (infer/bleu.h), and exact match, of a translation
// against one or more references, one segment a line.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/infer/bleu.h"

namespace tessera::cli {

int cmd_eval(int argc, char** argv) {
  Flags a("eval",
          "Scores a translation against its references, one segment a line: corpus BLEU as the sacrebleu package "
          "computes it by default (tessera's C++ port of sacrebleu " +
              std::string(bleu::kSacreBleuVersion) +
              "'s BLEU: 13a tokenizer, case kept, exp smoothing, 4-grams), printed with sacrebleu's signature, and "
              "exact match: the share of lines equal, byte for byte, to one of their references.");
  a.add_switch("bleu", "score BLEU and exact match (the one metric so far, and required)");
  a.add("hyp", "FILE", "the translation (system output), one segment a line");
  a.add_repeated("ref", "FILE", "a reference, one segment a line, as many lines as --hyp; repeat for more references");
  a.add("tokenize", "NAME", "13a (sacrebleu's default), intl (mteval-v14's Unicode punctuation) or none");
  a.add_switch("lowercase",
               "lowercase hypotheses and references first (Python's str.lower(), but a capital sigma ending a word "
               "becomes σ, not ς)");
  a.add_switch("json", "print one JSON object instead of the text lines");
  if (!a.parse(argc, argv, 2)) return 0;
  TS_CHECK(a.has("bleu"), "say what to score: --bleu");
  TS_CHECK(a.has("hyp"), "--hyp FILE is required");
  const std::vector<std::string> ref_files = a.all("ref");
  TS_CHECK(!ref_files.empty(), "--ref FILE is required (repeat it for more references)");
  bleu::Options opt;
  if (a.has("tokenize")) opt.tokenize = bleu::parse_tokenize(a.str("tokenize"));
  opt.lowercase = a.has("lowercase");

  const std::string hyp_file = a.str("hyp");
  const std::vector<std::string> hyps = read_text_lines("hyp", hyp_file);
  TS_CHECK(!hyps.empty(), "--hyp ", hyp_file, " has no lines");
  std::vector<std::vector<std::string>> refs;
  for (const std::string& f : ref_files) {
    refs.push_back(read_text_lines("ref", f));
    TS_CHECK(refs.back().size() == hyps.size(), "--ref ", f, " has ", refs.back().size(), " lines but --hyp ", hyp_file,
             " has ", hyps.size(), ": one reference line is needed for each");
  }

  const bleu::Score s = bleu::corpus_bleu(hyps, refs, opt);
  const bleu::ExactMatch em = bleu::exact_match(hyps, refs);
  const std::string sig = bleu::signature(opt, s.nrefs);
  const std::string impl = std::string("tessera's C++ port of sacrebleu ") + bleu::kSacreBleuVersion +
                           "'s BLEU; the sacrebleu package did not run";
  if (a.has("json")) {
    nlohmann::json j = {{"name", "BLEU"},
                        {"score", s.score},
                        {"signature", sig},
                        {"verbose_score", bleu::verbose_score(s)},
                        {"counts", s.counts},
                        {"totals", s.totals},
                        {"precisions", s.precisions},
                        {"bp", s.bp},
                        {"ratio", s.ratio},
                        {"hyp_len", s.hyp_len},
                        {"ref_len", s.ref_len},
                        {"nrefs", s.nrefs},
                        {"exact_match", {{"matched", em.matched}, {"lines", em.lines}, {"share", em.share()}}},
                        {"implementation", impl}};
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  std::printf("%s\n", bleu::format_score(s, sig).c_str());
  std::printf("exact match = %.2f%% (%lld of %lld lines)\n", 100.0 * em.share(), static_cast<long long>(em.matched),
              static_cast<long long>(em.lines));
  std::printf("(%s)\n", impl.c_str());
  return 0;
}

}  // namespace tessera::cli
