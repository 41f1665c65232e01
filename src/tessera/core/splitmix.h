// tessera/core/splitmix.h — SplitMix64 and the draws built on it, the same on every platform.
//
// make-task's synthetic pairs and the pair batcher's epochs must be the same for a seed on every platform and
// standard library. std::uniform_int_distribution and std::shuffle do not promise that (their algorithms are the
// library's own), so tessera draws from SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014: a Weyl sequence through a fixed 64-bit mix) with its own bounded draw and shuffle.
#pragma once
#include <cstdint>
#include <span>
#include <utility>

namespace tessera {

struct SplitMix64 {
  uint64_t state = 0;

  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, n) for n > 0, without modulo bias: Lemire's multiply-shift (the high half of x·n), redrawing x
  // while the low half falls below 2^64 mod n, the few products that would make some values more likely.
  uint64_t below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Uniform in [lo, hi], lo <= hi.
  uint64_t between(uint64_t lo, uint64_t hi) { return hi - lo == UINT64_MAX ? next() : lo + below(hi - lo + 1); }
};

// The stream for (seed, stream): a seed and a second number (an epoch, a task) mixed into one state, so that
// neighbouring seeds or epochs give unrelated streams.
inline SplitMix64 splitmix_stream(uint64_t seed, uint64_t stream) {
  SplitMix64 s{seed};
  SplitMix64 t{s.next() ^ (stream * 0xd1b54a32d192ed03ull)};
  return SplitMix64{t.next()};
}

// Fisher-Yates: every permutation of v equally likely, given the generator.
template <typename T>
void shuffle_splitmix(std::span<T> v, SplitMix64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace tessera
