// Beam search through the engine (beam_generate.h): prefill, alias the beams, then per step decode, rank, reorder.
#include "tessera/infer/beam_generate.h"

#include <algorithm>
#include <numeric>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"

namespace tessera {

namespace {

// True when every entry is done: one read of the B flags (a copy and a stream sync on the GPU).
bool all_done(const BeamSearch& bs, int B, Context& ctx) {
  std::vector<int32_t> done(static_cast<size_t>(B));
  copy_bytes(done.data(), Device::cpu(), bs.done().data(), bs.done().device(), done.size() * sizeof(int32_t), ctx);
  return std::all_of(done.begin(), done.end(), [](int32_t d) { return d != 0; });
}

}  // namespace

std::vector<std::vector<BeamSequence>> beam_generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                     const BeamSearchOptions& o) {
  const int B = static_cast<int>(prompts.size()), K = o.beams;
  BeamSearchOptions bo = o;
  bo.batch = B;
  bo.vocab = engine.vocab();
  beam_search_check(bo);
  TS_CHECK(engine.rows() == B * K, "internal: beam search over ", B, " prompts x ", K, " beams needs an engine of ",
           B * K, " rows, this one has ", engine.rows());
  for (int b = 0; b < B; ++b) {
    const int64_t need = static_cast<int64_t>(prompts[static_cast<size_t>(b)].size()) + o.max_new_tokens - 1;
    TS_CHECK(need <= engine.max_seq(), "beam search: prompt ", b, " has ", prompts[static_cast<size_t>(b)].size(),
             " tokens; with --max-new-tokens ", o.max_new_tokens, " it needs ", need,
             " cache positions, the model takes ", engine.max_seq());
  }
  Context& ctx = engine.context();

  // Entry e runs prompt order[e]: longest first (see the header: no row writes over another entry's prompt).
  std::vector<int> order(static_cast<size_t>(B));
  std::iota(order.begin(), order.end(), 0);
  const auto len = [&](int b) { return prompts[static_cast<size_t>(b)].size(); };
  std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return len(a) > len(c); });
  std::vector<std::vector<int32_t>> sorted;
  for (int b : order) sorted.push_back(prompts[static_cast<size_t>(b)]);
  engine.prefill(sorted);

  const int64_t ld = engine.logits_stride();
  const Tensor prefill_logits = engine.logits();  // (B, ld)
  const size_t es = dtype_size(prefill_logits.dtype()), row_bytes = static_cast<size_t>(ld) * es;
  // Step 0's logits: (B*K, ld), prefill row e at row e*K; the rows of beams 1..K-1 are zeros, ranked at -inf.
  Buffer first(static_cast<size_t>(B) * K * row_bytes, ctx.device(), "the first beam step's logits");
  const Tensor first_logits = first.view(prefill_logits.dtype(), {int64_t{B} * K, ld});
  fill_bytes(first_logits, 0, ctx);
  for (int e = 0; e < B; ++e)
    copy_bytes(static_cast<char*>(first.data()) + static_cast<size_t>(e) * K * row_bytes, ctx.device(),
               static_cast<const char*>(prefill_logits.data()) + static_cast<size_t>(e) * row_bytes, ctx.device(),
               row_bytes, ctx);
  if (K > 1) {
    // Every beam of entry e a child of row e, which holds the prompt: its slot is shared, not copied.
    std::vector<int32_t> alias(static_cast<size_t>(B) * K);
    for (int r = 0; r < B * K; ++r) alias[static_cast<size_t>(r)] = r / K;
    engine.reorder(alias);
  }

  BeamSearch bs(bo, ctx);
  bs.step(first_logits, ld, ctx);
  const int poll = ctx.is_cuda() ? kBeamDonePollSteps : 1;
  // The step's work around the engine's decode: the same tensors every step, so that on the GPU the whole step is
  // one graph. With K == 1 every parent is the row itself (entry_step), and the engine has no slot table.
  const auto feed = [&] {
    if (K > 1) engine.reorder(bs.parents());
    engine.set_tokens(bs.next_tokens());
  };
  const auto rank = [&] { bs.step(engine.logits(), ld, ctx); };  // the decode's (S, ld) logits
  for (int t = 1; t < o.max_new_tokens; ++t) {
    if (t % poll == 0 && all_done(bs, B, ctx)) break;
    engine.decode_with(feed, rank);
  }
  std::vector<std::vector<BeamSequence>> by_entry = bs.finish(ctx);
  std::vector<std::vector<BeamSequence>> out(static_cast<size_t>(B));
  for (int e = 0; e < B; ++e)
    out[static_cast<size_t>(order[static_cast<size_t>(e)])] = std::move(by_entry[static_cast<size_t>(e)]);
  return out;
}

}  // namespace tessera
