// The stop signals of `tessera train`: a first SIGINT, SIGTERM, SIGHUP or SIGPIPE stops the run after its step
// with a checkpoint (said at once); a second one, later than a repeat of the same stop, exits without one.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>

#include "tessera/cli/cmd_train.h"

namespace tessera::cli {

SignalFlag g_stop = 0;

namespace {

// What the first stop signal prints at once, chosen before the handlers are installed: rank 0's line, which says
// whether a checkpoint follows; null (the other ranks) for none.
const char* g_stop_note = nullptr;
size_t g_stop_note_len = 0;
constexpr char kStopNoteCheckpoint[] =
    "\ntessera: stopping after this step, with a checkpoint (a second signal exits at once, without one)\n";
constexpr char kStopNoteNone[] = "\ntessera: stopping after this step (--no-checkpoint: nothing is written)\n";
// When the first stop came (CLOCK_MONOTONIC, ns; a lock-free atomic, safe in the handler).
std::atomic<int64_t> g_stop_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the stop handler reads it");
// A repeat within this of the first signal is the same stop: `timeout` signals the command and then its process
// group, microseconds apart, and `kill` run twice in a script lands milliseconds apart; either way the run left
// without its checkpoint, losing up to --ckpt-minutes of training. A person's second Ctrl-C comes later than this.
constexpr int64_t kRepeatNs = 250'000'000;

int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

}  // namespace

extern "C" void on_stop_signal(int sig) {
  // A closed output pipe (`tessera train | head`) raises SIGPIPE at every write after the first: only the first
  // counts, as a stop.
  if (sig == SIGPIPE && g_stop != 0) return;
  if (g_stop != 0 && monotonic_ns() - g_stop_ns.load() < kRepeatNs) return;
  if (g_stop != 0) {  // the second signal: leave now, without a checkpoint
    constexpr char kMsg[] = "\ntessera: interrupted again: exiting without a checkpoint\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    ::_exit(128 + sig);
  }
  g_stop_ns.store(monotonic_ns());
  g_stop = sig;
  // Said at once: the step, or a checkpoint being written, can take minutes, and a stop that printed nothing until
  // then would invite the second Ctrl-C that abandons the checkpoint. Not for SIGPIPE: stderr may be
  // the pipe that closed. The interrupted code sees errno as it was.
  if (sig != SIGPIPE && g_stop_note != nullptr) {
    const int saved = errno;
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, g_stop_note, g_stop_note_len);
    errno = saved;
  }
}

void set_stop_note(bool lead, bool checkpoints, bool progress) {
  g_stop_note = !lead ? nullptr : checkpoints ? kStopNoteCheckpoint : kStopNoteNone;
  g_stop_note_len = !lead ? 0 : checkpoints ? sizeof kStopNoteCheckpoint - 1 : sizeof kStopNoteNone - 1;
  // The note's leading newline ends a bar drawn in place; with none (--no-progress, or stderr not a terminal,
  // where the bar prints whole lines) it would be an empty line, so it is dropped there.
  if (g_stop_note && !(progress && ::isatty(STDERR_FILENO))) {
    ++g_stop_note;
    --g_stop_note_len;
  }
}

void say_earlier_stop(int read_stop) {
  if (g_stop == 0 && read_stop != 0) {
    on_stop_signal(read_stop);
  } else if (g_stop != 0 && g_stop_note != nullptr) {
    std::fflush(stdout);
    std::fwrite(g_stop_note, 1, g_stop_note_len, stderr);
  }
}

void record_stop(int sig) {
  g_stop_ns.store(monotonic_ns());  // a repeat of it (timeout's second) is the same stop
  g_stop = sig;
}

}  // namespace tessera::cli
