// tessera/core/cuda_graph.h — CUDA graphs: a captured, instantiated graph replayed on a Context's stream, and
// page-locked host memory whose contents a graph copies to the device at every replay.
//
// A graph freezes every kernel argument it was captured with. Whatever changes between replays must therefore
// live in device memory that the graph's kernels read, filled by a copy that the graph itself starts with, from
// pinned host memory that the host rewrites before each replay (a captured copy from pinned memory reads it when
// it runs, not when it was captured). train/graph_step.h builds the training step this way.
//
// Both classes are RAII. The CPU-only build has them too: they refuse to be made (Error), and nothing calls them
// there, since only a CUDA Context captures.
#pragma once
#include <cstddef>
#include <functional>

#include "tessera/core/context.h"

namespace tessera {

// True when this build can capture a step: false in a Debug build, whose TS_CHECK_LAUNCH synchronizes the device
// after every launch, which a capture forbids.
bool cuda_graph_capture_supported();

// Page-locked host memory (cudaMallocHost), zeroed. A copy from it to the device runs asynchronously, and one
// captured into a graph reads it again at every replay. `ready()` is the host's guard against overwriting it
// while a copy queued earlier still has to read it: an event recorded after the last of those copies (in the
// graph or on the stream), waited on by wait_until_read().
class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(size_t bytes, Context& ctx);
  ~PinnedStaging();
  PinnedStaging(PinnedStaging&& o) noexcept;
  PinnedStaging& operator=(PinnedStaging&& o) noexcept;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  void* data() const { return host_; }
  size_t bytes() const { return bytes_; }
  // Records, on ctx's stream, the point after which every copy out of this memory queued so far has read it. In a
  // capture it becomes an event node of the graph (cudaEventRecordExternal), recorded at each replay.
  void mark_read(Context& ctx);
  // Waits on the host until the last mark_read has been passed by the device (at once when it has, or when none
  // was recorded). Call before writing data().
  void wait_until_read() const;

 private:
  void release() noexcept;
  void* host_ = nullptr;
  size_t bytes_ = 0;
  void* event_ = nullptr;  // cudaEvent_t
  int device_ = 0;
};

// What CudaGraph::capture throws when the capture or the instantiation fails (never for an error of the device
// itself): the stream is usable after it, and the same work can run eagerly, which is what `train` does in its
// default --cuda-graph mode.
class CudaGraphCaptureError : public Error {
 public:
  using Error::Error;
};

// One CUDA graph captured from a Context's stream and instantiated for replay.
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(CudaGraph&& o) noexcept;
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Captures what `record` queues on ctx's stream (cudaStreamCaptureModeThreadLocal: a call from this thread that
  // would synchronize or allocate fails the capture; other threads are not affected) and instantiates it; nothing
  // runs. A graph held before is dropped first. When record throws, or the capture fails (an illegal call inside
  // it: a host copy, a synchronize, a cudaMalloc), the capture is ended, its partial graph dropped, the stream
  // is left usable, and CudaGraphCaptureError says "CUDA graph capture of <what> failed: <why>".
  void capture(Context& ctx, const char* what, const std::function<void()>& record);
  // Queues one replay on ctx's stream (the host does not wait).
  void launch(Context& ctx) const;
  bool ready() const { return exec_ != nullptr; }
  size_t nodes() const { return nodes_; }
  void reset() noexcept;

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
  size_t nodes_ = 0;
  int device_ = 0;
};

}  // namespace tessera
