#include "tessera/core/philox.h"

#include <cmath>

namespace tessera {

float philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  // Two words from the 4-word block of the pair (2*index, 2*index+1); u1 in (0, 1] keeps log finite.
  const double u1 = (static_cast<double>(philox_u32(seed, stream, 2 * index) >> 8) + 1.0) / 16777216.0;
  const double u2 = static_cast<double>(philox_u32(seed, stream, 2 * index + 1) >> 8) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace tessera
