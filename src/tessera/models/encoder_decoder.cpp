#include "tessera/models/encoder_decoder.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/nn/block.h"
#include "tessera/nn/cross_attention.h"
#include "tessera/nn/cross_kv.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/lm_head.h"
#include "tessera/nn/norm.h"

namespace tessera {

// The layers in the order they run. Optional norms: the LayerNorm after each embedding (layernorm_embedding), and
// a pre-norm encoder's final norm (a pre-norm decoder's is the head's).
struct EncoderDecoder::Layers {
  Embedding enc_emb, dec_emb;
  std::optional<Norm> enc_lne, dec_lne, enc_lnf;
  std::vector<Block> enc, dec;
  CrossKvProjection cross_kv;
  LmHead head;
  StepSchedule sched;
  int enc_lne_fwd = -1, enc_lne_bwd = -1, dec_lne_fwd = -1, dec_lne_bwd = -1, enc_lnf_fwd = -1, enc_lnf_bwd = -1;
};

// The model's own buffers: the inputs (outliving the step), the sublayers' outputs of each side, and the streams'
// gradients.
struct EncoderDecoder::Acts {
  Tensor src, src_lens, tgt_in, tgt_out, loss, count;
  Tensor enc_tmp, dec_tmp, d_enc, d_memory, d_enc_emb, d_dec, d_dec_emb;
};

namespace {

BlockShape block_shape(const EncDecConfig& c, BlockKind kind) {
  return {.kind = kind,
          .placement = c.placement,
          .attention = {.C = c.d_model, .H = c.n_heads, .Hkv = c.kv_heads(), .Dh = c.head_dim(), .bias = true},
          .cross_kv = CrossKvSource::Batched,
          .mlp = {.C = c.d_model, .F = c.d_ff, .kind = c.act, .bias = true},
          .norm = NormKind::LayerNorm,
          .norm_eps = c.norm_eps};
}

EmbeddingShape embedding_shape(const EncDecConfig& c, int V) {
  const bool learned = c.positions == PositionKind::Learned;
  return {.V = V,
          .C = c.d_model,
          .max_seq = c.max_seq,
          .positions = c.positions,
          .scale = c.emb_scale(),
          .padding_id = c.pad_id,
          .pos_offset = learned ? c.pos_offset : 0};
}

}  // namespace

void EncoderDecoder::Clock::at(int event) {
  TS_CHECK(event > last && event < sched->end(), "internal: step event ", sched->name(event), " after ",
           last < 0 ? std::string("the start") : sched->name(last));
  last = event;
}

EncoderDecoder::EncoderDecoder(const EncDecConfig& cfg, Context& ctx, DType dtype)
    : cfg_(cfg), ctx_(&ctx), dtype_(dtype), params_(ctx.device(), dtype) {
  build();
}

EncoderDecoder::~EncoderDecoder() = default;

const StepSchedule& EncoderDecoder::schedule() const { return layers_->sched; }

void EncoderDecoder::build() {
  cfg_.validate();
  TS_CHECK(dtype_is_float(dtype_), "model dtype must be a float type, got ", dtype_name(dtype_));
  const EncDecConfig& c = cfg_;
  const bool pre = c.placement == NormPlacement::Pre;
  const int64_t ld = dtype_ == DType::BF16 || dtype_ == DType::F16 ? (c.vocab + 63) / 64 * 64 : c.vocab;
  layers_ = std::make_unique<Layers>(
      Layers{.enc_emb = Embedding("enc.", embedding_shape(c, c.source_vocab())),
             .dec_emb = Embedding("dec.", embedding_shape(c, c.vocab)),
             .enc_lne = {},
             .dec_lne = {},
             .enc_lnf = {},
             .enc = {},
             .dec = {},
             .cross_kv = CrossKvProjection("dec.cross_kv", c.d_model, c.dec_layers, c.kv_heads() * c.head_dim(), true),
             .head = LmHead({.V = c.vocab,
                             .C = c.d_model,
                             .ld = ld,
                             .norm = NormKind::LayerNorm,
                             .bias = true,
                             .norm_eps = c.norm_eps,
                             .tied = c.tied_output,
                             .ignore_index = c.pad_id,
                             .final_norm = pre}),
             .sched = {}});
  Layers& lay = *layers_;
  if (c.layernorm_embedding) {
    lay.enc_lne.emplace("enc.lne", NormKind::LayerNorm, true, c.d_model, c.norm_eps);
    lay.dec_lne.emplace("dec.lne", NormKind::LayerNorm, true, c.d_model, c.norm_eps);
  }
  if (pre) lay.enc_lnf.emplace("enc.lnf", NormKind::LayerNorm, true, c.d_model, c.norm_eps);
  lay.enc.reserve(static_cast<size_t>(c.enc_layers));  // the wiring below points into the vectors
  lay.dec.reserve(static_cast<size_t>(c.dec_layers));
  for (int l = 0; l < c.enc_layers; ++l)
    lay.enc.emplace_back("enc." + std::to_string(l) + ".", "encoder " + std::to_string(l),
                         block_shape(c, BlockKind::Encoder));
  for (int l = 0; l < c.dec_layers; ++l)
    lay.dec.emplace_back("dec." + std::to_string(l) + ".", "decoder " + std::to_string(l),
                         block_shape(c, BlockKind::DecoderCross));
  if (pre) {
    // Each block's last residual add computes the norm that reads its output: the next block's first, the
    // encoder's final norm, or the head's.
    const int Le = c.enc_layers, Ld = c.dec_layers;
    for (int l = 0; l < Le; ++l) {
      lay.enc[l].set_producer(l > 0 ? &lay.enc[l - 1] : nullptr);
      lay.enc[l].set_next_norm(l + 1 < Le ? &lay.enc[l + 1].input_norm() : &*lay.enc_lnf);
    }
    for (int l = 0; l < Ld; ++l) {
      lay.dec[l].set_producer(l > 0 ? &lay.dec[l - 1] : nullptr);
      lay.dec[l].set_next_norm(l + 1 < Ld ? &lay.dec[l + 1].input_norm() : &lay.head.input_norm());
    }
    lay.head.set_producer(&lay.dec.back());
  }

  lay.enc_emb.add_params(params_);
  if (lay.enc_lne) lay.enc_lne->add_params(params_);
  for (Block& b : lay.enc) b.add_params(params_);
  if (lay.enc_lnf) lay.enc_lnf->add_params(params_);
  lay.dec_emb.add_params(params_, c.shared_embeddings ? lay.enc_emb.wte_offset() : kNoParam);
  if (lay.dec_lne) lay.dec_lne->add_params(params_);
  lay.cross_kv.add_params(params_);
  for (Block& b : lay.dec) b.add_params(params_);
  lay.head.add_params(params_, lay.dec_emb.wte_offset());

  StepSchedule& s = lay.sched;
  lay.enc_emb.schedule_forward(s);
  if (lay.enc_lne) lay.enc_lne_fwd = s.add(Phase::Forward, "", {"encoder layernorm_embedding"});
  for (Block& b : lay.enc) b.schedule_forward(s);
  if (lay.enc_lnf) lay.enc_lnf_fwd = s.add(Phase::Forward, "", {"encoder final norm"});
  lay.cross_kv.schedule_forward(s);
  lay.dec_emb.schedule_forward(s);
  if (lay.dec_lne) lay.dec_lne_fwd = s.add(Phase::Forward, "", {"decoder layernorm_embedding"});
  for (Block& b : lay.dec) b.schedule_forward(s);
  lay.head.schedule_forward(s);
  lay.head.schedule_backward(s);
  for (int l = c.dec_layers - 1; l >= 0; --l) lay.dec[l].schedule_backward(s);
  if (lay.dec_lne) lay.dec_lne_bwd = s.add(Phase::Backward, "", {"decoder layernorm_embedding"});
  lay.dec_emb.schedule_backward(s);
  lay.cross_kv.schedule_backward(s);
  if (lay.enc_lnf) lay.enc_lnf_bwd = s.add(Phase::Backward, "", {"encoder final norm"});
  for (int l = c.enc_layers - 1; l >= 0; --l) lay.enc[l].schedule_backward(s);
  if (lay.enc_lne) lay.enc_lne_bwd = s.add(Phase::Backward, "", {"encoder layernorm_embedding"});
  lay.enc_emb.schedule_backward(s);
  clock_.sched = &s;

  params_.finalize(*ctx_);
  lay.enc_emb.make_tables(dtype_, *ctx_);
  lay.dec_emb.make_tables(dtype_, *ctx_);
}

void EncoderDecoder::init_weights(uint64_t seed) {
  const auto& segs = params_.segments();
  std::vector<float> w(params_.size(), 0.0f);
  const int64_t C = cfg_.d_model;
  for (size_t s = 0; s < segs.size(); ++s) {
    const ParamSegment& seg = segs[s];
    const std::string& n = seg.name;
    const bool is_gain = n.ends_with("ln1.w") || n.ends_with("ln2.w") || n.ends_with("ln3.w") || n.ends_with("lne.w") ||
                         n.ends_with("lnf.w");
    const bool is_bias = n.ends_with(".b");
    // fairseq draws scaled token embeddings from N(0, C^-1/2), so that sqrt(C) e has unit scale; the rest is
    // N(0, init_std), as BART draws every Linear and Embedding.
    const bool is_wte = n.ends_with("wte");
    const double sd = is_wte && cfg_.scale_embedding ? 1.0 / std::sqrt(static_cast<double>(C)) : cfg_.init_std;
    float* dst = w.data() + seg.offset;
    for (size_t i = 0; i < seg.numel; ++i)
      dst[i] = is_gain ? 1.0f : is_bias ? 0.0f : static_cast<float>(sd * philox_normal(seed, s, i));
    // The pad token's row is zero, as nn.Embedding(padding_idx) makes it.
    if (is_wte)
      for (int64_t c = 0; c < C; ++c) dst[cfg_.pad_id * C + c] = 0.0f;
  }
  params_.write_f32(w, *ctx_);
}

StepEnv EncoderDecoder::env(int T) const {
  return {.ctx = ctx_,
          .params = &params_,
          .dtype = dtype_,
          .clock = &clock_,
          .B = B_,
          .T = T,
          .dropout = dropout_p_,
          .attn_dropout = attn_dropout_p_,
          .act_dropout = act_dropout_p_,
          .seed = seed_};
}

Tensor EncoderDecoder::enc_input(int l, int64_t N) const {
  const Layers& lay = *layers_;
  if (l > 0) return lay.enc[l - 1].out(N);
  return lay.enc_lne ? lay.enc_lne->out(N) : lay.enc_emb.out(N);
}

Tensor EncoderDecoder::dec_input(int l, int64_t N) const {
  const Layers& lay = *layers_;
  if (l > 0) return lay.dec[l - 1].out(N);
  return lay.dec_lne ? lay.dec_lne->out(N) : lay.dec_emb.out(N);
}

Tensor EncoderDecoder::memory(int64_t N) const {
  const Layers& lay = *layers_;
  return lay.enc_lnf ? lay.enc_lnf->out(N) : lay.enc.back().out(N);
}

void EncoderDecoder::check_batch(const Seq2SeqBatch& b) const {
  TS_CHECK(b.B > 0, "batch: needs at least one pair, got B = ", b.B);
  TS_CHECK(b.src && b.src_lens && b.tgt_in && b.tgt_lens, "batch: sources, targets and their lengths are required");
  TS_CHECK(b.Ts > 0 && b.Ts <= cfg_.max_seq, "batch: source length ", b.Ts, " is outside [1, max_seq ", cfg_.max_seq,
           "]");
  TS_CHECK(b.Tt > 0 && b.Tt <= cfg_.max_seq, "batch: target length ", b.Tt, " is outside [1, max_seq ", cfg_.max_seq,
           "]");
  for (int i = 0; i < b.B; ++i) {
    TS_CHECK(b.src_lens[i] >= 1 && b.src_lens[i] <= b.Ts, "batch: pair ", i, " has source length ", b.src_lens[i],
             ", outside [1, ", b.Ts, "]");
    TS_CHECK(b.tgt_lens[i] >= 1 && b.tgt_lens[i] <= b.Tt, "batch: pair ", i, " has target length ", b.tgt_lens[i],
             ", outside [1, ", b.Tt, "]");
  }
  layers_->enc_emb.check_tokens(b.src, b.B, b.Ts);
  layers_->dec_emb.check_tokens(b.tgt_in, b.B, b.Tt);
  if (b.tgt_out)
    for (int64_t i = 0; i < int64_t{b.B} * b.Tt; ++i)
      TS_CHECK(b.tgt_out[i] >= 0 && b.tgt_out[i] < cfg_.vocab, "batch: target id ", b.tgt_out[i], " at ", i,
               " is outside [0, ", cfg_.vocab, ")");
}

double EncoderDecoder::forward(const Seq2SeqBatch& b, const ForwardOptions& opt) {
  check_batch(b);
  reserve(b.B, b.Ts, b.Tt);
  B_ = b.B;
  Ts_ = b.Ts;
  Tt_ = b.Tt;
  const int64_t Ns = int64_t{B_} * Ts_, Nt = int64_t{B_} * Tt_;
  const Acts& a = *acts_;
  const Device dev = ctx_->device(), host = Device::cpu();
  copy_bytes(a.src.data(), dev, b.src, host, Ns * sizeof(int32_t), *ctx_);
  copy_bytes(a.src_lens.data(), dev, b.src_lens, host, B_ * sizeof(int32_t), *ctx_);
  copy_bytes(a.tgt_in.data(), dev, b.tgt_in, host, Nt * sizeof(int32_t), *ctx_);
  has_targets_ = b.tgt_out != nullptr;
  if (has_targets_) {
    // Targets past a row's length are padding: pad_id, the ignore index of the loss.
    std::vector<int32_t> out(b.tgt_out, b.tgt_out + Nt);
    for (int i = 0; i < B_; ++i)
      for (int t = b.tgt_lens[i]; t < Tt_; ++t) out[size_t(i) * Tt_ + t] = cfg_.pad_id;
    copy_bytes(a.tgt_out.data(), dev, out.data(), host, Nt * sizeof(int32_t), *ctx_);
  }
  const bool dropout_on = opt.training && cfg_.dropout > 0, attn_on = opt.training && cfg_.attn_dropout > 0;
  const bool act_on = opt.training && cfg_.act_dropout > 0;
  TS_CHECK(!(dropout_on || attn_on || act_on) || opt.rng, "forward: training with dropout needs an RNG state");
  dropout_p_ = dropout_on ? cfg_.dropout : 0.0f;
  attn_dropout_p_ = attn_on ? cfg_.attn_dropout : 0.0f;
  act_dropout_p_ = act_on ? cfg_.act_dropout : 0.0f;
  seed_ = dropout_on || attn_on || act_on ? opt.rng->seed : 0;
  Layers& lay = *layers_;
  lay.enc_emb.draw_streams(opt.rng, dropout_on);
  for (Block& blk : lay.enc) blk.draw_streams(opt.rng, dropout_on, attn_on, act_on);
  lay.dec_emb.draw_streams(opt.rng, dropout_on);
  for (Block& blk : lay.dec) blk.draw_streams(opt.rng, dropout_on, attn_on, act_on);
  clock_.last = -1;
  run_encoder(env(Ts_));
  const StepEnv ed = env(Tt_);
  run_decoder(ed);
  fused_scale_.reset();
  if (!has_targets_) return 0.0;
  label_smoothing_ = opt.label_smoothing;
  fused_scale_ = opt.loss_grad_scale;
  lay.head.loss_forward(ed, a.tgt_out, opt.label_smoothing, opt.loss_grad_scale, a.loss, a.count);
  return read_loss();
}

void EncoderDecoder::run_encoder(const StepEnv& ee) {
  Layers& lay = *layers_;
  const Acts& a = *acts_;
  const int64_t N = ee.N();
  lay.enc_emb.forward(ee, a.src);
  if (lay.enc_lne) {
    ee.at(lay.enc_lne_fwd);
    lay.enc_lne->forward(ee, lay.enc_emb.out(N));
  }
  const Tensor tmp = rows(a.enc_tmp, N, cfg_.d_model), src_lens = a.src_lens.slice1d(0, B_);
  for (int l = 0; l < cfg_.enc_layers; ++l) {
    lay.enc[l].set_key_lens(src_lens);
    lay.enc[l].forward(ee, enc_input(l, N), tmp);
  }
  // A pre-norm encoder's final norm is computed by its last block's residual op; the event stays, empty.
  if (lay.enc_lnf) ee.at(lay.enc_lnf_fwd);
  lay.cross_kv.forward(ee, memory(N));
}

void EncoderDecoder::run_decoder(const StepEnv& ed) {
  Layers& lay = *layers_;
  const Acts& a = *acts_;
  const int64_t N = ed.N(), Nk = int64_t{B_} * Ts_;
  lay.dec_emb.forward(ed, a.tgt_in);
  if (lay.dec_lne) {
    ed.at(lay.dec_lne_fwd);
    lay.dec_lne->forward(ed, lay.dec_emb.out(N));
  }
  const Tensor tmp = rows(a.dec_tmp, N, cfg_.d_model), src_lens = a.src_lens.slice1d(0, B_);
  for (int l = 0; l < cfg_.dec_layers; ++l) {
    CrossAttention& x = *lay.dec[l].cross_attention();
    x.set_memory_length(Ts_);
    x.set_memory(Tensor(), Tensor(), src_lens);
    x.set_batched_kv(lay.cross_kv.k(l, Nk), lay.cross_kv.v(l, Nk), lay.cross_kv.d_k(l, Nk), lay.cross_kv.d_v(l, Nk));
    lay.dec[l].forward(ed, dec_input(l, N), tmp);
  }
  lay.head.forward(ed, lay.dec.back().out(N));
}

void EncoderDecoder::backward(double loss_scale) {
  TS_CHECK(has_targets_, "backward: needs a forward with targets first");
  has_targets_ = false;  // the logits are consumed below
  const bool fused = fused_scale_.has_value();
  TS_CHECK(!fused || *fused_scale_ == loss_scale, "backward: loss scale ", loss_scale,
           " differs from the forward's loss_grad_scale ", fused ? *fused_scale_ : 0.0);
  fused_scale_.reset();
  backward_decoder(env(Tt_), fused, loss_scale);
  backward_encoder(env(Ts_));
}

void EncoderDecoder::backward_decoder(const StepEnv& ed, bool fused, double loss_scale) {
  Layers& lay = *layers_;
  const Acts& a = *acts_;
  const int64_t N = ed.N(), C = cfg_.d_model;
  const Tensor d_dec = rows(a.d_dec, N, C);
  lay.head.backward(ed, d_dec, lay.dec.back().out(N), a.tgt_out, label_smoothing_, loss_scale, fused, a.count);
  // Each block's cross-attention writes its dK and dV into the batched projection's shared gradient.
  for (int l = cfg_.dec_layers - 1; l >= 0; --l) lay.dec[l].backward(ed, d_dec, dec_input(l, N));
  Tensor d_emb = d_dec;
  if (lay.dec_lne) {
    ed.at(lay.dec_lne_bwd);
    d_emb = rows(a.d_dec_emb, N, C);
    fill_bytes(d_emb, 0, *ed.ctx);
    lay.dec_lne->backward(ed, d_emb, d_dec, lay.dec_emb.out(N));
  }
  lay.dec_emb.backward(ed, d_emb, a.tgt_in);
}

void EncoderDecoder::backward_encoder(const StepEnv& ee) {
  Layers& lay = *layers_;
  const Acts& a = *acts_;
  const int64_t N = ee.N(), C = cfg_.d_model;
  const Tensor d_enc = rows(a.d_enc, N, C);
  // The memory's gradient from every decoder layer at once: one GEMM over the batched d_kv.
  lay.cross_kv.backward(ee, lay.enc_lnf ? rows(a.d_memory, N, C) : d_enc, memory(N));
  if (lay.enc_lnf) {
    // The final norm's backward runs the last block's output residual backward along (its fused forward).
    ee.at(lay.enc_lnf_bwd);
    fill_bytes(d_enc, 0, *ee.ctx);
    const NormResidualBackward res = lay.enc.back().output_residual_backward(ee);
    lay.enc_lnf->backward(ee, d_enc, rows(a.d_memory, N, C), lay.enc.back().out(N), &res);
  }
  for (int l = cfg_.enc_layers - 1; l >= 0; --l) lay.enc[l].backward(ee, d_enc, enc_input(l, N));
  Tensor d_emb = d_enc;
  if (lay.enc_lne) {
    ee.at(lay.enc_lne_bwd);
    d_emb = rows(a.d_enc_emb, N, C);
    fill_bytes(d_emb, 0, *ee.ctx);
    lay.enc_lne->backward(ee, d_emb, d_enc, lay.enc_emb.out(N));
  }
  lay.enc_emb.backward(ee, d_emb, a.src);
}

double EncoderDecoder::read_loss() const {
  // loss holds {Σ, mean} in the stat dtype.
  if (dtype_ == DType::F64) {
    double v[2] = {0, 0};
    copy_bytes(v, Device::cpu(), acts_->loss.data(), acts_->loss.device(), sizeof v, *ctx_);
    return v[1];
  }
  float v[2] = {0, 0};
  copy_bytes(v, Device::cpu(), acts_->loss.data(), acts_->loss.device(), sizeof v, *ctx_);
  return v[1];
}

int64_t EncoderDecoder::logits_stride() const {
  return dtype_ == DType::BF16 || dtype_ == DType::F16 ? (int64_t{cfg_.vocab} + 63) / 64 * 64 : cfg_.vocab;
}

Tensor EncoderDecoder::cross_k(int l) const { return layers_->cross_kv.k(l, int64_t{B_} * Ts_); }
Tensor EncoderDecoder::cross_v(int l) const { return layers_->cross_kv.v(l, int64_t{B_} * Ts_); }
Tensor EncoderDecoder::source_lens() const { return acts_->src_lens.slice1d(0, B_); }

Tensor EncoderDecoder::logits() const { return layers_->head.logits(int64_t{B_} * Tt_); }

std::vector<float> EncoderDecoder::read_logits_row(int row) const {
  TS_CHECK(row >= 0 && row < B_ * Tt_, "internal: logits row ", row, " of ", B_ * Tt_);
  const size_t es = dtype_size(dtype_);
  std::vector<unsigned char> raw(static_cast<size_t>(cfg_.vocab) * es);
  const char* at = static_cast<const char*>(logits().data()) + row * logits_stride() * es;
  copy_bytes(raw.data(), Device::cpu(), at, ctx_->device(), raw.size(), *ctx_);
  std::vector<float> out(static_cast<size_t>(cfg_.vocab));
  convert_to_f32(raw.data(), dtype_, out.size(), out.data());
  return out;
}

}  // namespace tessera

namespace tessera {

// Every activation buffer of a step with its life (the layers declare their own), over one MemoryPlan: the
// encoder's through a builder of B x Ts tokens, the decoder's through one of B x Tt.
void EncoderDecoder::reserve(int B, int Ts, int Tt) {
  if (B <= planned_B_ && Ts <= planned_Ts_ && Tt <= planned_Tt_) return;
  B = std::max(B, planned_B_);
  Ts = std::max(Ts, planned_Ts_);
  Tt = std::max(Tt, planned_Tt_);
  arena_ = Arena();  // free the old plan before allocating the new one
  Layers& lay = *layers_;
  acts_ = std::make_unique<Acts>();
  Acts& a = *acts_;
  const PlanDebug debug = plan_debug_from_env();
  MemoryPlan mp(Arena::kAlign);
  PlanBuilder pe(mp, debug, B, Ts), pd(mp, debug, B, Tt);
  const DType dt = dtype_, st = stat_dtype(dtype_);
  const int64_t C = cfg_.d_model;
  const int end = lay.sched.end(), Le = cfg_.enc_layers, Ld = cfg_.dec_layers;
  // The inputs and the loss outlive the step.
  pe.add(a.src, "src", DType::I32, {pe.N()}, 0, end);
  pe.add(a.src_lens, "src_lens", DType::I32, {B}, 0, end);
  pd.add(a.tgt_in, "tgt_in", DType::I32, {pd.N()}, 0, end);
  pd.add(a.tgt_out, "tgt_out", DType::I32, {pd.N()}, 0, end);
  pd.add(a.loss, "loss", st, {2}, 0, end);
  pd.add(a.count, "count", DType::I32, {1}, 0, end);

  // The encoder: embedding, [layernorm_embedding], blocks, [final norm]; its output is read by the batched K/V
  // projection's forward and (for d_W) its backward.
  const int enc0_last = lay.enc[0].input_last_use(), memory_death = lay.cross_kv.backward_event();
  lay.enc_emb.declare(pe, dt, lay.enc_lne ? lay.enc_lne_bwd : enc0_last);
  if (lay.enc_lne) lay.enc_lne->declare(pe, dt, lay.enc_lne_fwd, enc0_last, lay.enc_lne_bwd);
  pe.add(a.enc_tmp, "enc.tmp", dt, {pe.N(), C}, lay.enc[0].sublayer_output_event(), lay.enc.back().output_event());
  for (int l = 0; l < Le; ++l) {
    const int death = l + 1 < Le ? lay.enc[l + 1].input_last_use() : lay.enc_lnf ? lay.enc_lnf_bwd : memory_death;
    lay.enc[l].declare(pe, dt, "enc.res." + std::to_string(l + 1), death);
  }
  if (lay.enc_lnf) lay.enc_lnf->declare(pe, dt, lay.enc.back().output_event(), memory_death, lay.enc_lnf_bwd);
  for (Block& blk : lay.dec) blk.cross_attention()->set_memory_length(Ts);
  lay.cross_kv.declare(pe, dt, lay.dec[0].cross_attention()->attention_backward_event(),
                       lay.dec.back().cross_attention()->attention_backward_event());

  // The decoder: embedding, [layernorm_embedding], blocks, head.
  const int dec0_last = lay.dec[0].input_last_use();
  lay.dec_emb.declare(pd, dt, lay.dec_lne ? lay.dec_lne_bwd : dec0_last);
  if (lay.dec_lne) lay.dec_lne->declare(pd, dt, lay.dec_lne_fwd, dec0_last, lay.dec_lne_bwd);
  pd.add(a.dec_tmp, "dec.tmp", dt, {pd.N(), C}, lay.dec[0].sublayer_output_event(), lay.dec.back().output_event());
  for (int l = 0; l < Ld; ++l)
    lay.dec[l].declare(pd, dt, "dec.res." + std::to_string(l + 1),
                       l + 1 < Ld ? lay.dec[l + 1].input_last_use() : lay.head.input_last_use());
  lay.head.declare(pd, dt);

  // The streams' gradients.
  const int dec_emb_bwd = lay.dec_emb.backward_event(), enc_emb_bwd = lay.enc_emb.backward_event();
  pd.add(a.d_dec, "dec.d_res", dt, {pd.N(), C}, lay.head.d_input_event(), lay.dec_lne ? lay.dec_lne_bwd : dec_emb_bwd);
  if (lay.dec_lne) pd.add(a.d_dec_emb, "dec.d_emb", dt, {pd.N(), C}, lay.dec_lne_bwd, dec_emb_bwd);
  const int kv_bwd = lay.cross_kv.backward_event();
  if (lay.enc_lnf) pe.add(a.d_memory, "enc.d_memory", dt, {pe.N(), C}, kv_bwd, lay.enc_lnf_bwd);
  pe.add(a.d_enc, "enc.d_res", dt, {pe.N(), C}, lay.enc_lnf ? lay.enc_lnf_bwd : kv_bwd,
         lay.enc_lne ? lay.enc_lne_bwd : enc_emb_bwd);
  if (lay.enc_lne) pe.add(a.d_enc_emb, "enc.d_emb", dt, {pe.N(), C}, lay.enc_lne_bwd, enc_emb_bwd);
  pd.check_planted();

  mp.assign(/*reuse=*/!debug.no_reuse);
  arena_ = Arena(mp.peak(), ctx_->device());
  pe.bind(arena_);
  pd.bind(arena_);
  planned_B_ = B;
  planned_Ts_ = Ts;
  planned_Tt_ = Tt;
  ++plan_count_;
}

}  // namespace tessera
