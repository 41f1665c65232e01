#include "tessera/ops/embedding/embedding.h"

#include "tessera/core/error.h"
#include "tessera/core/philox.h"

namespace tessera {

void embedding_check(const EmbeddingParams& p, const int32_t* tokens, bool has_positions) {
  TS_CHECK(p.pos_offset + p.T <= p.max_seq || !has_positions, "embedding: sequence of ", p.pos_offset + p.T,
           " positions exceeds max_seq ", p.max_seq);
  for (int64_t i = 0; i < static_cast<int64_t>(p.B) * p.T; ++i) {
    const int32_t tok = tokens[i];
    TS_CHECK(tok >= 0 && tok < p.V, "embedding: token id ", tok, " at index ", i, " is outside the vocab [0, ", p.V,
             ")");
  }
}

template <typename T>
void embedding_forward_ref(const EmbeddingParams& p, T* out, const int32_t* tokens, const T* wte, const T* wpe) {
  embedding_check(p, tokens, wpe != nullptr);
  const T keep_scale = p.dropout > 0 ? T(1) / (T(1) - T(p.dropout)) : T(1);
  for (int64_t row = 0; row < static_cast<int64_t>(p.B) * p.T; ++row) {
    const int t = static_cast<int>(row % p.T);
    const int32_t tok = tokens[row];
    T* o = out + row * p.C;
    if (tok == p.padding_id) {
      for (int c = 0; c < p.C; ++c) o[c] = T(0);
      continue;
    }
    const T* e = wte + static_cast<int64_t>(tok) * p.C;
    const T* pos = wpe ? wpe + static_cast<int64_t>(p.pos_offset + t) * p.C : nullptr;
    for (int c = 0; c < p.C; ++c) {
      T v = T(p.scale) * e[c] + (pos ? pos[c] : T(0));
      if (p.dropout > 0) {
        const uint64_t idx = static_cast<uint64_t>(row) * p.C + c;
        v = philox_keep(p.seed, p.stream, idx, p.dropout) ? v * keep_scale : T(0);
      }
      o[c] = v;
    }
  }
}

template <typename T>
void embedding_backward_ref(const EmbeddingParams& p, T* d_wte, T* d_wpe, const T* d_out, const int32_t* tokens) {
  const T keep_scale = p.dropout > 0 ? T(1) / (T(1) - T(p.dropout)) : T(1);
  for (int64_t row = 0; row < static_cast<int64_t>(p.B) * p.T; ++row) {
    const int t = static_cast<int>(row % p.T);
    const int32_t tok = tokens[row];
    if (tok == p.padding_id) continue;
    const T* g = d_out + row * p.C;
    T* dw = d_wte + static_cast<int64_t>(tok) * p.C;
    T* dp = d_wpe ? d_wpe + static_cast<int64_t>(p.pos_offset + t) * p.C : nullptr;
    for (int c = 0; c < p.C; ++c) {
      T gv = g[c];
      if (p.dropout > 0) {
        const uint64_t idx = static_cast<uint64_t>(row) * p.C + c;
        gv = philox_keep(p.seed, p.stream, idx, p.dropout) ? gv * keep_scale : T(0);
      }
      dw[c] += T(p.scale) * gv;
      if (dp) dp[c] += gv;
    }
  }
}

template void embedding_forward_ref<float>(const EmbeddingParams&, float*, const int32_t*, const float*, const float*);
template void embedding_forward_ref<double>(const EmbeddingParams&, double*, const int32_t*, const double*,
                                            const double*);
template void embedding_backward_ref<float>(const EmbeddingParams&, float*, float*, const float*, const int32_t*);
template void embedding_backward_ref<double>(const EmbeddingParams&, double*, double*, const double*, const int32_t*);

}  // namespace tessera
