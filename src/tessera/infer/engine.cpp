#include "tessera/infer/engine.h"

#include <algorithm>

#include "tessera/core/error.h"
#include "tessera/infer/decode_linear.h"
#include "tessera/infer/decode_ops.h"
#include "tessera/ops/activation/activation.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_decode.h"
#include "tessera/ops/embedding/embedding.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/gemm/gemv.h"
#include "tessera/ops/norm/norm.h"
#include "tessera/ops/residual/residual.h"

namespace tessera {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
DType stat_of(DType dt) { return dt == DType::F64 ? DType::F64 : DType::F32; }

// The engine's sizes, resolved from the options (checked here, once, for the constructor and memory()).
struct Sizes {
  int S = 0, max_seq = 0, max_prompt = 0;
  int64_t N = 0;  // rows of the shared buffers: max(batch x max_prompt, S)
  int64_t R = 0;  // rows of the head's buffers: S (>= batch)
};

Sizes resolve(const ModelConfig& cfg, const EngineOptions& o) {
  TS_CHECK(o.batch >= 1, "engine: the batch must be >= 1, got ", o.batch);
  TS_CHECK(o.beams >= 1, "engine: beams must be >= 1, got ", o.beams);
  TS_CHECK(o.max_seq >= 0 && o.max_seq <= cfg.max_seq, "engine: a cache of ", o.max_seq,
           " positions; the model takes at most ", cfg.max_seq);
  Sizes s;
  s.max_seq = o.max_seq > 0 ? o.max_seq : cfg.max_seq;
  TS_CHECK(o.max_prompt >= 0 && o.max_prompt <= s.max_seq, "engine: prompts of up to ", o.max_prompt,
           " tokens do not fit a cache of ", s.max_seq, " positions");
  s.max_prompt = o.max_prompt > 0 ? o.max_prompt : s.max_seq;
  TS_CHECK(static_cast<int64_t>(o.batch) * o.beams <= (1 << 20), "engine: batch x beams of ",
           static_cast<int64_t>(o.batch) * o.beams, " cache slots is past 2^20");
  s.S = o.batch * o.beams;
  s.N = std::max<int64_t>(static_cast<int64_t>(o.batch) * s.max_prompt, s.S);
  s.R = s.S;
  return s;
}

KvCacheShape cache_shape(const ModelConfig& cfg, const EngineOptions& o, const Sizes& s) {
  return {.layers = cfg.n_layers,
          .S = s.S,
          .Hkv = cfg.kv_heads(),
          .max_seq = s.max_seq,
          .Dh = cfg.head_dim(),
          .slot_table = o.beams > 1 || o.slot_table};
}

}  // namespace

// The weights of one layer and of the ends, views into the model's ParamBuffer (undefined where the config has
// none: biases, wpe, a tied head's own matrix).
struct Engine::Weights {
  struct Layer {
    Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w, fcp_b;
  };
  Tensor wte, wpe, lnf_w, lnf_b, lm;
  std::vector<Layer> layers;
};

// The shared buffers (all views of one allocation), in the order laid out by Acts::layout.
struct Engine::Acts {
  Tensor x, x2, ln, qkv, att, y, fc_pre, fc_act, mean, rstd, lse;  // N rows; x2: the residual stream's other half
  Tensor tokens, lens, pos0;                                       // prefill inputs: N, batch, S int32
  Tensor last, lnf, logits;                                        // R rows
  Tensor next;                                                     // S int32: the decode step's input tokens
  Tensor parents;                                                  // S int32

  // Lays the buffers out from offset 0 of `base` (null: only counts); returns the bytes.
  static size_t layout(const ModelConfig& cfg, DType dt, const EngineOptions& o, const Sizes& s, void* base, Device dev,
                       Acts* a) {
    size_t at = 0;
    auto take = [&](Tensor* t, DType d, int64_t rows, int64_t cols) {
      const size_t bytes = static_cast<size_t>(rows * cols) * dtype_size(d);
      if (a && base)
        *t = Tensor::from_shape(static_cast<char*>(base) + at, d, std::initializer_list<int64_t>{rows, cols}, dev);
      at += align_up(bytes);
    };
    Acts dummy;
    Acts& r = a ? *a : dummy;
    const int64_t C = cfg.d_model, W = cfg.qkv_width(), HD = int64_t{cfg.n_heads} * cfg.head_dim();
    const DType st = stat_of(dt);
    take(&r.x, dt, s.N, C);
    take(&r.x2, dt, s.N, C);
    take(&r.ln, dt, s.N, C);
    take(&r.qkv, dt, s.N, W);
    take(&r.att, dt, s.N, HD);
    take(&r.y, dt, s.N, C);
    take(&r.fc_pre, dt, s.N, cfg.d_ff_in());
    take(&r.fc_act, dt, s.N, cfg.d_ff);
    take(&r.mean, st, s.N, 1);
    take(&r.rstd, st, s.N, 1);
    take(&r.lse, st, int64_t{o.batch} * cfg.n_heads, s.max_prompt);
    take(&r.tokens, DType::I32, s.N, 1);
    take(&r.lens, DType::I32, o.batch, 1);
    take(&r.pos0, DType::I32, s.S, 1);
    take(&r.last, dt, s.R, C);
    take(&r.lnf, dt, s.R, C);
    take(&r.logits, dt, s.R, model_logits_stride(cfg, dt));
    take(&r.next, DType::I32, s.S, 1);
    take(&r.parents, DType::I32, s.S, 1);
    return at;
  }
};

std::string Engine::unsupported(const ModelConfig& cfg) {
  if (cfg.positions == PositionKind::Sinusoidal)
    return "the inference engine runs learned (GPT-2) or rotary (Llama) positions, not sinusoidal ones";
  return "";
}

EngineMemory Engine::memory(const ModelConfig& cfg, DType dtype, const EngineOptions& opt) {
  const Sizes s = resolve(cfg, opt);
  return {.weights = model_flat_params(cfg) * dtype_size(dtype),
          .cache = KvCache::bytes(cache_shape(cfg, opt, s), dtype),
          .buffers = Acts::layout(cfg, dtype, opt, s, nullptr, Device::cpu(), nullptr)};
}

EngineMemory Engine::memory() const { return memory(cfg_, dtype_, opt_); }

Engine::Engine(Model& model, const EngineOptions& opt)
    : model_(model), ctx_(model.context()), cfg_(model.config()), dtype_(model.dtype()), opt_(opt) {
  const std::string why = unsupported(cfg_);
  TS_CHECK(why.empty(), why);
  const Sizes s = resolve(cfg_, opt_);
  S_ = s.S;
  max_seq_ = s.max_seq;
  max_prompt_ = s.max_prompt;
  V_ = cfg_.vocab;
  ld_ = model_logits_stride(cfg_, dtype_);

  // The weights by name, in place.
  const ParamBuffer& pb = model_.params();
  auto get = [&](const std::string& name, bool required) {
    const int i = pb.find(name);
    TS_CHECK(i >= 0 || !required, "engine: the model has no parameter '", name, "'");
    if (i < 0) return Tensor();
    const ParamSegment& seg = pb.segments()[static_cast<size_t>(i)];
    return pb.data_at(seg.offset, static_cast<int64_t>(seg.numel));
  };
  w_ = std::make_unique<Weights>();
  Weights& w = *w_;
  w.wte = get("wte", true);
  w.wpe = cfg_.positions == PositionKind::Learned ? get("wpe", true) : Tensor();
  w.lnf_w = get("lnf.w", true);
  w.lnf_b = get("lnf.b", false);
  w.lm = cfg_.tied ? w.wte : get("lm_head", true);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    w.layers.push_back({.ln1_w = get(p + "ln1.w", true),
                        .ln1_b = get(p + "ln1.b", false),
                        .qkv_w = get(p + "qkv.w", true),
                        .qkv_b = get(p + "qkv.b", false),
                        .proj_w = get(p + "proj.w", true),
                        .proj_b = get(p + "proj.b", false),
                        .ln2_w = get(p + "ln2.w", true),
                        .ln2_b = get(p + "ln2.b", false),
                        .fc_w = get(p + "fc.w", true),
                        .fc_b = get(p + "fc.b", false),
                        .fcp_w = get(p + "fcp.w", true),
                        .fcp_b = get(p + "fcp.b", false)});
  }

  cache_ = KvCache(cache_shape(cfg_, opt_, s), dtype_, ctx_);
  const size_t bytes = Acts::layout(cfg_, dtype_, opt_, s, nullptr, ctx_.device(), nullptr);
  acts_ = Buffer(bytes, ctx_.device(), "the inference engine's buffers");
  a_ = std::make_unique<Acts>();
  Acts::layout(cfg_, dtype_, opt_, s, acts_.data(), ctx_.device(), a_.get());
  fill_bytes(acts_.view(DType::U8, {static_cast<int64_t>(bytes)}), 0, ctx_);
  if (ctx_.is_cuda()) pinned_ = PinnedStaging(static_cast<size_t>(S_) * sizeof(int32_t), ctx_);
  host_pos_.assign(static_cast<size_t>(S_), 0);
  ctx_.synchronize();
}

Engine::~Engine() = default;

namespace {
// A (B, T, heads, Dh) view at column `col` of rows of width `ld` (the fused qkv's q, k or v; the attention output).
Tensor heads_view(const Tensor& t, int64_t col, int B, int T, int heads, int Dh, int64_t ld) {
  char* base = static_cast<char*>(t.data()) + col * static_cast<int64_t>(dtype_size(t.dtype()));
  return Tensor::strided(base, t.dtype(), {B, T, heads, Dh}, {T * ld, ld, Dh, 1}, t.device());
}
Tensor first_rows(const Tensor& t, int64_t n) {
  const int64_t cols = t.ndim() > 1 ? t.size(1) : 1;
  return Tensor::from_shape(t.data(), t.dtype(), std::initializer_list<int64_t>{n, cols}, t.device());
}
Tensor flat(const Tensor& t, int64_t n) {
  return Tensor::from_shape(t.data(), t.dtype(), std::initializer_list<int64_t>{n}, t.device());
}
}  // namespace

void Engine::run_layers(int n, int T, bool decode) {
  const Acts& a = *a_;
  const int64_t N = static_cast<int64_t>(n) * T;
  const int C = cfg_.d_model, H = cfg_.n_heads, Hkv = cfg_.kv_heads(), Dh = cfg_.head_dim(), F = cfg_.d_ff;
  const int64_t W = cfg_.qkv_width(), HD = int64_t{H} * Dh;
  const bool ln = cfg_.norm == NormKind::LayerNorm;
  const NormParams np{.N = static_cast<int>(N), .C = C, .eps = cfg_.norm_eps};
  const Tensor x = first_rows(a.x, N), x2 = first_rows(a.x2, N), lnx = first_rows(a.ln, N);
  const Tensor qkv = first_rows(a.qkv, N);
  const Tensor att = first_rows(a.att, N), y = first_rows(a.y, N);
  const Tensor fc_pre = first_rows(a.fc_pre, N), fc_act = first_rows(a.fc_act, N);
  const Tensor mean = flat(a.mean, N), rstd = flat(a.rstd, N);
  // The residual stream moves between x and x2: each residual add is fused with the norm that reads its sum
  // (norm_residual_forward, one kernel), which needs the sum in memory of its own. cur holds the stream.
  const Tensor* cur = &x;
  const Tensor* other = &x2;
  auto add_then_norm = [&](const Tensor& wt, const Tensor& b) {
    norm_residual_forward(np, ln, {.N = static_cast<int>(N), .C = C}, *other, lnx, ln ? mean : Tensor(), rstd, *cur, y,
                          Tensor(), wt, ln ? b : Tensor(), ctx_);
    std::swap(cur, other);
  };
  // c = in_t wtᵀ + bias: gemv or the GEMM, as decode_linear.h chooses (the CPU always takes the GEMM).
  auto mm = [&](int out, int in, const Tensor& c, const Tensor& in_t, const Tensor& wt, const Tensor& bias) {
    decode_linear({.M = static_cast<int>(N), .N = out, .K = in}, c, in_t, wt, bias, ctx_);
  };
  const DecodeAttentionParams dp{.B = n,
                                 .Tq = T,
                                 .H = H,
                                 .Hkv = Hkv,
                                 .Dh = Dh,
                                 .S = S_,
                                 .max_seq = max_seq_,
                                 .rope_theta = cfg_.positions == PositionKind::Rope ? cfg_.rope_theta : 0.0f};
  const Tensor pos = flat(cache_.pos(), n);
  const Tensor slots = cache_.slots().defined()
                           ? Tensor::from_shape(cache_.slots().data(), DType::I32,
                                                std::initializer_list<int64_t>{n, max_seq_}, ctx_.device())
                           : Tensor();
  const Tensor q = heads_view(qkv, 0, n, T, H, Dh, W), k = heads_view(qkv, HD, n, T, Hkv, Dh, W);
  const Tensor v = heads_view(qkv, HD + int64_t{Hkv} * Dh, n, T, Hkv, Dh, W);
  const Tensor out = heads_view(att, 0, n, T, H, Dh, HD);
  const ResidualParams rp{.N = static_cast<int>(N), .C = C};
  const bool fused_gelu = model_fuses_gelu(cfg_, dtype_);
  if (ln) layernorm_forward(np, lnx, mean, rstd, x, w_->layers[0].ln1_w, w_->layers[0].ln1_b, ctx_);
  else rmsnorm_forward(np, lnx, rstd, x, w_->layers[0].ln1_w, ctx_);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const Weights::Layer& lw = w_->layers[static_cast<size_t>(l)];
    const KvCacheView kv = cache_.layer(l);
    mm(static_cast<int>(W), C, qkv, lnx, lw.qkv_w, lw.qkv_b);
    kv_append(dp, kv, q, k, v, pos, slots, ctx_);
    if (decode) {
      attention_decode(dp, out, q, kv, pos, slots, ctx_);
    } else {
      // The general call over the cache as K and V: slot b's (T, Hkv, Dh) with strides (Dh, max_seq Dh).
      const int64_t sh = int64_t{max_seq_} * Dh, sb = int64_t{Hkv} * sh;
      const Tensor kc = Tensor::strided(kv.k.data(), dtype_, {n, T, Hkv, Dh}, {sb, Dh, sh, 1}, ctx_.device());
      const Tensor vc = Tensor::strided(kv.v.data(), dtype_, {n, T, Hkv, Dh}, {sb, Dh, sh, 1}, ctx_.device());
      const AttentionParams ap{.B = n,
                               .T = T,
                               .H = H,
                               .Dh = Dh,
                               .causal = true,
                               .n_kv_heads = Hkv,
                               .Tq = T,
                               .Tk = T,
                               .key_lens = flat(a.lens, n)};
      attention_forward(ap, out, flat(a.lse, int64_t{n} * H * T), q, kc, vc, ctx_);
    }
    mm(C, static_cast<int>(HD), y, att, lw.proj_w, lw.proj_b);
    add_then_norm(lw.ln2_w, lw.ln2_b);
    const GemvParams fc_gemv{.M = static_cast<int>(N), .N = F, .K = C, .act = cfg_.mlp};
    if (cfg_.mlp != Activation::Swiglu && decode_linear_uses_gemv(fc_gemv, lnx, lw.fc_w, ctx_)) {
      gemv(fc_gemv, fc_act, lnx, lw.fc_w, lw.fc_b, ctx_);
    } else if (fused_gelu) {
      gemm_gelu_forward({.M = static_cast<int>(N), .N = F, .K = C, .trans_b = true}, fc_act, fc_pre, lnx, lw.fc_w,
                        lw.fc_b, ctx_);
    } else {
      mm(cfg_.d_ff_in(), C, fc_pre, lnx, lw.fc_w, Tensor());
      activation_forward({.N = static_cast<int>(N), .d_ff = F, .kind = cfg_.mlp}, fc_act, fc_pre, lw.fc_b, ctx_);
    }
    mm(C, F, y, fc_act, lw.fcp_w, lw.fcp_b);
    if (l + 1 < cfg_.n_layers) {
      add_then_norm(w_->layers[static_cast<size_t>(l) + 1].ln1_w, w_->layers[static_cast<size_t>(l) + 1].ln1_b);
    } else {
      residual_forward(rp, x, *cur, y, Tensor(), ctx_);  // the stream ends in x, where the head reads it
    }
  }
}

void Engine::run_head(const Tensor& last, int n) {
  const Acts& a = *a_;
  const Tensor lnf = first_rows(a.lnf, n);
  const NormParams np{.N = n, .C = cfg_.d_model, .eps = cfg_.norm_eps};
  if (cfg_.norm == NormKind::LayerNorm)
    layernorm_forward(np, lnf, flat(a.mean, n), flat(a.rstd, n), last, w_->lnf_w, w_->lnf_b, ctx_);
  else rmsnorm_forward(np, lnf, flat(a.rstd, n), last, w_->lnf_w, ctx_);
  const Tensor logits = flat(a.logits, (n - 1) * ld_ + V_);
  const GemvParams gp{.M = n, .N = V_, .K = cfg_.d_model, .ldc = ld_};
  decode_linear(gp, logits, lnf, w_->lm, Tensor(), ctx_);
  last_rows_ = n;
}

void Engine::prefill(const std::vector<std::vector<int32_t>>& prompts) {
  const int n = static_cast<int>(prompts.size());
  TS_CHECK(n >= 1 && n <= opt_.batch, "engine: a prefill of ", n, " prompts; this engine takes 1 to ", opt_.batch);
  int T = 0;
  std::vector<int32_t> lens(static_cast<size_t>(n));
  for (int b = 0; b < n; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    TS_CHECK(!p.empty(), "engine: prompt ", b, " is empty");
    TS_CHECK(static_cast<int>(p.size()) <= max_prompt_, "engine: prompt ", b, " has ", p.size(),
             " tokens; this engine takes up to ", max_prompt_);
    lens[static_cast<size_t>(b)] = static_cast<int32_t>(p.size());
    T = std::max(T, static_cast<int>(p.size()));
  }
  // Right-padded with the first token of each prompt: a valid id, whose rows the key lengths mask and whose cache
  // positions the decode steps overwrite.
  std::vector<int32_t> tokens(static_cast<size_t>(n) * T);
  for (int b = 0; b < n; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    for (int t = 0; t < T; ++t) tokens[static_cast<size_t>(b) * T + t] = t < static_cast<int>(p.size()) ? p[t] : p[0];
  }
  const int64_t N = static_cast<int64_t>(n) * T;
  const EmbeddingParams ep{.B = n,
                           .T = T,
                           .C = cfg_.d_model,
                           .V = V_,
                           .max_seq = cfg_.max_seq,
                           .scale = cfg_.emb_scale,
                           .padding_id = cfg_.padding_id};
  embedding_check(ep, tokens.data(), w_->wpe.defined());
  const Acts& a = *a_;
  copy_bytes(a.tokens.data(), ctx_.device(), tokens.data(), Device::cpu(), tokens.size() * sizeof(int32_t), ctx_);
  copy_bytes(a.lens.data(), ctx_.device(), lens.data(), Device::cpu(), lens.size() * sizeof(int32_t), ctx_);
  // Every row starts at position 0; the slot table, where there is one, maps each row to its own slot.
  fill_bytes(cache_.pos(), 0, ctx_);
  cache_.reset_slots(ctx_);
  embedding_forward(ep, first_rows(a.x, N), flat(a.tokens, N), w_->wte, w_->wpe, ctx_);
  {
    const PdlScope pdl(ctx_, opt_.pdl);
    run_layers(n, T, /*decode=*/false);
  }
  // Each sequence's last row only: the head runs on n rows, not n T.
  const size_t row_bytes = static_cast<size_t>(cfg_.d_model) * dtype_size(dtype_);
  for (int b = 0; b < n; ++b)
    copy_bytes(static_cast<char*>(a.last.data()) + b * row_bytes, ctx_.device(),
               static_cast<const char*>(a.x.data()) + (static_cast<int64_t>(b) * T + lens[b] - 1) * row_bytes,
               ctx_.device(), row_bytes, ctx_);
  run_head(first_rows(a.last, n), n);
  std::vector<int32_t> pos(static_cast<size_t>(S_), 0);
  std::copy(lens.begin(), lens.end(), pos.begin());
  copy_bytes(cache_.pos().data(), ctx_.device(), pos.data(), Device::cpu(), pos.size() * sizeof(int32_t), ctx_);
  host_pos_ = std::vector<int>(pos.begin(), pos.end());
  ctx_.synchronize();  // the host vectors die here
  // The caller's work of decode_with belongs to one generation: its graph goes (the stream is idle after the sync).
  graph_[kStepWith] = CudaGraph();
  eager_steps_[kStepWith] = 0;
}

void Engine::set_tokens(const std::vector<int32_t>& tokens) {
  TS_CHECK(static_cast<int>(tokens.size()) == S_, "engine: ", tokens.size(), " tokens for ", S_, " rows");
  for (int32_t t : tokens) TS_CHECK(t >= 0 && t < V_, "engine: token id ", t, " is outside the vocab ", V_);
  copy_bytes(a_->next.data(), ctx_.device(), tokens.data(), Device::cpu(), tokens.size() * sizeof(int32_t), ctx_);
  ctx_.synchronize();
}

void Engine::set_tokens(const Tensor& tokens) {
  TS_CHECK(tokens.dtype() == DType::I32 && tokens.numel() == S_ && tokens.device() == ctx_.device(),
           "internal: engine set_tokens takes (", S_, ") i32 on ", ctx_.device().str());
  copy_bytes(a_->next.data(), ctx_.device(), tokens.data(), ctx_.device(), static_cast<size_t>(S_) * sizeof(int32_t),
             ctx_);
}

void Engine::enqueue_decode(bool greedy) {
  const Acts& a = *a_;
  decode_embedding({.B = S_,
                    .C = cfg_.d_model,
                    .V = V_,
                    .max_seq = cfg_.max_seq,
                    .scale = cfg_.emb_scale,
                    .padding_id = cfg_.padding_id},
                   first_rows(a.x, S_), flat(a.next, S_), cache_.pos(), w_->wte, w_->wpe, ctx_);
  // From here to the end of the step each kernel follows one of the step's own (engine.h: PDL).
  const PdlScope pdl(ctx_, opt_.pdl);
  run_layers(S_, 1, /*decode=*/true);
  run_head(first_rows(a.x, S_), S_);  // every row is a last row
  if (greedy) greedy_argmax(S_, V_, ld_, flat(a.logits, (S_ - 1) * ld_ + V_), flat(a.next, S_), ctx_);
  positions_advance(cache_.pos(), ctx_);
}

void Engine::decode(bool greedy) { run_step(greedy ? kStepGreedy : kStepPlain, nullptr, nullptr); }

void Engine::decode_with(const std::function<void()>& before, const std::function<void()>& after) {
  run_step(kStepWith, before, after);
}

void Engine::run_step(int kind, const std::function<void()>& before, const std::function<void()>& after) {
  for (int b = 0; b < S_; ++b)
    TS_CHECK(host_pos_[static_cast<size_t>(b)] < max_seq_, "engine: row ", b, " has filled the cache's ", max_seq_,
             " positions");
  const int g = kind;
  auto enqueue = [&] {
    if (before) before();
    enqueue_decode(kind == kStepGreedy);
    if (after) after();
  };
  bool replayed = false;
  // On the GPU the first step of each kind runs eagerly (what the ops set up once: the cuBLASLt workspace, the RoPE
  // table, the scratch); the second is captured, and every later one replays the graph. A capture that fails
  // leaves the engine eager.
  if (ctx_.is_cuda() && opt_.cuda_graph && !graph_failed_ && cuda_graph_capture_supported() && eager_steps_[g] > 0) {
    if (!graph_[g].ready() || graph_scratch_[g] != ctx_.scratch_generation()) {
      try {
        graph_[g].capture(ctx_, "the decode step", enqueue);
        graph_scratch_[g] = ctx_.scratch_generation();
        ++graph_captures_;
      } catch (const CudaGraphCaptureError&) {
        graph_failed_ = true;
      }
    }
    if (graph_[g].ready() && !graph_failed_) {
      graph_[g].launch(ctx_);
      last_rows_ = S_;
      ++graph_replays_;
      replayed = true;
    }
  }
  if (!replayed) {
    enqueue();
    ++eager_steps_[g];
  }
  for (int& p : host_pos_) ++p;
}

void Engine::read_tokens_to(int n, int32_t* host) {
  // On the GPU through the pinned buffer: an async copy on the stream, then the one sync of the step.
  read_to_host(ctx_.is_cuda() ? pinned_.data() : nullptr, host, flat(a_->next, n), ctx_);
}

std::vector<int32_t> Engine::greedy_tokens() {
  const int n = last_rows_;
  TS_CHECK(n > 0, "engine: no logits yet (prefill first)");
  greedy_argmax(n, V_, ld_, flat(a_->logits, (n - 1) * ld_ + V_), flat(a_->next, n), ctx_);
  std::vector<int32_t> out(static_cast<size_t>(n));
  read_tokens_to(n, out.data());
  return out;
}

std::vector<int32_t> Engine::read_tokens() {
  std::vector<int32_t> out(static_cast<size_t>(S_));
  read_tokens_to(S_, out.data());
  return out;
}

void Engine::reorder(const std::vector<int32_t>& parents) {
  TS_CHECK(cache_.slots().defined(), "engine: reorder needs a slot table (beams > 1)");
  TS_CHECK(static_cast<int>(parents.size()) == S_, "engine: ", parents.size(), " parents for ", S_, " rows");
  std::vector<int> pos(host_pos_.size());
  for (int b = 0; b < S_; ++b) {
    const int32_t p = parents[static_cast<size_t>(b)];
    TS_CHECK(p >= 0 && p < S_, "engine: parent ", p, " of row ", b, " is outside ", S_, " rows");
    pos[static_cast<size_t>(b)] = host_pos_[static_cast<size_t>(p)];
  }
  copy_bytes(a_->parents.data(), ctx_.device(), parents.data(), Device::cpu(), parents.size() * sizeof(int32_t), ctx_);
  cache_.reorder(flat(a_->parents, S_), ctx_);
  host_pos_ = pos;
  ctx_.synchronize();
}

void Engine::reorder(const Tensor& parents) {
  TS_CHECK(cache_.slots().defined(), "engine: reorder needs a slot table (beams > 1)");
  TS_CHECK(parents.dtype() == DType::I32 && parents.numel() == S_ && parents.device() == ctx_.device(),
           "internal: engine reorder takes (", S_, ") i32 on ", ctx_.device().str());
  cache_.reorder(parents, ctx_);
}

Tensor Engine::logits() const { return first_rows(a_->logits, last_rows_); }

Tensor Engine::next_tokens() const { return flat(a_->next, S_); }

std::vector<float> Engine::read_logits_row(int row) const {
  TS_CHECK(row >= 0 && row < last_rows_, "internal: engine logits row ", row, " of ", last_rows_);
  const size_t es = dtype_size(dtype_);
  std::vector<unsigned char> raw(static_cast<size_t>(V_) * es);
  const char* at = static_cast<const char*>(a_->logits.data()) + row * ld_ * static_cast<int64_t>(es);
  copy_bytes(raw.data(), Device::cpu(), at, ctx_.device(), raw.size(), ctx_);
  std::vector<float> out(static_cast<size_t>(V_));
  if (dtype_ == DType::F64) {
    const double* d = reinterpret_cast<const double*>(raw.data());
    for (int v = 0; v < V_; ++v) out[static_cast<size_t>(v)] = static_cast<float>(d[v]);
  } else {
    convert_to_f32(raw.data(), dtype_, out.size(), out.data());
  }
  return out;
}

std::vector<int32_t> engine_generate(Engine& engine, std::vector<int32_t> tokens, int max_new, const SamplerParams& p,
                                     const std::function<void(int32_t)>& on_token) {
  sampler_check(p);
  TS_CHECK(!tokens.empty(), "generate: the prompt is empty");
  TS_CHECK(engine.rows() == 1, "internal: engine_generate runs one sequence, the engine has ", engine.rows(), " rows");
  if (max_new <= 0) return tokens;
  const int max_seq = engine.max_seq(), V = engine.vocab();
  const bool greedy = p.temperature == 0;
  auto prefill_window = [&] {
    const size_t T = std::min(tokens.size(), static_cast<size_t>(max_seq));
    engine.prefill({std::vector<int32_t>(tokens.end() - static_cast<std::ptrdiff_t>(T), tokens.end())});
  };
  // The next token from the last logits; it becomes the next step's input.
  auto draw = [&](int i) {
    if (greedy) return engine.greedy_tokens()[0];
    const std::vector<float> row = engine.read_logits_row(0);
    const int32_t t = sample_token(p, row.data(), V, static_cast<uint64_t>(i));
    engine.set_tokens({t});
    return t;
  };
  prefill_window();
  for (int i = 0; i < max_new; ++i) {
    int32_t t = 0;
    if (i == 0) {
      t = draw(i);
    } else if (engine.position(0) >= max_seq) {
      prefill_window();  // the context slides: its positions all move
      t = draw(i);
    } else if (greedy) {
      engine.decode(/*greedy=*/true);
      t = engine.read_tokens()[0];
    } else {
      engine.decode(/*greedy=*/false);
      t = draw(i);
    }
    tokens.push_back(t);
    if (on_token) on_token(t);
  }
  return tokens;
}

}  // namespace tessera
