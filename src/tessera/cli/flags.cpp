#include "tessera/cli/flags.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "tessera/core/error.h"
#include "tessera/core/units.h"

namespace tessera::cli {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_name(const std::string& name, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& n : names) {
    const size_t d = edit_distance(name, n);
    if (d < best_d) best_d = d, best = n;
  }
  // Near enough to be a typo: at most 2 edits, and fewer than half the name.
  return best_d <= 2 && best_d * 2 < std::max<size_t>(name.size(), 2) ? best : std::string();
}

Flags::Flags(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)), app_(std::make_unique<CLI::App>(summary_)) {
  app_->set_help_flag("--help,-h", "show this help");
  // Extras are collected, not thrown, so that parse() can word the error and suggest the nearest flag.
  app_->allow_extras();
  // A repeated flag is not an error: the last value wins.
  app_->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

Flags::~Flags() = default;

void Flags::add(const std::string& name, const std::string& placeholder, const std::string& help) {
  CLI::Option* o = app_->add_option("--" + name, help)->type_name(placeholder);
  options_[name] = o;
  placeholders_[name] = placeholder;
  names_.push_back(name);
}

void Flags::add_repeated(const std::string& name, const std::string& placeholder, const std::string& help) {
  add(name, placeholder, help);
  options_[name]->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void Flags::add_switch(const std::string& name, const std::string& help) {
  options_[name] = app_->add_flag("--" + name, help);
  placeholders_[name] = "";
  names_.push_back(name);
}

bool Flags::parse(int argc, char** argv, int first, bool print_help) {
  std::vector<std::string> args;
  std::set<std::pair<std::string, std::string>> attached;  // (name, value) given as --name=value
  for (int i = argc - 1; i >= first; --i) {                // CLI11 takes the arguments in reverse order
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      std::replace(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
      // CLI11 would read `--switch=3` as the switch given; a switch takes no value.
      const std::string name = a.substr(2, end - 2);
      const auto it = placeholders_.find(name);
      if (end < a.size()) attached.emplace(name, a.substr(end + 1));
      TS_CHECK(end == a.size() || it == placeholders_.end() || !it->second.empty(), command_, ": --", name,
               " takes no value");
      // `--name=` gives the empty value, as `--name ''` does (and getopt_long), rather than the next argument as its
      // value, or a "flag is missing its value" that does not name it.
      if (end + 1 == a.size() && it != placeholders_.end()) {
        args.emplace_back();
        a.pop_back();
      }
    }
    args.push_back(std::move(a));
  }
  const std::string see = " (see tessera " + command_ + " --help)";
  try {
    std::vector<std::string> consumed = args;  // CLI11 pops what it parses
    app_->parse(consumed);
  } catch (const CLI::CallForHelp&) {
    // Checked here: a help longer than stdio's buffer fails in its first flush, and close_stdout in main can then
    // no longer say why ("cannot write standard output", no reason, for train --help > /dev/full).
    if (print_help)
      TS_CHECK(std::fputs(usage().c_str(), stdout) != EOF && std::fflush(stdout) == 0,
               "cannot write standard output: ", std::strerror(errno));
    return false;
  } catch (const CLI::ArgumentMismatch&) {
    // A flag without its value: find which (CLI11's message names it, but in its own words).
    for (const auto& n : names_) {
      if (placeholders_[n].empty()) continue;
      for (size_t i = 0; i < args.size(); ++i)
        if (args[i] == "--" + n && (i == 0 || args[i - 1].rfind("--", 0) == 0))
          TS_THROW(command_, ": --", n, " needs a value (", placeholders_[n], ")");
    }
    TS_THROW(command_, ": a flag is missing its value", see);
  } catch (const CLI::ParseError& e) {
    TS_THROW(command_, ": ", e.what(), see);
  }
  // A flag given without its value would take the next flag as it: `--out --force` would train into a directory
  // named "--force". A separate value that is exactly one of this command's flags is taken as that mistake. Anything
  // else that starts with "--" is still a value, and `--prompt=--force` says unambiguously that it is one.
  for (const auto& [name, option] : options_) {
    if (placeholders_.at(name).empty() || option->count() == 0) continue;
    const std::string& v = option->results().back();  // the one used (the last of a repeated flag)
    if (!v.starts_with("--") || attached.count({name, v})) continue;
    const std::string other = v.substr(2);
    TS_CHECK(options_.count(other) == 0 && other != "help", command_, ": --", name, " needs a value (",
             placeholders_.at(name), "); it took the flag ", v, " as one");
  }
  const std::vector<std::string> extra = app_->remaining();
  if (!extra.empty()) {
    const std::string& a = extra.front();
    TS_CHECK(a.rfind("--", 0) == 0, command_, ": unexpected argument '", a, "'", see);
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    TS_CHECK(options_.count(name) == 0, command_, ": --", name, " takes no value");
    const std::string best = nearest_name(name, names_);
    if (!best.empty()) TS_THROW(command_, ": unknown flag --", name, " (did you mean --", best, "?)");
    TS_THROW(command_, ": unknown flag --", name, see);
  }
  return true;
}

const CLI::Option* Flags::option(const std::string& name) const {
  const auto it = options_.find(name);
  TS_CHECK(it != options_.end(), "internal: tessera ", command_, " has no flag --", name);
  return it->second;
}

bool Flags::has(const std::string& name) const { return option(name)->count() > 0; }

std::string Flags::str(const std::string& name, const std::string& fallback) const {
  const CLI::Option* o = option(name);
  if (o->count() == 0) return fallback;
  if (placeholders_.at(name).empty()) return "true";
  return o->results().back();
}

std::vector<std::string> Flags::all(const std::string& name) const { return option(name)->results(); }

int Flags::integer(const std::string& name, int fallback) const {
  if (!has(name)) return fallback;
  const std::string v = str(name);
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  // strtol skips leading blanks and newlines: the first character must be the number's.
  TS_CHECK(!v.empty() && *end == '\0' && (std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '-' || v[0] == '+'),
           command_, ": --", name, " expects an integer, got '", v, "'");
  // The side it left by, not int's whole range: most of these flags must be positive, and "-2147483648 to
  // 2147483647" would read as if a negative count were fine.
  const bool high = errno == ERANGE ? x > 0 : x > INT32_MAX;
  TS_CHECK(errno == 0 && x >= INT32_MIN && x <= INT32_MAX, command_, ": --", name, " ", v, " is out of range (",
           high ? "at most " : "at least ", high ? int64_t{INT32_MAX} : int64_t{INT32_MIN}, ")");
  return static_cast<int>(x);
}

uint64_t Flags::u64(const std::string& name, uint64_t fallback) const {
  if (!has(name)) return fallback;
  const std::string v = str(name);
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  TS_CHECK(!v.empty() && *end == '\0' && (std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '+'), command_,
           ": --", name, " expects a non-negative integer, got '", v, "'");
  TS_CHECK(errno == 0, command_, ": --", name, " ", v, " is out of range (at most ", UINT64_MAX, ")");
  return x;
}

template <typename T>
T Flags::number_of(const std::string& name, T fallback) const {
  if (!has(name)) return fallback;
  const std::string v = str(name);
  T x = 0;
  const DecimalStatus status = parse_decimal(v, &x);
  TS_CHECK(status != DecimalStatus::NotANumber, command_, ": --", name, " expects a number, got '", v, "'");
  TS_CHECK(status == DecimalStatus::Ok, command_, ": --", name, " ", v, " ", decimal_range_note<T>(status));
  return x;
}

double Flags::number(const std::string& name, double fallback) const { return number_of(name, fallback); }

float Flags::number_f32(const std::string& name, float fallback) const { return number_of(name, fallback); }

std::string Flags::usage() const {
  std::string s = "usage: tessera " + command_ + " [flags]\n\n" + summary_ + "\n\nflags:\n";
  for (const auto& n : names_) {
    const std::string& ph = placeholders_.at(n);
    std::string left = "  --" + n + (ph.empty() ? "" : " " + ph);
    if (left.size() < 30) left.append(30 - left.size(), ' ');
    else left += "\n" + std::string(30, ' ');
    s += left + options_.at(n)->get_description() + "\n";
  }
  s += "  --help                      show this help\n";
  return s;
}

}  // namespace tessera::cli
