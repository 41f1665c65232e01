// The CUDA side of core/trace.h: NVTX ranges (nvtx3, header-only) and the CUDA events that time slices on a
// context's stream.
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include "tessera/core/context.h"
#include "tessera/core/cuda_check.h"

namespace tessera {

void nvtx_push(const char* name) { nvtxRangePushA(name); }
void nvtx_pop() { nvtxRangePop(); }

// An event recorded on the context's stream now; with timing on (no cudaEventDisableTiming).
void* trace_event_record(const Context& ctx) {
  cudaEvent_t e = nullptr;
  TS_CHECK_CUDA(cudaEventCreate(&e));
  TS_CHECK_CUDA(cudaEventRecord(e, ctx.stream()));
  return e;
}

double trace_event_elapsed_us(void* from, void* to) {
  TS_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(to)));
  float ms = 0;
  TS_CHECK_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
  return 1000.0 * ms;
}

void trace_event_destroy(void* event) noexcept { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

}  // namespace tessera
