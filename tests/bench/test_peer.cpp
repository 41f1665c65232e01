// run_peer_script: the JSON figures of a peer script reach the caller, and every way a peer can fail becomes the
// one-line note the bench tables print, a timeout included (the figures before it stand, and the peer's whole
// process group is stopped), as is an interrupt. /bin/sh stands in for python (TESSERA_PYTHON), a shell script for
// the peer.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/bench/peer.h"
#include "tessera/core/file_io.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

class PeerScript : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("tessera_peer_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const char* old = std::getenv("TESSERA_PYTHON");
    saved = old ? old : "";
    had = old != nullptr;
    ::setenv("TESSERA_PYTHON", "/bin/sh", 1);
  }
  void TearDown() override {
    if (had) ::setenv("TESSERA_PYTHON", saved.c_str(), 1);
    else ::unsetenv("TESSERA_PYTHON");
    fs::remove_all(dir);
  }
  // Runs a peer whose output is `body` (shell commands); collects the objects with a "v" as figures.
  std::string run(const std::string& body, double timeout_s = 0) {
    const fs::path script = dir / "peer.sh";
    write_file_atomic(script.string(), body + "\n");
    got.clear();
    std::string quoted = "'";  // appended, not "'" + ...: GCC 12 warns falsely (-Wrestrict) on that
    quoted += script.string();
    quoted += "'";
    return run_peer_script(
        quoted, "peer.sh",
        [&](const nlohmann::json& j) {
          if (!j.contains("v")) return false;
          got.push_back(j["v"].get<int>());
          return true;
        },
        timeout_s);
  }
  // Seconds that `run` took.
  double timed_run(const std::string& body, double timeout_s, std::string* note) {
    const auto t0 = std::chrono::steady_clock::now();
    *note = run(body, timeout_s);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  fs::path dir;
  std::string saved;
  bool had = false;
  std::vector<int> got;
};

TEST_F(PeerScript, FiguresReachTheCallerInOrder) {
  EXPECT_EQ(run("echo '{\"v\": 1}'; echo 'some log line'; echo '{\"other\": 5}'; echo; echo '{\"v\": 2}'"), "");
  EXPECT_EQ(got, (std::vector<int>{1, 2}));
}

TEST_F(PeerScript, NoFiguresIsSkippedWithTheLastLine) {
  EXPECT_EQ(run("echo 'loading'; echo 'torch is not installed'"), "peer skipped: torch is not installed");
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(run("true"), "peer skipped: peer.sh printed no figures");
  // A JSON object that is not a figure counts as a line.
  EXPECT_EQ(run("echo '{\"other\": 5}'"), "peer skipped: {\"other\": 5}");
  // A peer's own "peer: " is not said twice.
  EXPECT_EQ(run("echo 'peer: torch is not importable (x)' >&2; exit 1"), "peer skipped: torch is not importable (x)");
  EXPECT_EQ(run("echo '{\"v\": 3}'; echo 'peer: lost the GPU' >&2; exit 1"), "peer exited with code 1: lost the GPU");
}

TEST_F(PeerScript, FiguresWithAFailingExitAreNoted) {
  EXPECT_EQ(run("echo '{\"v\": 7}'; echo 'Traceback: boom' >&2; exit 3"), "peer exited with code 3: Traceback: boom");
  EXPECT_EQ(got, (std::vector<int>{7}));
}

TEST_F(PeerScript, ALastLineWithoutItsNewlineCounts) {
  EXPECT_EQ(run("printf '{\"v\": 4}'"), "");
  EXPECT_EQ(got, (std::vector<int>{4}));
}

// At --peer-timeout the peer is stopped: the figures it printed stand, the note says where it stopped, and the
// call returns at once rather than when the peer would have ended.
TEST_F(PeerScript, ATimeoutKeepsTheFiguresSoFar) {
  std::string note;
  const double s = timed_run("echo '{\"v\": 1}'; sleep 30; echo '{\"v\": 2}'", 1.0, &note);
  EXPECT_EQ(note, "peer stopped at --peer-timeout 1 s: the cells it had not reached are –");
  EXPECT_EQ(got, (std::vector<int>{1}));
  EXPECT_LT(s, 10.0);
  // No figure before the timeout: skipped, with the peer's last line.
  timed_run("echo 'compiling'; sleep 30", 0.5, &note);
  EXPECT_EQ(note, "peer skipped: stopped at --peer-timeout 0.5 s (its last line: compiling)");
  EXPECT_TRUE(got.empty());
  // A peer that ends in time is not affected by the limit.
  EXPECT_EQ(run("echo '{\"v\": 3}'", 30.0), "");
  EXPECT_EQ(got, (std::vector<int>{3}));
}

// What the peer started is stopped with it (torch.compile's workers): a background job of the script that would
// write a file two seconds later never writes it.
TEST_F(PeerScript, ATimeoutStopsWhatThePeerStarted) {
  const fs::path mark = dir / "late.txt";
  std::string note;
  const double s = timed_run("(sleep 2; echo late > '" + mark.string() + "') & echo '{\"v\": 5}'; wait", 0.5, &note);
  EXPECT_EQ(got, (std::vector<int>{5}));
  EXPECT_NE(note.find("--peer-timeout 0.5 s"), std::string::npos) << note;
  EXPECT_LT(s, 2.0) << "the call waited for the background job";
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  EXPECT_FALSE(fs::exists(mark)) << "the peer's background job outlived the timeout";
}

// A Ctrl-C while the peer runs (the peer has a process group of its own, which the terminal's signal misses): the
// caller stops the peer's group and then ends by the same signal. Here the caller is a forked copy of the test.
TEST_F(PeerScript, AnInterruptStopsThePeerAndThenTheCaller) {
  const fs::path mark = dir / "late.txt";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    run("(sleep 2; echo late > '" + mark.string() + "') & sleep 30", 0);
    ::_exit(0);  // not reached: the SIGINT ends this process
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(child, SIGINT);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "status " << status;
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_FALSE(fs::exists(mark)) << "the peer outlived the interrupt";
}

TEST_F(PeerScript, AMissingInterpreterIsNamed) {
  ::setenv("TESSERA_PYTHON", "/nonexistent/python9", 1);
  EXPECT_EQ(run("echo '{\"v\": 1}'"), "peer skipped: /nonexistent/python9 not found");
}

}  // namespace
}  // namespace tessera
