// A stand-in for the PyTorch peer in bench tests: TESSERA_PYTHON becomes a shell script that records the arguments
// it was given (args.txt) and runs a canned body (echo the records bench/peers/*.py would print), in a temporary
// directory of the test's own; the environment is restored afterwards. Shared by bench model --peer and bench
// compare's tests, with the table helpers both use.
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

namespace tessera::test {

inline std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// A speedup as the bench tables print it.
inline std::string speedup_cell(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f×", x);
  return buf;
}

// The cells of every row of the markdown table whose header line starts with `header_start`, the header first.
inline std::vector<std::vector<std::string>> md_table(const std::string& md, const std::string& header_start) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(md);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(header_start, 0) == 0) inside = true;
    else if (inside && (line.empty() || line[0] != '|')) break;
    if (!inside || line.rfind("|---", 0) == 0) continue;
    std::vector<std::string> cells;
    for (size_t i = 1, j; (j = line.find('|', i)) != std::string::npos; i = j + 1)
      cells.push_back(trim(line.substr(i, j - i)));
    rows.push_back(cells);
  }
  return rows;
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
