// tessera/infer/sampler_math.h — the arithmetic that the batched sampler's CPU reference and its CUDA kernel share.
//
// Every function here runs on the host and in the kernel and gives the same bits on both: each float operation
// is one IEEE operation rounded to nearest (on the device through the __f*_rn intrinsics, which nvcc never fuses
// into an FMA; the host build is ISO C++ without -march, so GCC contracts nothing), FMAs are explicit, and the
// exponential is the polynomial below rather than the two libraries' expf. So for f32 logits the reference and the
// kernel compute the same masses and draw the same token for the same (seed, row, step).
#pragma once
#include <cmath>
#include <cstdint>

#include "tessera/core/philox.h"

namespace tessera::sampling {

#if defined(__CUDA_ARCH__)
TS_HOST_DEVICE float add_rn(float a, float b) { return __fadd_rn(a, b); }
TS_HOST_DEVICE float sub_rn(float a, float b) { return __fsub_rn(a, b); }
TS_HOST_DEVICE float mul_rn(float a, float b) { return __fmul_rn(a, b); }
TS_HOST_DEVICE float div_rn(float a, float b) { return __fdiv_rn(a, b); }
TS_HOST_DEVICE float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
TS_HOST_DEVICE float rint_f(float a) { return rintf(a); }
#else
TS_HOST_DEVICE float add_rn(float a, float b) { return a + b; }
TS_HOST_DEVICE float sub_rn(float a, float b) { return a - b; }
TS_HOST_DEVICE float mul_rn(float a, float b) { return a * b; }
TS_HOST_DEVICE float div_rn(float a, float b) { return a / b; }
TS_HOST_DEVICE float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
TS_HOST_DEVICE float rint_f(float a) { return std::nearbyint(a); }
#endif

// A token's mass is w = exp((l - max) / T) in (0, 1], held as the integer floor(w 2^38): sums of up to 2^24 masses
// stay below 2^62, integer sums are the same in any order (so the kernel's shared-memory atomics are
// deterministic), and the reference and the kernel add the same integers. A token with w < 2^-38 has mass 0 and is
// never drawn: its true probability is below 2^-38 / 1 (the maximum's w is exactly 1).
constexpr int kMassBits = 38;
constexpr float kMassScale = 274877906944.0f;  // 2^38

// exp(x) for x <= 0, within 2 ulp; exactly 1 at x = 0, and 0 below -30 (where the mass is 0 anyway).
// exp(x) = 2^k exp(r), k = rint(x / ln 2), r = x - k ln 2 (ln 2 split in two so that k ln2_hi is exact),
// |r| <= ln2 / 2, and exp(r) by its degree-7 Taylor polynomial (truncation below 2^-27 on that interval).
TS_HOST_DEVICE float exp_nonpositive(float x) {
  if (!(x > -30.0f)) return 0.0f;
  const float k = rint_f(mul_rn(x, 1.44269502f));
  const float r = fma_rn(-k, 1.428606765e-06f, fma_rn(-k, 0.693145752f, x));  // ln2_hi has 15 bits: k ln2_hi exact
  float q = 1.0f / 5040.0f;
  q = fma_rn(q, r, 1.0f / 720.0f);
  q = fma_rn(q, r, 1.0f / 120.0f);
  q = fma_rn(q, r, 1.0f / 24.0f);
  q = fma_rn(q, r, 1.0f / 6.0f);
  q = fma_rn(q, r, 0.5f);
  q = fma_rn(q, r, 1.0f);
  q = fma_rn(q, r, 1.0f);
  // 2^k for k in [-44, 0]: normal floats, built from their exponent bits.
  const int ki = static_cast<int>(k);
  union {
    uint32_t u;
    float f;
  } scale{static_cast<uint32_t>(127 + ki) << 23};
  return mul_rn(q, scale.f);
}

// w = exp((l - max) / T) for a finite max; l = -inf gives 0.
TS_HOST_DEVICE float weight(float l, float max, float temperature) {
  return exp_nonpositive(div_rn(sub_rn(l, max), temperature));
}
TS_HOST_DEVICE uint64_t mass_of(float w) { return static_cast<uint64_t>(mul_rn(w, kMassScale)); }

// The order key of a logit: an unsigned integer that orders as the float does (-inf lowest; NaN never reaches it),
// with -0 and +0 one key, since they compare equal.
TS_HOST_DEVICE uint32_t order_key(float l) {
  union {
    float f;
    uint32_t u;
  } b{l == 0.0f ? 0.0f : l};
  return (b.u & 0x80000000u) ? ~b.u : (b.u | 0x80000000u);
}

// The penalties of Hugging Face and OpenAI for a token that appears `count` times in the row's history:
// repetition r (RepetitionPenaltyLogitsProcessor): l < 0 ? l * r : l / r, for count > 0;
// then l - (count · frequency + [count > 0] · presence) (OpenAI's frequency and presence penalties).
TS_HOST_DEVICE float penalize(float l, int32_t count, float repetition, float presence, float frequency) {
  if (count <= 0) return l;
  if (repetition != 1.0f) l = l < 0.0f ? mul_rn(l, repetition) : div_rn(l, repetition);
  return sub_rn(l, fma_rn(static_cast<float>(count), frequency, presence));
}

// ceil(p · Z) clamped to [1, Z]: the nucleus keeps a token iff the mass strictly above it is below p · Z, and for
// an integer mass S, S < p Z iff S < ceil(p Z). Computed in f64 with one rounding, the same on host and device.
TS_HOST_DEVICE uint64_t nucleus_mass(float top_p, uint64_t Z) {
  const double m = ceil(static_cast<double>(top_p) * static_cast<double>(Z));
  if (!(m >= 1.0)) return 1;
  if (m >= static_cast<double>(Z)) return Z;
  return static_cast<uint64_t>(m);
}

// The draw of (seed, row, step): a 32-bit Philox word u, and the target t = floor(u · Z / 2^32) < Z in exact
// integer arithmetic (Z < 2^62). The drawn token is the first, in id order, whose inclusive prefix of kept mass
// exceeds t: token j with probability mass_j / Z (up to the 2^-32 resolution of u).
TS_HOST_DEVICE uint32_t draw_word(uint64_t seed, int row, uint32_t step) {
  return philox_u32(seed, /*stream=*/static_cast<uint64_t>(row), /*index=*/step);
}
TS_HOST_DEVICE uint64_t draw_target(uint32_t u, uint64_t Z) {
  return (Z >> 32) * u + (((Z & 0xffffffffull) * u) >> 32);
}

}  // namespace tessera::sampling
