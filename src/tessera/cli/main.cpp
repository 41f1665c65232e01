// tessera — train and run transformer language models.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/train/trainer.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "unknown"
#endif
#include "tessera_git_commit.h"  // generated at every build: TESSERA_GIT_COMMIT

namespace {

const char* kUsage =
    "usage: tessera <command> [flags]\n"
    "\n"
    "commands:\n"
    "  train      train a model (no flags: the tiny model on the bundled corpus)\n"
    "  generate   continue a prompt with a trained checkpoint\n"
    "  translate  translate a file of sources with an encoder-decoder checkpoint (beam search)\n"
    "  prepare    turn a text file into train/val token shards, or parallel text into paired shards\n"
    "  make-task  write a synthetic translation set (copy, reverse, sort, digits-to-words) as a TSV file\n"
    "  eval       score a translation against references: BLEU as sacrebleu computes it, and exact match\n"
    "  info       show a model's config, parameter count and memory estimate\n"
    "  tokenizer  train, encode, decode, inspect or convert a BPE tokenizer (tokenizer "
    "train|encode|decode|info|convert)\n"
    "  bench      time kernels, AdamW, attention, models, all-reduce, tokenizers, top-k or decoding (`tessera "
    "bench --help` lists them)\n"
    "\n"
    "Run `tessera <command> --help` for the flags of each command, `tessera --version` for the version.\n";

// Every error is one line on stderr, `tessera: error: <message>`; a message that spans lines is folded into it.
int fail(std::string msg, const char* kind = "error", int code = 2) {
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  std::fflush(stdout);
  std::fprintf(stderr, "tessera: %s: %s\n", kind, msg.c_str());
  return code;
}

// A standard stream that was closed when tessera started (`tessera train 2>&-`) is opened on /dev/null in the mode
// that makes every use fail (stdout and stderr read-only: writes fail with EBADF), as gnulib's stdopen does. Left
// closed, its number would go to the next file tessera opened, and what is printed on it would land there (train's
// progress lines in metrics.jsonl).
void hold_closed_std_streams() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open() takes the lowest free number: fd itself, the lower ones being open or held already.
    ::open("/dev/null", fd == STDIN_FILENO ? O_WRONLY : O_RDONLY);
  }
}

// Output lost to a full disk or a closed stdout (`tessera info > /dev/full`) is an error, as coreutils'
// close_stdout makes it: exit code 0 would tell a script that the output is there. Only after a command that
// succeeded: one that failed has said why, in its own line. A closed pipe still ends tessera with SIGPIPE at the write,
// or train with its own stop; only where SIGPIPE is ignored is it said here, as a broken pipe.
int close_stdout(int code) {
  if (code != 0) return code;
  const bool lost_before = std::ferror(stdout) != 0;  // a write that failed earlier (its buffer dropped since)
  errno = 0;
  const bool close_failed = std::fclose(stdout) != 0;  // flushes what is left, then closes
  if (!lost_before && !close_failed) return 0;
  const int err = errno;
  // The command's work is done by now (prepare's shards, a whole training run): said, so that exit 2 is not read as
  // nothing written.
  std::fprintf(stderr, "tessera: error: cannot write standard output%s%s%s\n", err ? ": " : "",
               err ? std::strerror(err) : "", tessera::cli::kOutputLostNote);
  return 2;
}

// Whether a resource limit is set (a soft limit below infinity).
bool limited(int resource) {
  rlimit lim{};
  return ::getrlimit(resource, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY;
}

int run_command(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    std::printf("tessera %s (commit %s)\n", TESSERA_VERSION, TESSERA_GIT_COMMIT);
    return 0;
  }
  try {
    if (cmd == "train") return tessera::cli::cmd_train(argc, argv);
    if (cmd == "generate") return tessera::cli::cmd_generate(argc, argv);
    if (cmd == "translate") return tessera::cli::cmd_translate(argc, argv);
    if (cmd == "prepare") return tessera::cli::cmd_prepare(argc, argv);
    if (cmd == "info") return tessera::cli::cmd_info(argc, argv);
    if (cmd == "make-task") return tessera::cli::cmd_make_task(argc, argv);
    if (cmd == "eval") return tessera::cli::cmd_eval(argc, argv);
    if (cmd == "bench") return tessera::cli::cmd_bench(argc, argv);
    if (cmd == "tokenizer") return tessera::cli::cmd_tokenizer(argc, argv);
    // A typo of a command or of --version / --help is named, as a typo of a flag is.
    const std::string near =
        tessera::cli::nearest_name(cmd, {"train", "generate", "translate", "prepare", "make-task", "eval", "info",
                                         "bench", "tokenizer", "--version", "--help"});
    return fail("unknown command '" + cmd + "' (" +
                (near.empty() ? "see tessera --help" : "did you mean " + near + "?") + ")");
  } catch (const tessera::Error& e) {
    return fail(e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    // A path given on the command line that the file system refuses (a name too long, a directory not searchable)
    // is bad input, said in one line without the library's "filesystem error: status: ..." wording.
    return fail(tessera::filesystem_error_message(e));
  } catch (const std::bad_alloc&) {
    // The hint names the flags of the command that failed: --batch and --seq are train's.
    return fail(cmd == "train" ? std::string("out of memory (") + tessera::kTrainMemoryHint + ")" : "out of memory");
  } catch (const std::exception& e) {
    return fail(e.what(), "internal error", 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  hold_closed_std_streams();
  const int code = close_stdout(run_command(argc, argv));
  // Under an address-space or data limit (ulimit -v, ulimit -d: both bound OpenBLAS's anonymous mappings),
  // OpenBLAS's worker threads, started when the library loaded, may have found no room for their work buffers: they
  // retry the mapping forever (spinning all along), and exit() waits for them (OpenBLAS's shutdown joins its
  // threads), so `tessera info` printed its report and never ended, nor did a bench after its out-of-memory line.
  // With such a limit set, the process ends here, its output flushed, without exit()'s handlers: tessera registers
  // none (its files, locks and MPI_Finalize belong to the command, done by now), but a tool that writes its data
  // at exit (gprof, gcov, a profiler's last flush) loses it under such a limit.
  if (limited(RLIMIT_AS) || limited(RLIMIT_DATA)) {
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}
