// tessera/train/hold_signals.h — SIGINT and SIGTERM held back across the renames that put a prepare's files in place.
#pragma once
#include <pthread.h>
#include <signal.h>

namespace tessera {

// Holds SIGINT and SIGTERM back while it lives (they are delivered when it ends), so that a Ctrl-C, or the kill of
// a `timeout`, never lands between the renames that put a prepare's shards in place and leaves half of them there.
// It blocks them in the calling thread only: in a process with other threads (train's CUDA, MPI and OpenMP ones) one
// of those may take a process-directed signal meanwhile. That is harmless as long as the handler only records the
// signal (ScopedSignals' flag), which prepare reads after the renames.
class HoldSignals {
 public:
  HoldSignals() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    ::pthread_sigmask(SIG_BLOCK, &s, &old_);
  }
  ~HoldSignals() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  HoldSignals(const HoldSignals&) = delete;
  HoldSignals& operator=(const HoldSignals&) = delete;

 private:
  sigset_t old_;
};

}  // namespace tessera
