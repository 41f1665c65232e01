// Beam search: the state on the context's device, the step (top-k, then the per-entry bookkeeping), and HF's
// finalization on the host after one read-back.
#include "tessera/infer/beam_search.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "tessera/core/error.h"
#include "tessera/ops/dispatch.h"
#include "tessera/ops/topk/topk.h"

namespace tessera {

void beam_search_check(const BeamSearchOptions& o) {
  TS_CHECK(o.batch >= 1, "--batch must be at least 1, got ", o.batch);
  TS_CHECK(o.beams >= 1 && 2 * o.beams <= kTopkMaxK && o.beams <= beam::Hyps::kMax, "--beams must lie in [1, ",
           kTopkMaxK / 2, "], got ", o.beams);
  TS_CHECK(o.vocab >= 1, "beam search needs a vocabulary, got ", o.vocab, " tokens");
  TS_CHECK(o.beams <= o.vocab, "--beams ", o.beams, " exceeds the vocabulary of ", o.vocab, " tokens");
  TS_CHECK(o.max_new_tokens >= 1, "--max-new-tokens must be at least 1 for beam search, got ", o.max_new_tokens);
  TS_CHECK(o.eos_id >= -1 && o.eos_id < o.vocab, "--eos-id ", o.eos_id, " lies outside the vocabulary [0, ", o.vocab,
           ")");
  TS_CHECK(o.pad_id >= 0 && o.pad_id < o.vocab, "the pad id ", o.pad_id, " lies outside the vocabulary [0, ", o.vocab,
           ")");
  TS_CHECK(std::isfinite(o.length_penalty), "--length-penalty must be finite");
  TS_CHECK(o.num_return_sequences >= 1 && o.num_return_sequences <= o.beams, "--num-return-sequences must lie in [1, ",
           o.beams, "] (at most --beams), got ", o.num_return_sequences);
}

namespace {
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

BeamSearch::BeamSearch(const BeamSearchOptions& o, Context& ctx) : o_(o) {
  beam_search_check(o);
  shape_ = {.K = o.beams,
            .V = o.vocab,
            .eos = o.eos_id,
            .pad = o.pad_id,
            .length_penalty = o.length_penalty,
            .early_stopping = o.early_stopping,
            .max_new_tokens = o.max_new_tokens};
  const int64_t B = o.batch, S = B * o.beams, C = B * 2 * o.beams, N = o.max_new_tokens;
  // (bytes, dtype, elements) of each array, laid out 256-byte aligned in one buffer.
  struct Slot {
    Tensor* t;
    DType dt;
    int64_t n;
  };
  const Slot slots[] = {{&scores_, DType::F32, S},
                        {&tokens_, DType::I32, S},
                        {&parents_, DType::I32, S},
                        {&done_, DType::I32, B},
                        {&cand_s_, DType::F32, C},
                        {&cand_i_, DType::I32, C},
                        {&lse_, DType::F32, S},
                        {&hist_tokens_, DType::I32, N * S},
                        {&hist_parents_, DType::I32, N * S},
                        {&step_, DType::I32, 1},
                        {&hyps_, DType::U8, B * static_cast<int64_t>(sizeof(beam::Hyps))}};
  size_t total = 0;
  for (const Slot& s : slots) total += align256(static_cast<size_t>(s.n) * dtype_size(s.dt));
  mem_ = Buffer(total, ctx.device(), "the beam search state");
  size_t off = 0;
  for (const Slot& s : slots) {
    *s.t = mem_.view(s.dt, {s.n}, off);
    off += align256(static_cast<size_t>(s.n) * dtype_size(s.dt));
  }
  // The initial state, copied once: beam 0 of each entry at score 0, the others at -inf; no hypotheses.
  std::vector<float> scores(S, -std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b < B; ++b) scores[b * o.beams] = 0.0f;
  std::vector<beam::Hyps> hyps(B);
  for (auto& h : hyps) {
    std::memset(&h, 0, sizeof h);
    beam::hyps_init(h);
  }
  const std::vector<int32_t> zeros(B, 0), rows_identity = [&] {
    std::vector<int32_t> v(S);
    for (int64_t r = 0; r < S; ++r) v[r] = static_cast<int32_t>(r);
    return v;
  }();
  copy_bytes(scores_.data(), ctx.device(), scores.data(), Device::cpu(), S * sizeof(float), ctx);
  copy_bytes(hyps_.data(), ctx.device(), hyps.data(), Device::cpu(), B * sizeof(beam::Hyps), ctx);
  copy_bytes(done_.data(), ctx.device(), zeros.data(), Device::cpu(), B * sizeof(int32_t), ctx);
  copy_bytes(step_.data(), ctx.device(), zeros.data(), Device::cpu(), sizeof(int32_t), ctx);
  copy_bytes(parents_.data(), ctx.device(), rows_identity.data(), Device::cpu(), S * sizeof(int32_t), ctx);
  ctx.synchronize();  // the host vectors go out of scope
}

void BeamSearch::step(const Tensor& logits, int64_t ld, Context& ctx) {
  const int K = o_.beams, B = o_.batch;
  const BeamTopkParams p{.B = B, .K = K, .V = o_.vocab, .k = 2 * K, .ld = ld};
  beam_topk(p, cand_s_, cand_i_, lse_, Tensor(), logits, scores_, ctx);
  auto* hyps = reinterpret_cast<beam::Hyps*>(hyps_.data());
  if (on_cuda(ctx, [&] {
        beam_search_entries_cuda(shape_, B, cand_s_.as<float>(), cand_i_.as<int32_t>(), hyps, done_.as<int32_t>(),
                                 tokens_.as<int32_t>(), parents_.as<int32_t>(), scores_.as<float>(),
                                 hist_tokens_.as<int32_t>(), hist_parents_.as<int32_t>(), step_.as<int32_t>(), ctx);
      }))
    return;
  const int t = step_.as<int32_t>()[0];
  TS_CHECK(t < o_.max_new_tokens, "beam search: step ", t + 1, " exceeds --max-new-tokens ", o_.max_new_tokens);
  for (int b = 0; b < B; ++b)
    beam::entry_step(shape_, b, t, cand_s_.as<float>() + 2 * K * b, cand_i_.as<int32_t>() + 2 * K * b, hyps[b],
                     done_.as<int32_t>()[b], tokens_.as<int32_t>(), parents_.as<int32_t>(), scores_.as<float>());
  const int64_t S = static_cast<int64_t>(B) * K;
  std::memcpy(hist_tokens_.as<int32_t>() + t * S, tokens_.as<int32_t>(), S * sizeof(int32_t));
  std::memcpy(hist_parents_.as<int32_t>() + t * S, parents_.as<int32_t>(), S * sizeof(int32_t));
  step_.as<int32_t>()[0] = t + 1;
}

std::vector<std::vector<BeamSequence>> BeamSearch::finish(Context& ctx) {
  const int K = o_.beams, B = o_.batch;
  const int64_t S = static_cast<int64_t>(B) * K;
  auto read = [&](const Tensor& t) {
    std::vector<unsigned char> v(t.nbytes());
    copy_bytes(v.data(), Device::cpu(), t.data(), t.device(), v.size(), ctx);
    return v;
  };
  const auto step_b = read(step_), tok_b = read(hist_tokens_), par_b = read(hist_parents_), sc_b = read(scores_),
             done_b = read(done_), hyp_b = read(hyps_);
  int steps;
  std::memcpy(&steps, step_b.data(), sizeof steps);
  steps = std::min(steps, o_.max_new_tokens);
  TS_CHECK(steps >= 1, "beam search: finish() before any step");
  const auto* tok = reinterpret_cast<const int32_t*>(tok_b.data());
  const auto* par = reinterpret_cast<const int32_t*>(par_b.data());
  const auto* sc = reinterpret_cast<const float*>(sc_b.data());
  const auto* done = reinterpret_cast<const int32_t*>(done_b.data());
  std::vector<beam::Hyps> hyps(B);
  std::memcpy(hyps.data(), hyp_b.data(), B * sizeof(beam::Hyps));

  // The tokens of row `row` after step `last` (inclusive), walked back through the parents.
  auto history = [&](int last, int row) {
    std::vector<int32_t> out;
    for (int u = last; u >= 0; --u) {
      out.push_back(tok[u * S + row]);
      row = par[u * S + row];
    }
    std::reverse(out.begin(), out.end());
    return out;
  };
  std::vector<std::vector<BeamSequence>> result(B);
  for (int b = 0; b < B; ++b) {
    beam::Hyps& h = hyps[b];
    // HF's finalize: the open beams of an entry that is not done join its hypotheses (generated_len = steps).
    if (!done[b])
      for (int i = 0; i < K; ++i)
        beam::hyps_add(h, K, beam::hyp_score(sc[b * K + i], steps, o_.length_penalty), steps, b * K + i);
    // sorted(key=score) is stable; HF pops from its end: the highest score, the last of equal ones.
    std::vector<int> order(h.n);
    for (int i = 0; i < h.n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return h.score[a] < h.score[c]; });
    for (int j = 0; j < o_.num_return_sequences && !order.empty(); ++j) {
      const int i = order.back();
      order.pop_back();
      // A hypothesis that ended with EOS at step t continues its row's history through step t - 1; an open beam
      // (step == steps) is the whole history of its row.
      BeamSequence seq{.tokens = history(h.step[i] - 1, h.row[i]), .score = h.score[i]};
      if (h.step[i] < steps) seq.tokens.push_back(o_.eos_id);
      result[b].push_back(std::move(seq));
    }
  }
  return result;
}

}  // namespace tessera
