// tessera/core/units.h — numbers and byte sizes as the command line writes them.
//
// strtod and sscanf("%lf") also read hex floats ("0x10" is 16), "inf", "nan" and leading blanks: a flag such as
// `--lr 0x10` was taken as 16. These read decimal notation only.
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace tessera {

// The decimal number at the start of `v` (sign, digits, point, exponent), and in *used how many characters it
// took; *used is 0 (and the result 0) when `v` does not start with one.
double parse_decimal_prefix(std::string_view v, size_t* used);

// A size in bytes: a decimal number then an optional unit, B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB,
// TiB (powers of 1024): "512MiB", "1.5GB", "4096". nullopt when `v` is not one (an unknown unit, trailing text,
// a value that is not finite). The value is not rounded or range-checked: the caller says what it accepts.
std::optional<double> parse_byte_size(std::string_view v);

}  // namespace tessera
