// run_peer_script: the JSON figures of a peer script reach the caller, and every way a peer can fail becomes the
// one-line note the bench tables print. /bin/sh stands in for python (TESSERA_PYTHON), a shell script for the peer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
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
  std::string run(const std::string& body) {
    const fs::path script = dir / "peer.sh";
    write_file_atomic(script.string(), body + "\n");
    got.clear();
    std::string quoted = "'";  // appended, not "'" + ...: GCC 12 warns falsely (-Wrestrict) on that
    quoted += script.string();
    quoted += "'";
    return run_peer_script(quoted, "peer.sh", [&](const nlohmann::json& j) {
      if (!j.contains("v")) return false;
      got.push_back(j["v"].get<int>());
      return true;
    });
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
}

TEST_F(PeerScript, FiguresWithAFailingExitAreNoted) {
  EXPECT_EQ(run("echo '{\"v\": 7}'; echo 'Traceback: boom' >&2; exit 3"), "peer exited with code 3: Traceback: boom");
  EXPECT_EQ(got, (std::vector<int>{7}));
}

TEST_F(PeerScript, AMissingInterpreterIsNamed) {
  ::setenv("TESSERA_PYTHON", "/nonexistent/python9", 1);
  EXPECT_EQ(run("echo '{\"v\": 1}'"), "peer skipped: /nonexistent/python9 not found");
}

}  // namespace
}  // namespace tessera
