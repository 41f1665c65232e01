// ScopedSignals, the handlers of train, prepare and the bench peers: each signal recorded while the scope lives,
// what was there before put back after it (nested scopes too), a signal ignored by the launcher kept ignored
// where asked (nohup), and no SA_RESTART, so that a blocking poll returns at the signal.
#include <gtest/gtest.h>
#include <signal.h>

#include <csignal>

#include "tessera/core/signals.h"

namespace tessera {
namespace {

volatile std::sig_atomic_t g_custom = 0;
extern "C" void custom_handler(int sig) { g_custom = 1000 + sig; }

struct sigaction disposition(int sig) {
  struct sigaction a {};
  ::sigaction(sig, nullptr, &a);
  return a;
}

// Sets `sig` to `handler` for one test and puts back what was there at its end.
class SetDisposition {
 public:
  SetDisposition(int sig, void (*handler)(int)) : sig_(sig) {
    struct sigaction a {};
    a.sa_handler = handler;
    sigemptyset(&a.sa_mask);
    ::sigaction(sig, &a, &old_);
  }
  ~SetDisposition() { ::sigaction(sig_, &old_, nullptr); }

 private:
  int sig_;
  struct sigaction old_ {};
};

TEST(ScopedSignals, RecordsTheSignalAndPutsBackTheHandlerItFound) {
  const SetDisposition before(SIGUSR1, custom_handler);
  SignalFlag flag = 5;
  {
    const ScopedSignals scope({SIGUSR1}, &flag);
    EXPECT_EQ(flag, 0) << "not cleared when the scope starts";
    EXPECT_EQ(disposition(SIGUSR1).sa_flags & SA_RESTART, 0);
    ::raise(SIGUSR1);
    EXPECT_EQ(flag, SIGUSR1);
  }
  EXPECT_EQ(disposition(SIGUSR1).sa_handler, custom_handler);
  flag = 0;
  g_custom = 0;
  ::raise(SIGUSR1);
  EXPECT_EQ(g_custom, 1000 + SIGUSR1);
  EXPECT_EQ(flag, 0) << "recorded after the scope ended";
}

TEST(ScopedSignals, CallsTheHandlerGiven) {
  const SetDisposition before(SIGUSR1, SIG_DFL);
  g_custom = 0;
  {
    const ScopedSignals scope({SIGUSR1}, custom_handler);
    ::raise(SIGUSR1);
    EXPECT_EQ(g_custom, 1000 + SIGUSR1);
  }
  EXPECT_EQ(disposition(SIGUSR1).sa_handler, SIG_DFL);
}

// nohup ignores SIGHUP: train keeps it ignored. Only the signals named are kept so; prepare and the peers take an
// ignored SIGINT or SIGTERM over, as they always did.
TEST(ScopedSignals, KeepsAnIgnoredSignalIgnoredOnlyWhereAsked) {
  const SetDisposition ignored(SIGUSR2, SIG_IGN);
  const SetDisposition also_ignored(SIGUSR1, SIG_IGN);
  SignalFlag flag = 0;
  {
    const ScopedSignals scope({SIGUSR1, SIGUSR2}, &flag, /*keep_ignored=*/{SIGUSR2});
    EXPECT_EQ(disposition(SIGUSR2).sa_handler, SIG_IGN);
    ::raise(SIGUSR2);
    EXPECT_EQ(flag, 0) << "an ignored signal was taken over";
    ::raise(SIGUSR1);
    EXPECT_EQ(flag, SIGUSR1);
  }
  EXPECT_EQ(disposition(SIGUSR1).sa_handler, SIG_IGN);
  {
    const ScopedSignals scope({SIGUSR2}, &flag);
    ::raise(SIGUSR2);
    EXPECT_EQ(flag, SIGUSR2);
  }
  EXPECT_EQ(disposition(SIGUSR2).sa_handler, SIG_IGN);
}

TEST(ScopedSignals, NestedScopesRecordIntoTheirOwnFlags) {
  const SetDisposition usr1(SIGUSR1, SIG_DFL);
  const SetDisposition usr2(SIGUSR2, SIG_DFL);
  SignalFlag outer_flag = 0, inner_flag = 0;
  const ScopedSignals outer({SIGUSR1, SIGUSR2}, &outer_flag);
  {
    const ScopedSignals inner({SIGUSR2}, &inner_flag);
    ::raise(SIGUSR2);
    EXPECT_EQ(inner_flag, SIGUSR2);
    EXPECT_EQ(outer_flag, 0);
    ::raise(SIGUSR1);
    EXPECT_EQ(outer_flag, SIGUSR1) << "the outer scope's other signal went to the inner flag";
  }
  outer_flag = 0;
  inner_flag = 0;
  ::raise(SIGUSR2);
  EXPECT_EQ(outer_flag, SIGUSR2) << "the outer scope's flag is not back";
  EXPECT_EQ(inner_flag, 0);
}

}  // namespace
}  // namespace tessera
