// tessera/core/context.h — what an op needs to run: the device, and on a GPU its properties.
// No globals: every op receives the Context it runs under.
#pragma once
#include <string>

#include "tessera/core/tensor.h"

namespace tessera {

struct GpuInfo {
  bool available = false;
  int count = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  size_t memory_bytes = 0;
};

// Probes the CUDA runtime. Returns available=false when tessera was built without CUDA, when no driver is
// loaded or when no device is visible: a machine without a GPU is a normal case, not an error.
GpuInfo probe_gpu();

class Context {
 public:
  explicit Context(Device device = Device::cpu()) : device_(device) {}
  Device device() const { return device_; }
  // The best device here: the first GPU if one is visible and the CUDA backend was built, else the CPU.
  static Context best_available();

 private:
  Device device_;
};

}  // namespace tessera
