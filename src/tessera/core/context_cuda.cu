// tessera/core/context_cuda.cu — the CUDA half of Context: device probe, stream, cuBLASLt handle, workspaces.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>

#include "tessera/core/context.h"
#include "tessera/core/cuda_check.h"

namespace tessera {

GpuInfo probe_gpu() {
  GpuInfo info;
  int count = 0;
  // No driver or no device is the normal CPU-only case: clear the sticky error and report none.
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    return info;
  }
  info.available = true;
  info.count = count;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.memory_bytes = prop.totalGlobalMem;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  return info;
}

bool built_with_cuda() { return true; }

struct Context::Cuda {
  static constexpr size_t kGemmWorkspace = size_t{32} << 20;  // cuBLASLt's recommendation for Hopper
  GpuInfo info;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* gemm_ws = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  uint32_t* counters = nullptr;  // kArrivalCounters, zeroed
  int64_t scratch_generation = 0;
  std::map<std::string, void*> tables;  // device_table()
  int device = 0;

  ~Cuda() {
    // Destructors must not throw: release what exists and ignore errors from a device already in trouble.
    cudaSetDevice(device);
    if (stream) cudaStreamSynchronize(stream);
    if (scratch) cudaFree(scratch);
    for (auto& [key, ptr] : tables) cudaFree(ptr);
    if (counters) cudaFree(counters);
    if (gemm_ws) cudaFree(gemm_ws);
    if (lt) cublasLtDestroy(lt);
    if (stream) cudaStreamDestroy(stream);
  }
};

Context::Context(Device device) : device_(device) {
  if (device.is_cpu()) return;
  const GpuInfo probe = probe_gpu();
  TS_CHECK(probe.available, "device ", device.str(), ": no GPU is visible (no driver or no device); use --device cpu");
  TS_CHECK(device.index >= 0 && device.index < probe.count, "device ", device.str(), ": only ", probe.count,
           " GPU(s) visible");
  auto c = std::make_unique<Cuda>();
  c->device = device.index;
  TS_CHECK_CUDA(cudaSetDevice(device.index));
  cudaDeviceProp prop{};
  TS_CHECK_CUDA(cudaGetDeviceProperties(&prop, device.index));
  c->info = probe;
  c->info.name = prop.name;
  c->info.sm_major = prop.major;
  c->info.sm_minor = prop.minor;
  c->info.sm_count = prop.multiProcessorCount;
  c->info.memory_bytes = prop.totalGlobalMem;
  c->info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  c->info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  TS_CHECK(prop.major >= 9, "device ", device.str(), " (", prop.name, ", sm_", prop.major, prop.minor,
           "): tessera's kernels are built for sm_90a (H100/H200) only");
  TS_CHECK_CUDA(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  const cublasStatus_t st = cublasLtCreate(&c->lt);
  TS_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLASLt: cannot create a handle (status ", static_cast<int>(st), ")");
  TS_CHECK_CUDA(cudaMalloc(&c->gemm_ws, Cuda::kGemmWorkspace));
  TS_CHECK_CUDA(cudaMalloc(&c->counters, kArrivalCounters * sizeof(uint32_t)));
  TS_CHECK_CUDA(cudaMemsetAsync(c->counters, 0, kArrivalCounters * sizeof(uint32_t), c->stream));
  TS_CHECK_CUDA(cudaStreamSynchronize(c->stream));
  cuda_ = std::move(c);
}

Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;

Stream Context::stream() const {
  TS_CHECK(cuda_, "internal: stream() on a CPU context");
  return cuda_->stream;
}
void* Context::cublaslt() const {
  TS_CHECK(cuda_, "internal: cublaslt() on a CPU context");
  return cuda_->lt;
}
void* Context::gemm_workspace() const {
  TS_CHECK(cuda_, "internal: gemm_workspace() on a CPU context");
  return cuda_->gemm_ws;
}
size_t Context::gemm_workspace_bytes() const { return cuda_ ? Cuda::kGemmWorkspace : 0; }
const GpuInfo& Context::gpu() const {
  TS_CHECK(cuda_, "internal: gpu() on a CPU context");
  return cuda_->info;
}

void* Context::scratch(size_t bytes) {
  TS_CHECK(cuda_, "internal: scratch() on a CPU context");
  if (bytes <= cuda_->scratch_bytes) return cuda_->scratch;
  const size_t grown = std::max(bytes, cuda_->scratch_bytes * 2);
  // A graph being captured cannot synchronize or allocate: say why, rather than leave the capture invalidated.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TS_CHECK_CUDA(cudaStreamIsCapturing(cuda_->stream, &capturing));
  TS_CHECK(capturing == cudaStreamCaptureStatusNone, "internal: the context's scratch must grow from ",
           cuda_->scratch_bytes, " to ", bytes, " bytes during a CUDA graph capture (a step must run eagerly first)");
  TS_CHECK_CUDA(cudaStreamSynchronize(cuda_->stream));
  if (cuda_->scratch) TS_CHECK_CUDA(cudaFree(cuda_->scratch));
  cuda_->scratch = nullptr;
  cuda_->scratch_bytes = 0;
  TS_CHECK_CUDA(cudaMalloc(&cuda_->scratch, grown));
  cuda_->scratch_bytes = grown;
  cuda_->scratch_generation++;
  return cuda_->scratch;
}

int64_t Context::scratch_generation() const { return cuda_ ? cuda_->scratch_generation : 0; }

const void* Context::device_table(const std::string& key, size_t bytes, const std::function<void(void*)>& fill) {
  TS_CHECK(cuda_, "internal: device_table() on a CPU context");
  if (auto it = cuda_->tables.find(key); it != cuda_->tables.end()) return it->second;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TS_CHECK_CUDA(cudaStreamIsCapturing(cuda_->stream, &capturing));
  TS_CHECK(capturing == cudaStreamCaptureStatusNone, "internal: the device table '", key, "' is first asked for ",
           "during a CUDA graph capture (a step must run eagerly first)");
  void* ptr = nullptr;
  TS_CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)));
  try {
    fill(ptr);
  } catch (...) {
    cudaFree(ptr);
    throw;
  }
  cuda_->tables.emplace(key, ptr);
  return ptr;
}

uint32_t* Context::arrival_counters() const {
  TS_CHECK(cuda_, "internal: arrival_counters() on a CPU context");
  return cuda_->counters;
}

void Context::synchronize() const {
  if (cuda_) TS_CHECK_CUDA(cudaStreamSynchronize(cuda_->stream));
}

size_t Context::device_memory_used() const {
  if (!cuda_) return 0;
  TS_CHECK_CUDA(cudaSetDevice(cuda_->device));
  size_t free_b = 0, total_b = 0;
  TS_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

}  // namespace tessera
