// tessera/core/dtype.h — element types and the 16-bit float conversions used on the host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tessera {

// F64 exists for the CPU reference's gradient checks (finite differences in double); no CUDA kernel takes it.
enum class DType : uint8_t { F32, BF16, F16, I32, U16, U8, F64 };

// True for the floating-point types a model can compute in.
inline bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64;
}

size_t dtype_size(DType t);
// The names used by safetensors ("F32", "BF16", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype name; throws Error for one tessera does not hold.
DType dtype_from_name(std::string_view name);

// bf16: the top 16 bits of an f32, rounded to nearest even. NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16, round to nearest even, with subnormals, infinities and NaN.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// n host elements of a float dtype (f32, bf16, f16, f64) to f32, and f32 to one (rounded to nearest even).
void convert_to_f32(const void* src, DType src_dtype, size_t n, float* dst);
void convert_from_f32(const float* src, size_t n, DType dst_dtype, void* dst);

}  // namespace tessera
