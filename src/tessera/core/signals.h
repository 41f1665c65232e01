// tessera/core/signals.h — signal handlers for the length of a scope.
//
// train (a stop at the next step, with a checkpoint), prepare (its work undone) and the bench peers (the peer's
// process group stopped, then the signal raised again) each catch a few signals while they run. ScopedSignals
// installs the handlers, remembers the dispositions it found and puts them back when it ends.
#pragma once
#include <signal.h>

#include <csignal>
#include <initializer_list>
#include <vector>

namespace tessera {

// What a recording handler sets: the number of the signal that arrived, 0 while none has. Written in a signal
// handler, hence volatile sig_atomic_t.
using SignalFlag = volatile std::sig_atomic_t;

class ScopedSignals {
 public:
  // While this lives, each of `signals` stores its number in *flag, which starts at 0 (the last to arrive wins).
  ScopedSignals(std::initializer_list<int> signals, SignalFlag* flag, std::initializer_list<int> keep_ignored = {});
  // While this lives, each of `signals` calls `handler`, which must have C linkage and be async-signal-safe.
  ScopedSignals(std::initializer_list<int> signals, void (*handler)(int), std::initializer_list<int> keep_ignored = {});
  // Both: a signal of `keep_ignored` that is ignored when this is made (nohup ignores SIGHUP; systemd, SIGPIPE)
  // stays ignored. The handlers run without SA_RESTART, so a blocking call (poll, read) returns EINTR at once and
  // its loop sees the signal; the other signals are not blocked while one runs.
  ~ScopedSignals();  // the dispositions found are back
  ScopedSignals(const ScopedSignals&) = delete;
  ScopedSignals& operator=(const ScopedSignals&) = delete;

 private:
  struct Saved {
    int signal;
    struct sigaction action;  // the disposition found
    SignalFlag* flag;         // the flag it recorded into before (nested scopes), for the recording handler
  };
  void install(std::initializer_list<int> signals, void (*handler)(int), std::initializer_list<int> keep_ignored,
               SignalFlag* flag);
  std::vector<Saved> saved_;
};

}  // namespace tessera
