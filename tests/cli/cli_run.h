// Runs the tessera binary under test through the shell, for the CLI and bench tests.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "tessera/core/file_io.h"

namespace tessera::test {

struct CliRun {
  int code = -1;
  std::string out, err;
};

// The binary under test; TESSERA_TEST_BINARY points the tests at another build (e.g. an older one, to watch
// a new test fail there).
inline std::string binary() {
  const char* b = std::getenv("TESSERA_TEST_BINARY");
  return b && *b ? b : TESSERA_BINARY;
}

// Runs `tessera args` (in `cwd` when given, after the shell words `prefix`) with no standard input; stdout and
// stderr come back apart.
inline CliRun run_after(const std::string& prefix, const std::string& args, const std::filesystem::path& cwd = {}) {
  namespace fs = std::filesystem;
  const fs::path err_file = fs::temp_directory_path() / ("tessera_cli_err_" + std::to_string(::getpid()));
  const std::string cmd = (cwd.empty() ? "" : "cd '" + cwd.string() + "' && ") + prefix + binary() + " " + args +
                          " 2>" + err_file.string() + " </dev/null";
  CliRun r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file_text(err_file.string());
  fs::remove(err_file);
  return r;
}

inline CliRun run(const std::string& args, const std::filesystem::path& cwd = {}) { return run_after("", args, cwd); }

// AddressSanitizer reserves terabytes of address space for its shadow memory as a process starts, so under an
// address limit (ulimit -v) a sanitized tessera cannot start at all: the tests that impose one skip in that build
// (scripts/test_sanitize.sh), and run in every other.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressLimitsApply = false;
#else
inline constexpr bool kAddressLimitsApply = true;
#endif
#define TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY() \
  if (!::tessera::test::kAddressLimitsApply) \
  GTEST_SKIP() << "built with AddressSanitizer, whose shadow memory no address limit leaves room for"

// The prefix that runs tessera with its address space limited to `mib` MiB (ulimit -v), with one OpenMP and
// OpenBLAS thread: each thread reserves address space, and a run that could not start its threads spun instead of
// failing.
inline std::string address_limit_prefix(size_t mib) {
  return "ulimit -v " + std::to_string(mib * 1024) + " && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ";
}

// The smallest address limit (ulimit -v), to 16 MiB, under which `runs(mib)` succeeds, found by doubling from `from`
// MiB, then halving the gap. A limit that still fails at 1 TiB is returned as is: the caller's run then fails and
// says why.
inline size_t smallest_address_limit_mib(const std::function<bool(size_t)>& runs, size_t from = 64) {
  size_t lo = 0, hi = from;
  while (!runs(hi)) {
    lo = hi;
    hi *= 2;
    if (hi > (size_t{1} << 20)) return hi;
  }
  while (hi - lo > 16) {
    const size_t mid = (lo + hi) / 2;
    (runs(mid) ? hi : lo) = mid;
  }
  return hi;
}

// The address space tessera takes before it does anything, to 16 MiB: its shared libraries. It depends on the
// build: built with CUDA, cuBLASLt alone maps hundreds of MiB, and under a limit below that the loader refuses to
// start the binary at all. Found once per test process, from `tessera --version`. A command may take more than this
// before its own work on a machine with a GPU driver or more cores (libcuda, MPI's threads): tests that bound what
// the work itself adds measure their baseline with the same command on a trivial input.
inline size_t startup_address_mib() {
  static const size_t mib =
      smallest_address_limit_mib([](size_t m) { return run_after(address_limit_prefix(m), "--version").code == 0; });
  return mib;
}

// Runs `tessera args` with `mib` MiB of address space beyond what the binary takes to start (ulimit -v): an
// allocation past it fails although MemAvailable allows it, as in a shell where a user or a batch system set that
// limit.
inline CliRun run_with_address_limit(size_t mib, const std::string& args) {
  return run_after(address_limit_prefix(startup_address_mib() + mib), args);
}

// `train` arguments for a tiny CPU run of 4 steps into `out` (seconds), plus `extra`.
inline std::string small_train_args(const std::filesystem::path& out, const std::string& extra) {
  return "train --out " + out.string() + " --batch 2 --seq 16 --d-model 32 --n-layers 2 --n-heads 2 --val-every 2 " +
         "--no-progress --sample-tokens 0 --device cpu --steps 4 " + extra;
}

}  // namespace tessera::test
