#include "tessera/models/gpt.h"

#include <cmath>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/models/gpt_layers.h"

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

std::unique_ptr<Gpt::Layers> Gpt::make_layers(const ModelConfig& cfg, DType dtype, ParamBuffer& pb) {
  const int L = cfg.n_layers;
  auto lay = std::make_unique<Layers>(Layers{.emb = Embedding("", {.V = cfg.vocab,
                                                                   .C = cfg.d_model,
                                                                   .max_seq = cfg.max_seq,
                                                                   .positions = cfg.positions,
                                                                   .scale = cfg.emb_scale,
                                                                   .padding_id = cfg.padding_id}),
                                             .blocks = {},
                                             .head = LmHead({.V = cfg.vocab,
                                                             .C = cfg.d_model,
                                                             .ld = logits_stride(cfg, dtype),
                                                             .norm = cfg.norm,
                                                             .bias = cfg.bias,
                                                             .norm_eps = cfg.norm_eps,
                                                             .tied = cfg.tied,
                                                             .ignore_index = cfg.padding_id}),
                                             .sched = {}});
  const BlockShape shape{
      .kind = BlockKind::Decoder,
      .placement = NormPlacement::Pre,
      .attention = {.C = cfg.d_model,
                    .H = cfg.n_heads,
                    .Hkv = cfg.kv_heads(),
                    .Dh = cfg.head_dim(),
                    .bias = cfg.bias,
                    .rope_theta = cfg.positions == PositionKind::Rope ? cfg.rope_theta : 0.0f},
      .mlp = {.C = cfg.d_model, .F = cfg.d_ff, .kind = cfg.mlp, .bias = cfg.bias, .fused_gelu = fuses_gelu(cfg, dtype)},
      .norm = cfg.norm,
      .norm_eps = cfg.norm_eps};
  lay->blocks.reserve(static_cast<size_t>(L));  // the wiring below points into the vector
  for (int l = 0; l < L; ++l)
    lay->blocks.emplace_back("h." + std::to_string(l) + ".", "layer " + std::to_string(l), shape);
  for (int l = 0; l < L; ++l) {
    Block& b = lay->blocks[l];
    b.set_producer(l > 0 ? &lay->blocks[l - 1] : nullptr);
    b.set_next_norm(l + 1 < L ? &lay->blocks[l + 1].input_norm() : &lay->head.input_norm());
  }
  lay->head.set_producer(&lay->blocks.back());

  lay->emb.add_params(pb);
  for (Block& b : lay->blocks) b.add_params(pb);
  lay->head.add_params(pb, lay->emb.wte_offset());

  StepSchedule& s = lay->sched;
  lay->emb.schedule_forward(s);
  for (Block& b : lay->blocks) b.schedule_forward(s);
  lay->head.schedule_forward(s);
  lay->head.schedule_backward(s);
  for (int l = L - 1; l >= 0; --l) lay->blocks[l].schedule_backward(s);
  lay->emb.schedule_backward(s);
  return lay;
}

void Gpt::add_params(const ModelConfig& cfg, ParamBuffer& pb) { make_layers(cfg, DType::F32, pb); }

size_t Gpt::flat_params(const ModelConfig& cfg) {
  ParamBuffer pb;  // segments only: nothing is allocated before finalize()
  add_params(cfg, pb);
  return pb.size();
}

void Gpt::build() {
  cfg_.validate();
  TS_CHECK(dtype_is_float(dtype_), "model dtype must be a float type, got ", dtype_name(dtype_));
  layers_ = make_layers(cfg_, dtype_, params_);
  clock_.model = this;
  params_.finalize(*ctx_);
  TS_CHECK(static_cast<int64_t>(params_.num_params()) == cfg_.num_params(), "internal: parameter count mismatch");
  layers_->emb.make_tables(dtype_, *ctx_);
}

int Gpt::end_event() const { return layers_->sched.end(); }

StepEnv Gpt::step_env() {
  return {.ctx = ctx_,
          .params = &params_,
          .dtype = dtype_,
          .clock = &clock_,
          .B = B_,
          .T = T_,
          .dropout = dropout_p_,
          .attn_dropout = attn_dropout_p_,
          .seed = dropout_seed_};
}

Tensor Gpt::block_input(int l, int64_t N) const {
  return l == 0 ? layers_->emb.out(N) : layers_->blocks[static_cast<size_t>(l - 1)].out(N);
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
    // depend on the thread count: a billion-parameter model's initialization is then no longer one core's work.
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

Tensor Gpt::tokens_buffer(int B, int T) {
  reserve(B, T);
  return acts_.tokens.slice1d(0, static_cast<int64_t>(B) * T);
}

Tensor Gpt::targets_buffer(int B, int T) {
  reserve(B, T);
  return acts_.targets.slice1d(0, static_cast<int64_t>(B) * T);
}

double Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt) {
  forward_async(tokens, targets, B, T, opt);
  return targets ? read_loss() : 0.0;
}

void Gpt::check_tokens(const int32_t* tokens, int B, int T) const {
  // Bad token ids are caught here on the host, before they reach a kernel as out-of-range rows.
  layers_->emb.check_tokens(tokens, B, T);
}

void Gpt::forward_async(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt) {
  reserve(B, T);
  const int64_t N = static_cast<int64_t>(B) * T;
  check_tokens(tokens, B, T);
  copy_bytes(acts_.tokens.data(), ctx_->device(), tokens, Device::cpu(), N * sizeof(int32_t), *ctx_);
  if (targets) copy_bytes(acts_.targets.data(), ctx_->device(), targets, Device::cpu(), N * sizeof(int32_t), *ctx_);
  forward_device(B, T, targets != nullptr, opt);
}

void Gpt::forward_device(int B, int T, bool with_targets, const ForwardOptions& opt) {
  reserve(B, T);
  B_ = B;
  T_ = T;
  const int64_t N = static_cast<int64_t>(B) * T;
  has_targets_ = with_targets;
  fused_loss_grad_scale_.reset();
  begin_step();
  const RangesCloser close_ranges{*this};

  const bool dropout_on = opt.training && cfg_.dropout > 0;
  const bool attn_dropout_on = opt.training && cfg_.attn_dropout > 0;
  TS_CHECK(!(dropout_on || attn_dropout_on) || opt.rng, "forward: training with dropout needs an RNG state");
  Layers& lay = *layers_;
  lay.emb.draw_streams(opt.rng, dropout_on);
  dropout_seed_ = dropout_on || attn_dropout_on ? opt.rng->seed : 0;
  dropout_p_ = dropout_on ? cfg_.dropout : 0.0f;
  attn_dropout_p_ = attn_dropout_on ? cfg_.attn_dropout : 0.0f;
  const StepEnv env = step_env();
  lay.emb.forward(env, acts_.tokens);
  const Tensor tmp = rows(acts_.tmp, N, cfg_.d_model);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    lay.blocks[l].draw_streams(opt.rng, dropout_on, attn_dropout_on);
    lay.blocks[l].forward(env, block_input(l, N), tmp);
  }
  lay.head.forward(env, lay.blocks.back().out(N));
  if (!with_targets) return;
  label_smoothing_ = opt.label_smoothing;
  fused_loss_grad_scale_ = opt.loss_grad_scale;
  lay.head.loss_forward(env, acts_.targets, opt.label_smoothing, opt.loss_grad_scale, acts_.loss, acts_.count);
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

Tensor Gpt::logits() const {
  const int64_t N = static_cast<int64_t>(B_) * T_;
  return layers_->head.logits(N);
}

std::vector<float> Gpt::read_logits_row(int row) const {
  TS_CHECK(row >= 0 && row < B_ * T_, "internal: logits row ", row, " of ", B_ * T_);
  const int64_t V = cfg_.vocab;
  const size_t es = dtype_size(dtype_);
  std::vector<unsigned char> raw(static_cast<size_t>(V) * es);
  const char* at = static_cast<const char*>(layers_->head.logits(1).data()) + row * logits_stride() * es;
  copy_bytes(raw.data(), Device::cpu(), at, ctx_->device(), raw.size(), *ctx_);
  std::vector<float> out(static_cast<size_t>(V));
  convert_to_f32(raw.data(), dtype_, out.size(), out.data());
  return out;
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
  const bool fused = fused_loss_grad_scale_.has_value();
  if (fused) {
    // The forward wrote d_logits already (ForwardOptions::loss_grad_scale).
    TS_CHECK(*fused_loss_grad_scale_ == loss_scale, "backward: loss scale ", loss_scale,
             " differs from the forward's loss_grad_scale ", *fused_loss_grad_scale_);
    fused_loss_grad_scale_.reset();
  }
  const int64_t N = static_cast<int64_t>(B_) * T_;
  const int L = cfg_.n_layers;
  Layers& lay = *layers_;
  const StepEnv env = step_env();
  const Tensor d_res = rows(acts_.d_res, N, cfg_.d_model);
  lay.head.backward(env, d_res, lay.blocks.back().out(N), acts_.targets, label_smoothing_, loss_scale, fused,
                    acts_.count);
  // Block l's parameters are one run, from its first norm's up to the next block's (or the final norm's).
  auto block_begin = [&](int l) { return l < L ? lay.blocks[l].param_begin() : lay.head.param_begin(); };
  if (grad_ready_) grad_ready_(lay.head.param_begin(), params_.size());
  for (int l = L - 1; l >= 0; --l) {
    lay.blocks[l].backward(env, d_res, block_input(l, N));
    if (grad_ready_) grad_ready_(block_begin(l), block_begin(l + 1));
  }
  lay.emb.backward(env, d_res, acts_.tokens);
  if (grad_ready_) grad_ready_(0, block_begin(0));
  at(end_event());
  zero_pending_ = false;
}

}  // namespace tessera
