// A stand-in for the PyTorch peer in bench tests: TESSERA_PYTHON becomes a shell script that records the arguments
// it was given (args.txt) and runs a canned body (echo the records bench/peers/*.py would print), in a temporary
// directory of the test's own; the environment is restored afterwards. Shared by bench model --peer and bench
// compare's tests (their table helpers are test_util.h's).
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/core/file_io.h"
#include "test_util.h"

namespace tessera::test {

// A speedup as the bench tables print it.
inline std::string speedup_cell(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f×", x);
  return buf;
}

class PeerStandIn : public ::testing::Test {
 protected:
  std::filesystem::path dir;

  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("tessera_peer_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    ::setenv("OMP_NUM_THREADS", "1", 1);  // tiny steps on a loaded 2-core machine: barriers cost more than they give
    const char* old = std::getenv("TESSERA_PYTHON");
    had_python_ = old != nullptr;
    saved_python_ = old ? old : "";
  }
  void TearDown() override {
    if (had_python_) ::setenv("TESSERA_PYTHON", saved_python_.c_str(), 1);
    else ::unsetenv("TESSERA_PYTHON");
    std::filesystem::remove_all(dir);
  }

  // Makes TESSERA_PYTHON a script that writes its arguments, one a line, to args.txt and then runs `body`.
  void stand_in(const std::string& body) {
    const std::filesystem::path py = dir / "python";
    std::string text = "#!/bin/sh\nprintf '%s\\n' \"$@\" > '";
    text += (dir / "args.txt").string();
    text += "'\n";
    text += body;
    text += "\n";
    write_file_atomic(py.string(), text);
    ASSERT_EQ(::chmod(py.c_str(), 0755), 0);
    ::setenv("TESSERA_PYTHON", py.c_str(), 1);
  }

 private:
  std::string saved_python_;
  bool had_python_ = false;
};

}  // namespace tessera::test
