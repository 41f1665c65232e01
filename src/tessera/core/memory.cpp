#include "tessera/core/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "tessera/core/error.h"

namespace tessera {

size_t available_host_memory() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "MemAvailable: %zu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

size_t address_space_left() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return SIZE_MAX;
  unsigned long pages = 0;
  const bool read = std::fscanf(f, "%lu", &pages) == 1;
  std::fclose(f);
  if (!read) return SIZE_MAX;
  const size_t used = static_cast<size_t>(pages) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t limit = static_cast<size_t>(lim.rlim_cur);
  return limit > used ? limit - used : 0;
}

void check_host_memory(size_t bytes, const char* what, std::string_view hint) {
  const size_t avail = available_host_memory();
  if (avail == 0) return;  // unknown: let the allocation decide
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  TS_CHECK(bytes <= avail, "out of memory: ", what, " needs ", bytes / kGiB, " GiB, ", avail / kGiB, " GiB available",
           hint.empty() ? "" : " (", hint, hint.empty() ? "" : ")");
}

bool is_out_of_memory(std::string_view message) {
  return message.starts_with("out of memory") || message.starts_with("out of GPU memory");
}

}  // namespace tessera
