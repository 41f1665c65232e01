#include "tessera/infer/seq2seq_engine.h"

#include <algorithm>
#include <cmath>

#include "tessera/core/error.h"
#include "tessera/infer/decode_linear.h"
#include "tessera/infer/decode_ops.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_decode.h"
#include "tessera/ops/norm/norm.h"
#include "tessera/ops/residual/residual.h"

namespace tessera {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
DType stat_of(DType dt) { return dt == DType::F64 ? DType::F64 : DType::F32; }

Tensor first_rows(const Tensor& t, int64_t n) {
  const int64_t cols = t.ndim() > 1 ? t.size(1) : 1;
  return Tensor::from_shape(t.data(), t.dtype(), std::initializer_list<int64_t>{n, cols}, t.device());
}
Tensor flat(const Tensor& t, int64_t n) {
  return Tensor::from_shape(t.data(), t.dtype(), std::initializer_list<int64_t>{n}, t.device());
}
// A (B, T, heads, Dh) view at column `col` of rows of width `ld`.
Tensor heads_view(const Tensor& t, int64_t col, int B, int T, int heads, int Dh, int64_t ld) {
  char* base = static_cast<char*>(t.data()) + col * static_cast<int64_t>(dtype_size(t.dtype()));
  return Tensor::strided(base, t.dtype(), {B, T, heads, Dh}, {T * ld, ld, Dh, 1}, t.device());
}

}  // namespace

// Views into the model's ParamBuffer (undefined where the config has none). norm[k]: the layer's ln{k+1}.
struct Seq2SeqEngine::Weights {
  struct Layer {
    Tensor norm_w[3], norm_b[3], qkv_w, qkv_b, proj_w, proj_b, q_w, q_b, xproj_w, xproj_b, fc_w, fc_b, fcp_w, fcp_b;
  };
  Tensor wte, wpe, lne_w, lne_b, lnf_w, lnf_b, lm;
  std::vector<Layer> layers;
};

// The shared buffers, S = batch x beams rows each. The residual stream alternates between x and x2 (a fused add
// and norm writes memory of its own); t holds a post-norm sum before its norm, or the embedding before
// LayerNorm_emb; h a pre-norm sublayer's input (the stream's norm).
struct Seq2SeqEngine::Acts {
  Tensor x, x2, t, h, y, qkv, q, att, fc_pre, fc_act, mean, rstd, lse, logits;
  Tensor tokens, parents;  // (S) int32

  static size_t layout(const EncDecConfig& c, DType dt, int S, int64_t ld, void* base, Device dev, Acts* a) {
    size_t at = 0;
    auto take = [&](Tensor* t, DType d, int64_t rows, int64_t cols) {
      if (a) *t = Tensor::from_shape(static_cast<char*>(base) + at, d, std::initializer_list<int64_t>{rows, cols}, dev);
      at += align_up(static_cast<size_t>(rows * cols) * dtype_size(d));
    };
    Acts dummy;
    Acts& r = a ? *a : dummy;
    const int64_t C = c.d_model, HD = int64_t{c.n_heads} * c.head_dim();
    const int64_t W = HD + 2 * int64_t{c.kv_heads()} * c.head_dim();
    for (Tensor* t : {&r.x, &r.x2, &r.t, &r.h, &r.y}) take(t, dt, S, C);
    take(&r.qkv, dt, S, W);
    take(&r.q, dt, S, HD);
    take(&r.att, dt, S, HD);
    take(&r.fc_pre, dt, S, c.d_ff);
    take(&r.fc_act, dt, S, c.d_ff);
    take(&r.mean, stat_of(dt), S, 1);
    take(&r.rstd, stat_of(dt), S, 1);
    take(&r.lse, stat_of(dt), S, c.n_heads);
    take(&r.logits, dt, S, ld);
    take(&r.tokens, DType::I32, S, 1);
    take(&r.parents, DType::I32, S, 1);
    return at;
  }
};

Seq2SeqEngine::Seq2SeqEngine(EncoderDecoder& model, const Seq2SeqEngineOptions& opt)
    : model_(model), ctx_(model.context()), cfg_(model.config()), dtype_(model.dtype()), opt_(opt) {
  TS_CHECK(opt.batch >= 1 && opt.beams >= 1, "seq2seq engine: batch and beams must be >= 1, got ", opt.batch, " and ",
           opt.beams);
  TS_CHECK(int64_t{opt.batch} * opt.beams <= (1 << 20), "seq2seq engine: batch x beams is past 2^20");
  TS_CHECK(opt.max_src >= 0 && opt.max_src <= cfg_.max_seq && opt.max_tgt >= 0 && opt.max_tgt <= cfg_.max_seq,
           "seq2seq engine: source and target lengths must lie in [1, max_seq ", cfg_.max_seq, "]");
  S_ = opt.batch * opt.beams;
  max_src_ = opt.max_src > 0 ? opt.max_src : cfg_.max_seq;
  max_tgt_ = opt.max_tgt > 0 ? opt.max_tgt : cfg_.max_seq;
  V_ = cfg_.vocab;
  ld_ = model.logits_stride();

  const ParamBuffer& pb = model_.params();
  auto get = [&](const std::string& name, bool required) {
    const int i = pb.find(name);
    TS_CHECK(i >= 0 || !required, "seq2seq engine: the model has no parameter '", name, "'");
    if (i < 0) return Tensor();
    const ParamSegment& seg = pb.segments()[static_cast<size_t>(i)];
    return pb.data_at(seg.offset, static_cast<int64_t>(seg.numel));
  };
  w_ = std::make_unique<Weights>();
  Weights& w = *w_;
  const bool pre = cfg_.placement == NormPlacement::Pre;
  w.wte = get(cfg_.shared_embeddings ? "enc.wte" : "dec.wte", true);
  if (cfg_.positions == PositionKind::Learned) {
    // Row pos_offset of the table is position 0 (BART's offset of 2).
    const Tensor wpe = get("dec.wpe", true);
    const int64_t C = cfg_.d_model;
    w.wpe = wpe.slice1d(int64_t{cfg_.pos_offset} * C, int64_t{cfg_.max_seq} * C);
  }
  if (cfg_.layernorm_embedding) {
    w.lne_w = get("dec.lne.w", true);
    w.lne_b = get("dec.lne.b", true);
  }
  if (pre) {
    w.lnf_w = get("lnf.w", true);
    w.lnf_b = get("lnf.b", true);
  }
  w.lm = cfg_.tied_output ? w.wte : get("lm_head", true);
  for (int l = 0; l < cfg_.dec_layers; ++l) {
    const std::string p = "dec." + std::to_string(l) + ".";
    Weights::Layer lw;
    for (int k = 0; k < 3; ++k) {
      lw.norm_w[k] = get(p + "ln" + std::to_string(k + 1) + ".w", true);
      lw.norm_b[k] = get(p + "ln" + std::to_string(k + 1) + ".b", true);
    }
    lw.qkv_w = get(p + "qkv.w", true);
    lw.qkv_b = get(p + "qkv.b", true);
    lw.proj_w = get(p + "proj.w", true);
    lw.proj_b = get(p + "proj.b", true);
    lw.q_w = get(p + "cross.q.w", true);
    lw.q_b = get(p + "cross.q.b", true);
    lw.xproj_w = get(p + "cross.proj.w", true);
    lw.xproj_b = get(p + "cross.proj.b", true);
    lw.fc_w = get(p + "fc.w", true);
    lw.fc_b = get(p + "fc.b", true);
    lw.fcp_w = get(p + "fcp.w", true);
    lw.fcp_b = get(p + "fcp.b", true);
    w.layers.push_back(lw);
  }
  if (cfg_.positions == PositionKind::Sinusoidal) {
    // Embedding::make_tables's table: PE[pos, 2i] = sin(pos / 10000^(2i/C)), PE[pos, 2i+1] = cos(..), in f64,
    // rounded through f32 (kept in f64 for an f64 model).
    const int64_t C = cfg_.d_model;
    std::vector<double> table(static_cast<size_t>(cfg_.max_seq) * C, 0.0);
    for (int pos = 0; pos < cfg_.max_seq; ++pos)
      for (int64_t i = 0; i < C / 2; ++i) {
        const double ang = pos / std::pow(10000.0, 2.0 * i / C);
        table[pos * C + 2 * i] = std::sin(ang);
        table[pos * C + 2 * i + 1] = std::cos(ang);
      }
    std::vector<unsigned char> raw(table.size() * dtype_size(dtype_));
    if (dtype_ == DType::F64) {
      std::copy_n(reinterpret_cast<const unsigned char*>(table.data()), raw.size(), raw.data());
    } else {
      const std::vector<float> f32(table.begin(), table.end());
      convert_from_f32(f32.data(), f32.size(), dtype_, raw.data());
    }
    sinusoid_ = Buffer(raw.size(), ctx_.device(), "the sinusoid table");
    copy_bytes(sinusoid_.data(), ctx_.device(), raw.data(), Device::cpu(), raw.size(), ctx_);
    w.wpe = sinusoid_.view(dtype_, {int64_t{cfg_.max_seq}, C});
  }

  cache_ = KvCache({.layers = cfg_.dec_layers,
                    .S = S_,
                    .Hkv = cfg_.kv_heads(),
                    .max_seq = max_tgt_,
                    .Dh = cfg_.head_dim(),
                    .slot_table = opt_.beams > 1},
                   dtype_, ctx_);
  const size_t bytes = Acts::layout(cfg_, dtype_, S_, ld_, nullptr, ctx_.device(), nullptr);
  acts_ = Buffer(bytes, ctx_.device(), "the seq2seq engine's buffers");
  a_ = std::make_unique<Acts>();
  Acts::layout(cfg_, dtype_, S_, ld_, acts_.data(), ctx_.device(), a_.get());
  fill_bytes(acts_.view(DType::U8, {static_cast<int64_t>(bytes)}), 0, ctx_);
  ctx_.synchronize();
}

Seq2SeqEngine::~Seq2SeqEngine() = default;

void Seq2SeqEngine::encode(const std::vector<std::vector<int32_t>>& sources) {
  const int n = static_cast<int>(sources.size());
  TS_CHECK(n >= 1 && n <= opt_.batch, "seq2seq engine: an encode of ", n, " sources; this engine takes 1 to ",
           opt_.batch);
  int Ts = 0;
  std::vector<int32_t> lens(static_cast<size_t>(n));
  for (int b = 0; b < n; ++b) {
    const size_t L = sources[static_cast<size_t>(b)].size();
    TS_CHECK(L >= 1 && static_cast<int>(L) <= max_src_, "seq2seq engine: source ", b, " has ", L,
             " tokens; this engine takes 1 to ", max_src_);
    lens[static_cast<size_t>(b)] = static_cast<int32_t>(L);
    Ts = std::max(Ts, static_cast<int>(L));
  }
  // Right-padded with pad_id: the key lengths mask those positions in every attention over the source.
  std::vector<int32_t> src(static_cast<size_t>(n) * Ts, cfg_.pad_id);
  for (int b = 0; b < n; ++b)
    std::copy(sources[static_cast<size_t>(b)].begin(), sources[static_cast<size_t>(b)].end(),
              src.begin() + static_cast<ptrdiff_t>(b) * Ts);
  const std::vector<int32_t> start(static_cast<size_t>(n), cfg_.decoder_start_id), one(static_cast<size_t>(n), 1);
  // The model's forward runs the encoder and the one batched cross K/V projection of every decoder layer (its
  // one-token decoder pass is not read).
  model_.forward({.B = n,
                  .Ts = Ts,
                  .Tt = 1,
                  .src = src.data(),
                  .src_lens = lens.data(),
                  .tgt_in = start.data(),
                  .tgt_out = nullptr,
                  .tgt_lens = one.data()});
  n_ = n;
  R_ = n * opt_.beams;
  Ts_ = Ts;
  pos_ = 0;
  std::vector<uintptr_t> key{static_cast<uintptr_t>(n), static_cast<uintptr_t>(Ts),
                             reinterpret_cast<uintptr_t>(model_.source_lens().data())};
  for (int l = 0; l < cfg_.dec_layers; ++l)
    for (const Tensor& t : {model_.cross_k(l), model_.cross_v(l)}) key.push_back(reinterpret_cast<uintptr_t>(t.data()));
  drop_graphs(/*all=*/key != graph_key_);
  graph_key_ = std::move(key);
  fill_bytes(cache_.pos(), 0, ctx_);
  if (cache_.slots().defined()) cache_.reset_slots(ctx_);
  std::vector<int32_t> ident(static_cast<size_t>(S_));
  for (int r = 0; r < S_; ++r) ident[static_cast<size_t>(r)] = r;
  copy_bytes(a_->parents.data(), ctx_.device(), ident.data(), Device::cpu(), ident.size() * sizeof(int32_t), ctx_);
  set_tokens(std::vector<int32_t>(static_cast<size_t>(R_), cfg_.decoder_start_id));
}

void Seq2SeqEngine::drop_graphs(bool all) {
  // decode_with's graph holds the caller's tensors (one beam search's): it never outlives an encode. decode()'s goes
  // when what it froze moved. An exec still in flight is freed when its launch completes (cudaGraphExecDestroy).
  for (int k = all ? kStepPlain : kStepWith; k <= kStepWith; ++k) {
    graph_[k].reset();
    graph_scratch_[k] = -1;
    eager_steps_[k] = 0;
  }
}

void Seq2SeqEngine::set_tokens(const std::vector<int32_t>& tokens) {
  TS_CHECK(static_cast<int>(tokens.size()) == R_, "seq2seq engine: ", tokens.size(), " tokens for ", R_, " rows");
  for (int32_t t : tokens) TS_CHECK(t >= 0 && t < V_, "seq2seq engine: token ", t, " is outside [0, ", V_, ")");
  copy_bytes(a_->tokens.data(), ctx_.device(), tokens.data(), Device::cpu(), tokens.size() * sizeof(int32_t), ctx_);
}

void Seq2SeqEngine::set_tokens(const Tensor& tokens) {
  copy_bytes(a_->tokens.data(), ctx_.device(), tokens.data(), tokens.device(), size_t(R_) * sizeof(int32_t), ctx_);
}

void Seq2SeqEngine::reorder(const Tensor& parents) {
  if (!cache_.slots().defined()) return;
  // Rows past R keep themselves (the identity written at encode).
  copy_bytes(a_->parents.data(), ctx_.device(), parents.data(), parents.device(), size_t(R_) * sizeof(int32_t), ctx_);
  cache_.reorder(flat(a_->parents, S_), ctx_);
}

void Seq2SeqEngine::embed() {
  const Acts& a = *a_;
  const DecodeEmbeddingParams ep{.B = R_,
                                 .C = cfg_.d_model,
                                 .V = V_,
                                 .max_seq = cfg_.max_seq,
                                 .scale = cfg_.emb_scale(),
                                 .padding_id = cfg_.pad_id};
  const NormParams np{.N = R_, .C = cfg_.d_model, .eps = cfg_.norm_eps};
  const Tensor x = first_rows(a.x, R_), mean = flat(a.mean, R_), rstd = flat(a.rstd, R_);
  const bool lne = w_->lne_w.defined();
  const Tensor e = lne ? first_rows(a.t, R_) : x;
  decode_embedding(ep, e, flat(a.tokens, R_), flat(cache_.pos(), R_), w_->wte, w_->wpe, ctx_);
  if (lne) layernorm_forward(np, x, mean, rstd, e, w_->lne_w, w_->lne_b, ctx_);
  cur_ = 0;
  // Pre-norm: layer 0's first sublayer reads LN1(x); every later norm is fused with the add before it.
  if (cfg_.placement == NormPlacement::Pre) {
    const Weights::Layer& l0 = w_->layers.front();
    layernorm_forward(np, first_rows(a.h, R_), mean, rstd, x, l0.norm_w[0], l0.norm_b[0], ctx_);
  }
}

const Tensor& Seq2SeqEngine::stream() const { return cur_ == 0 ? a_->x : a_->x2; }
const Tensor& Seq2SeqEngine::stream_other() const { return cur_ == 0 ? a_->x2 : a_->x; }

const Tensor& Seq2SeqEngine::sublayer_input() const { return cfg_.placement == NormPlacement::Pre ? a_->h : stream(); }

void Seq2SeqEngine::add_norm(int l, int k) {
  const Acts& a = *a_;
  const int C = cfg_.d_model;
  const NormParams np{.N = R_, .C = C, .eps = cfg_.norm_eps};
  const ResidualParams rp{.N = R_, .C = C};
  const Tensor cur = first_rows(stream(), R_), next = first_rows(stream_other(), R_), y = first_rows(a.y, R_);
  const Tensor mean = flat(a.mean, R_), rstd = flat(a.rstd, R_);
  const Weights::Layer& lw = w_->layers[static_cast<size_t>(l)];
  if (cfg_.placement != NormPlacement::Pre) {
    // The sum in t (read by nothing after), its norm the new stream.
    norm_residual_forward(np, /*layernorm=*/true, rp, first_rows(a.t, R_), next, mean, rstd, cur, y, Tensor(),
                          lw.norm_w[k], lw.norm_b[k], ctx_);
  } else {
    // The sum the new stream, its next norm in h: LN_{k+1} of this layer, LN_1 of the next, or LN_f after the last.
    const Tensor* w = &w_->lnf_w;
    const Tensor* b = &w_->lnf_b;
    if (k < 2) {
      w = &lw.norm_w[k + 1];
      b = &lw.norm_b[k + 1];
    } else if (l + 1 < cfg_.dec_layers) {
      w = &w_->layers[static_cast<size_t>(l) + 1].norm_w[0];
      b = &w_->layers[static_cast<size_t>(l) + 1].norm_b[0];
    }
    norm_residual_forward(np, /*layernorm=*/true, rp, next, first_rows(a.h, R_), mean, rstd, cur, y, Tensor(), *w, *b,
                          ctx_);
  }
  cur_ ^= 1;
}

namespace {
// y = x Wᵀ + b over the first M rows (decode_linear: gemv for a few rows on the GPU, else exact-f32 GEMM).
void linear(int M, int out, int in, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, Context& ctx) {
  decode_linear({.M = M, .N = out, .K = in}, first_rows(y, M), first_rows(x, M), w, b, ctx);
}
}  // namespace

void Seq2SeqEngine::self_attention(int l, const Tensor& in) {
  const Acts& a = *a_;
  const Weights::Layer& lw = w_->layers[static_cast<size_t>(l)];
  const int C = cfg_.d_model, H = cfg_.n_heads, Hkv = cfg_.kv_heads(), Dh = cfg_.head_dim();
  const int64_t HD = int64_t{H} * Dh, W = HD + 2 * int64_t{Hkv} * Dh;
  linear(R_, static_cast<int>(W), C, a.qkv, in, lw.qkv_w, lw.qkv_b, ctx_);
  const DecodeAttentionParams dp{.B = R_, .Tq = 1, .H = H, .Hkv = Hkv, .Dh = Dh, .S = S_, .max_seq = max_tgt_};
  const Tensor q = heads_view(a.qkv, 0, R_, 1, H, Dh, W), k = heads_view(a.qkv, HD, R_, 1, Hkv, Dh, W);
  const Tensor v = heads_view(a.qkv, HD + int64_t{Hkv} * Dh, R_, 1, Hkv, Dh, W);
  const Tensor pos = flat(cache_.pos(), R_);
  const Tensor slots = cache_.slots().defined()
                           ? Tensor::from_shape(cache_.slots().data(), DType::I32,
                                                std::initializer_list<int64_t>{R_, max_tgt_}, ctx_.device())
                           : Tensor();
  const KvCacheView kv = cache_.layer(l);
  kv_append(dp, kv, q, k, v, pos, slots, ctx_);
  attention_decode(dp, heads_view(a.att, 0, R_, 1, H, Dh, HD), q, kv, pos, slots, ctx_);
  linear(R_, C, static_cast<int>(HD), a.y, a.att, lw.proj_w, lw.proj_b, ctx_);
}

void Seq2SeqEngine::cross_attention(int l, const Tensor& in) {
  const Acts& a = *a_;
  const Weights::Layer& lw = w_->layers[static_cast<size_t>(l)];
  const int C = cfg_.d_model, H = cfg_.n_heads, Hkv = cfg_.kv_heads(), Dh = cfg_.head_dim(), K = opt_.beams;
  const int64_t HD = int64_t{H} * Dh, KV = int64_t{Hkv} * Dh;
  linear(R_, static_cast<int>(HD), C, a.q, in, lw.q_w, lw.q_b, ctx_);
  // Entry e's K beams are its Tq = K queries against its own Ts keys: the cross K/V are never copied per beam.
  const Tensor q = heads_view(a.q, 0, n_, K, H, Dh, HD), out = heads_view(a.att, 0, n_, K, H, Dh, HD);
  const Tensor k = heads_view(model_.cross_k(l), 0, n_, Ts_, Hkv, Dh, KV);
  const Tensor v = heads_view(model_.cross_v(l), 0, n_, Ts_, Hkv, Dh, KV);
  const AttentionParams ap{.B = n_,
                           .T = K,
                           .H = H,
                           .Dh = Dh,
                           .causal = false,
                           .n_kv_heads = Hkv,
                           .Tq = K,
                           .Tk = Ts_,
                           .key_lens = model_.source_lens()};
  attention_forward(ap, out, flat(a.lse, int64_t{n_} * H * K), q, k, v, ctx_);
  linear(R_, C, static_cast<int>(HD), a.y, a.att, lw.xproj_w, lw.xproj_b, ctx_);
}

void Seq2SeqEngine::mlp(int l, const Tensor& in) {
  const Acts& a = *a_;
  const Weights::Layer& lw = w_->layers[static_cast<size_t>(l)];
  const int C = cfg_.d_model, F = cfg_.d_ff;
  // fc with its bias and activation: gemv's epilogue where it takes the call, else the GEMM into fc_pre, then
  // activation_forward.
  decode_linear_act({.M = R_, .N = F, .K = C, .act = cfg_.act}, first_rows(a.fc_act, R_), first_rows(a.fc_pre, R_),
                    first_rows(in, R_), lw.fc_w, lw.fc_b, ctx_);
  linear(R_, C, F, a.y, a.fc_act, lw.fcp_w, lw.fcp_b, ctx_);
}

void Seq2SeqEngine::enqueue_step() {
  embed();
  for (int l = 0; l < cfg_.dec_layers; ++l) {
    self_attention(l, sublayer_input());
    add_norm(l, 0);
    cross_attention(l, sublayer_input());
    add_norm(l, 1);
    mlp(l, sublayer_input());
    add_norm(l, 2);
  }
  const Acts& a = *a_;
  // Pre-norm: the last add wrote LN_f of the stream into h.
  const Tensor& head_in = cfg_.placement == NormPlacement::Pre ? a.h : stream();
  decode_linear({.M = R_, .N = V_, .K = cfg_.d_model, .ldc = ld_}, flat(a.logits, (R_ - 1) * ld_ + V_),
                first_rows(head_in, R_), w_->lm, Tensor(), ctx_);
  positions_advance(flat(cache_.pos(), R_), ctx_);
}

void Seq2SeqEngine::decode() { run_step(kStepPlain, nullptr, nullptr); }

void Seq2SeqEngine::decode_with(const std::function<void()>& before, const std::function<void()>& after) {
  run_step(kStepWith, before, after);
}

void Seq2SeqEngine::run_step(int kind, const std::function<void()>& before, const std::function<void()>& after) {
  TS_CHECK(R_ > 0, "seq2seq engine: decode before encode");
  TS_CHECK(pos_ < max_tgt_, "seq2seq engine: the target reached the cache's ", max_tgt_, " positions");
  auto enqueue = [&] {
    if (before) before();
    enqueue_step();
    if (after) after();
  };
  bool replayed = false;
  // On the GPU the first step of each kind after an encode that moved its inputs runs eagerly (what the ops set
  // up once: the cuBLASLt workspace, the scratch); the next is captured, and every later one replays the graph.
  // A capture that fails leaves the engine eager.
  if (ctx_.is_cuda() && opt_.cuda_graph && !graph_failed_ && cuda_graph_capture_supported() && eager_steps_[kind] > 0) {
    CudaGraph& g = graph_[kind];
    if (!g.ready() || graph_scratch_[kind] != ctx_.scratch_generation()) {
      try {
        g.capture(ctx_, "the seq2seq decode step", enqueue);
        graph_scratch_[kind] = ctx_.scratch_generation();
        ++graph_captures_;
      } catch (const CudaGraphCaptureError&) {
        graph_failed_ = true;
      }
    }
    if (g.ready() && !graph_failed_) {
      g.launch(ctx_);
      ++graph_replays_;
      replayed = true;
    }
  }
  if (!replayed) {
    enqueue();
    ++eager_steps_[kind];
  }
  ++pos_;
}

Tensor Seq2SeqEngine::logits() const { return first_rows(a_->logits, R_); }

std::vector<float> Seq2SeqEngine::read_logits_row(int row) const {
  TS_CHECK(row >= 0 && row < R_, "internal: logits row ", row, " of ", R_);
  const size_t es = dtype_size(dtype_);
  std::vector<unsigned char> raw(static_cast<size_t>(V_) * es);
  const char* at = static_cast<const char*>(a_->logits.data()) + row * ld_ * static_cast<int64_t>(es);
  copy_bytes(raw.data(), Device::cpu(), at, ctx_.device(), raw.size(), ctx_);
  std::vector<float> out(static_cast<size_t>(V_));
  convert_to_f32(raw.data(), dtype_, out.size(), out.data());
  return out;
}

std::vector<int32_t> Seq2SeqEngine::greedy_tokens() {
  const Tensor tokens = flat(a_->tokens, R_);
  greedy_argmax(R_, V_, ld_, flat(a_->logits, (R_ - 1) * ld_ + V_), tokens, ctx_);
  std::vector<int32_t> out(static_cast<size_t>(R_));
  copy_bytes(out.data(), Device::cpu(), tokens.data(), ctx_.device(), out.size() * sizeof(int32_t), ctx_);
  return out;
}

}  // namespace tessera
