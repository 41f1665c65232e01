#include "tessera/cli/args.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstdlib>

#include "tessera/core/error.h"

namespace tessera::cli {

Args::Args(const std::string& command, const std::vector<FlagSpec>& specs, int argc, char** argv, int first)
    : command_(command) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    TS_CHECK(a.rfind("--", 0) == 0, "tessera ", command, ": unexpected argument '", a, "' (see tessera ", command,
             " --help)");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    std::replace(name.begin(), name.end(), '_', '-');
    auto spec = std::find_if(specs.begin(), specs.end(), [&](const FlagSpec& s) { return s.name == name; });
    TS_CHECK(spec != specs.end(), "tessera ", command, ": unknown flag --", name, " (see tessera ", command, " --help)");
    if (spec->value.empty()) {
      TS_CHECK(!has_value, "tessera ", command, ": --", name, " takes no value");
      value = "true";
    } else if (!has_value) {
      TS_CHECK(i + 1 < argc, "tessera ", command, ": --", name, " needs a value (", spec->value, ")");
      value = argv[++i];
    }
    values_[name] = value;
    given_.push_back(name);
  }
}

std::string Args::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int Args::integer(const std::string& name, int fallback) const {
  if (!has(name)) return fallback;
  const std::string v = str(name);
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  TS_CHECK(!v.empty() && *end == '\0' && errno == 0 && x >= INT32_MIN && x <= INT32_MAX, "tessera ", command_, ": --",
           name, " expects an integer, got '", v, "'");
  return static_cast<int>(x);
}

uint64_t Args::u64(const std::string& name, uint64_t fallback) const {
  if (!has(name)) return fallback;
  const std::string v = str(name);
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  TS_CHECK(!v.empty() && v[0] != '-' && *end == '\0' && errno == 0, "tessera ", command_, ": --", name,
           " expects a non-negative integer, got '", v, "'");
  return x;
}

float Args::number(const std::string& name, float fallback) const {
  if (!has(name)) return fallback;
  const std::string v = str(name);
  char* end = nullptr;
  const float x = std::strtof(v.c_str(), &end);
  TS_CHECK(!v.empty() && *end == '\0' && std::isfinite(x), "tessera ", command_, ": --", name,
           " expects a number, got '", v, "'");
  return x;
}

std::string Args::usage(const std::string& command, const std::string& summary, const std::vector<FlagSpec>& specs) {
  std::string s = "usage: tessera " + command + " [flags]\n\n" + summary + "\n\nflags:\n";
  for (const auto& f : specs) {
    std::string left = "  --" + f.name + (f.value.empty() ? "" : " " + f.value);
    if (left.size() < 30) left.append(30 - left.size(), ' ');
    else left += "\n" + std::string(30, ' ');
    s += left + f.help + "\n";
  }
  s += "  --help                      show this help\n";
  return s;
}

}  // namespace tessera::cli
