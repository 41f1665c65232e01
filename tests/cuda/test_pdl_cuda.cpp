// cuda::launch under Context::pdl (tessera/core/cuda_util.cuh) on a toy chain (pdl_chain.h) where each kernel reads
// what the one before wrote: eagerly on the stream and replayed from a captured CUDA graph, with PDL on the values
// are right on every run and the links overlap (a link starts before the one before it has finished); with PDL off
// they never do.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "pdl_chain.h"
#include "tessera/core/buffer.h"
#include "tessera/core/cuda_graph.h"

namespace tessera {
namespace {

struct Chain {
  static constexpr int kLinks = 8;  // even: x holds the result
  int blocks, n;
  Buffer x, y, finished, early;
  Chain(Context& ctx, int blocks_)
      : blocks(blocks_), n(blocks_ * 256 * 4), x(sizeof(int32_t) * n, ctx.device(), "x"),
        y(sizeof(int32_t) * n, ctx.device(), "y"), finished(sizeof(uint32_t) * kLinks, ctx.device(), "finished"),
        early(sizeof(uint32_t), ctx.device(), "early") {
    std::vector<int32_t> init(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) init[static_cast<size_t>(i)] = i;
    copy_bytes(x.data(), ctx.device(), init.data(), Device::cpu(), init.size() * sizeof(int32_t), ctx);
    const uint32_t zero = 0;
    copy_bytes(early.data(), ctx.device(), &zero, Device::cpu(), sizeof zero, ctx);
    ctx.synchronize();
  }
  void enqueue(Context& ctx) const {
    // 40000 cycles of spin per link, many times what a dependent launch takes: the next link is up and waiting
    // (and would race without its wait) while this one still spins.
    test::pdl_chain_enqueue(ctx, static_cast<int32_t*>(x.data()), static_cast<int32_t*>(y.data()), n, kLinks,
                            static_cast<uint32_t*>(finished.data()), static_cast<uint32_t*>(early.data()), blocks,
                            /*spin=*/40000);
  }
  // Expects x[i] = i + runs * kLinks; returns the early count.
  uint32_t check(Context& ctx, int runs, const char* what) const {
    std::vector<int32_t> got(static_cast<size_t>(n));
    copy_bytes(got.data(), Device::cpu(), x.data(), ctx.device(), got.size() * sizeof(int32_t), ctx);
    int wrong = 0, first = -1;
    for (int i = 0; i < n; ++i)
      if (got[static_cast<size_t>(i)] != i + runs * kLinks && wrong++ == 0) first = i;
    EXPECT_EQ(wrong, 0) << what << ": " << wrong << " of " << n << " values wrong after " << runs
                        << " runs, the first at " << first << ": " << (first >= 0 ? got[static_cast<size_t>(first)] : 0)
                        << " for " << first + runs * kLinks;
    uint32_t e = 0;
    copy_bytes(&e, Device::cpu(), early.data(), ctx.device(), sizeof e, ctx);
    return e;
  }
};

void run_chain(Context& ctx, bool pdl, bool graph) {
  const char* what = graph ? (pdl ? "graph, PDL on" : "graph, PDL off") : (pdl ? "eager, PDL on" : "eager, PDL off");
  // Two blocks per SM: every block of a link is resident with room for the next link's blocks beside it.
  const Chain c(ctx, 2 * ctx.gpu().sm_count);
  const PdlScope scope(ctx, pdl);
  constexpr int kRuns = 200;
  CudaGraph g;
  if (graph) g.capture(ctx, "the PDL test chain", [&] { c.enqueue(ctx); });
  for (int r = 0; r < kRuns; ++r) {
    if (graph) g.launch(ctx);
    else c.enqueue(ctx);
  }
  ctx.synchronize();
  const uint32_t early = c.check(ctx, kRuns, what);
  const uint32_t probes = kRuns * (Chain::kLinks - 1);
  if (pdl) {
    EXPECT_GT(early, 0u) << what << ": no link started before the one before it had finished, in " << probes
                         << " probes: the launches did not overlap, so the values above test nothing";
  } else {
    EXPECT_EQ(early, 0u) << what << ": a plain launch started before the kernel before it had finished";
  }
}

TEST(PdlLaunchCuda, ChainIsRightAndOverlapsOnlyWithPdl) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  EXPECT_FALSE(ctx.pdl()) << "a Context starts with PDL off";
  for (bool pdl : {true, false}) {
    run_chain(ctx, pdl, /*graph=*/false);
    if (cuda_graph_capture_supported()) run_chain(ctx, pdl, /*graph=*/true);
  }
  EXPECT_FALSE(ctx.pdl()) << "PdlScope puts the flag back";
}

}  // namespace
}  // namespace tessera
