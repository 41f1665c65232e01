// tessera/core/memory.h — host memory available to a new allocation.
#pragma once
#include <cstddef>
#include <string_view>

namespace tessera {

// MemAvailable from /proc/meminfo (what can be allocated without swapping), or 0 when it cannot be read.
size_t available_host_memory();

// The address space this process may still map under its limit (RLIMIT_AS, `ulimit -v`): the limit less what is
// mapped now (/proc/self/statm). SIZE_MAX without a limit, or when either cannot be read.
size_t address_space_left();

// Throws Error "out of memory: <what> needs X GiB, Y GiB available (<hint>)" when `bytes` exceed what is
// available. Checked before large allocations because Linux overcommits: a too-large std::vector would not fail
// cleanly but get the process killed once its pages are touched. The hint, when given, is the caller's: the
// flags that size this allocation belong to the command that made it (train's --batch and --seq are not
// bench allreduce's --sizes), so an allocation deep down names none.
void check_host_memory(size_t bytes, const char* what, std::string_view hint = {});

// True for tessera's allocation failures: "out of memory: ..." (check_host_memory, and a host Buffer whose
// allocation fails although the check passed, under a ulimit -v for one) and "out of GPU memory: ..." (a device
// Buffer). Whoever goes on past one (bench model marks the size OOM) or adds its own flags to it (bench allreduce's
// --sizes) recognises them by this, so every such message must start with one of the two.
bool is_out_of_memory(std::string_view message);

}  // namespace tessera
