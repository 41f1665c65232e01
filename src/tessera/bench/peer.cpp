#include "tessera/bench/peer.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include <nlohmann/json.hpp>

#include "tessera/core/signals.h"

namespace tessera {

namespace {

// Waits for the child; its exit code, 128 + the signal that ended it, or -1.
int reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

// Ends the peer's whole process group (torch.compile starts workers of its own): SIGTERM, up to a second for the
// peer itself to end (it stays waitable: WNOWAIT), then SIGKILL for whatever of the group is left. The group is
// not polled for emptiness: orphans that died there may stay zombies where no init reaps them.
void stop_group(pid_t pid) {
  ::kill(-pid, SIGTERM);
  for (int i = 0; i < 50; ++i) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) break;
    ::usleep(20000);
  }
  ::kill(-pid, SIGKILL);
}

// A Ctrl-C (or a SIGTERM) while the peer runs: the peer has a process group of its own, so the terminal's signal
// does not reach it. g_signal records it (ScopedSignals, without SA_RESTART: poll returns EINTR and the loop sees
// it at once); the read loop stops the peer's group, the old handlers come back and the signal is raised again,
// so tessera ends as it would have and no peer is left running on the GPU.
SignalFlag g_signal = 0;

}  // namespace

std::string fmt_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s == std::floor(s) ? "%.0f s" : "%.1f s", s);
  return b;
}

std::string run_peer_script(const std::string& args, const std::string& what,
                            const std::function<bool(const nlohmann::json&)>& take, double timeout_s) {
  const char* py = std::getenv("TESSERA_PYTHON");
  const std::string python = py && *py ? py : "python3";
  const std::string cmd = python + " " + args;
  std::fflush(stdout);  // the peer's output must not overtake ours
  std::fflush(stderr);
  int fds[2];
  if (::pipe(fds) != 0) return "peer skipped: could not start " + python;
  // Before the fork: a signal from here on is seen by the loop.
  std::optional<ScopedSignals> forwarding;
  forwarding.emplace(std::initializer_list<int>{SIGINT, SIGTERM}, &g_signal);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return "peer skipped: could not start " + python;
  }
  if (pid == 0) {  // the child: a process group of its own, stdout and stderr into the pipe, then the shell
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::setpgid(0, 0);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // here too, so that the group exists before any kill below, whichever runs first
  ::close(fds[1]);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool figures = false, timed_out = false;
  int signalled = 0;
  std::string last, pending;
  auto take_line = [&](std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.empty()) return;
    const auto j = s.front() == '{' ? nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
    if (j.is_object() && take(j)) figures = true;
    else last = s;
  };
  std::array<char, 4096> buf;
  for (;;) {
    if (g_signal) {
      signalled = g_signal;
      break;
    }
    int wait_ms = 1000;  // a bounded wait even without a timeout: a signal just before poll() is seen within 1 s
    if (timeout_s > 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) {
        timed_out = true;
        break;
      }
      wait_ms = static_cast<int>(std::min<int64_t>(left, 1000));
    }
    pollfd pf{.fd = fds[0], .events = POLLIN, .revents = 0};
    const int ready = ::poll(&pf, 1, wait_ms);
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;  // the deadline and the signal are checked above
    const ssize_t n = ready < 0 ? -1 : ::read(fds[0], buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the end of the output: the peer, and whatever it started, closed the pipe
    pending.append(buf.data(), static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
      take_line(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
  ::close(fds[0]);
  if (timed_out || signalled) stop_group(pid);
  const int code = reap(pid);
  forwarding.reset();  // the old handlers are back
  if (signalled) ::raise(signalled);
  if (!timed_out) take_line(pending);  // a last line without its newline (one cut by the timeout is dropped)
  // The peers start their own errors with "peer: " (`sys.exit("peer: torch is not importable")`), which the note
  // says already: dropped, so that the line does not read "peer skipped: peer: ...".
  if (last.starts_with("peer: ")) last.erase(0, 6);
  if (timed_out) {
    const std::string limit = "stopped at --peer-timeout " + fmt_seconds(timeout_s);
    return figures ? "peer " + limit + ": the cells it had not reached are –"
                   : "peer skipped: " + limit + (last.empty() ? "" : " (its last line: " + last + ")");
  }
  if (!figures)
    return code == 127 ? "peer skipped: " + python + " not found"
                       : "peer skipped: " + (last.empty() ? what + " printed no figures" : last);
  if (code != 0) return "peer exited with code " + std::to_string(code) + (last.empty() ? "" : ": " + last);
  return "";
}

}  // namespace tessera
