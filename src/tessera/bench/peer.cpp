#include "tessera/bench/peer.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace tessera {

std::string run_peer_script(const std::string& args, const std::string& what,
                            const std::function<bool(const nlohmann::json&)>& take) {
  const char* py = std::getenv("TESSERA_PYTHON");
  const std::string python = py && *py ? py : "python3";
  const std::string cmd = python + " " + args + " 2>&1";
  std::fflush(stdout);  // the peer's output must not overtake ours
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "peer skipped: could not start " + python;
  bool figures = false;
  std::string last;
  std::array<char, 4096> line;
  while (std::fgets(line.data(), static_cast<int>(line.size()), p)) {
    std::string s(line.data());
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.empty()) continue;
    const auto j = s.front() == '{' ? nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false)
                                    : nlohmann::json();
    if (j.is_object() && take(j)) figures = true;
    else last = s;
  }
  const int status = ::pclose(p);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (!figures)
    return code == 127 ? "peer skipped: " + python + " not found"
                       : "peer skipped: " + (last.empty() ? what + " printed no figures" : last);
  if (code != 0) return "peer exited with code " + std::to_string(code) + (last.empty() ? "" : ": " + last);
  return "";
}

}  // namespace tessera
