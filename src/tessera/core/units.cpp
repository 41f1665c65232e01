#include "tessera/core/units.h"

#include <cmath>
#include <cstdlib>
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
  *out = t;
  return DecimalStatus::Ok;
}
template DecimalStatus parse_decimal<float>(std::string_view, float*);
template DecimalStatus parse_decimal<double>(std::string_view, double*);

std::optional<double> parse_byte_size(std::string_view v) {
  size_t used = 0;
  const double x = parse_decimal_prefix(v, &used);
  if (used == 0 || !std::isfinite(x)) return std::nullopt;
  const std::string_view unit = v.substr(used);
  constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1.0},         {"B", 1.0},
      {"KB", 1e3},       {"MB", 1e6},
      {"GB", 1e9},       {"TB", 1e12},
      {"KiB", 1024.0},   {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits)
    if (unit == name) return x * scale;
  return std::nullopt;
}

}  // namespace tessera
