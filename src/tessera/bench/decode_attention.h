// tessera/bench/decode_attention.h — rows for decode attention (ops/attention/attention_decode.h) at gpt2-124m's
// shape: one new query per sequence against a full cache (pos = max_seq - 1, so each query reads all max_seq keys),
// B 1 and 16, H = Hkv = 12, Dh 64, max_seq 1024, the launcher's split count (small: B 1 and 2, H 2, Dh 16,
// max_seq 64). A row's bytes are what the call must move: K and V of B H max_seq keys, q read and out written
// (es · (2 B H max_seq Dh + 2 B H Dh)) and pos (4 B); GB/s over the median time is the achieved bandwidth.
// The caller prints the rows (BenchRow of kernels.h) beside the copy bandwidth of the same run.
#pragma once
#include <vector>

#include "tessera/bench/harness.h"
#include "tessera/bench/kernels.h"

namespace tessera {

std::vector<BenchRow> bench_decode_attention(const BenchConfig& cfg, BenchHarness& h);

}  // namespace tessera
