// tessera/models/gpt.h — decoder-only transformer with explicit forward and backward (no autograd tape).
//
// Pre-norm blocks:  h = x + Drop(Attn(Norm1(x)) Woᵀ + bo),  x' = h + Drop(Act(Norm2(h) W1ᵀ + b1) W2ᵀ + b2)
// then a final norm and logits = Norm_f(x) W_lmᵀ (W_lm = wte when tied). Shapes: tokens (B, T), residual
// stream (B*T, C), qkv (B*T, 3C), logits (B*T, V).
//
// The model runs on a Context: its parameters (one ParamBuffer) and activations (one Arena planned per (B, T))
// live on the context's device, and every op goes through the Tensor-level entries, which send the work to the
// CPU reference or to the CUDA kernels. The compute dtype is f32 or f64 on the CPU (f64 for gradient checks by
// finite differences) and f32, bf16 or f16 on a GPU; statistics (mean, rstd, lse) and the loss are f32 (f64 in
// an f64 model). The host reads the model only through explicit copies: read_loss(), read_logits_row(), and
// ParamBuffer::read_f32() for checkpoints.
//
// Activations: every buffer of a step declares its life over the step's events (one per op, gpt_plan.h), and one
// arena is laid out by the lifetime planner, so that buffers whose lives are disjoint share memory: the backward
// writes its gradient temporaries over activations that have died. The logits buffer is overwritten in place by
// its gradient. A plan for (B, T) serves any smaller B*T (every buffer is sized by B*T), so generation reserves
// once and does not re-plan per token.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/arena.h"
#include "tessera/core/context.h"
#include "tessera/core/philox.h"
#include "tessera/core/planner.h"
#include "tessera/core/trace.h"
#include "tessera/models/config.h"
#include "tessera/models/gpt_plan.h"
#include "tessera/models/model.h"
#include "tessera/nn/param_buffer.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/norm/norm.h"

namespace tessera {

class Gpt final : public Model {
 public:
  // A model on ctx's device computing in `dtype`. The context must outlive the model. master: whether a 16-bit
  // model keeps f32 master weights (ParamBuffer).
  Gpt(const ModelConfig& cfg, Context& ctx, DType dtype = DType::F32, MasterWeights master = MasterWeights::On);
  // A CPU model with a context of its own (the reference engine and tests).
  explicit Gpt(const ModelConfig& cfg, DType dtype = DType::F32);
  ~Gpt() override;
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const ModelConfig& config() const override { return cfg_; }
  Context& context() const override { return *ctx_; }
  DType dtype() const override { return dtype_; }
  ParamBuffer& params() override { return params_; }
  const ParamBuffer& params() const override { return params_; }
  // The elements of the flat parameter buffers of `cfg`, padding included (params().size() of its model), without
  // making one: what ZeRO-1 shards.
  static size_t flat_params(const ModelConfig& cfg);
  // The parameter segments of `cfg` (names, shapes, offsets) added to an empty `pb`, nothing allocated: what
  // checkpoint_layout reads to check a checkpoint without building its model.
  static void describe_params(const ModelConfig& cfg, ParamBuffer& pb) { add_params(cfg, pb); }

  // GPT-2 initialisation: N(0, 0.02) for matrices and embeddings, residual projections scaled by
  // 1/sqrt(2 n_layers), zero biases, unit norm gains. Each tensor draws its own Philox stream of `seed`.
  void init_weights(uint64_t seed) override;

  // Plans the activations for up to B*T tokens (a smaller B*T reuses the plan).
  void reserve(int B, int T) override;
  // The model's input buffers, (B*T) int32 on its device, for a caller that copies a batch in itself.
  Tensor tokens_buffer(int B, int T) override;
  Tensor targets_buffer(int B, int T) override;

  // Runs the model on the tokens (and targets) already in tokens_buffer / targets_buffer. With targets it
  // computes the mean cross-entropy over non-ignored targets (padding_id is ignored) into loss(), on the device.
  void forward_device(int B, int T, bool with_targets, const ForwardOptions& opt) override;
  // Host convenience: copies tokens (B*T) and targets (or null) in, runs forward_device and, with targets,
  // returns the mean loss (one explicit device-to-host copy); without, returns 0.
  double forward(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt) override;
  // The same without reading the loss back: the step stays on the device (loss() holds the mean loss), and the
  // training loop reads it once per step, after the optimizer.
  void forward_async(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt) override;
  // The host-side check of a batch's token ids that forward_async makes before its copy (embedding_check): a bad
  // id is an Error here, before it reaches a kernel as an out-of-range row. A caller that copies batches in itself
  // (a CUDA graph's staging, train/graph_step.h) calls it.
  void check_tokens(const int32_t* tokens, int B, int T) const override;
  // The mean loss of the last forward with targets: a device scalar in the stat dtype.
  Tensor loss() const override { return loss_; }
  double read_loss() const override;

  // Accumulates into params().grad() the gradient of loss_scale * (mean loss of the last forward).
  // Needs a forward with targets just before. Overwrites the logits.
  void backward(double loss_scale = 1.0) override;
  // Own gradients: zero-filled now. Planned: each range is zeroed as the next backward reaches its birth.
  void zero_grad() override;
  // Moves the gradients (their values are lost): GradMemory::Planned releases their own buffer and plans them at
  // the next reserve or forward; Own allocates it again, zero-filled. Call it between steps, before a GraphStep is
  // made for the model: a graph captured earlier keeps the old addresses until a re-plan makes it capture again.
  void set_grad_memory(GradMemory where) override;
  GradMemory grad_memory() const override { return grad_memory_; }
  // Called during backward() each time a range [begin, end) of the flat gradient buffer (elements, padding
  // included) holds its final gradient for this backward: the LM head and final norm, then layers L-1 .. 0, then
  // the embeddings (wte last, as a tied head adds to it twice). The ranges descend and together cover the buffer
  // once. On a GPU the kernels that wrote a range are queued on the context's stream, not finished. Data-parallel
  // training (dist/) starts reducing a range here while backward goes on. An empty function: no calls.
  using GradReadyHook = std::function<void(size_t begin, size_t end)>;
  void set_grad_ready_hook(GradReadyHook hook) override { grad_ready_ = std::move(hook); }

  // Logits of the last forward, in the compute dtype, on the device: (B*T, logits_stride()), row n's V logits
  // starting at n * logits_stride().
  Tensor logits() const override;
  int64_t logits_stride() const override { return logits_stride(cfg_, dtype_); }
  // The row stride of the logits buffer: V for f32 / f64 models; for 16-bit ones V rounded up to a multiple of 64
  // (50257 -> 50304, as llm.c pads its vocab), so that each row starts 128-byte aligned and cuBLASLt can run the
  // lm_head GEMMs on its aligned tensor-core kernels. The padding columns are never read or written.
  static int64_t logits_stride(const ModelConfig& cfg, DType dtype);
  // Whether the MLP's GELU runs inside the fc GEMM (gemm_gelu_forward) and its gradient in place over d_fc_pre: for
  // GELU with biases in bf16 / f16, the GPU's dtypes. fc_pre then holds the bias, and the plan has no d_fc_act. f32
  // and f64 models keep the separate activation op, so the CPU reference and the f32 GPU model stay op for op the
  // same.
  static bool fuses_gelu(const ModelConfig& cfg, DType dtype) {
    return cfg.mlp == Activation::Gelu && cfg.bias && (dtype == DType::BF16 || dtype == DType::F16);
  }
  // Row `row` of the logits as f32 on the host (sampling).
  std::vector<float> read_logits_row(int row) const override;
  int last_B() const override { return B_; }
  int last_T() const override { return T_; }

  // The activation plan for (B, T): every buffer with its life (in events of the step, gpt_plan.h) and its
  // offset, the planned peak, the sum of all buffers and the largest live set. The model lays out its arena from
  // exactly this plan.
  // With GradMemory::Planned the gradients are in it too, as fixed buffers (grad.head, grad.h.<l>,
  // grad.embedding) at offset 0.
  static MemoryPlan activation_plan(const ModelConfig& cfg, int B, int T, DType dtype = DType::F32,
                                    const PlanDebug& debug = {}, GradMemory grads = GradMemory::Own);
  // Its planned peak: the bytes of the arena.
  static size_t activation_bytes(const ModelConfig& cfg, int B, int T, DType dtype = DType::F32,
                                 GradMemory grads = GradMemory::Own);
  // The peak of this model's current plan, and how many plans it has made (generation must not re-plan per token).
  size_t activation_peak() const override { return arena_.capacity(); }
  int64_t plan_count() const override { return plans_made_; }
  int64_t planned_tokens() const override { return planned_N_; }
  const MemoryPlan& current_plan() const override { return plan_; }
  // Debug settings of the plan (poison dead buffers, no reuse; gpt_plan.h). The model starts with those of the
  // environment; new settings take effect at the next plan, which the next reserve or forward makes.
  void set_plan_debug(const PlanDebug& debug) override;
  const PlanDebug& plan_debug() const override { return debug_; }

  // Profiling. Every step opens nested ranges: FWD_STEP and BWD_STEP, one per layer ("layer 3") inside them,
  // and one per op inside those ("qkv", "attention bwd", "fc dW"; step_op_range_name). They are NVTX ranges
  // in a CUDA build (for nsys), and with a tracer also slices of its Chrome trace, together with a counter of
  // the activation memory the plan has live at each op. Set the tracer between steps; null stops recording.
  void set_tracer(Tracer* tracer) override;

 private:
  struct LayerOffsets {
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w, fcp_b;
  };
  // Where each parameter starts in the flat buffers (kNoParam when the config has none).
  struct ParamLayout {
    size_t wte = kNoParam, wpe = kNoParam, lnf_w = kNoParam, lnf_b = kNoParam, lm_head = kNoParam;
    std::vector<LayerOffsets> layers;
  };
  // A range of the flat gradients [begin, end) (elements) that backward writes from one op on: the head, a
  // layer, the embeddings. `birth`: the event of that op.
  struct GradRegion {
    std::string name;
    size_t begin = 0, end = 0;
    int birth = 0;
  };
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, att, lse, mid, ln2, ln2_mean, ln2_rstd, fc_pre, fc_act;  // saved
    Tensor d_tmp, d_ln, d_att, d_qkv, d_fc_act, d_fc_pre;  // gradient temporaries of this layer's backward
    uint64_t stream_attn = 0, stream_mlp = 0;  // residual dropout after attention and after the MLP
    uint64_t stream_probs = 0;                 // attention dropout (on the probabilities)
  };
  struct Acts {
    std::vector<Tensor> res;  // L + 1 residual stream states
    std::vector<LayerActs> layers;
    Tensor lnf, lnf_mean, lnf_rstd, logits, losses, ce_lse, loss, count, tmp;
    Tensor d_res, d_lnf;
    Tensor tokens, targets;
    uint64_t stream_emb = 0;
  };
  // A planned buffer: the Tensor of Acts it becomes, once the plan has an offset for it.
  struct Slot {
    Tensor* tensor;
    DType dtype;
    std::vector<int64_t> shape;
  };

  void build();
  // Adds the model's parameters to `pb` in their order (the flat layout); returns where each starts.
  static ParamLayout add_params(const ModelConfig& cfg, ParamBuffer& pb);
  // The gradient ranges, in the order backward reaches them.
  static std::vector<GradRegion> grad_regions(const ModelConfig& cfg);
  // Declares every activation buffer of a (B, T) step with its life into `mp` (gpt_plan.cpp), and where each
  // one goes in `acts` (slots[i] is plan buffer i); then, with planned gradients, one fixed buffer per range of
  // grad_regions (plan ids slots.size() on).
  static void declare_plan(const ModelConfig& cfg, DType dtype, int B, int T, const PlanDebug& debug,
                           GradMemory grads, MemoryPlan& mp, Acts& acts, std::vector<Slot>& slots);
  // The step's events as they run: begin_step() starts a forward, at(op, layer) marks each op before it runs
  // (checking the plan's order), and in the debug mode poisons the buffers that died and checks those born.
  void begin_step();
  void at(StepOp op, int layer = 0);
  void poison(int id);
  void check_unborn(int id);
  // Moves the open profiler ranges to those of (op, layer): closes the op, layer and phase ranges that end
  // there and opens the new ones. StepOp::End closes them all.
  void ranges_to(StepOp op, int layer);
  void range_push(const char* name);
  void range_pop();
  // Closes the open ranges when a forward returns (with or without targets) or throws.
  struct RangesCloser {
    Gpt& model;
    ~RangesCloser() { model.ranges_to(StepOp::End, 0); }
  };
  // The first N rows of an (N_planned, cols) activation.
  Tensor rows(const Tensor& t, int64_t n, int64_t cols) const;
  // t's memory from element `col` on, flat: the start of column `col` of a row-major matrix, for a GEMM with a
  // row stride.
  Tensor columns_from(const Tensor& t, int64_t col) const;
  // With padded logits rows, the lm_head's forward and dx GEMMs run over the first V0 = V rounded down to 64
  // vocabulary entries, then the V - V0 left (17 of GPT-2's 50257) in a second, small GEMM: cuBLASLt ran the
  // whole V = 50257 as an output width or a reduction length 5-7x slower than the aligned V0 (the dW GEMM, where V
  // is the row count, was fast). Returns V0 (V when the rows are packed: one GEMM).
  int64_t lm_head_split() const;
  Tensor p(size_t offset, int64_t numel) const { return params_.data_at(offset, numel); }
  Tensor g(size_t offset, int64_t numel) const { return params_.grad_at(offset, numel); }
  void mm(GemmParams gp, const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias);
  void norm_forward(int N, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, size_t w,
                    size_t b);
  void norm_backward(int N, const Tensor& d_x, const Tensor& d_out, const Tensor& x, size_t w, size_t b,
                     const Tensor& mean, const Tensor& rstd,
                     const NormResidualBackward* res = nullptr);
  // mid = residual + Drop(y + bias) and out = norm(mid) with its statistics, in one op (norm_residual_forward);
  // stream: the add's dropout stream. bias, w, b: parameter offsets (kNoParam: none).
  void residual_norm_forward(int N, uint64_t stream, const Tensor& mid, const Tensor& residual, const Tensor& y,
                             size_t bias, const Tensor& out, const Tensor& mean, const Tensor& rstd, size_t w,
                             size_t b);
  // The backward of layer l's x' = mid + Drop(fc_act W2ᵀ + b2) as the norm above it runs it: d_tmp and d b2.
  NormResidualBackward mlp_residual_backward(int l, int N);
  void layer_forward(int l, int B, int T);
  // Layer l's attention call: its shape, causal, and the last forward's attention dropout with layer l's stream.
  AttentionParams attention_params(int l, int B, int T) const;
  void layer_backward(int l, int B, int T);

  ModelConfig cfg_;
  std::unique_ptr<Context> owned_ctx_;
  Context* ctx_;
  DType dtype_;
  ParamBuffer params_;
  size_t wte_ = kNoParam, wpe_ = kNoParam, lnf_w_ = kNoParam, lnf_b_ = kNoParam, lm_head_ = kNoParam;
  std::vector<LayerOffsets> layers_;
  GradMemory grad_memory_ = GradMemory::Own;
  std::vector<GradRegion> grad_regions_;  // planned gradients: the ranges, by birth
  std::vector<int> grad_ids_;             // and their plan buffers
  size_t next_grad_zero_ = 0;             // the next range a pending zero_grad zeroes
  bool zero_pending_ = false;             // planned gradients: zero_grad() was called since the last backward
  Buffer sinusoid_;  // (max_seq, C) table for sinusoidal positions, in the compute dtype

  Arena arena_;
  Acts acts_;
  MemoryPlan plan_;
  PlanDebug debug_ = plan_debug_from_env();
  std::vector<int> by_death_, by_birth_;  // the buffers that die within a step, by last and by first event
  size_t next_death_ = 0, next_birth_ = 0;
  int event_ = -1;  // the event the step has reached (-1: before its start)
  Tracer* tracer_ = nullptr;
  int range_phase_ = 0, range_layer_ = -1;  // the open ranges: phase 0 none, 1 forward, 2 backward
  bool range_op_open_ = false;
  std::vector<std::string> layer_range_names_;
  std::vector<size_t> live_bytes_;  // the plan's live bytes at each event (the trace's memory counter)
  Tensor loss_;
  int B_ = 0, T_ = 0;
  int64_t planned_N_ = 0;
  int plans_made_ = 0;
  uint64_t dropout_seed_ = 0;   // dropout of the last forward (0 probability when off)
  float dropout_p_ = 0.0f;
  float attn_dropout_p_ = 0.0f;  // attention dropout of the last forward (0 when off)
  float label_smoothing_ = 0;
  std::optional<double> fused_loss_grad_scale_;  // the last forward wrote d_logits with this scale
  bool has_targets_ = false;
  GradReadyHook grad_ready_;
};

}  // namespace tessera
