// tessera/core/philox.h — Philox4x32-10 (Salmon et al., SC'11), a counter-based RNG.
//
// The same function runs on the host and in CUDA kernels, so a dropout mask drawn on the GPU equals the one
// drawn by the CPU reference: element i of draw `stream` under `seed` is a pure function of (seed, stream, i).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define TS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TS_HOST_DEVICE inline
#endif

namespace tessera {

struct Philox4 {
  uint32_t v[4];
};

TS_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// One block of 4 random words for counter `ctr` and key `key`, ten rounds.
TS_HOST_DEVICE Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, ctr.v[0], hi0, lo0);
    philox_mulhilo(kMul1, ctr.v[2], hi1, lo1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return ctr;
}

// Block `block` of draw `stream` under `seed`: words 4 block .. 4 block + 3 of that draw (counter (block,
// stream), key seed).
TS_HOST_DEVICE Philox4 philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  const Philox4 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(stream),
                     static_cast<uint32_t>(stream >> 32)}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The 32-bit word for element `index` of draw `stream` under `seed`.
TS_HOST_DEVICE uint32_t philox_u32(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox_block(seed, stream, index >> 2).v[index & 3];
}

// Uniform in [0, 1) with 24 bits: exact in f32.
TS_HOST_DEVICE float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<float>(philox_u32(seed, stream, index) >> 8) * (1.0f / 16777216.0f);
}

// The 16-bit draw of element `index`: element i takes half i % 2 of word i / 2 (the low half first), so one
// Philox block (4 words) serves 8 elements. Dropout needs no more resolution than 2^-16, and with a word per
// element the Philox rounds would be the larger part of a dropout kernel's time.
TS_HOST_DEVICE uint32_t philox_u16(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint32_t w = philox_u32(seed, stream, index >> 1);
  return (index & 1) ? w >> 16 : w & 0xffffu;
}

// Dropout keep decision for element `index`: kept when philox_u16 / 2^16 >= p, with probability
// 1 - ceil(p 2^16) / 2^16 (within 2^-16 of 1 - p; exact when p 2^16 is a whole number, as for p = 0.25).
TS_HOST_DEVICE bool philox_keep(uint64_t seed, uint64_t stream, uint64_t index, float p) {
  return static_cast<float>(philox_u16(seed, stream, index)) * (1.0f / 65536.0f) >= p;
}

// Host-side RNG state of a training run: the seed and the next unused stream. Each random draw (a dropout
// site in one step, an init of one tensor) takes a fresh stream, so a checkpoint of {seed, next_stream}
// resumes the exact sequence.
struct RngState {
  uint64_t seed = 0;
  uint64_t next_stream = 0;
  uint64_t take() { return next_stream++; }
};

// Standard normal via Box-Muller over two uniforms of one draw (host only: used for initialisation).
float philox_normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace tessera
