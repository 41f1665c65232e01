// The beam step's per-entry bookkeeping on the device (beam_search_entry.h), after the top-k on the same stream.
#include "tessera/core/cuda_util.cuh"
#include "tessera/infer/beam_search.h"

namespace tessera {
namespace {

constexpr int kEntryThreads = 256;

// One block; thread i runs entries i, i + blockDim, ... (each entry's loop is sequential, as HF's is, and touches
// only its own rows). The step index t = *step is read by every thread before thread 0 advances it; a step past
// max_new_tokens changes nothing. hist_tokens, hist_parents: (max_new_tokens, B*K); row t gets this step's outputs.
__global__ void __launch_bounds__(kEntryThreads)
    beam_search_entries(beam::StepShape s, int B, const float* cand_s, const int32_t* cand_i, beam::Hyps* hyps,
                        int32_t* done, int32_t* tokens, int32_t* parents, float* scores, int32_t* hist_tokens,
                        int32_t* hist_parents, int32_t* step) {
  const int t = *step;
  if (t >= s.max_new_tokens) return;
  const int64_t S = static_cast<int64_t>(B) * s.K;
  for (int b = threadIdx.x; b < B; b += blockDim.x) {
    beam::entry_step(s, b, t, cand_s + 2 * s.K * b, cand_i + 2 * s.K * b, hyps[b], done[b], tokens, parents, scores);
    for (int i = 0; i < s.K; ++i) {
      const int64_t r = static_cast<int64_t>(b) * s.K + i;
      hist_tokens[t * S + r] = tokens[r];
      hist_parents[t * S + r] = parents[r];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *step = t + 1;
}

}  // namespace

void beam_search_entries_cuda(const beam::StepShape& s, int B, const float* cand_s, const int32_t* cand_i,
                              beam::Hyps* hyps, int32_t* done, int32_t* tokens, int32_t* parents, float* scores,
                              int32_t* hist_tokens, int32_t* hist_parents, int32_t* step, Context& ctx) {
  beam_search_entries<<<1, kEntryThreads, 0, ctx.stream()>>>(s, B, cand_s, cand_i, hyps, done, tokens, parents, scores,
                                                             hist_tokens, hist_parents, step);
  TS_CHECK_LAUNCH();
}

}  // namespace tessera
