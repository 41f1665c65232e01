// tessera/core/units.h — numbers and byte sizes as the command line writes them.
//
// strtod and sscanf("%lf") also read hex floats ("0x10" is 16), "inf", "nan" and leading blanks: a flag such as
// `--lr 0x10` would be taken as 16. These read decimal notation only.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace tessera {

// The decimal number at the start of `v` (sign, digits, point, exponent), and in *used how many characters it
// took; *used is 0 (and the result 0) when `v` does not start with one.
double parse_decimal_prefix(std::string_view v, size_t* used);

// `v` as a whole decimal number (parse_decimal_prefix over all of it) of type T, float or double. strtod reads a
// decimal past double's range as +-inf, and a double past float's rounds to +-inf as a float: both are OutOfRange,
// so that the message can quote what was typed ("--lr 1e300 is out of range") instead of the inf it would have
// become. A nonzero decimal closer to zero than T's smallest normal magnitude is Underflow: as a float, `--lr 1e-50`
// is 0, and an error would say "got 0" of a number that is not. *out is set when Ok.
enum class DecimalStatus { Ok, NotANumber, OutOfRange, Underflow };
template <typename T>
DecimalStatus parse_decimal(std::string_view v, T* out);
// What an error says after the number as typed, for OutOfRange and Underflow (T's range, in six digits):
// "is out of range (-3.40282e+38 to 3.40282e+38)", "is too close to zero (the smallest magnitude it takes is
// 1.17549e-38)".
template <typename T>
std::string decimal_range_note(DecimalStatus status);

// A size in bytes: a decimal number then an optional unit, B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB,
// TiB (powers of 1024): "512MiB", "1.5GB", "4096". nullopt when `v` is not one (an unknown unit, trailing text,
// a value that is not finite). The value is not rounded or range-checked: the caller says what it accepts.
std::optional<double> parse_byte_size(std::string_view v);

// "1 token", "0 tokens", "2 tokens": n and the noun, plural but for n == 1 (the noun's plural is noun + "s").
std::string counted(unsigned long long n, std::string_view noun);
// "1.50 GiB", "640.00 KiB", "12.00 B": two decimals in the largest binary unit (to PiB) that leaves at least 1.
std::string human_bytes(double bytes);

}  // namespace tessera
