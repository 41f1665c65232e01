// tessera/cli/args.h — a small command-line parser: `--name value`, `--name=value` and bare `--switch`.
// Unknown flags and missing values are errors (exit code 2), never ignored.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tessera::cli {

struct FlagSpec {
  std::string name;   // without dashes, words joined by '-'
  std::string value;  // placeholder shown in help ("N", "FILE"); empty for a switch
  std::string help;
};

class Args {
 public:
  // Parses argv[first..]. Underscores in flag names are read as dashes (--d_model == --d-model).
  Args(const std::string& command, const std::vector<FlagSpec>& specs, int argc, char** argv, int first);

  bool help() const { return help_; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string str(const std::string& name, const std::string& fallback = "") const;
  int integer(const std::string& name, int fallback) const;
  uint64_t u64(const std::string& name, uint64_t fallback) const;
  float number(const std::string& name, float fallback) const;
  // Flags given, in order.
  const std::vector<std::string>& given() const { return given_; }

  static std::string usage(const std::string& command, const std::string& summary, const std::vector<FlagSpec>& specs);

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> given_;
  bool help_ = false;
};

}  // namespace tessera::cli
