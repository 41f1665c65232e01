#include "tessera/core/context.h"

#include <cctype>
#include <cstdlib>

namespace tessera {

#ifndef TESSERA_WITH_CUDA
// The CPU-only build: no GPU is ever visible, and a CUDA Context is a clear error.
GpuInfo probe_gpu() { return {}; }
bool built_with_cuda() { return false; }

struct Context::Cuda {};

Context::Context(Device device) : device_(device) {
  TS_CHECK(device.is_cpu(), "device ", device.str(),
           ": this tessera was built without CUDA (nvcc was not found "
           "at configure time); use --device cpu");
}
Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;
Stream Context::stream() const { TS_THROW("internal: stream() on a CPU context"); }
void* Context::cublaslt() const { TS_THROW("internal: cublaslt() on a CPU context"); }
void* Context::gemm_workspace() const { TS_THROW("internal: gemm_workspace() on a CPU context"); }
size_t Context::gemm_workspace_bytes() const { return 0; }
const GpuInfo& Context::gpu() const { TS_THROW("internal: gpu() on a CPU context"); }
void* Context::scratch(size_t) { TS_THROW("internal: scratch() on a CPU context"); }
int64_t Context::scratch_generation() const { return 0; }
const void* Context::device_table(const std::string&, size_t, const std::function<void(void*)>&) {
  TS_THROW("internal: device_table() on a CPU context");
}
uint32_t* Context::arrival_counters() const { TS_THROW("internal: arrival_counters() on a CPU context"); }
void Context::synchronize() const {}
size_t Context::device_memory_used() const { return 0; }
#endif

Context Context::best_available() {
  const GpuInfo gpu = probe_gpu();
  return gpu.available ? Context(Device::cuda(0)) : Context(Device::cpu());
}

Context Context::from_name(const std::string& name) {
  if (name == "cpu") return Context(Device::cpu());
  if (name == "cuda" || name.starts_with("cuda:")) {
    int index = 0;
    if (name != "cuda") {  // "cuda:" alone is refused, not taken as cuda:0
      char* end = nullptr;
      const long v = std::strtol(name.c_str() + 5, &end, 10);
      TS_CHECK(std::isdigit(static_cast<unsigned char>(name[5])) && *end == '\0' && v < 1024, "--device: '", name,
               "' is not cuda:N");
      index = static_cast<int>(v);
    }
    TS_CHECK(built_with_cuda(), "--device ", name, ": this tessera was built without CUDA; use --device cpu");
    const GpuInfo gpu = probe_gpu();
    TS_CHECK(gpu.available, "--device ", name, ": no GPU is visible (no driver or no device); use --device cpu");
    TS_CHECK(index < gpu.count, "--device ", name, ": only ", gpu.count, " GPU(s) visible");
    return Context(Device::cuda(index));
  }
  TS_THROW("--device: unknown device '", name, "' (expected cpu, cuda or cuda:N)");
}

}  // namespace tessera
