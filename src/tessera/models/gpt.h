// tessera/models/gpt.h — decoder-only transformer with explicit forward and backward (no autograd tape).
//
// Pre-norm blocks:  h = x + Drop(Attn(Norm1(x)) Woᵀ + bo),  x' = h + Drop(Act(Norm2(h) W1ᵀ + b1) W2ᵀ + b2)
// then a final norm and logits = Norm_f(x) W_lmᵀ (W_lm = wte when tied). Shapes: tokens (B, T), residual
// stream (B*T, C), qkv (B*T, (H + 2 Hkv) Dh) with Hkv key/value heads (3C without grouping), logits (B*T, V).
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
#include "tessera/nn/step.h"
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
  // The model's nn layers (gpt.cpp): the embedding, the blocks and the head, wired for the cross-block fusions,
  // with their parameters added and the step's events scheduled.
  struct Layers;
  // A range of the flat gradients [begin, end) (elements) that backward writes from one op on: the head, a
  // layer, the embeddings. `birth`: the event of that op.
  struct GradRegion {
    std::string name;
    size_t begin = 0, end = 0;
    int birth = 0;
  };
  // The buffers of the model itself; the layers hold their own.
  struct Acts {
    Tensor tokens, targets, loss, count;
    Tensor tmp;    // the sublayers' outputs before their residual add: one buffer for the whole forward
    Tensor d_res;  // d of the residual stream, accumulated in place from the final norm down to the embedding
  };
  // Marks the layers' events on the model (at).
  struct Clock final : StepClock {
    Gpt* model = nullptr;
    void at(int event) override { model->at(event); }
  };

  void build();
  // The layers of `cfg` computing in `dtype`, their parameters added to `pb` in the flat layout's order.
  static std::unique_ptr<Layers> make_layers(const ModelConfig& cfg, DType dtype, ParamBuffer& pb);
  static void add_params(const ModelConfig& cfg, ParamBuffer& pb);
  // The gradient ranges, in the order backward reaches them (`total`: the flat buffer's size).
  static std::vector<GradRegion> grad_regions(const Layers& layers, size_t total);
  // Declares every activation buffer of a step into `pb` (gpt_plan.cpp): the model's and each layer's, with
  // their lives; then, with planned gradients, one fixed buffer per range of grad_regions (plan ids
  // pb.num_slots() on).
  static void declare_plan(Layers& layers, int64_t C, DType dtype, GradMemory grads, size_t total, Acts& acts,
                           PlanBuilder& pb);
  // The values the layers read in this step.
  StepEnv step_env();
  // The step's events as they run: begin_step() starts a forward, at(event) marks each op before it runs
  // (checking the plan's order), and in the debug mode poisons the buffers that died and checks those born.
  void begin_step();
  void at(int event);
  void poison(int id);
  void check_unborn(int id);
  // Moves the open profiler ranges to those of `event`: closes the op, layer and phase ranges that end there
  // and opens the new ones. The end of the step closes them all.
  void ranges_to(int event);
  void range_push(const char* name);
  void range_pop();
  // Closes the open ranges when a forward returns (with or without targets) or throws.
  struct RangesCloser {
    Gpt& model;
    ~RangesCloser() { model.ranges_to(model.end_event()); }
  };
  int end_event() const;
  // The input of block l: the embedding's output, or block l-1's.
  Tensor block_input(int l, int64_t N) const;

  ModelConfig cfg_;
  std::unique_ptr<Context> owned_ctx_;
  Context* ctx_;
  DType dtype_;
  ParamBuffer params_;
  std::unique_ptr<Layers> layers_;
  Clock clock_;
  GradMemory grad_memory_ = GradMemory::Own;
  std::vector<GradRegion> grad_regions_;  // planned gradients: the ranges, by birth
  std::vector<int> grad_ids_;             // and their plan buffers
  size_t next_grad_zero_ = 0;             // the next range a pending zero_grad zeroes
  bool zero_pending_ = false;             // planned gradients: zero_grad() was called since the last backward

  Arena arena_;
  Acts acts_;
  MemoryPlan plan_;
  PlanDebug debug_ = plan_debug_from_env();
  std::vector<int> by_death_, by_birth_;  // the buffers that die within a step, by last and by first event
  size_t next_death_ = 0, next_birth_ = 0;
  int event_ = -1;  // the event the step has reached (-1: before its start)
  Tracer* tracer_ = nullptr;
  int range_phase_ = 0;      // the open ranges: phase 0 none, 1 forward, 2 backward
  std::string range_group_;  // the open layer range ("layer 3"; empty: none)
  bool range_op_open_ = false;
  std::vector<size_t> live_bytes_;  // the plan's live bytes at each event (the trace's memory counter)
  Tensor loss_;
  int B_ = 0, T_ = 0;
  int64_t planned_N_ = 0;
  int plans_made_ = 0;
  uint64_t dropout_seed_ = 0;  // dropout of the last forward (0 probability when off)
  float dropout_p_ = 0.0f;
  float attn_dropout_p_ = 0.0f;  // attention dropout of the last forward (0 when off)
  float label_smoothing_ = 0;
  std::optional<double> fused_loss_grad_scale_;  // the last forward wrote d_logits with this scale
  bool has_targets_ = false;
  GradReadyHook grad_ready_;
};

}  // namespace tessera
