// tessera/ops/attention/attention_dropout.h — which Philox draw keeps or drops score (i, j) of one attention head.
// Host and device: the CPU reference, the tiled f32 kernels and the flash kernels call the same functions, so
// they drop the same elements for the same (seed, stream).
//
// One Philox4x32-10 block (4 words = 8 draws of 16 bits) serves the eight scores of one head at queries i, i + 8
// (bit 3 of i) and keys j, j + 1, j + 8, j + 9 (bits 0 and 3 of j): exactly what one lane holds of an m16n8 (or
// wgmma) accumulator tile over two adjacent 8-key column blocks, when rows are queries. A flash kernel whose rows
// are queries (forward, dQ pass) draws one block for eight scores; where rows are keys (dK / dV pass) a lane holds
// queries c, c + 1 and needs half of each of two blocks, which it shares with the lane that holds the other halves
// (one draws each, and they swap words), so that it too draws one block per eight scores.
//   block = ((b H + h) Gi + i') Gj + j',  i' = 8 (i >> 4) + (i & 7),  j' = 4 (j >> 4) + ((j >> 1) & 3),
//   Gi = 8 ceil(Tq / 16),  Gj = 4 ceil(Tk / 16) (Tq = Tk = T for the packed call);   word = 2 bit3(i) + bit3(j),  half
//   = bit0(j) (the low half first).
// The score is kept when that 16-bit draw is >= ceil(p 2^16), i.e. when draw / 2^16 >= p, as philox_keep: with
// probability within 2^-16 of 1 - p. A kept score is scaled by 1 / (1 - p).
#pragma once
#include <cmath>
#include <cstdint>

#include "tessera/core/philox.h"

namespace tessera {

// The dropout of one attention call as kernels take it: threshold 0 means none.
struct AttentionDropoutDraw {
  uint64_t seed = 0, stream = 0;
  uint32_t threshold = 0;  // ceil(p 2^16): a 16-bit draw below it drops the score
  float scale = 1.0f;      // 1 / (1 - p)
  // Context::philox_stream_base (device memory, CUDA graphs): when set, the stream drawn is *stream_base + stream.
  const uint64_t* stream_base = nullptr;
};

inline AttentionDropoutDraw attention_dropout_draw(float dropout, uint64_t seed, uint64_t stream,
                                                   const uint64_t* stream_base = nullptr) {
  if (!(dropout > 0.0f)) return {};
  return {seed, stream, static_cast<uint32_t>(std::ceil(static_cast<double>(dropout) * 65536.0)),
          static_cast<float>(1.0 / (1.0 - static_cast<double>(dropout))), stream_base};
}

#if defined(__CUDACC__)
// In a kernel, before the first draw: adds the graph's stream base (once) where there is one.
__device__ __forceinline__ void attention_dropout_resolve(AttentionDropoutDraw& d) {
  if (d.threshold && d.stream_base) {
    d.stream += *d.stream_base;
    d.stream_base = nullptr;
  }
}
#endif

// The Philox block index of score (i, j) of query head bh = b H + h, Tq queries and Tk keys (the formula above).
TS_HOST_DEVICE uint64_t attention_dropout_block(uint64_t bh, int Tq, int Tk, int i, int j) {
  const uint64_t groups_q = (static_cast<uint64_t>(Tq) + 15) >> 4, groups_k = (static_cast<uint64_t>(Tk) + 15) >> 4;
  const uint64_t ii = (static_cast<uint64_t>(i >> 4) << 3) | static_cast<uint64_t>(i & 7);
  const uint64_t jj = (static_cast<uint64_t>(j >> 4) << 2) | static_cast<uint64_t>((j >> 1) & 3);
  return (bh * (groups_q << 3) + ii) * (groups_k << 2) + jj;
}
// The packed call's: Tq = Tk = T.
TS_HOST_DEVICE uint64_t attention_dropout_block(uint64_t bh, int T, int i, int j) {
  return attention_dropout_block(bh, T, T, i, j);
}

// Which of the block's four words, and which 16-bit half of it, draws score (i, j).
TS_HOST_DEVICE int attention_dropout_word(int i, int j) { return ((i >> 2) & 2) | ((j >> 3) & 1); }
TS_HOST_DEVICE bool attention_dropout_keeps(uint32_t word, int half, uint32_t threshold) {
  return ((half ? word >> 16 : word & 0xffffu)) >= threshold;
}

// Kept (true) or dropped, one block drawn per call: for the reference and the tiled kernels.
TS_HOST_DEVICE bool attention_dropout_keep(const AttentionDropoutDraw& d, uint64_t bh, int Tq, int Tk, int i, int j) {
  const Philox4 r = philox_block(d.seed, d.stream, attention_dropout_block(bh, Tq, Tk, i, j));
  return attention_dropout_keeps(r.v[attention_dropout_word(i, j)], j & 1, d.threshold);
}
TS_HOST_DEVICE bool attention_dropout_keep(const AttentionDropoutDraw& d, uint64_t bh, int T, int i, int j) {
  return attention_dropout_keep(d, bh, T, T, i, j);
}

}  // namespace tessera
