// tessera/core/memory.h — host memory available to a new allocation.
#pragma once
#include <cstddef>

namespace tessera {

// MemAvailable from /proc/meminfo (what can be allocated without swapping), or 0 when it cannot be read.
size_t available_host_memory();

// Throws Error "out of memory: <what> needs X GiB, Y GiB available" when `bytes` exceed what is available.
// Checked before large allocations because Linux overcommits: a too-large std::vector would not fail cleanly
// but get the process killed once its pages are touched.
void check_host_memory(size_t bytes, const char* what);

}  // namespace tessera
