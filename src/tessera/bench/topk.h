// tessera/bench/topk.h — the timing of the beam step's top-k (ops/topk: log-softmax + running score, HARS retrieve
// + re-rank) on random logits of (B*K, V), shared by `tessera bench topk` and `tessera bench decode`'s top-k row.
//
// Inputs: logits ~ N(0, 3^2) (a language model's spread of logits) in `dtype`, running scores ~ N(0, 1), drawn once
// from a fixed seed; the outputs stay on the device. The candidates per row are the keys >= R that the retrieve
// keeps before the exact top k: the GPU's retrieve counts them; on the CPU beam_topk_hars_cpu runs the same
// algorithm on the host.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/bench/harness.h"
#include "tessera/core/dtype.h"
#include "tessera/ops/topk/topk.h"

namespace tessera {

struct TopkBench {
  Timing t;
  std::vector<int32_t> candidates;  // (B*K): per row, the retrieve's candidates
  double logit_bytes = 0;           // the logits read per call
};

// Times beam_topk(p) on h's context. p must be supported there (beam_topk_supports).
TopkBench bench_beam_topk(const BeamTopkParams& p, DType dtype, BenchHarness& h, const TimingOptions& timing);

// "min / median / max" of the candidates per row.
std::string topk_candidate_summary(std::vector<int32_t> candidates);

}  // namespace tessera
