// tessera bench end to end on the CPU (small shapes, two timed runs): every kernel gets a row with a positive,
// finite bandwidth, and bad flags are one-line errors with exit code 2. No timing is asserted.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run.h"
#include "tessera/bench/harness.h"
#include "tessera/core/context.h"
#include "tessera/core/file_io.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// `tessera bench args`.
test::CliRun run_bench(const std::string& args) { return test::run("bench " + args); }

using test::table_rows;
using test::trim;

// `text` with every run of digits as one '#': two runs' outputs then compare, whatever their timings and dates.
using test::without_numbers;

class Bench : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("tessera_bench_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  // Every name in `kernels` has a row in the markdown file with a positive, finite GB/s.
  void expect_rows(const fs::path& md, const std::vector<std::string>& kernels) {
    ASSERT_TRUE(fs::exists(md));
    std::vector<std::string> header;
    const auto rows = table_rows(read_file_text(md.string()), "kernel", &header);
    size_t gbs_col = header.size();
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == "GB/s") gbs_col = i;
    ASSERT_LT(gbs_col, header.size()) << "no GB/s column";
    EXPECT_EQ(rows.size(), kernels.size());
    for (const std::string& k : kernels) {
      ASSERT_TRUE(rows.count(k)) << "no row for " << k;
      const double gbs = std::stod(rows.at(k).at(gbs_col));
      EXPECT_TRUE(std::isfinite(gbs) && gbs > 0) << k << ": " << rows.at(k).at(gbs_col);
    }
  }

  // `err` is the progress bar off a terminal: a line as each of `rows` starts ("[#...] <unit> i/n | running <row> |
  // ... elapsed"), then "done", and nothing else.
  // The bar's lines, one a row, then (with --out) the line that says the file was written, on stderr too.
  void expect_progress(const std::string& err, const char* unit, const std::vector<std::string>& rows,
                       const fs::path& md = {}) {
    std::istringstream lines(err);
    std::string line;
    for (size_t i = 0; i <= rows.size(); ++i) {
      ASSERT_TRUE(std::getline(lines, line)) << "no line for " << unit << " " << i << " in:\n" << err;
      const std::string count = "] " + std::string(unit) + " " + std::to_string(i) + "/" + std::to_string(rows.size()) +
                                " | ";
      const std::string what = i < rows.size() ? "running " + rows[i] : "done";
      EXPECT_EQ(line.rfind('[', 0), 0u) << line;
      EXPECT_NE(line.find(count + what + " | "), std::string::npos) << "expected '" << count << what << "' in " << line;
      EXPECT_TRUE(line.ends_with(" elapsed")) << line;
    }
    if (!md.empty()) {
      ASSERT_TRUE(std::getline(lines, line)) << err;
      EXPECT_EQ(line, "wrote " + md.string());
    }
    EXPECT_FALSE(std::getline(lines, line)) << "more than a line a " << unit << ": " << err;
  }

  // `args` run again with --no-progress: nothing on stderr, and stdout and the --out file `md` as run `r` left
  // them (`with_md`), timings and dates aside.
  void expect_same_without_progress(const std::string& args, const test::CliRun& r, const fs::path& md,
                                    const std::string& with_md) {
    const test::CliRun quiet = run_bench(args + " --no-progress");
    ASSERT_EQ(quiet.code, 0) << quiet.err;
    EXPECT_EQ(quiet.err, "wrote " + md.string() + "\n");
    EXPECT_EQ(without_numbers(quiet.out), without_numbers(r.out));
    EXPECT_EQ(without_numbers(read_file_text(md.string())), without_numbers(with_md));
  }

  void expect_usage_error(const std::string& args, const std::string& names) {
    const test::CliRun r = run_bench(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("tessera: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(names), std::string::npos) << r.err;
  }
};

TEST_F(Bench, KernelsSmallOnCpuWritesARowPerKernel) {
  const fs::path md = dir / "kernels.md";
  const test::CliRun r =
      run_bench("kernels --size small --device cpu --iters 2 --warmup 1 --no-progress --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "wrote " + md.string() + "\n");  // stdout is the table alone
  expect_rows(md, {"embedding fwd", "embedding bwd", "embedding bwd (no positions)", "embedding bwd (zipf ids)",
                   "layernorm fwd", "layernorm bwd", "residual fwd", "residual bwd", "gelu fwd", "gelu bwd",
                   "swiglu fwd", "swiglu bwd", "cross-entropy fwd+bwd", "cross-entropy fused fwd+bwd"});
  EXPECT_NE(r.out.find("| layernorm fwd |"), std::string::npos) << "the table goes to stdout too";
}

// --only runs the families named, in table order whatever the order given, a family named twice once.
TEST_F(Bench, KernelsOnlyRunsTheFamiliesNamed) {
  const fs::path md = dir / "kernels.md";
  const test::CliRun r = run_bench(
      "kernels --size small --device cpu --iters 1 --warmup 0 --only residual,embedding,residual --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  expect_rows(md, {"embedding fwd", "embedding bwd", "embedding bwd (no positions)", "embedding bwd (zipf ids)",
                   "residual fwd", "residual bwd"});
  const fs::path ce = dir / "ce.md";
  ASSERT_EQ(run_bench("kernels --size small --device cpu --iters 1 --warmup 0 --only cross-entropy --out " +
                      ce.string())
                .code,
            0);
  expect_rows(ce, {"cross-entropy fwd+bwd", "cross-entropy fused fwd+bwd"});
}

// On a GPU each row is set against the 1 GiB copy and against a copy of its own size: both columns are there and
// hold percentages (no timing is asserted).
TEST_F(Bench, KernelsOnGpuSetEachRowAgainstBothCopies) {
  if (!probe_gpu().available) GTEST_SKIP() << "no GPU visible";
  const fs::path md = dir / "kernels.md";
  const test::CliRun r = run_bench("kernels --size small --device cuda --iters 2 --warmup 1 --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> header;
  const auto rows = table_rows(read_file_text(md.string()), "kernel", &header);
  const auto col = [&](const std::string& name) {
    return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  const size_t big = col("% of copy"), same = col("% of same-size copy"), same_gbs = col("same-size copy GB/s");
  ASSERT_LT(big, header.size());
  ASSERT_LT(same, header.size());
  ASSERT_LT(same_gbs, header.size());
  ASSERT_FALSE(rows.empty());
  // The small shapes move kilobytes, which may round to 0% of either copy; the copy's own rate cannot be 0.
  for (const auto& [kernel, cells] : rows) {
    for (const size_t c : {big, same}) {
      const std::string& cell = cells.at(c);
      ASSERT_EQ(cell.back(), '%') << kernel << ": " << cell;
      const double pct = std::stod(cell);
      EXPECT_TRUE(std::isfinite(pct) && pct >= 0) << kernel << ": " << cell;
    }
    const double gbs = std::stod(cells.at(same_gbs));
    EXPECT_TRUE(std::isfinite(gbs) && gbs > 0) << kernel << ": " << cells.at(same_gbs);
  }
}

// --size large runs full's widths over 4x the rows (kernels.h), without the cross-entropy rows.
TEST_F(Bench, KernelsLargeOnGpuHasFourTimesTheRowsAndNoCrossEntropy) {
  if (!probe_gpu().available) GTEST_SKIP() << "no GPU visible";
  const fs::path md = dir / "kernels.md";
  const test::CliRun r = run_bench("kernels --size large --device cuda --iters 1 --warmup 0 --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  expect_rows(md, {"embedding fwd", "embedding bwd", "embedding bwd (no positions)", "embedding bwd (zipf ids)",
                   "layernorm fwd", "layernorm bwd", "residual fwd", "residual bwd", "gelu fwd", "gelu bwd",
                   "swiglu fwd", "swiglu bwd"});
  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("| layernorm fwd | (65536, 768) |"), std::string::npos) << text;
  EXPECT_NE(text.find("size large"), std::string::npos) << text;
}

// bench kernels --size full ran for about 7 minutes on the CPU with nothing printed until its table. It shows
// progress on stderr as bench attention does, a line as each row starts (off a terminal, each of these rows is more
// than 5%); stdout and --out are as without it (--no-progress). bench optimizer counts its two rows the same way.
TEST_F(Bench, KernelsAndOptimizerShowProgressOnStderrOnly) {
  const fs::path md = dir / "kernels.md";
  const std::string args = "kernels --device cpu --iters 1 --warmup 0 --only layernorm,embedding --out " + md.string();
  const test::CliRun r = run_bench(args);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string with_md = read_file_text(md.string());
  expect_progress(r.err, "row",
                  {"embedding fwd", "embedding bwd", "embedding bwd (no positions)", "embedding bwd (zipf ids)",
                   "layernorm fwd", "layernorm bwd"},
                  md);
  EXPECT_EQ(r.out.find("running"), std::string::npos) << r.out;
  expect_same_without_progress(args, r, md, with_md);
  // Every family: the bar's total is the table's row count.
  const test::CliRun all = run_bench("kernels --device cpu --iters 1 --warmup 0");
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_NE(all.err.find("] row 14/14 | done | "), std::string::npos) << all.err;
  const test::CliRun opt = run_bench("optimizer --size small --device cpu --iters 1 --warmup 0");
  ASSERT_EQ(opt.code, 0) << opt.err;
  expect_progress(opt.err, "row", {"adamw step", "adamw step+clip"});
}

TEST_F(Bench, OptimizerSmallOnCpu) {
  const fs::path md = dir / "optimizer.md";
  const test::CliRun r = run_bench("optimizer --size small --device cpu --iters 2 --warmup 1 --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  expect_rows(md, {"adamw step", "adamw step+clip"});
  EXPECT_NE(read_file_text(md.string()).find("tiny: 834304 params"), std::string::npos);
}

TEST_F(Bench, AttentionSmallOnCpuFillsBothTables) {
  const fs::path md = dir / "attention.md";
  const test::CliRun r = run_bench("attention --device cpu --iters 2 --warmup 1 --peer --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("peer skipped"), std::string::npos);
  // Every (impl, d, T) of the small sweep has a row with a positive forward time, and the naive rows hold the
  // (B, T, T) matrices, so they need more memory than flash during the backward.
  //
  // The memory columns, by hand (f32 on the CPU, B = 2, one head, N = B·T rows, C = d): every row holds
  // qkv (3NC), out and dO (NC each) and lse (N); naive keeps Q, K, V (3NC) and P (B·T·T) for its backward. During
  // the backward both add dqkv (3NC); naive also dO, dQ, dK, dV split by heads (4NC) and dP (B·T·T); flash on the
  // CPU nothing more. A term left out (naive's backward temporaries, say) still leaves naive above flash, which
  // is why the cells are checked against these sums and not only against each other. Printed with 2 decimals.
  auto expect_mib = [](const std::string& cell, double elems, const std::string& what) {
    EXPECT_NEAR(std::stod(cell), elems * 4 / (1024.0 * 1024.0), 0.0051) << what;
  };
  std::map<std::string, double> during;
  for (const char* impl : {"tessera naive", "tessera flash"})
    for (int d : {16, 32})
      for (int T : {16, 64}) {
        const std::string key = std::string("| ") + impl + " | " + std::to_string(d) + " | " + std::to_string(T) +
                                " | ";
        const size_t at = text.find(key);
        ASSERT_NE(at, std::string::npos) << "no row " << key;
        std::vector<std::string> cells;
        std::istringstream in(text.substr(at + key.size(), text.find('\n', at) - at - key.size()));
        for (std::string c; std::getline(in, c, '|');) cells.push_back(trim(c));
        ASSERT_GE(cells.size(), 4u) << key;
        EXPECT_GT(std::stod(cells[0]), 0.0) << key << " fwd ms";
        EXPECT_GT(std::stod(cells[1]), 0.0) << key << " bwd ms";
        during[key] = std::stod(cells[3]);
        const bool naive = std::string(impl) == "tessera naive";
        const double B = 2, N = B * T, NC = N * d, inputs = 5 * NC + N, grad = 3 * NC;
        const double before = inputs + (naive ? 3 * NC + B * T * T : 0.0);
        expect_mib(cells[2], before, key + "MiB before bwd");
        expect_mib(cells[3], before + grad + (naive ? 4 * NC + B * T * T : 0.0), key + "MiB during bwd");
      }
  EXPECT_GT(during["| tessera naive | 32 | 64 | "], during["| tessera flash | 32 | 64 | "]);
  // The TFLOP/s cells are nonzero on the CPU too (printed with one decimal they all read "0.0").
  for (int Dh : {32, 64})
    for (int T : {64, 128}) {
      const std::string key = "| tessera flash | " + std::to_string(Dh) + " | " + std::to_string(T) + " | ";
      const size_t at = text.find(key, text.find("## TFLOP"));
      ASSERT_NE(at, std::string::npos) << "no TFLOP/s row for Dh " << Dh << " T " << T;
      std::vector<std::string> cells;  // B × H, fwd ms, fwd+bwd ms, fwd TFLOP/s, fwd+bwd TFLOP/s
      std::istringstream in(text.substr(at + key.size(), text.find('\n', at) - at - key.size()));
      for (std::string c; std::getline(in, c, '|');) cells.push_back(trim(c));
      ASSERT_GE(cells.size(), 5u) << key;
      EXPECT_GT(std::stod(cells[3]), 0.0) << key << " fwd TFLOP/s: " << cells[3];
      EXPECT_GT(std::stod(cells[4]), 0.0) << key << " fwd+bwd TFLOP/s: " << cells[4];
    }
}

// bench attention --size full ran for about 9 minutes on the CPU with nothing printed until its tables. It shows
// progress on stderr as train does (a bar redrawn on a terminal; off one, a line every 5%: here each of the 12
// configurations), naming each configuration as it starts; stdout and --out are as without it (--no-progress).
TEST_F(Bench, AttentionShowsProgressOnStderrOnly) {
  const fs::path md = dir / "attention.md";
  const std::string args = "attention --device cpu --iters 1 --warmup 0 --out " + md.string();
  const test::CliRun r = run_bench(args);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string with_md = read_file_text(md.string());
  std::vector<std::string> rows;
  for (int d : {16, 32})
    for (int T : {16, 64})
      for (const char* impl : {"naive", "flash"})
        rows.push_back(std::string("tessera ") + impl + " d " + std::to_string(d) + " T " + std::to_string(T));
  for (int Dh : {32, 64})
    for (int T : {64, 128}) rows.push_back("tessera flash causal Dh " + std::to_string(Dh) + " T " + std::to_string(T));
  expect_progress(r.err, "config", rows, md);
  EXPECT_EQ(r.out.find("config "), std::string::npos) << r.out;
  expect_same_without_progress(args, r, md, with_md);
}

// --attn-dropout runs the TFLOP/s table with attention dropout (the CPU reference takes it too) and says so.
TEST_F(Bench, AttentionDropoutRunsTheFlopsTableWithIt) {
  const fs::path md = dir / "dropout.md";
  const test::CliRun r =
      run_bench("attention --size small --device cpu --iters 1 --warmup 0 --attn-dropout 0.2 --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("width 128, attention dropout 0.2 (tessera and the peers)"), std::string::npos) << text;
  EXPECT_NE(text.find("| tessera flash | 64 | 128 | "), std::string::npos) << text;
}

// --head-dims replaces the TFLOP/s table's head dims (width / Dh heads each, rounded down: 128 / 40 = 3), and the
// progress bar counts its rows: 8 of the CS336 table, then 3 dims x 2 T.
TEST_F(Bench, AttentionHeadDimsChooseTheFlopsTablesRows) {
  const fs::path md = dir / "dims.md";
  const test::CliRun r =
      run_bench("attention --size small --device cpu --iters 1 --warmup 0 --head-dims 16,40,8 --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("| tessera flash | 16 | 64 | 4 × 8 | "), std::string::npos) << text;
  EXPECT_NE(text.find("| tessera flash | 40 | 128 | 2 × 3 | "), std::string::npos) << text;
  EXPECT_NE(text.find("| tessera flash | 8 | 128 | 2 × 16 | "), std::string::npos) << text;
  EXPECT_EQ(text.find("| tessera flash | 64 | 128 | "), std::string::npos) << text;  // the default's row
  EXPECT_NE(r.err.find("] config 14/14 | done | "), std::string::npos) << r.err;
}

// --gqa G runs the TFLOP/s table through the packed call with H / G KV heads, leaving out the head dims whose
// heads G does not divide (128 / 40 = 3 heads at G 2), and the progress bar counts only the rows it runs.
TEST_F(Bench, AttentionGqaRunsGroupedHeads) {
  const fs::path md = dir / "gqa.md";
  const test::CliRun r = run_bench(
      "attention --size small --device cpu --iters 1 --warmup 0 --head-dims 16,40 --gqa 2 "
      "--out " +
      md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = read_file_text(md.string());
  EXPECT_NE(text.find("| tessera flash (GQA 2) | 16 | 64 | 4 × 8 | "), std::string::npos) << text;
  EXPECT_EQ(text.find("| 40 | 128 |"), std::string::npos) << text;
  EXPECT_NE(r.err.find("] config 10/10 | done | "), std::string::npos) << r.err;
  expect_usage_error("attention --device cpu --gqa 0", "--gqa must be >= 1, got 0");
  expect_usage_error("attention --device cpu --gqa 2 --peer", "--gqa 2: the PyTorch peers run multi-head");
}

TEST_F(Bench, PeerOnCpuIsSkippedWithANote) {
  const fs::path md = dir / "peer.md";
  const test::CliRun r =
      run_bench("optimizer --size small --device cpu --iters 1 --warmup 0 --peer --out " + md.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(read_file_text(md.string()).find("peer skipped"), std::string::npos);
}

// Out of memory at --size full said nothing of the flag that sizes the work (and where std::bad_alloc was thrown, a
// bare "out of memory"): the line now names --size small, which runs under the same limit. In a 128 MiB address
// space bench kernels' first full tensor does not fit (tessera's Error); in 256 MiB it does but its random fill
// does not (std::bad_alloc), nor do AdamW's gpt2-124m parameters or attention's naive scores at T 4096. bench
// kernels --size large says the same.
TEST_F(Bench, OutOfMemoryAtSizeFullOrLargeNamesSizeSmall) {
  TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY();
  for (const auto& [which, mib] : {std::pair{"kernels", 128}, std::pair{"kernels", 256}, std::pair{"optimizer", 256},
                                   std::pair{"attention", 256}}) {
    const std::string args = std::string("bench ") + which + " --device cpu --warmup 0 --iters 1 --size ";
    SCOPED_TRACE(std::string(which) + " in " + std::to_string(mib) + " MiB");
    const test::CliRun full = test::run_with_address_limit(mib, args + "full");
    EXPECT_EQ(full.code, 2) << full.err;
    // bench attention's progress lines come first ("[###...] config 2/46 | running ..."): the error is the last.
    const size_t error = full.err.find("tessera: error: ");
    ASSERT_NE(error, std::string::npos) << full.err;
    std::istringstream progress(full.err.substr(0, error));
    for (std::string line; std::getline(progress, line);) EXPECT_EQ(line.rfind('[', 0), 0u) << full.err;
    EXPECT_EQ(full.err.find("tessera: error: out of memory", error), error) << full.err;
    EXPECT_EQ(std::count(full.err.begin() + static_cast<std::ptrdiff_t>(error), full.err.end(), '\n'), 1) << full.err;
    EXPECT_TRUE(full.err.ends_with(" (try --size small)\n")) << full.err;
    const test::CliRun small = test::run_with_address_limit(mib, args + "small");
    EXPECT_EQ(small.code, 0) << small.err;
  }
  const test::CliRun large =
      test::run_with_address_limit(256, "bench kernels --device cpu --warmup 0 --iters 1 --size large");
  EXPECT_EQ(large.code, 2) << large.err;
  EXPECT_EQ(large.err.rfind("tessera: error: out of memory", 0), 0u) << large.err;
  EXPECT_EQ(std::count(large.err.begin(), large.err.end(), '\n'), 1) << large.err;
  EXPECT_TRUE(large.err.ends_with(" (try --size small)\n")) << large.err;
}

TEST_F(Bench, BadFlagsAreOneLineErrors) {
  expect_usage_error("kernels --device cpu --itres 2", "--iters");
  expect_usage_error("kernels --device cpu --size huge", "--size");
  expect_usage_error("optimizer --device cpu --size large", "--size large applies to bench kernels only");
  expect_usage_error("kernels --device cpu --dtype bf16", "--dtype");
  expect_usage_error("kernels --device cpu --iters 0", "--iters");
  expect_usage_error("kernels --device cpu --warmup -1", "--warmup");
  expect_usage_error("kernels --device tpu", "tpu");
  expect_usage_error("speed", "speed");
  expect_usage_error("kernels --device cpu --out " + (dir / "missing" / "x.md").string(), "--out");
  expect_usage_error("attention --device cpu --out " + dir.string(), "is a directory; give a file name");
  expect_usage_error("attention --device cpu --attn-dropout 1", "--attn-dropout must be in [0, 1)");
  expect_usage_error("attention --device cpu --attn-dropout -0.1", "--attn-dropout must be in [0, 1)");
  expect_usage_error("attention --device cpu --head-dims 64,x",
                     "--head-dims: 'x' is not a head dim from 1 to 128 (the table's width) in '64,x'");
  expect_usage_error("attention --device cpu --head-dims 0", "--head-dims: '0' is not a head dim");
  expect_usage_error("attention --device cpu --head-dims 64,", "--head-dims: '' is not a head dim");
  expect_usage_error("attention --device cpu --head-dims +5", "--head-dims: '+5' is not a head dim");
  expect_usage_error("attention --device cpu --head-dims '64, 32'", "--head-dims: ' 32' is not a head dim");
  expect_usage_error("attention --device cpu --head-dims 32,64,32", "--head-dims: 32 is listed twice in '32,64,32'");
  // Two flags on one file: the second write replaced the first, and both said "wrote".
  const std::string same = (dir / "same").string(), x = (dir / "x").string();
  expect_usage_error("model --device cpu --preset tiny --out " + same + " --json " + (dir / "." / "same").string(),
                     "--json " + (dir / "." / "same").string() + " is also --out's file");
  expect_usage_error("model --device cpu --preset tiny --csv " + x + ".csv --memory-timeline " + x + ".png",
                     "--memory-timeline's CSV " + x + ".csv is also --csv's file");
  expect_usage_error("model --device cpu --preset tiny --trace " + x + ".json --json " + x + ".json",
                     "--trace " + x + ".json is also --json's file");
  expect_usage_error("compare --device cpu --preset tiny --json " + same + " --csv " + same,
                     "--csv " + same + " is also --json's file");
  EXPECT_FALSE(fs::exists(same));
  expect_usage_error("kernels --device cpu --only gemm",
                     "--only: unknown kernel family 'gemm' (expected a comma list of embedding, layernorm, residual, "
                     "gelu, swiglu, cross-entropy)");
  expect_usage_error("kernels --device cpu --only embedding,", "--only: unknown kernel family ''");
  expect_usage_error("kernels --device cpu --size large --only cross-entropy",
                     "--size large has no cross-entropy rows");
  expect_usage_error("optimizer --device cpu --only embedding", "unknown flag --only");
  EXPECT_FALSE(fs::exists(dir / "x.md"));
}

TEST(BenchHarness, SummaryIsTheMedianMinAndMax) {
  const Timing odd = timing_summary({5, 1, 3});
  EXPECT_EQ(odd.median_ms, 3);
  EXPECT_EQ(odd.min_ms, 1);
  EXPECT_EQ(odd.max_ms, 5);
  EXPECT_EQ(odd.iters, 3);
  EXPECT_EQ(timing_summary({4, 1, 2, 10}).median_ms, 3);  // the mean of the middle two
}

TEST(BenchHarness, CpuTimingRunsWarmupThenIters) {
  Context ctx;
  BenchHarness h(ctx);
  int calls = 0;
  const Timing t = h.time([&] { ++calls; }, {.warmup = 3, .iters = 4});
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(t.iters, 4);
  EXPECT_LE(t.min_ms, t.median_ms);
  EXPECT_LE(t.median_ms, t.max_ms);
}

}  // namespace
}  // namespace tessera
