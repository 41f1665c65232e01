// tessera/core/parallel.h — when the CPU reference spreads a loop over threads.
#pragma once

namespace tessera {

// Work (iterations × inner loop length) below which a reference loop stays on one thread: forking OpenMP
// threads for less costs more than it saves, and oversubscribes machines that run many small tests at once (the
// fp64 model gradient checks are many such small loops, under a parallel ctest).
constexpr long kParallelMinWork = 1L << 16;

}  // namespace tessera
