// tessera/core/fnv.h — FNV-1a, 64 bits: a fingerprint of what must agree (a run's options and data, the ranks'
// flags), not a defence against anyone. Checkpoints store such fingerprints (data_fingerprint): the hash of given
// bytes must never change.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  // The bytes, continuing the hash.
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  // The string's length (8 bytes), then its bytes: "ab" + "c" and "a" + "bc" differ.
  void add(const std::string& s) {
    const uint64_t n = s.size();
    add(&n, sizeof n);
    add(s.data(), s.size());
  }
};

}  // namespace tessera
