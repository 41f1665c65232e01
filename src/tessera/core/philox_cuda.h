// tessera/core/philox_cuda.h — Philox draws made on the GPU, for checking them against the host.
#pragma once
#include <cstdint>
#include <vector>

namespace tessera {

// Words philox_u32(seed, stream, i) for i in [0, n), computed by a CUDA kernel (one thread per word).
// Only built with the CUDA backend; throws Error when no GPU is usable.
std::vector<uint32_t> philox_u32_cuda(uint64_t seed, uint64_t stream, size_t n);

}  // namespace tessera
