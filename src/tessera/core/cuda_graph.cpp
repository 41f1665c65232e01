// The CPU-only build's CUDA graphs: none can be made (only a CUDA Context captures, and there is none here).
#include "tessera/core/cuda_graph.h"

#include "tessera/core/error.h"

namespace tessera {

#ifndef TESSERA_WITH_CUDA
bool cuda_graph_capture_supported() { return false; }

PinnedStaging::PinnedStaging(size_t, Context&) { TS_THROW("internal: pinned memory in a build without CUDA"); }
PinnedStaging::~PinnedStaging() = default;
PinnedStaging::PinnedStaging(PinnedStaging&&) noexcept = default;
PinnedStaging& PinnedStaging::operator=(PinnedStaging&&) noexcept = default;
void PinnedStaging::mark_read(Context&) {}
void PinnedStaging::wait_until_read() const {}
void PinnedStaging::release() noexcept {}

CudaGraph::~CudaGraph() = default;
CudaGraph::CudaGraph(CudaGraph&&) noexcept = default;
CudaGraph& CudaGraph::operator=(CudaGraph&&) noexcept = default;
void CudaGraph::capture(Context&, const char* what, const std::function<void()>&) {
  TS_THROW("CUDA graph capture of ", what, ": this tessera was built without CUDA");
}
void CudaGraph::launch(Context&) const { TS_THROW("internal: CUDA graph launch in a build without CUDA"); }
void CudaGraph::reset() noexcept {}
#endif

}  // namespace tessera
