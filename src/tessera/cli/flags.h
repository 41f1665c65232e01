// tessera/cli/flags.h — a command's flags, parsed by CLI11: `--name value`, `--name=value` and bare `--switch`.
//
// CLI11 does the parsing (names, values, switches, --help); this wrapper keeps tessera's conventions on top:
// underscores in flag names read as dashes (--d_model == --d-model), the last of a repeated flag wins, help in
// one aligned list, and every usage error a one-line tessera::Error (exit code 2): an unknown flag names the
// nearest known one ("did you mean --steps?"), a value that is not a number says what was expected.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace tessera::cli {

class Flags {
 public:
  Flags(std::string command, std::string summary);
  ~Flags();

  // A flag that takes a value; `placeholder` is shown in help ("N", "FILE"). `name` has no dashes.
  void add(const std::string& name, const std::string& placeholder, const std::string& help);
  // A flag that may be given several times, every value kept (all()); otherwise as add().
  void add_repeated(const std::string& name, const std::string& placeholder, const std::string& help);
  // A switch without a value.
  void add_switch(const std::string& name, const std::string& help);

  // Parses argv[first..]. Returns false when --help was asked for (the help is then printed on stdout, when
  // print_help is true: under mpirun only rank 0 prints it). Throws Error on any usage error.
  bool parse(int argc, char** argv, int first, bool print_help = true);

  bool has(const std::string& name) const;
  std::string str(const std::string& name, const std::string& fallback = "") const;
  // Every value of a flag added with add_repeated, in the order given.
  std::vector<std::string> all(const std::string& name) const;
  int integer(const std::string& name, int fallback) const;
  uint64_t u64(const std::string& name, uint64_t fallback) const;
  // A finite decimal number ("3e-4", "0.5"; not hex, "inf" or "nan"); one past double's range ("1e999") is out of
  // range, as an integer past int's is.
  double number(const std::string& name, double fallback) const;
  // The same for a flag the program keeps as a float: past float's range ("--lr 1e300") is out of range, not inf.
  float number_f32(const std::string& name, float fallback) const;
  // Names of the flags (no dashes), in the order they were added.
  const std::vector<std::string>& names() const { return names_; }

  std::string usage() const;

 private:
  const CLI::Option* option(const std::string& name) const;
  // number() and number_f32().
  template <typename T>
  T number_of(const std::string& name, T fallback) const;

  std::string command_, summary_;
  std::unique_ptr<CLI::App> app_;
  std::map<std::string, CLI::Option*> options_;
  std::map<std::string, std::string> placeholders_;
  std::vector<std::string> names_;
};

// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b);
// The one of `names` nearest to `name` when it is near enough to be a typo of it, else "": for "did you mean".
std::string nearest_name(const std::string& name, const std::vector<std::string>& names);

}  // namespace tessera::cli
