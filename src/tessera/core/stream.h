// tessera/core/stream.h — the CUDA stream type, named without including the CUDA headers, so that plain C++
// files (the CPU build, op headers) can pass streams around. Identical to the runtime's own typedef.
#pragma once

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace tessera {
using Stream = cudaStream_t;
}  // namespace tessera
