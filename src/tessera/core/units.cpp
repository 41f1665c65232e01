#include "tessera/core/units.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

namespace tessera {

double parse_decimal_prefix(std::string_view v, size_t* used) {
  const std::string head(v.substr(0, v.find_first_not_of("0123456789+-.eE")));
  char* end = nullptr;
  const double x = std::strtod(head.c_str(), &end);  // on those characters alone, strtod reads decimal only
  *used = static_cast<size_t>(end - head.c_str());
  return *used == 0 ? 0.0 : x;
}

template <typename T>
DecimalStatus parse_decimal(std::string_view v, T* out) {
  size_t used = 0;
  const double x = parse_decimal_prefix(v, &used);
  if (v.empty() || used != v.size()) return DecimalStatus::NotANumber;
  const T t = static_cast<T>(x);  // rounds to nearest: past the largest finite T by more than half an ulp is inf
  if (std::isinf(t)) return DecimalStatus::OutOfRange;  // the text is digits: an inf is an overflow
  // A zero or subnormal T from a mantissa with a nonzero digit ("1e-50", and "1e-400" as a double) underflowed.
  const std::string_view mantissa = v.substr(0, v.find_first_of("eE"));
  if (std::fabs(t) < std::numeric_limits<T>::min() && mantissa.find_first_of("123456789") != std::string_view::npos)
    return DecimalStatus::Underflow;
  *out = t;
  return DecimalStatus::Ok;
}
template DecimalStatus parse_decimal<float>(std::string_view, float*);
template DecimalStatus parse_decimal<double>(std::string_view, double*);

template <typename T>
std::string decimal_range_note(DecimalStatus status) {
  std::ostringstream s;
  if (status == DecimalStatus::Underflow)
    s << "is too close to zero (the smallest magnitude it takes is " << std::numeric_limits<T>::min() << ")";
  else s << "is out of range (" << std::numeric_limits<T>::lowest() << " to " << std::numeric_limits<T>::max() << ")";
  return s.str();
}
template std::string decimal_range_note<float>(DecimalStatus);
template std::string decimal_range_note<double>(DecimalStatus);

std::optional<double> parse_byte_size(std::string_view v) {
  size_t used = 0;
  const double x = parse_decimal_prefix(v, &used);
  if (used == 0 || !std::isfinite(x)) return std::nullopt;
  const std::string_view unit = v.substr(used);
  constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1.0},    {"B", 1.0},      {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits)
    if (unit == name) return x * scale;
  return std::nullopt;
}

std::string counted(unsigned long long n, std::string_view noun) {
  return std::to_string(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

std::string human_bytes(double b) {
  // Up to PiB: info's estimate for a config of a trillion parameters read "1570.01 TiB".
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

}  // namespace tessera
