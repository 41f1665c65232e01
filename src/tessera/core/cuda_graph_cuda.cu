// tessera/core/cuda_graph_cuda.cu — capture, instantiation and replay of CUDA graphs; pinned staging memory.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <utility>

#include "tessera/core/cuda_check.h"
#include "tessera/core/cuda_graph.h"

namespace tessera {

bool cuda_graph_capture_supported() {
#ifdef NDEBUG
  return true;
#else
  return false;  // TS_CHECK_LAUNCH synchronizes the device after each launch
#endif
}

PinnedStaging::PinnedStaging(size_t bytes, Context& ctx) : bytes_(bytes), device_(ctx.device().index) {
  TS_CHECK(ctx.is_cuda(), "internal: pinned staging on a CPU context");
  TS_CHECK_CUDA(cudaSetDevice(device_));
  TS_CHECK_CUDA(cudaMallocHost(&host_, bytes));
  std::memset(host_, 0, bytes);
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    cudaFreeHost(host_);
    host_ = nullptr;
    TS_CHECK_CUDA(err);
  }
  event_ = e;
}

PinnedStaging::~PinnedStaging() { release(); }

PinnedStaging::PinnedStaging(PinnedStaging&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
      event_(std::exchange(o.event_, nullptr)), device_(o.device_) {}

PinnedStaging& PinnedStaging::operator=(PinnedStaging&& o) noexcept {
  if (this != &o) {
    release();
    host_ = std::exchange(o.host_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    event_ = std::exchange(o.event_, nullptr);
    device_ = o.device_;
  }
  return *this;
}

void PinnedStaging::release() noexcept {
  // A copy still queued may read the memory: wait for it before freeing (errors ignored in a destructor).
  if (event_) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(event_));
    cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  }
  if (host_) cudaFreeHost(host_);
  host_ = nullptr;
  event_ = nullptr;
  bytes_ = 0;
}

void PinnedStaging::mark_read(Context& ctx) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TS_CHECK_CUDA(cudaStreamIsCapturing(ctx.stream(), &status));
  // Inside a capture a plain record only orders streams within the graph; the external flag makes it a node that
  // records the event at each replay, which is what the host waits for.
  const unsigned flags = status == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault;
  TS_CHECK_CUDA(cudaEventRecordWithFlags(static_cast<cudaEvent_t>(event_), ctx.stream(), flags));
}

void PinnedStaging::wait_until_read() const {
  if (event_) TS_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

CudaGraph::~CudaGraph() { reset(); }

CudaGraph::CudaGraph(CudaGraph&& o) noexcept
    : exec_(std::exchange(o.exec_, nullptr)), nodes_(std::exchange(o.nodes_, 0)), device_(o.device_) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    reset();
    exec_ = std::exchange(o.exec_, nullptr);
    nodes_ = std::exchange(o.nodes_, 0);
    device_ = o.device_;
  }
  return *this;
}

void CudaGraph::reset() noexcept {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = nullptr;
  nodes_ = 0;
}

void CudaGraph::capture(Context& ctx, const char* what, const std::function<void()>& record) {
  TS_CHECK(ctx.is_cuda(), "internal: CUDA graph capture on a CPU context");
  reset();
  device_ = ctx.device().index;
  const cudaStream_t stream = ctx.stream();
  TS_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string failure;
  try {
    record();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "a non-standard exception";
  }
  // The capture ends whatever happened, so that the stream is never left capturing.
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (failure.empty() && ended != cudaSuccess)
    failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
  if (failure.empty() && graph == nullptr) failure = "the capture produced no graph";
  if (!failure.empty()) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // an invalidated capture's error is not sticky; clear it so that later calls start clean
    throw CudaGraphCaptureError(__FILE__, __LINE__,
                                detail::concat("CUDA graph capture of ", what, " failed: ", failure,
                                               " (run with --cuda-graph off)"));
  }
  size_t n = 0;
  cudaGraphGetNodes(graph, nullptr, &n);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph is independent of it
  if (inst != cudaSuccess) {
    cudaGetLastError();
    throw CudaGraphCaptureError(__FILE__, __LINE__,
                                detail::concat("CUDA graph of ", what, ": cannot instantiate it (",
                                               cudaGetErrorString(inst), "; ", n,
                                               " nodes); run with --cuda-graph off"));
  }
  exec_ = exec;
  nodes_ = n;
}

void CudaGraph::launch(Context& ctx) const {
  TS_CHECK(exec_, "internal: launch of a CUDA graph that was not captured");
  TS_CHECK_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), ctx.stream()));
}

}  // namespace tessera
