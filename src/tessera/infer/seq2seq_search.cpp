// Greedy and beam search over the seq2seq engine (seq2seq_engine.h).
#include <algorithm>

#include "tessera/core/error.h"
#include "tessera/infer/beam_generate.h"
#include "tessera/infer/seq2seq_engine.h"

namespace tessera {

std::vector<std::vector<int32_t>> seq2seq_greedy(Seq2SeqEngine& engine,
                                                 const std::vector<std::vector<int32_t>>& sources,
                                                 const std::vector<int>& max_len) {
  TS_CHECK(engine.beams() == 1, "internal: greedy decoding needs an engine of one beam");
  TS_CHECK(max_len.size() == sources.size(), "internal: ", max_len.size(), " lengths for ", sources.size(), " sources");
  const int eos = engine.config().eos_id, pad = engine.config().pad_id;
  std::vector<std::vector<int32_t>> out(sources.size());
  const size_t B = static_cast<size_t>(engine.batch());
  for (size_t at = 0; at < sources.size(); at += B) {
    const size_t n = std::min(B, sources.size() - at);
    engine.encode({sources.begin() + static_cast<ptrdiff_t>(at), sources.begin() + static_cast<ptrdiff_t>(at + n)});
    int steps = 0;
    for (size_t i = 0; i < n; ++i) {
      TS_CHECK(max_len[at + i] >= 1 && max_len[at + i] <= engine.max_tgt(), "decode: a maximum target length of ",
               max_len[at + i], " is outside [1, ", engine.max_tgt(), "]");
      steps = std::max(steps, max_len[at + i]);
    }
    // Row i is open until it draws EOS or holds max_len tokens; a closed row is fed the pad token (its outputs
    // are not read).
    std::vector<char> open(n, 1);
    for (int t = 0; t < steps; ++t) {
      engine.decode();
      std::vector<int32_t> next = engine.greedy_tokens();
      bool any = false;
      for (size_t i = 0; i < n; ++i) {
        if (open[i] && next[i] == eos) open[i] = 0;
        if (open[i]) out[at + i].push_back(next[i]);
        if (open[i] && static_cast<int>(out[at + i].size()) >= max_len[at + i]) open[i] = 0;
        if (!open[i]) next[i] = pad;
        any = any || open[i];
      }
      if (!any) break;
      engine.set_tokens(next);
    }
  }
  return out;
}

std::vector<std::vector<BeamSequence>> seq2seq_beam(Seq2SeqEngine& engine,
                                                    const std::vector<std::vector<int32_t>>& sources,
                                                    BeamSearchOptions o) {
  const int B = static_cast<int>(sources.size());
  o.batch = B;
  o.vocab = engine.vocab();
  beam_search_check(o);
  TS_CHECK(o.beams == engine.beams(), "internal: beam search of ", o.beams, " beams on an engine of ", engine.beams());
  TS_CHECK(o.max_new_tokens <= engine.max_tgt(), "decode: ", o.max_new_tokens, " target tokens; the model takes ",
           engine.max_tgt());
  Context& ctx = engine.context();
  engine.encode(sources);
  BeamSearch bs(o, ctx);
  // Step 0: every beam of an entry reads decoder_start at position 0; only beam 0 expands (beam_search.h).
  engine.decode();
  bs.step(engine.logits(), engine.logits_stride(), ctx);
  // Step t >= 1: the reorder and token feed from BeamSearch's device tensors, the decode, the beam step: the same
  // work on the same tensors every step and nothing read on the host, so that on the GPU the whole step is one
  // graph. The done flags are read outside it, every kBeamDonePollSteps steps on the GPU (a copy and a stream sync)
  // and every step on the CPU: a step past an entry's end is a no-op for it (beam_generate.h), so a late stop
  // changes only the time.
  const auto feed = [&] {
    engine.reorder(bs.parents());
    engine.set_tokens(bs.next_tokens());
  };
  const auto rank = [&] { bs.step(engine.logits(), engine.logits_stride(), ctx); };
  const int poll = ctx.is_cuda() ? kBeamDonePollSteps : 1;
  std::vector<int32_t> done(static_cast<size_t>(B));
  for (int t = 1; t < o.max_new_tokens; ++t) {
    if (t % poll == 0) {
      copy_bytes(done.data(), Device::cpu(), bs.done().data(), bs.done().device(), done.size() * sizeof(int32_t), ctx);
      if (std::all_of(done.begin(), done.end(), [](int32_t d) { return d != 0; })) break;
    }
    engine.decode_with(feed, rank);
  }
  return bs.finish(ctx);
}

}  // namespace tessera
