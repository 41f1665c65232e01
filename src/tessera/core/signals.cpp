#include "tessera/core/signals.h"

#include <algorithm>
#include <atomic>

namespace tessera {

namespace {

// The flag each signal records into, per signal number: a handler has no other way to reach its scope. Atomic
// pointers, lock-free, are safe to read in a handler.
std::atomic<SignalFlag*> g_flags[NSIG];
static_assert(std::atomic<SignalFlag*>::is_always_lock_free);

extern "C" void record_signal(int sig) {
  if (sig <= 0 || sig >= NSIG) return;
  if (SignalFlag* flag = g_flags[sig].load(std::memory_order_relaxed)) *flag = sig;
}

}  // namespace

ScopedSignals::ScopedSignals(std::initializer_list<int> signals, SignalFlag* flag,
                             std::initializer_list<int> keep_ignored) {
  *flag = 0;
  install(signals, record_signal, keep_ignored, flag);
}

ScopedSignals::ScopedSignals(std::initializer_list<int> signals, void (*handler)(int),
                             std::initializer_list<int> keep_ignored) {
  install(signals, handler, keep_ignored, nullptr);
}

void ScopedSignals::install(std::initializer_list<int> signals, void (*handler)(int),
                            std::initializer_list<int> keep_ignored, SignalFlag* flag) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: see the header
  // Room for every saved action first: a push_back that threw after some handlers were installed would leave them
  // installed, as the constructor would not finish and the destructor that restores them would never run.
  saved_.reserve(signals.size());
  for (const int sig : signals) {
    Saved s{.signal = sig, .action = {}, .flag = g_flags[sig].load()};
    ::sigaction(sig, nullptr, &s.action);
    saved_.push_back(s);
    const bool keep = std::find(keep_ignored.begin(), keep_ignored.end(), sig) != keep_ignored.end();
    if (keep && s.action.sa_handler == SIG_IGN) continue;
    if (flag) g_flags[sig].store(flag);  // before the handler that reads it
    ::sigaction(sig, &sa, nullptr);
  }
}

ScopedSignals::~ScopedSignals() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    ::sigaction(it->signal, &it->action, nullptr);
    g_flags[it->signal].store(it->flag);  // after: the handler that read it is gone
  }
}

}  // namespace tessera
