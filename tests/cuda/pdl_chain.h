// A toy chain of kernels for the test of cuda::launch (tessera/core/cuda_util.cuh) under Context::pdl: each link
// reads what the link before it wrote, so a link that ran ahead of the wait would read stale values.
//
// Buffers: x, y (n) i32, the chain ping-pongs between them; finished (links) u32, zeroed by the chain's first
// kernel; early (1) u32, never reset. Link k (0-based) computes dst[i] = src[i] + 1 with src, dst = x, y for even
// k and y, x for odd k, after spinning for `spin` clock cycles past its wait and trigger (so that the next link is
// launched, and would race, while this one still runs). Before its wait, thread 0 of block 0 of link k >= 1 reads
// finished[k - 1] through an atomic (the one deliberate read ahead of the wait, a probe of the overlap, never a
// value the chain computes with) and counts in *early when link k - 1 had not yet finished: > 0 only where links
// overlap. With an even number of links each run of the chain adds `links` to every element of x.
#pragma once
#include <cstdint>

#include "tessera/core/context.h"

namespace tessera::test {

// Queues the chain's reset kernel and then `links` links on ctx's stream, every kernel through cuda::launch (so as
// programmatic dependents while ctx.pdl() is set); blocks x 256 threads per kernel. Graph-capturable.
void pdl_chain_enqueue(Context& ctx, int32_t* x, int32_t* y, int n, int links, uint32_t* finished, uint32_t* early,
                       int blocks, long long spin);

}  // namespace tessera::test
