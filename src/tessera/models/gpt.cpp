#include "tessera/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/ops/activation/activation.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/embedding/embedding.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/loss/cross_entropy.h"
#include "tessera/ops/norm/norm.h"
#include "tessera/ops/residual/residual.h"

namespace tessera {

template <typename Real>
GptT<Real>::GptT(const ModelConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  const int64_t C = cfg_.d_model, V = cfg_.vocab, F = cfg_.d_ff, Fin = cfg_.d_ff_in();
  const bool ln_bias = cfg_.norm == NormKind::LayerNorm && cfg_.bias;
  wte_ = params_.add("wte", {V, C}, true);
  if (cfg_.positions == PositionKind::Learned) wpe_ = params_.add("wpe", {cfg_.max_seq, C}, true);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    LayerOffsets o{};
    o.ln1_w = params_.add(p + "ln1.w", {C}, false);
    o.ln1_b = ln_bias ? params_.add(p + "ln1.b", {C}, false) : kNoParam;
    o.qkv_w = params_.add(p + "qkv.w", {3 * C, C}, true);
    o.qkv_b = cfg_.bias ? params_.add(p + "qkv.b", {3 * C}, false) : kNoParam;
    o.proj_w = params_.add(p + "proj.w", {C, C}, true);
    o.proj_b = cfg_.bias ? params_.add(p + "proj.b", {C}, false) : kNoParam;
    o.ln2_w = params_.add(p + "ln2.w", {C}, false);
    o.ln2_b = ln_bias ? params_.add(p + "ln2.b", {C}, false) : kNoParam;
    o.fc_w = params_.add(p + "fc.w", {Fin, C}, true);
    o.fc_b = cfg_.bias ? params_.add(p + "fc.b", {Fin}, false) : kNoParam;
    o.fcp_w = params_.add(p + "fcp.w", {C, F}, true);
    o.fcp_b = cfg_.bias ? params_.add(p + "fcp.b", {C}, false) : kNoParam;
    layers_.push_back(o);
  }
  lnf_w_ = params_.add("lnf.w", {C}, false);
  lnf_b_ = ln_bias ? params_.add("lnf.b", {C}, false) : kNoParam;
  if (!cfg_.tied) lm_head_ = params_.add("lm_head", {V, C}, true);
  params_.finalize();
  TS_CHECK(static_cast<int64_t>(params_.size()) == cfg_.num_params(), "internal: parameter count mismatch");

  if (cfg_.positions == PositionKind::Sinusoidal) {
    // PE[pos, 2i] = sin(pos / 10000^(2i/C)), PE[pos, 2i+1] = cos(pos / 10000^(2i/C))
    sinusoid_.resize(static_cast<size_t>(cfg_.max_seq) * C);
    for (int pos = 0; pos < cfg_.max_seq; ++pos) {
      for (int64_t i = 0; i < C / 2; ++i) {
        const double a = pos / std::pow(10000.0, 2.0 * i / C);
        sinusoid_[pos * C + 2 * i] = static_cast<Real>(std::sin(a));
        sinusoid_[pos * C + 2 * i + 1] = static_cast<Real>(std::cos(a));
      }
    }
  }
}

template <typename Real>
void GptT<Real>::init_weights(uint64_t seed) {
  const double resid_std = 0.02 / std::sqrt(2.0 * cfg_.n_layers);
  const auto& segs = params_.segments();
  for (size_t s = 0; s < segs.size(); ++s) {
    const ParamSegment& seg = segs[s];
    Real* w = params_.data() + seg.offset;
    const bool is_gain = seg.name.ends_with("ln1.w") || seg.name.ends_with("ln2.w") || seg.name == "lnf.w";
    const bool is_bias = seg.name.ends_with(".b");
    const bool is_resid = seg.name.ends_with("proj.w") || seg.name.ends_with("fcp.w");
    for (size_t i = 0; i < seg.numel; ++i) {
      if (is_gain) w[i] = Real(1);
      else if (is_bias) w[i] = Real(0);
      else w[i] = static_cast<Real>((is_resid ? resid_std : 0.02) * philox_normal(seed, s, i));
    }
  }
}

template <typename Real>
void GptT<Real>::plan(const ModelConfig& cfg, int B, int T, Arena& a, Acts& acts) {
  const size_t N = static_cast<size_t>(B) * T, C = cfg.d_model, V = cfg.vocab;
  const size_t F = cfg.d_ff, Fin = cfg.d_ff_in(), H = cfg.n_heads;
  auto buf = [&](size_t n) { return a.allocate_n<Real>(n); };
  acts.tokens = a.allocate_n<int32_t>(N);
  acts.targets = a.allocate_n<int32_t>(N);
  acts.res.assign(cfg.n_layers + 1, nullptr);
  acts.layers.assign(cfg.n_layers, LayerActs{});
  acts.res[0] = buf(N * C);
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerActs& L = acts.layers[l];
    L.ln1 = buf(N * C);
    L.ln1_mean = buf(N);
    L.ln1_rstd = buf(N);
    L.qkv = buf(N * 3 * C);
    L.att = buf(N * C);
    L.lse = buf(N * H);
    L.mid = buf(N * C);
    L.ln2 = buf(N * C);
    L.ln2_mean = buf(N);
    L.ln2_rstd = buf(N);
    L.fc_pre = buf(N * Fin);
    L.fc_act = buf(N * F);
    acts.res[l + 1] = buf(N * C);
  }
  acts.lnf = buf(N * C);
  acts.lnf_mean = buf(N);
  acts.lnf_rstd = buf(N);
  acts.logits = buf(N * V);  // the cross-entropy backward overwrites it with d_logits
  acts.losses = buf(N);
  acts.ce_lse = buf(N);
  acts.tmp = buf(N * C);
  // Gradient buffers, shared by all layers: each holds one layer's gradient at a time.
  acts.d_res = buf(N * C);
  acts.d_tmp = buf(N * C);
  acts.d_ln = buf(N * C);
  acts.d_att = buf(N * C);
  acts.d_qkv = buf(N * 3 * C);
  acts.d_fc_act = buf(N * F);
  acts.d_fc_pre = buf(N * Fin);
}

template <typename Real>
size_t GptT<Real>::activation_bytes(const ModelConfig& cfg, int B, int T) {
  Arena a = Arena::measuring();
  Acts acts;
  plan(cfg, B, T, a, acts);
  return a.peak();
}

template <typename Real>
void GptT<Real>::ensure_plan(int B, int T) {
  // Every buffer is sized by N = B*T (attention indexes lse as (B, H, T) inside a buffer of N*H), so a plan
  // for a larger N holds any smaller (B, T): generation, whose T grows by one each token, plans once.
  const int64_t N = static_cast<int64_t>(B) * T;
  if (N <= planned_N_) return;
  arena_ = Arena();  // free the old plan before the new one is allocated
  arena_ = Arena(activation_bytes(cfg_, B, T));
  plan(cfg_, B, T, arena_, acts_);
  planned_N_ = N;
  ++plan_count_;
}

template <typename Real>
void GptT<Real>::reserve(int B, int T) {
  TS_CHECK(B > 0 && T > 0, "reserve: batch and sequence must be positive, got B=", B, " T=", T);
  TS_CHECK(T <= cfg_.max_seq, "reserve: sequence length ", T, " exceeds max_seq ", cfg_.max_seq);
  ensure_plan(B, T);
}

template <typename Real>
void GptT<Real>::norm_forward(int N, Real* out, Real* mean, Real* rstd, const Real* x, size_t w, size_t b) {
  const NormParams p{.N = N, .C = cfg_.d_model, .eps = cfg_.norm_eps};
  if (cfg_.norm == NormKind::LayerNorm)
    layernorm_forward_ref(p, out, mean, rstd, x, params_.data_at(w), params_.data_at(b));
  else
    rmsnorm_forward_ref(p, out, rstd, x, params_.data_at(w));
}

template <typename Real>
void GptT<Real>::norm_backward(int N, Real* d_x, const Real* d_out, const Real* x, size_t w, size_t b,
                               const Real* mean, const Real* rstd) {
  const NormParams p{.N = N, .C = cfg_.d_model, .eps = cfg_.norm_eps};
  if (cfg_.norm == NormKind::LayerNorm)
    layernorm_backward_ref(p, d_x, params_.grad_at(w), params_.grad_at(b), d_out, x, params_.data_at(w), mean,
                           rstd);
  else
    rmsnorm_backward_ref(p, d_x, params_.grad_at(w), d_out, x, params_.data_at(w), rstd);
}

template <typename Real>
double GptT<Real>::forward(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt) {
  TS_CHECK(B > 0 && T > 0, "forward: batch and sequence must be positive, got B=", B, " T=", T);
  TS_CHECK(T <= cfg_.max_seq, "forward: sequence length ", T, " exceeds max_seq ", cfg_.max_seq);
  ensure_plan(B, T);
  B_ = B;
  T_ = T;
  const int N = B * T, C = cfg_.d_model, V = cfg_.vocab;
  std::memcpy(acts_.tokens, tokens, sizeof(int32_t) * N);
  has_targets_ = targets != nullptr;
  if (targets) std::memcpy(acts_.targets, targets, sizeof(int32_t) * N);

  const bool dropout_on = opt.training && cfg_.dropout > 0;
  TS_CHECK(!dropout_on || opt.rng, "forward: training with dropout needs an RNG state");
  acts_.stream_emb = dropout_on ? opt.rng->take() : 0;
  dropout_seed_ = dropout_on ? opt.rng->seed : 0;
  dropout_p_ = dropout_on ? cfg_.dropout : 0.0f;
  const EmbeddingParams ep{.B = B, .T = T, .C = C, .V = V, .max_seq = cfg_.max_seq, .scale = cfg_.emb_scale,
                           .padding_id = cfg_.padding_id, .dropout = dropout_p_, .seed = dropout_seed_,
                           .stream = acts_.stream_emb};
  const Real* pos_table = cfg_.positions == PositionKind::Learned      ? params_.data_at(wpe_)
                          : cfg_.positions == PositionKind::Sinusoidal ? sinusoid_.data()
                                                                       : nullptr;
  embedding_forward_ref(ep, acts_.res[0], acts_.tokens, params_.data_at(wte_), pos_table);

  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (dropout_on) {
      acts_.layers[l].stream_attn = opt.rng->take();
      acts_.layers[l].stream_mlp = opt.rng->take();
    }
    layer_forward(l, B, T);
  }

  norm_forward(N, acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, acts_.res[cfg_.n_layers], lnf_w_, lnf_b_);
  const Real* w_lm = params_.data_at(cfg_.tied ? wte_ : lm_head_);
  gemm_ref<Real>({.M = N, .N = V, .K = C, .trans_b = true}, acts_.logits, acts_.lnf, w_lm, nullptr);

  if (!targets) return 0.0;
  label_smoothing_ = opt.label_smoothing;
  const CrossEntropyParams cp{.N = N, .V = V, .label_smoothing = opt.label_smoothing,
                              .ignore_index = cfg_.padding_id};
  count_ = cross_entropy_forward_ref(cp, acts_.losses, acts_.ce_lse, acts_.logits, acts_.targets);
  if (count_ == 0) return 0.0;
  double sum = 0;
  for (int n = 0; n < N; ++n) sum += acts_.losses[n];
  return sum / static_cast<double>(count_);
}

template <typename Real>
void GptT<Real>::layer_forward(int l, int B, int T) {
  const int N = B * T, C = cfg_.d_model, F = cfg_.d_ff, Fin = cfg_.d_ff_in();
  const LayerOffsets& o = layers_[l];
  LayerActs& A = acts_.layers[l];
  const Real* x = acts_.res[l];

  norm_forward(N, A.ln1, A.ln1_mean, A.ln1_rstd, x, o.ln1_w, o.ln1_b);
  gemm_ref<Real>({.M = N, .N = 3 * C, .K = C, .trans_b = true}, A.qkv, A.ln1, params_.data_at(o.qkv_w),
                 params_.data_at(o.qkv_b));
  if (cfg_.positions == PositionKind::Rope)
    rope_forward_ref<Real>({.B = B, .T = T, .H = cfg_.n_heads, .Dh = cfg_.head_dim(), .theta = cfg_.rope_theta},
                           A.qkv);
  attention_forward_ref<Real>({.B = B, .T = T, .H = cfg_.n_heads, .Dh = cfg_.head_dim()}, A.att, A.lse, A.qkv);
  gemm_ref<Real>({.M = N, .N = C, .K = C, .trans_b = true}, acts_.tmp, A.att, params_.data_at(o.proj_w), nullptr);
  residual_forward_ref<Real>({.N = N, .C = C, .dropout = dropout_p_, .seed = dropout_seed_, .stream = A.stream_attn},
                             A.mid, x, acts_.tmp, params_.data_at(o.proj_b));

  norm_forward(N, A.ln2, A.ln2_mean, A.ln2_rstd, A.mid, o.ln2_w, o.ln2_b);
  gemm_ref<Real>({.M = N, .N = Fin, .K = C, .trans_b = true}, A.fc_pre, A.ln2, params_.data_at(o.fc_w), nullptr);
  activation_forward_ref<Real>({.N = N, .d_ff = F, .kind = cfg_.mlp}, A.fc_act, A.fc_pre, params_.data_at(o.fc_b));
  gemm_ref<Real>({.M = N, .N = C, .K = F, .trans_b = true}, acts_.tmp, A.fc_act, params_.data_at(o.fcp_w), nullptr);
  residual_forward_ref<Real>({.N = N, .C = C, .dropout = dropout_p_, .seed = dropout_seed_, .stream = A.stream_mlp},
                             acts_.res[l + 1], A.mid, acts_.tmp, params_.data_at(o.fcp_b));
}

template <typename Real>
void GptT<Real>::backward(double loss_scale) {
  TS_CHECK(has_targets_, "backward: needs a forward with targets first");
  has_targets_ = false;  // the logits are consumed below
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, V = cfg_.vocab;
  if (count_ == 0) return;
  const CrossEntropyParams cp{.N = N, .V = V, .label_smoothing = label_smoothing_, .ignore_index = cfg_.padding_id};
  Real* d_logits = acts_.logits;  // in place: each element of the gradient needs only its own logit and lse
  cross_entropy_backward_ref(cp, d_logits, acts_.logits, acts_.ce_lse, acts_.targets,
                             loss_scale / static_cast<double>(count_));

  const size_t lm = cfg_.tied ? wte_ : lm_head_;
  gemm_ref<Real>({.M = V, .N = C, .K = N, .trans_a = true, .beta = 1.0f}, params_.grad_at(lm), d_logits, acts_.lnf,
                 nullptr);
  gemm_ref<Real>({.M = N, .N = C, .K = V}, acts_.d_ln, d_logits, params_.data_at(lm), nullptr);
  std::fill(acts_.d_res, acts_.d_res + static_cast<size_t>(N) * C, Real(0));
  norm_backward(N, acts_.d_res, acts_.d_ln, acts_.res[cfg_.n_layers], lnf_w_, lnf_b_, acts_.lnf_mean,
                acts_.lnf_rstd);

  for (int l = cfg_.n_layers - 1; l >= 0; --l) layer_backward(l, B, T);

  const EmbeddingParams ep{.B = B, .T = T, .C = C, .V = V, .max_seq = cfg_.max_seq, .scale = cfg_.emb_scale,
                           .padding_id = cfg_.padding_id, .dropout = dropout_p_, .seed = dropout_seed_,
                           .stream = acts_.stream_emb};
  embedding_backward_ref(ep, params_.grad_at(wte_), params_.grad_at(wpe_), acts_.d_res, acts_.tokens);
}

template <typename Real>
void GptT<Real>::layer_backward(int l, int B, int T) {
  const int N = B * T, C = cfg_.d_model, F = cfg_.d_ff, Fin = cfg_.d_ff_in();
  const LayerOffsets& o = layers_[l];
  LayerActs& A = acts_.layers[l];
  Real* d_res = acts_.d_res;  // d of this layer's output; becomes d of its input

  // x' = mid + Drop(fc_act W2ᵀ + b2): d_mid = d_res (skip path, kept in place), d_tmp = d of the projection.
  residual_backward_ref<Real>({.N = N, .C = C, .dropout = dropout_p_, .seed = dropout_seed_, .stream = A.stream_mlp},
                              acts_.d_tmp, params_.grad_at(o.fcp_b), d_res);
  gemm_ref<Real>({.M = C, .N = F, .K = N, .trans_a = true, .beta = 1.0f}, params_.grad_at(o.fcp_w), acts_.d_tmp,
                 A.fc_act, nullptr);
  gemm_ref<Real>({.M = N, .N = F, .K = C}, acts_.d_fc_act, acts_.d_tmp, params_.data_at(o.fcp_w), nullptr);
  activation_backward_ref<Real>({.N = N, .d_ff = F, .kind = cfg_.mlp}, acts_.d_fc_pre, params_.grad_at(o.fc_b),
                                acts_.d_fc_act, A.fc_pre, params_.data_at(o.fc_b));
  gemm_ref<Real>({.M = Fin, .N = C, .K = N, .trans_a = true, .beta = 1.0f}, params_.grad_at(o.fc_w), acts_.d_fc_pre,
                 A.ln2, nullptr);
  gemm_ref<Real>({.M = N, .N = C, .K = Fin}, acts_.d_ln, acts_.d_fc_pre, params_.data_at(o.fc_w), nullptr);
  norm_backward(N, d_res, acts_.d_ln, A.mid, o.ln2_w, o.ln2_b, A.ln2_mean, A.ln2_rstd);

  // mid = x + Drop(att Woᵀ + bo)
  residual_backward_ref<Real>({.N = N, .C = C, .dropout = dropout_p_, .seed = dropout_seed_, .stream = A.stream_attn},
                              acts_.d_tmp, params_.grad_at(o.proj_b), d_res);
  gemm_ref<Real>({.M = C, .N = C, .K = N, .trans_a = true, .beta = 1.0f}, params_.grad_at(o.proj_w), acts_.d_tmp,
                 A.att, nullptr);
  gemm_ref<Real>({.M = N, .N = C, .K = C}, acts_.d_att, acts_.d_tmp, params_.data_at(o.proj_w), nullptr);
  attention_backward_ref<Real>({.B = B, .T = T, .H = cfg_.n_heads, .Dh = cfg_.head_dim()}, acts_.d_qkv, acts_.d_att,
                               A.qkv, A.att, A.lse);
  if (cfg_.positions == PositionKind::Rope)
    rope_backward_ref<Real>({.B = B, .T = T, .H = cfg_.n_heads, .Dh = cfg_.head_dim(), .theta = cfg_.rope_theta},
                            acts_.d_qkv);
  gemm_ref<Real>({.M = 3 * C, .N = C, .K = N, .trans_a = true, .beta = 1.0f}, params_.grad_at(o.qkv_w), acts_.d_qkv,
                 A.ln1, nullptr);
  if (o.qkv_b != kNoParam) bias_grad_ref(N, 3 * C, params_.grad_at(o.qkv_b), acts_.d_qkv);
  gemm_ref<Real>({.M = N, .N = C, .K = 3 * C}, acts_.d_ln, acts_.d_qkv, params_.data_at(o.qkv_w), nullptr);
  norm_backward(N, d_res, acts_.d_ln, acts_.res[l], o.ln1_w, o.ln1_b, A.ln1_mean, A.ln1_rstd);
}

template class GptT<float>;
template class GptT<double>;

}  // namespace tessera
