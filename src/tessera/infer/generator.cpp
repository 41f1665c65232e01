#include "tessera/infer/generator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"

namespace tessera {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
  }
  return "length";
}

void generate_options_check(const GenerateOptions& o, int V) {
  SampleParams p = o.sampling;
  p.rows = 0;
  p.V = V;
  p.ld = 0;
  p.n_bias = 0;
  sample_params_check(p);
  sampler_bias_check(o.logit_bias, V);
  TS_CHECK(o.max_new_tokens >= 0, "--max-new-tokens must be >= 0, got ", o.max_new_tokens);
  TS_CHECK(o.min_new_tokens >= 0, "--min-new-tokens must be >= 0, got ", o.min_new_tokens);
  TS_CHECK(o.min_new_tokens <= o.max_new_tokens, "--min-new-tokens ", o.min_new_tokens,
           " is more than --max-new-tokens ", o.max_new_tokens);
  for (int32_t id : o.eos_ids)
    TS_CHECK(id >= 0 && id < V, "--eos-id ", id, " is outside the model's vocabulary [0, ", V, ")");
  for (const std::string& s : o.stop) TS_CHECK(!s.empty(), "--stop: a stop string must not be empty");
}

EngineOptions generator_engine_options(const std::vector<std::vector<int32_t>>& prompts, int batch,
                                       const GenerateOptions& o, int max_seq) {
  TS_CHECK(!prompts.empty(), "generate: no prompts");
  TS_CHECK(batch >= 1, "--batch must be >= 1, got ", batch);
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  const int rows = static_cast<int>(std::min<size_t>(static_cast<size_t>(batch), prompts.size()));
  // Before the decode of new token i + 1 (i >= 1) a row sits at position len + i - 1: past the cache only where
  // len + max_new_tokens - 2 reaches max_seq.
  const bool can_fill = static_cast<int64_t>(longest) + o.max_new_tokens - 2 >= max_seq;
  return {.batch = rows, .max_prompt = static_cast<int>(longest), .slot_table = rows > 1 && can_fill};
}

namespace {

// The first n elements of a contiguous tensor, as a 1-D view.
Tensor prefix(const Tensor& t, int64_t n) {
  return Tensor::from_shape(t.data(), t.dtype(), std::initializer_list<int64_t>{n}, t.device());
}

// The longest tail of `text` that is a proper prefix of some stop string: held back from the stream, since the
// next tokens may complete the stop string and cut it.
size_t stop_prefix_tail(const std::string& text, const std::vector<std::string>& stops) {
  size_t tail = 0;
  for (const std::string& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > tail; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        tail = k;
        break;
      }
  return tail;
}

// The bytes at the end of `text` that begin a UTF-8 character but do not finish it (0 .. 3): a lead byte of an
// n-byte character (110xxxxx: 2, 1110xxxx: 3, 11110xxx: 4) followed by fewer than n - 1 continuation bytes
// (10xxxxxx). Anything else (ASCII, a whole character, bytes that can begin no character) is 0: those are final.
size_t unfinished_utf8_tail(const std::string& text, size_t end) {
  for (size_t k = 1; k <= 3 && k <= end; ++k) {
    const auto c = static_cast<unsigned char>(text[end - k]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return n > k ? k : 0;
  }
  return 0;
}

// The first occurrence of any stop string in `text`, or npos.
size_t first_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t at = std::string::npos;
  for (const std::string& s : stops) at = std::min(at, text.find(s));
  return at;
}

// A row's host state.
struct Row {
  GeneratedSequence seq;
  int budget = 0;  // new tokens it may draw: max_new_tokens, or fewer where the context fills first
  bool done = false;
  size_t streamed = 0;  // bytes of text handed to on_text
};

// The sampler's buffers on the engine's device: the count table (penalties), the two bias lists (the user's, and
// that with every EOS id at -inf for the first min_new_tokens draws), the step counters and the logprobs.
struct SamplerState {
  Buffer counts_buf, bias_buf[2], steps_buf, lp_buf;
  Tensor counts, bias_ids[2], bias_values[2], steps, lp_ids, lp_values;
  int n_bias[2] = {0, 0};
};

void upload_bias(const std::vector<std::pair<int32_t, float>>& bias, SamplerState& s, int which, Context& ctx) {
  const int64_t n = static_cast<int64_t>(bias.size());
  s.n_bias[which] = static_cast<int>(n);
  if (n == 0) return;
  std::vector<int32_t> ids;
  std::vector<float> values;
  for (const auto& [id, v] : bias) ids.push_back(id), values.push_back(v);
  s.bias_buf[which] = Buffer(static_cast<size_t>(n) * 8, ctx.device(), "the sampler's logit bias");
  s.bias_ids[which] = s.bias_buf[which].view(DType::I32, {n});
  s.bias_values[which] = s.bias_buf[which].view(DType::F32, {n}, static_cast<size_t>(n) * 4);
  copy_bytes(s.bias_ids[which].data(), ctx.device(), ids.data(), Device::cpu(), ids.size() * 4, ctx);
  copy_bytes(s.bias_values[which].data(), ctx.device(), values.data(), Device::cpu(), values.size() * 4, ctx);
  ctx.synchronize();  // the host vectors die here
}

SamplerState make_sampler_state(const GenerateOptions& o, const std::vector<std::vector<int32_t>>& prompts, int S,
                                int V, Context& ctx) {
  SamplerState s;
  const Device dev = ctx.device();
  if (o.sampling.penalized()) {
    // Zeroed, then each prompt counted once (right-padded; the lengths bound what is read).
    s.counts_buf = Buffer(static_cast<size_t>(S) * V * 4, dev, "the sampler's count table");
    s.counts = s.counts_buf.view(DType::I32, {static_cast<int64_t>(S) * V});
    fill_bytes(s.counts, 0, ctx);
    const int n = static_cast<int>(prompts.size());
    size_t T = 0;
    for (const auto& p : prompts) T = std::max(T, p.size());
    std::vector<int32_t> tokens(static_cast<size_t>(n) * T, 0), lens(static_cast<size_t>(n));
    for (int b = 0; b < n; ++b) {
      std::copy(prompts[b].begin(), prompts[b].end(), tokens.begin() + static_cast<std::ptrdiff_t>(b * T));
      lens[static_cast<size_t>(b)] = static_cast<int32_t>(prompts[b].size());
    }
    Buffer in(tokens.size() * 4 + lens.size() * 4, dev, "the prompts' counts");
    const Tensor t = in.view(DType::I32, {static_cast<int64_t>(tokens.size())});
    const Tensor l = in.view(DType::I32, {n}, tokens.size() * 4);
    copy_bytes(t.data(), dev, tokens.data(), Device::cpu(), tokens.size() * 4, ctx);
    copy_bytes(l.data(), dev, lens.data(), Device::cpu(), lens.size() * 4, ctx);
    sampler_counts_add(n, V, static_cast<int>(T), prefix(s.counts, static_cast<int64_t>(n) * V), t, l, ctx);
    ctx.synchronize();
  }
  upload_bias(o.logit_bias, s, 0, ctx);
  std::vector<std::pair<int32_t, float>> banned = o.logit_bias;
  if (!o.ignore_eos && o.min_new_tokens > 0)
    for (int32_t id : o.eos_ids) {
      auto it = std::find_if(banned.begin(), banned.end(), [&](const auto& e) { return e.first == id; });
      if (it == banned.end()) banned.emplace_back(id, -std::numeric_limits<float>::infinity());
      else it->second = -std::numeric_limits<float>::infinity();
    }
  upload_bias(banned, s, 1, ctx);
  s.steps_buf = Buffer(static_cast<size_t>(S) * 4, dev, "the sampler's step counters");
  s.steps = s.steps_buf.view(DType::I32, {S});
  fill_bytes(s.steps, 0, ctx);
  const int64_t lp = static_cast<int64_t>(S) * o.sampling.logprobs;
  if (lp > 0) {
    s.lp_buf = Buffer(static_cast<size_t>(lp) * 8, dev, "the sampler's logprobs");
    s.lp_ids = s.lp_buf.view(DType::I32, {lp});
    s.lp_values = s.lp_buf.view(DType::F32, {lp}, static_cast<size_t>(lp) * 4);
  }
  return s;
}

}  // namespace

std::vector<GeneratedSequence> generate_batch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                              const GenerateOptions& o, const TextDecoder& decode,
                                              const OnText& on_text) {
  const int n = static_cast<int>(prompts.size()), S = engine.rows(), V = engine.vocab(), max_seq = engine.max_seq();
  generate_options_check(o, V);
  TS_CHECK(n >= 1 && n <= S, "internal: generate_batch of ", n, " prompts on an engine of ", S, " rows");
  TS_CHECK(static_cast<bool>(decode), "internal: generate_batch needs a decoder");
  std::vector<Row> rows(static_cast<size_t>(n));
  for (int b = 0; b < n; ++b) {
    const int len = static_cast<int>(prompts[b].size());
    TS_CHECK(len >= 1 && len <= max_seq, "generate: prompt ", b, " has ", len, " tokens; the context takes 1 to ",
             max_seq);
    rows[b].budget = std::min(o.max_new_tokens, max_seq - len + 1);
    rows[b].done = o.max_new_tokens == 0;
  }
  std::vector<GeneratedSequence> out;
  if (o.max_new_tokens == 0) {
    for (Row& r : rows) out.push_back(std::move(r.seq));
    return out;
  }
  Context& ctx = engine.context();
  SamplerState st = make_sampler_state(o, prompts, S, V, ctx);
  const int N = o.sampling.logprobs;
  const bool track_text = !o.stop.empty() || static_cast<bool>(on_text);
  std::vector<int32_t> lp_ids(static_cast<size_t>(S) * N);
  std::vector<float> lp_values(lp_ids.size());

  // Draws token `step` (0-based) of every row from the last logits (`live` rows of them), and reads them back.
  auto sample = [&](int live, int step) {
    SampleParams p = o.sampling;
    const int which = step < o.min_new_tokens ? 1 : 0;
    p.rows = live;
    p.V = V;
    p.ld = engine.logits_stride();
    p.n_bias = st.n_bias[which];
    p.count_drawn = p.penalized();
    const Tensor next = prefix(engine.next_tokens(), live);
    sample_rows(p, next, engine.logits(), p.penalized() ? prefix(st.counts, static_cast<int64_t>(live) * V) : Tensor(),
                st.bias_ids[which], st.bias_values[which], prefix(st.steps, live),
                N ? prefix(st.lp_ids, static_cast<int64_t>(live) * N) : Tensor(),
                N ? prefix(st.lp_values, static_cast<int64_t>(live) * N) : Tensor(), ctx);
    std::vector<int32_t> t = engine.read_tokens();  // the step's one sync, through the pinned buffer
    if (N) {
      copy_bytes(lp_ids.data(), Device::cpu(), st.lp_ids.data(), ctx.device(), static_cast<size_t>(live) * N * 4, ctx);
      copy_bytes(lp_values.data(), Device::cpu(), st.lp_values.data(), ctx.device(), static_cast<size_t>(live) * N * 4,
                 ctx);
    }
    for (int b = 0; b < live; ++b)
      TS_CHECK(t[b] >= 0 && t[b] < V, "generate: row ", b, " had NaN or infinite logits at new token ", step + 1,
               " (the model diverged)");
    t.resize(static_cast<size_t>(live));
    return t;
  };

  // Appends row b's new token and decides whether it ends the row (header: eos, stop, length).
  auto take = [&](int b, int32_t t) {
    Row& r = rows[b];
    GeneratedSequence& s = r.seq;
    s.tokens.push_back(t);
    if (N) {
      StepLogprobs lp{.chosen = std::numeric_limits<float>::quiet_NaN(), .top = {}};
      for (int j = 0; j < N; ++j) {
        const size_t at = static_cast<size_t>(b) * N + j;
        lp.top.emplace_back(lp_ids[at], lp_values[at]);
        if (lp_ids[at] == t) lp.chosen = lp_values[at];
      }
      s.logprobs.push_back(std::move(lp));
    }
    const bool eos = !o.ignore_eos && std::find(o.eos_ids.begin(), o.eos_ids.end(), t) != o.eos_ids.end();
    if (eos) {
      r.done = true;
      s.finish = FinishReason::Eos;
      if (track_text) s.text = decode(std::vector<int32_t>(s.tokens.begin(), s.tokens.end() - 1));
    } else if (track_text) {
      s.text = decode(s.tokens);
      const size_t cut = first_stop(s.text, o.stop);
      if (cut != std::string::npos) {
        s.text.resize(cut);
        r.done = true;
        s.finish = FinishReason::Stop;
      }
    }
    if (!r.done && static_cast<int>(s.tokens.size()) >= r.budget) {
      r.done = true;
      s.finish = FinishReason::Length;
    }
    if (on_text) {
      size_t ready = r.done ? s.text.size() : s.text.size() - stop_prefix_tail(s.text, o.stop);
      if (!r.done) ready -= unfinished_utf8_tail(s.text, ready);
      if (ready > r.streamed) on_text(b, s.text.substr(r.streamed, ready - r.streamed));
      r.streamed = std::max(r.streamed, ready);
    }
  };
  auto any_running = [&] { return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.done; }); };
  // A finished row whose cache is full follows the running row with the most room (header).
  auto unblock = [&] {
    int best = -1;
    bool blocked = false;
    for (int b = 0; b < S; ++b) {
      const bool running = b < n && !rows[b].done;
      if (running && (best < 0 || engine.position(b) < engine.position(best))) best = b;
      if (!running && engine.position(b) >= max_seq) blocked = true;
    }
    if (!blocked) return;
    std::vector<int32_t> parents(static_cast<size_t>(S));
    for (int b = 0; b < S; ++b) {
      const bool running = b < n && !rows[b].done;
      parents[b] = !running && engine.position(b) >= max_seq ? best : b;
    }
    engine.reorder(parents);
  };

  engine.prefill(prompts);
  std::vector<int32_t> t = sample(n, 0);
  for (int b = 0; b < n; ++b) take(b, t[b]);
  for (int step = 1; any_running(); ++step) {
    unblock();
    engine.decode(/*greedy=*/false);
    t = sample(S, step);
    for (int b = 0; b < n; ++b)
      if (!rows[b].done) take(b, t[b]);
  }
  for (Row& r : rows) {
    if (!track_text) {
      const auto& tk = r.seq.tokens;
      const bool eos = r.seq.finish == FinishReason::Eos;
      r.seq.text = decode(std::vector<int32_t>(tk.begin(), eos ? tk.end() - 1 : tk.end()));
    }
    out.push_back(std::move(r.seq));
  }
  return out;
}

}  // namespace tessera
