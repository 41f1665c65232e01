#include "tessera/core/dtype.h"

#include <cmath>

#include "tessera/core/error.h"

namespace tessera {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::U16: return 2;
    case DType::U8: return 1;
    case DType::F64: return 8;
  }
  TS_THROW("unknown dtype");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
    case DType::F64: return "F64";
  }
  TS_THROW("unknown dtype");
}

DType dtype_from_name(std::string_view name) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::U16, DType::U8, DType::F64}) {
    if (dtype_name(t) == name) return t;
  }
  TS_THROW("unsupported dtype '", name, "'");
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): value = abs_float / 2^-24, rounded to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // 2^24, exact
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias exponent 127 -> 15 and round the mantissa from 23 to 10 bits.
  uint32_t r = abs - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Conversions of a whole model's weights (a checkpoint loaded into a 16-bit model) spread over the cores; each
// element is converted on its own, so the result does not depend on the thread count.
constexpr size_t kParallelFrom = size_t{1} << 20;

void convert_to_f32(const void* src, DType src_dtype, size_t n, float* dst) {
  switch (src_dtype) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(static_cast<const double*>(src)[i]);
      return;
    case DType::BF16:
#pragma omp parallel for schedule(static) if (n > kParallelFrom)
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::F16:
#pragma omp parallel for schedule(static) if (n > kParallelFrom)
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    default: TS_THROW("cannot convert ", dtype_name(src_dtype), " to F32");
  }
}

void convert_from_f32(const float* src, size_t n, DType dst_dtype, void* dst) {
  switch (dst_dtype) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(dst)[i] = src[i];
      return;
    case DType::BF16:
#pragma omp parallel for schedule(static) if (n > kParallelFrom)
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      return;
    case DType::F16:
#pragma omp parallel for schedule(static) if (n > kParallelFrom)
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      return;
    default: TS_THROW("cannot convert F32 to ", dtype_name(dst_dtype));
  }
}

}  // namespace tessera
