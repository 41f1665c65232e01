// tessera make-task: a synthetic translation set (train/synthetic_task.h) as a TSV file, source<TAB>target a line.
#include <cstdio>
#include <string>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/train/synthetic_task.h"

namespace tessera::cli {

namespace {
// The largest --pairs: the file is built in memory before its one atomic write.
constexpr uint64_t kMaxTaskPairs = uint64_t{100'000'000};
}  // namespace

int cmd_make_task(int argc, char** argv) {
  Flags a("make-task",
          "Writes a deterministic synthetic translation set: a TSV file of source<TAB>target pairs, one a line, for "
          "prepare --pairs.");
  a.add("task", "NAME",
        "copy, reverse, sort (sequences of letters a-z, space-separated: \"q b x\" -> \"x b q\" for reverse), or "
        "digits-to-words (\"907\" -> \"nine hundred seven\": American short scale, no \"and\", no hyphens)");
  a.add("pairs", "N", "how many pairs (lines) to write");
  a.add("out", "FILE", "the TSV file, written atomically");
  a.add("seed", "S", "the seed: the same seed gives the same file on every platform (default 0)");
  a.add("min-len", "N", "the shortest source: symbols, or digits for digits-to-words (default 3, or 1 digit)");
  a.add("max-len", "N", "the longest source (default 12, or 6 digits; digits-to-words at most 18)");
  if (!a.parse(argc, argv, 2)) return 0;
  TS_CHECK(a.has("task"), "--task NAME is required (copy, reverse, sort or digits-to-words)");
  TS_CHECK(a.has("pairs"), "--pairs N is required");
  TS_CHECK(a.has("out"), "--out FILE is required");
  SyntheticTaskParams p{.task = parse_synthetic_task(a.str("task")),
                        .pairs = a.u64("pairs", 0),
                        .seed = a.u64("seed", 0),
                        .min_len = a.integer("min-len", 0),
                        .max_len = a.integer("max-len", 0)};
  TS_CHECK(p.pairs >= 1 && p.pairs <= kMaxTaskPairs, "--pairs must be in [1, ", kMaxTaskPairs, "], got ",
           a.str("pairs"));
  for (const char* f : {"min-len", "max-len"})
    TS_CHECK(!a.has(f) || a.integer(f, 0) >= 1, "--", f, " must be at least 1, got ", a.str(f));
  const std::string out = a.str("out");
  check_output_path("out", out);
  std::string tsv;
  for (const auto& [source, target] : make_synthetic_pairs(p)) tsv.append(source).append("\t").append(target) += '\n';
  write_file_atomic(out, tsv);
  std::printf("wrote %s of %s to %s\n", counted(p.pairs, "pair").c_str(), synthetic_task_name(p.task), out.c_str());
  return 0;
}

}  // namespace tessera::cli
