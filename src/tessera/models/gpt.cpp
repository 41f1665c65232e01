#include "tessera/models/gpt.h"

#include <cmath>
#include <cstring>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/ops/activation/activation.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/embedding/embedding.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/loss/cross_entropy.h"
#include "tessera/ops/norm/norm.h"
#include "tessera/ops/residual/residual.h"

namespace tessera {

Gpt::Gpt(const ModelConfig& cfg, Context& ctx, DType dtype, MasterWeights master)
    : cfg_(cfg), ctx_(&ctx), dtype_(dtype), params_(ctx.device(), dtype, master) {
  build();
}

Gpt::Gpt(const ModelConfig& cfg, DType dtype)
    : cfg_(cfg), owned_ctx_(std::make_unique<Context>(Device::cpu())), ctx_(owned_ctx_.get()), dtype_(dtype),
      params_(Device::cpu(), dtype) {
  build();
}

Gpt::~Gpt() = default;

Gpt::ParamLayout Gpt::add_params(const ModelConfig& cfg, ParamBuffer& pb) {
  const int64_t C = cfg.d_model, V = cfg.vocab, F = cfg.d_ff, Fin = cfg.d_ff_in();
  const bool ln_bias = cfg.norm == NormKind::LayerNorm && cfg.bias;
  ParamLayout lay;
  lay.wte = pb.add("wte", {V, C}, true);
  if (cfg.positions == PositionKind::Learned) lay.wpe = pb.add("wpe", {cfg.max_seq, C}, true);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    LayerOffsets o{};
    o.ln1_w = pb.add(p + "ln1.w", {C}, false);
    o.ln1_b = ln_bias ? pb.add(p + "ln1.b", {C}, false) : kNoParam;
    o.qkv_w = pb.add(p + "qkv.w", {3 * C, C}, true);
    o.qkv_b = cfg.bias ? pb.add(p + "qkv.b", {3 * C}, false) : kNoParam;
    o.proj_w = pb.add(p + "proj.w", {C, C}, true);
    o.proj_b = cfg.bias ? pb.add(p + "proj.b", {C}, false) : kNoParam;
    o.ln2_w = pb.add(p + "ln2.w", {C}, false);
    o.ln2_b = ln_bias ? pb.add(p + "ln2.b", {C}, false) : kNoParam;
    o.fc_w = pb.add(p + "fc.w", {Fin, C}, true);
    o.fc_b = cfg.bias ? pb.add(p + "fc.b", {Fin}, false) : kNoParam;
    o.fcp_w = pb.add(p + "fcp.w", {C, F}, true);
    o.fcp_b = cfg.bias ? pb.add(p + "fcp.b", {C}, false) : kNoParam;
    lay.layers.push_back(o);
  }
  lay.lnf_w = pb.add("lnf.w", {C}, false);
  lay.lnf_b = ln_bias ? pb.add("lnf.b", {C}, false) : kNoParam;
  if (!cfg.tied) lay.lm_head = pb.add("lm_head", {V, C}, true);
  return lay;
}

size_t Gpt::flat_params(const ModelConfig& cfg) {
  ParamBuffer pb;  // segments only: nothing is allocated before finalize()
  add_params(cfg, pb);
  return pb.size();
}

void Gpt::build() {
  cfg_.validate();
  TS_CHECK(dtype_is_float(dtype_), "model dtype must be a float type, got ", dtype_name(dtype_));
  const int64_t C = cfg_.d_model;
  ParamLayout lay = add_params(cfg_, params_);
  wte_ = lay.wte;
  wpe_ = lay.wpe;
  lnf_w_ = lay.lnf_w;
  lnf_b_ = lay.lnf_b;
  lm_head_ = lay.lm_head;
  layers_ = std::move(lay.layers);
  params_.finalize(*ctx_);
  TS_CHECK(static_cast<int64_t>(params_.num_params()) == cfg_.num_params(), "internal: parameter count mismatch");

  if (cfg_.positions == PositionKind::Sinusoidal) {
    // PE[pos, 2i] = sin(pos / 10000^(2i/C)), PE[pos, 2i+1] = cos(pos / 10000^(2i/C)), made on the host in f64.
    std::vector<double> table(static_cast<size_t>(cfg_.max_seq) * C, 0.0);
    for (int pos = 0; pos < cfg_.max_seq; ++pos) {
      for (int64_t i = 0; i < C / 2; ++i) {
        const double a = pos / std::pow(10000.0, 2.0 * i / C);
        table[pos * C + 2 * i] = std::sin(a);
        table[pos * C + 2 * i + 1] = std::cos(a);
      }
    }
    // An f64 model keeps the table in f64 (its gradient checks need it); the others round it from f32.
    std::vector<unsigned char> raw(table.size() * dtype_size(dtype_));
    if (dtype_ == DType::F64) {
      std::memcpy(raw.data(), table.data(), raw.size());
    } else {
      const std::vector<float> f32(table.begin(), table.end());
      convert_from_f32(f32.data(), f32.size(), dtype_, raw.data());
    }
    sinusoid_ = Buffer(raw.size(), ctx_->device(), "the sinusoid table");
    copy_bytes(sinusoid_.data(), ctx_->device(), raw.data(), Device::cpu(), raw.size(), *ctx_);
    ctx_->synchronize();
  }
}

void Gpt::init_weights(uint64_t seed) {
  const double resid_std = 0.02 / std::sqrt(2.0 * cfg_.n_layers);
  const auto& segs = params_.segments();
  std::vector<float> w(params_.size(), 0.0f);
  for (size_t s = 0; s < segs.size(); ++s) {
    const ParamSegment& seg = segs[s];
    const bool is_gain = seg.name.ends_with("ln1.w") || seg.name.ends_with("ln2.w") || seg.name == "lnf.w";
    const bool is_bias = seg.name.ends_with(".b");
    const bool is_resid = seg.name.ends_with("proj.w") || seg.name.ends_with("fcp.w");
    // Each value is a pure function of (seed, segment, index), so the cores split the elements and the bits do not
    // depend on the thread count. On one core the 2.7B model took minutes before its first step.
    const int64_t n = static_cast<int64_t>(seg.numel);
    float* dst = w.data() + seg.offset;
    const double sd = is_resid ? resid_std : 0.02;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i)
      dst[i] = is_gain   ? 1.0f
               : is_bias ? 0.0f
                         : static_cast<float>(sd * philox_normal(seed, s, static_cast<uint64_t>(i)));
  }
  params_.write_f32(w, *ctx_);
}

void Gpt::mm(GemmParams gp, const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias) {
  // An f32 model computes its GEMMs in exact f32 (not TF32), so that a GPU run follows the CPU reference.
  gp.allow_tf32 = false;
  gemm(gp, c, a, b, bias, *ctx_);
}

Tensor Gpt::rows(const Tensor& t, int64_t n, int64_t cols) const {
  return Tensor::from_shape(t.data(), t.dtype(), std::initializer_list<int64_t>{n, cols}, t.device());
}

Tensor Gpt::tokens_buffer(int B, int T) {
  reserve(B, T);
  return acts_.tokens.slice1d(0, static_cast<int64_t>(B) * T);
}

Tensor Gpt::targets_buffer(int B, int T) {
  reserve(B, T);
  return acts_.targets.slice1d(0, static_cast<int64_t>(B) * T);
}

void Gpt::norm_forward(int N, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, size_t w,
                       size_t b) {
  const NormParams np{.N = N, .C = cfg_.d_model, .eps = cfg_.norm_eps};
  const int64_t C = cfg_.d_model;
  if (cfg_.norm == NormKind::LayerNorm)
    layernorm_forward(np, out, mean.slice1d(0, N), rstd.slice1d(0, N), x, p(w, C), p(b, C), *ctx_);
  else
    rmsnorm_forward(np, out, rstd.slice1d(0, N), x, p(w, C), *ctx_);
}

void Gpt::norm_backward(int N, const Tensor& d_x, const Tensor& d_out, const Tensor& x, size_t w, size_t b,
                        const Tensor& mean, const Tensor& rstd, const NormResidualBackward* res) {
  const NormParams np{.N = N, .C = cfg_.d_model, .eps = cfg_.norm_eps};
  const int64_t C = cfg_.d_model;
  const bool layernorm = cfg_.norm == NormKind::LayerNorm;
  if (res)
    norm_residual_backward(np, layernorm, d_x, g(w, C), layernorm ? g(b, C) : Tensor(), d_out, x, p(w, C),
                           layernorm ? mean.slice1d(0, N) : Tensor(), rstd.slice1d(0, N), *res, *ctx_);
  else if (layernorm)
    layernorm_backward(np, d_x, g(w, C), g(b, C), d_out, x, p(w, C), mean.slice1d(0, N), rstd.slice1d(0, N), *ctx_);
  else
    rmsnorm_backward(np, d_x, g(w, C), d_out, x, p(w, C), rstd.slice1d(0, N), *ctx_);
}

double Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt) {
  forward_async(tokens, targets, B, T, opt);
  return targets ? read_loss() : 0.0;
}

void Gpt::check_tokens(const int32_t* tokens, int B, int T) const {
  // Bad token ids are caught here on the host, before they reach a kernel as out-of-range rows.
  embedding_check({.B = B, .T = T, .C = cfg_.d_model, .V = cfg_.vocab, .max_seq = cfg_.max_seq,
                   .padding_id = cfg_.padding_id},
                  tokens, cfg_.positions == PositionKind::Learned);
}

void Gpt::forward_async(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt) {
  reserve(B, T);
  const int64_t N = static_cast<int64_t>(B) * T;
  check_tokens(tokens, B, T);
  copy_bytes(acts_.tokens.data(), ctx_->device(), tokens, Device::cpu(), N * sizeof(int32_t), *ctx_);
  if (targets) copy_bytes(acts_.targets.data(), ctx_->device(), targets, Device::cpu(), N * sizeof(int32_t), *ctx_);
  forward_device(B, T, targets != nullptr, opt);
}

AttentionParams Gpt::attention_params(int l, int B, int T) const {
  // RoPE rides with the attention op: q and k rotated on the way in, dQ and dK rotated back as they are stored.
  return {.B = B, .T = T, .H = cfg_.n_heads, .Dh = cfg_.head_dim(), .causal = true, .dropout = attn_dropout_p_,
          .seed = dropout_seed_, .stream = acts_.layers[l].stream_probs,
          .rope_theta = cfg_.positions == PositionKind::Rope ? cfg_.rope_theta : 0.0f};
}

void Gpt::forward_device(int B, int T, bool with_targets, const ForwardOptions& opt) {
  reserve(B, T);
  B_ = B;
  T_ = T;
  const int N = B * T, C = cfg_.d_model, V = cfg_.vocab;
  has_targets_ = with_targets;
  fused_loss_grad_scale_.reset();
  begin_step();
  const RangesCloser close_ranges{*this};

  const bool dropout_on = opt.training && cfg_.dropout > 0;
  const bool attn_dropout_on = opt.training && cfg_.attn_dropout > 0;
  TS_CHECK(!(dropout_on || attn_dropout_on) || opt.rng, "forward: training with dropout needs an RNG state");
  acts_.stream_emb = dropout_on ? opt.rng->take() : 0;
  dropout_seed_ = dropout_on || attn_dropout_on ? opt.rng->seed : 0;
  dropout_p_ = dropout_on ? cfg_.dropout : 0.0f;
  attn_dropout_p_ = attn_dropout_on ? cfg_.attn_dropout : 0.0f;
  const EmbeddingParams ep{.B = B, .T = T, .C = C, .V = V, .max_seq = cfg_.max_seq, .scale = cfg_.emb_scale,
                           .padding_id = cfg_.padding_id, .dropout = dropout_p_, .seed = dropout_seed_,
                           .stream = acts_.stream_emb};
  const Tensor pos_table = cfg_.positions == PositionKind::Learned ? p(wpe_, static_cast<int64_t>(cfg_.max_seq) * C)
                           : cfg_.positions == PositionKind::Sinusoidal
                               ? sinusoid_.view(dtype_, {static_cast<int64_t>(cfg_.max_seq) * C})
                               : Tensor();
  at(StepOp::Embedding);
  embedding_forward(ep, rows(acts_.res[0], N, C), acts_.tokens.slice1d(0, N), p(wte_, int64_t{V} * C), pos_table,
                    *ctx_);

  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (dropout_on) {
      acts_.layers[l].stream_attn = opt.rng->take();
      acts_.layers[l].stream_mlp = opt.rng->take();
    }
    if (attn_dropout_on) acts_.layers[l].stream_probs = opt.rng->take();
    layer_forward(l, B, T);
  }

  // ln_f: made by the last layer's mlp residual op (norm_residual_forward); the event stays, empty.
  at(StepOp::LnF);
  const size_t lm = cfg_.tied ? wte_ : lm_head_;
  at(StepOp::Logits);
  const int64_t ld = logits_stride(), V0 = lm_head_split(), Vt = V - V0;
  const Tensor logits = rows(acts_.logits, N, ld), lnf = rows(acts_.lnf, N, C);
  mm({.M = N, .N = static_cast<int>(V0), .K = C, .trans_b = true, .ldc = ld}, logits, lnf, p(lm, V0 * C), Tensor());
  if (Vt > 0)
    mm({.M = N, .N = static_cast<int>(Vt), .K = C, .trans_b = true, .ldc = ld}, columns_from(logits, V0), lnf,
       p(lm + V0 * C, Vt * C), Tensor());

  if (!with_targets) return;
  label_smoothing_ = opt.label_smoothing;
  const CrossEntropyParams cp{
      .N = N, .V = V, .label_smoothing = opt.label_smoothing, .ignore_index = cfg_.padding_id, .ld = ld};
  at(StepOp::Loss);
  fused_loss_grad_scale_ = opt.loss_grad_scale;
  if (opt.loss_grad_scale)
    cross_entropy_forward_backward(cp, acts_.losses.slice1d(0, N), acts_.ce_lse.slice1d(0, N),
                                   rows(acts_.logits, N, ld), acts_.targets.slice1d(0, N), *opt.loss_grad_scale,
                                   acts_.count, *ctx_);
  else
    cross_entropy_forward(cp, acts_.losses.slice1d(0, N), acts_.ce_lse.slice1d(0, N), rows(acts_.logits, N, ld),
                          acts_.targets.slice1d(0, N), *ctx_);
  // loss = Σ losses / count of non-ignored targets, reduced on the device (no host loop, no sync).
  cross_entropy_loss_sum(cp, acts_.loss, acts_.count, acts_.losses.slice1d(0, N), acts_.targets.slice1d(0, N),
                         *ctx_);
}

double Gpt::read_loss() const {
  if (dtype_ == DType::F64) {
    double v = 0;
    copy_bytes(&v, Device::cpu(), loss_.data(), loss_.device(), sizeof v, *ctx_);
    return v;
  }
  float v = 0;
  copy_bytes(&v, Device::cpu(), loss_.data(), loss_.device(), sizeof v, *ctx_);
  return v;
}

int64_t Gpt::logits_stride(const ModelConfig& cfg, DType dtype) {
  const int64_t V = cfg.vocab;
  return dtype == DType::BF16 || dtype == DType::F16 ? (V + 63) / 64 * 64 : V;
}

int64_t Gpt::lm_head_split() const {
  const int64_t V = cfg_.vocab;
  return logits_stride() == V ? V : V / 64 * 64;
}

Tensor Gpt::columns_from(const Tensor& t, int64_t col) const {
  return Tensor::from_shape(static_cast<char*>(t.data()) + col * static_cast<int64_t>(dtype_size(t.dtype())),
                            t.dtype(), std::initializer_list<int64_t>{t.numel() - col}, t.device());
}

Tensor Gpt::logits() const {
  const int64_t N = static_cast<int64_t>(B_) * T_;
  return rows(acts_.logits, N, logits_stride());
}

std::vector<float> Gpt::read_logits_row(int row) const {
  TS_CHECK(row >= 0 && row < B_ * T_, "internal: logits row ", row, " of ", B_ * T_);
  const int64_t V = cfg_.vocab;
  const size_t es = dtype_size(dtype_);
  std::vector<unsigned char> raw(static_cast<size_t>(V) * es);
  const char* at = static_cast<const char*>(acts_.logits.data()) + row * logits_stride() * es;
  copy_bytes(raw.data(), Device::cpu(), at, ctx_->device(), raw.size(), *ctx_);
  std::vector<float> out(static_cast<size_t>(V));
  convert_to_f32(raw.data(), dtype_, out.size(), out.data());
  return out;
}

void Gpt::layer_forward(int l, int B, int T) {
  const int N = B * T, C = cfg_.d_model, F = cfg_.d_ff, Fin = cfg_.d_ff_in(), H = cfg_.n_heads;
  const LayerOffsets& o = layers_[l];
  LayerActs& A = acts_.layers[l];
  const Tensor x = rows(acts_.res[l], N, C), ln1 = rows(A.ln1, N, C), qkv = rows(A.qkv, N, 3 * C);
  const Tensor att = rows(A.att, N, C), mid = rows(A.mid, N, C), ln2 = rows(A.ln2, N, C), tmp = rows(acts_.tmp, N, C);
  const Tensor fc_pre = rows(A.fc_pre, N, Fin), fc_act = rows(A.fc_act, N, F);
  const int64_t CC = int64_t{C} * C;

  // ln1 of layers 1 and up is made by the layer below's mlp residual op (norm_residual_forward); the event stays,
  // empty. Layer 0's input is the embedding's.
  at(StepOp::Ln1, l);
  if (l == 0) norm_forward(N, ln1, A.ln1_mean, A.ln1_rstd, x, o.ln1_w, o.ln1_b);
  at(StepOp::Qkv, l);
  mm({.M = N, .N = 3 * C, .K = C, .trans_b = true}, qkv, ln1, p(o.qkv_w, 3 * CC), p(o.qkv_b, 3 * C));
  at(StepOp::Attn, l);
  attention_forward(attention_params(l, B, T), att, A.lse.slice1d(0, int64_t{N} * H), qkv, *ctx_);
  at(StepOp::Proj, l);
  mm({.M = N, .N = C, .K = C, .trans_b = true}, tmp, att, p(o.proj_w, CC), Tensor());
  // mid = x + Drop(att Woᵀ + bo) and ln2 = norm(mid), in one kernel on the GPU (norm_residual_forward).
  at(StepOp::Res1, l);
  residual_norm_forward(N, A.stream_attn, mid, x, tmp, o.proj_b, ln2, A.ln2_mean, A.ln2_rstd, o.ln2_w, o.ln2_b);
  at(StepOp::Fc, l);
  if (fuses_gelu(cfg_, dtype_)) {
    // fc_pre = ln2 W1ᵀ + b1 and fc_act = gelu(fc_pre) from one GEMM (cuBLASLt's GELU epilogue).
    gemm_gelu_forward({.M = N, .N = F, .K = C, .trans_b = true}, fc_act, fc_pre, ln2, p(o.fc_w, int64_t{F} * C),
                      p(o.fc_b, F), *ctx_);
  } else {
    mm({.M = N, .N = Fin, .K = C, .trans_b = true}, fc_pre, ln2, p(o.fc_w, int64_t{Fin} * C), Tensor());
    at(StepOp::Act, l);
    activation_forward({.N = N, .d_ff = F, .kind = cfg_.mlp}, fc_act, fc_pre, p(o.fc_b, Fin), *ctx_);
  }
  at(StepOp::Fcp, l);
  mm({.M = N, .N = C, .K = F, .trans_b = true}, tmp, fc_act, p(o.fcp_w, int64_t{C} * F), Tensor());
  // x' = mid + Drop(fc_act W2ᵀ + b2), and the norm that reads it: the next layer's ln1, or ln_f.
  at(StepOp::Res2, l);
  const Tensor x_out = rows(acts_.res[l + 1], N, C);
  if (l + 1 == cfg_.n_layers) {
    residual_norm_forward(N, A.stream_mlp, x_out, mid, tmp, o.fcp_b, rows(acts_.lnf, N, C), acts_.lnf_mean,
                          acts_.lnf_rstd, lnf_w_, lnf_b_);
  } else {
    LayerActs& U = acts_.layers[l + 1];
    residual_norm_forward(N, A.stream_mlp, x_out, mid, tmp, o.fcp_b, rows(U.ln1, N, C), U.ln1_mean, U.ln1_rstd,
                          layers_[l + 1].ln1_w, layers_[l + 1].ln1_b);
  }
}

void Gpt::residual_norm_forward(int N, uint64_t stream, const Tensor& mid, const Tensor& residual, const Tensor& y,
                                size_t bias, const Tensor& out, const Tensor& mean, const Tensor& rstd, size_t w,
                                size_t b) {
  const int C = cfg_.d_model;
  const bool layernorm = cfg_.norm == NormKind::LayerNorm;
  norm_residual_forward({.N = N, .C = C, .eps = cfg_.norm_eps}, layernorm,
                        {.N = N, .C = C, .dropout = dropout_p_, .seed = dropout_seed_, .stream = stream}, mid, out,
                        layernorm ? mean.slice1d(0, N) : Tensor(), rstd.slice1d(0, N), residual, y, p(bias, C),
                        p(w, C), layernorm ? p(b, C) : Tensor(), *ctx_);
}

void Gpt::zero_grad() {
  if (grad_memory_ == GradMemory::Planned) zero_pending_ = true;
  else params_.zero_grad(*ctx_);
}

void Gpt::set_grad_memory(GradMemory where) {
  if (where == grad_memory_) return;
  grad_memory_ = where;
  zero_pending_ = false;
  planned_N_ = 0;  // the next reserve (or forward) plans again, with or without the gradients
  if (where == GradMemory::Own) {
    params_.own_grad(*ctx_);
  } else {
    params_.release_grad();
  }
}

void Gpt::backward(double loss_scale) {
  TS_CHECK(has_targets_, "backward: needs a forward with targets first");
  TS_CHECK(grad_memory_ == GradMemory::Own || zero_pending_,
           "backward: the gradients are planned in the activation arena, where the forward has overwritten them; "
           "call zero_grad() before each backward, or set_grad_memory(GradMemory::Own) to accumulate");
  has_targets_ = false;  // the logits are consumed below
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, V = cfg_.vocab;
  const int64_t ld = logits_stride();
  const CrossEntropyParams cp{
      .N = N, .V = V, .label_smoothing = label_smoothing_, .ignore_index = cfg_.padding_id, .ld = ld};
  const Tensor logits = rows(acts_.logits, N, ld), lnf = rows(acts_.lnf, N, C), d_ln = rows(acts_.d_lnf, N, C);
  const Tensor d_res = rows(acts_.d_res, N, C);
  // In place: each element of the gradient needs only its own logit and the row's lse. The scale is
  // loss_scale / count, with the count read on the device (an all-ignored batch gives zero gradients).
  at(StepOp::LossBwd);
  if (fused_loss_grad_scale_) {
    // The forward wrote d_logits already (ForwardOptions::loss_grad_scale).
    TS_CHECK(*fused_loss_grad_scale_ == loss_scale, "backward: loss scale ", loss_scale,
             " differs from the forward's loss_grad_scale ", *fused_loss_grad_scale_);
    fused_loss_grad_scale_.reset();
  } else {
    cross_entropy_backward(cp, logits, logits, acts_.ce_lse.slice1d(0, N), acts_.targets.slice1d(0, N), loss_scale,
                           acts_.count, *ctx_);
  }

  const size_t lm = cfg_.tied ? wte_ : lm_head_;
  at(StepOp::LmHeadW);
  // Split at V0 like the forward (lm_head_split): the whole V = 50257 as the output's row count ran at ~510 TFLOP/s
  // on the H200 where the forward's V0 part runs at ~735.
  const int64_t V0 = lm_head_split(), Vt = V - V0;
  mm({.M = static_cast<int>(V0), .N = C, .K = N, .trans_a = true, .beta = 1.0f, .lda = ld}, g(lm, V0 * C), logits,
     lnf, Tensor());
  if (Vt > 0)
    mm({.M = static_cast<int>(Vt), .N = C, .K = N, .trans_a = true, .beta = 1.0f, .lda = ld}, g(lm + V0 * C, Vt * C),
       columns_from(logits, V0), lnf, Tensor());
  at(StepOp::LmHeadX);
  mm({.M = N, .N = C, .K = static_cast<int>(V0), .lda = ld}, d_ln, logits, p(lm, V0 * C), Tensor());
  if (Vt > 0)
    mm({.M = N, .N = C, .K = static_cast<int>(Vt), .beta = 1.0f, .lda = ld}, d_ln, columns_from(logits, V0),
       p(lm + V0 * C, Vt * C), Tensor());
  at(StepOp::LnFBwd);
  fill_bytes(d_res, 0, *ctx_);
  // With the last layer's x' = mid + Drop(fc_act W2ᵀ + b2) backward along: its d_tmp and d b2.
  const NormResidualBackward res2 = mlp_residual_backward(cfg_.n_layers - 1, N);
  norm_backward(N, d_res, d_ln, rows(acts_.res[cfg_.n_layers], N, C), lnf_w_, lnf_b_, acts_.lnf_mean, acts_.lnf_rstd,
                &res2);
  // Layer l's parameters are added in one run, from its ln1.w up to the next layer's (or the final norm's).
  auto layer_begin = [&](int l) { return l < cfg_.n_layers ? layers_[l].ln1_w : lnf_w_; };
  if (grad_ready_) grad_ready_(lnf_w_, params_.size());

  for (int l = cfg_.n_layers - 1; l >= 0; --l) {
    layer_backward(l, B, T);
    if (grad_ready_) grad_ready_(layer_begin(l), layer_begin(l + 1));
  }

  const EmbeddingParams ep{.B = B, .T = T, .C = C, .V = V, .max_seq = cfg_.max_seq, .scale = cfg_.emb_scale,
                           .padding_id = cfg_.padding_id, .dropout = dropout_p_, .seed = dropout_seed_,
                           .stream = acts_.stream_emb};
  at(StepOp::EmbeddingBwd);
  embedding_backward(ep, g(wte_, int64_t{V} * C), g(wpe_, int64_t{cfg_.max_seq} * C), d_res, acts_.tokens.slice1d(0, N),
                     *ctx_);
  if (grad_ready_) grad_ready_(0, layer_begin(0));
  at(StepOp::End);
  zero_pending_ = false;
}

void Gpt::layer_backward(int l, int B, int T) {
  const int N = B * T, C = cfg_.d_model, F = cfg_.d_ff, Fin = cfg_.d_ff_in(), H = cfg_.n_heads;
  const LayerOffsets& o = layers_[l];
  LayerActs& A = acts_.layers[l];
  const int64_t CC = int64_t{C} * C;
  const Tensor d_res = rows(acts_.d_res, N, C);  // d of this layer's output; becomes d of its input
  const Tensor d_tmp = rows(A.d_tmp, N, C), d_ln = rows(A.d_ln, N, C), d_att = rows(A.d_att, N, C);
  const Tensor d_qkv = rows(A.d_qkv, N, 3 * C), d_fc_pre = rows(A.d_fc_pre, N, Fin);
  const Tensor fc_act = rows(A.fc_act, N, F), fc_pre = rows(A.fc_pre, N, Fin), ln2 = rows(A.ln2, N, C);
  const Tensor mid = rows(A.mid, N, C), att = rows(A.att, N, C), qkv = rows(A.qkv, N, 3 * C), ln1 = rows(A.ln1, N, C);

  // d_tmp (d of the fc proj's output) and d b2 are in place: the norm backward above this layer (the next layer's
  // ln1, or ln_f) ran this layer's x' = mid + Drop(fc_act W2ᵀ + b2) backward along (mlp_residual_backward).
  at(StepOp::FcpW, l);
  mm({.M = C, .N = F, .K = N, .trans_a = true, .beta = 1.0f}, g(o.fcp_w, int64_t{C} * F), d_tmp, fc_act, Tensor());
  at(StepOp::FcpX, l);
  if (fuses_gelu(cfg_, dtype_)) {
    // d_fc_pre = (d_tmp W2) ⊙ gelu'(fc_pre): the product into d_fc_pre, then the GELU gradient in place (fc_pre
    // holds the bias; b1's gradient summed on the way).
    mm({.M = N, .N = F, .K = C}, d_fc_pre, d_tmp, p(o.fcp_w, int64_t{C} * F), Tensor());
    at(StepOp::ActBwd, l);
    activation_backward({.N = N, .d_ff = F, .kind = cfg_.mlp}, d_fc_pre, g(o.fc_b, F), d_fc_pre, fc_pre, Tensor(),
                        *ctx_);
  } else {
    const Tensor d_fc_act = rows(A.d_fc_act, N, F);
    mm({.M = N, .N = F, .K = C}, d_fc_act, d_tmp, p(o.fcp_w, int64_t{C} * F), Tensor());
    at(StepOp::ActBwd, l);
    activation_backward({.N = N, .d_ff = F, .kind = cfg_.mlp}, d_fc_pre, g(o.fc_b, Fin), d_fc_act, fc_pre,
                        p(o.fc_b, Fin), *ctx_);
  }
  at(StepOp::FcW, l);
  mm({.M = Fin, .N = C, .K = N, .trans_a = true, .beta = 1.0f}, g(o.fc_w, int64_t{Fin} * C), d_fc_pre, ln2, Tensor());
  at(StepOp::FcX, l);
  mm({.M = N, .N = C, .K = Fin}, d_ln, d_fc_pre, p(o.fc_w, int64_t{Fin} * C), Tensor());
  // ln2 = norm(mid), mid = x + Drop(att Woᵀ + bo): d_res += the norm's backward, then d_tmp = Drop'(d_res) and
  // d bo, in one kernel on the GPU (norm_residual_backward).
  at(StepOp::Ln2Bwd, l);
  const NormResidualBackward res1{
      .p = {.N = N, .C = C, .dropout = dropout_p_, .seed = dropout_seed_, .stream = A.stream_attn},
      .d_y = d_tmp, .d_bias = g(o.proj_b, C)};
  norm_backward(N, d_res, d_ln, mid, o.ln2_w, o.ln2_b, A.ln2_mean, A.ln2_rstd, &res1);
  at(StepOp::ProjW, l);
  mm({.M = C, .N = C, .K = N, .trans_a = true, .beta = 1.0f}, g(o.proj_w, CC), d_tmp, att, Tensor());
  at(StepOp::ProjX, l);
  mm({.M = N, .N = C, .K = C}, d_att, d_tmp, p(o.proj_w, CC), Tensor());
  at(StepOp::AttnBwd, l);
  attention_backward(attention_params(l, B, T), d_qkv, d_att, qkv, att, A.lse.slice1d(0, int64_t{N} * H), *ctx_);
  at(StepOp::QkvW, l);
  mm({.M = 3 * C, .N = C, .K = N, .trans_a = true, .beta = 1.0f}, g(o.qkv_w, 3 * CC), d_qkv, ln1, Tensor());
  if (o.qkv_b != kNoParam) bias_grad({.M = N, .N = 3 * C}, g(o.qkv_b, 3 * C), d_qkv, *ctx_);
  at(StepOp::QkvX, l);
  mm({.M = N, .N = C, .K = 3 * C}, d_ln, d_qkv, p(o.qkv_w, 3 * CC), Tensor());
  // ln1's input is the layer below's output, x' = mid + Drop(fc_act W2ᵀ + b2): its backward comes along (layer 0's
  // input is the embedding's, whose dropout is the embedding backward's).
  at(StepOp::Ln1Bwd, l);
  const std::optional<NormResidualBackward> below =
      l > 0 ? std::optional(mlp_residual_backward(l - 1, N)) : std::nullopt;
  norm_backward(N, d_res, d_ln, rows(acts_.res[l], N, C), o.ln1_w, o.ln1_b, A.ln1_mean, A.ln1_rstd,
                below ? &*below : nullptr);
}

NormResidualBackward Gpt::mlp_residual_backward(int l, int N) {
  const int C = cfg_.d_model;
  const LayerActs& A = acts_.layers[l];
  return {.p = {.N = N, .C = C, .dropout = dropout_p_, .seed = dropout_seed_, .stream = A.stream_mlp},
          .d_y = rows(A.d_tmp, N, C), .d_bias = g(layers_[l].fcp_b, C)};
}

}  // namespace tessera
