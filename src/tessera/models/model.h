// tessera/models/model.h — Model: what train/, dist/, infer/, bench/ and checkpoints see of a model.
//
// A model owns one ParamBuffer (parameters, gradients, f32 master weights for 16-bit models), runs an explicit
// forward and backward on a batch of tokens already in its input buffers, and lays out its activations in one arena
// planned per (B, T). The interface is virtual: a step makes a few calls (zero_grad, forward, backward) and each
// does all of its work inside the model, so the dispatch costs nothing per element. make_model() builds the model
// a config describes.
//
// The questions asked of a config before (or without) building its model — the size of its flat buffers, its
// parameter table, its activation plan and peak, its logits row stride, its step's events — are free functions
// below, taking the config.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/philox.h"
#include "tessera/core/planner.h"
#include "tessera/core/trace.h"
#include "tessera/models/config.h"
#include "tessera/models/gpt_plan.h"
#include "tessera/models/hf_naming.h"
#include "tessera/nn/param_buffer.h"

namespace tessera {

// Where a model keeps its gradients (Model::set_grad_memory).
enum class GradMemory {
  // A buffer of their own, kept across forwards: backward() adds into it until zero_grad(). Gradient accumulation
  // over micro-batches needs this; it is the default.
  Own,
  // Planned in the activation arena, at the same offsets (still one contiguous range, so the optimizer, the
  // all-reduce and ZeRO's shards see no difference): the ranges of the final norm and head, of each layer and of
  // the embeddings are fixed buffers of the plan, each born at the first backward op that writes it (and zeroed
  // there) and living to the end of the step. Activations use that memory before then, as PyTorch reuses the
  // memory of dead activations for the gradients it allocates during backward. Every forward overwrites the
  // gradients, so a backward needs a zero_grad() since the last backward, and they hold until the next forward.
  Planned,
};
// What training uses: planned gradients, unless it accumulates them over micro-batches.
inline GradMemory train_grad_memory(int accum) { return accum > 1 ? GradMemory::Own : GradMemory::Planned; }

struct ForwardOptions {
  bool training = false;  // dropout on
  float label_smoothing = 0.0f;
  RngState* rng = nullptr;  // dropout streams are taken from here when training with dropout > 0
  // Set when backward(*loss_grad_scale) follows this forward (a training step): the forward then also writes the
  // loss gradient over the logits (cross_entropy_forward_backward: the logits read once and written once, where a
  // forward's loss and the backward's gradient read them twice), and backward() starts from it. The logits are
  // gone after such a forward.
  std::optional<double> loss_grad_scale = std::nullopt;
};

class Model {
 public:
  Model() = default;
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  virtual const ModelConfig& config() const = 0;
  virtual Context& context() const = 0;
  virtual DType dtype() const = 0;  // the compute dtype
  // Parameters, gradients and master weights, in one segment table.
  virtual ParamBuffer& params() = 0;
  virtual const ParamBuffer& params() const = 0;
  // The model's initialisation, every tensor drawn from its own Philox stream of `seed`.
  virtual void init_weights(uint64_t seed) = 0;

  // Plans the activations for up to B*T tokens (a smaller B*T reuses the plan).
  virtual void reserve(int B, int T) = 0;
  // The model's input buffers, (B*T) int32 on its device, for a caller that copies a batch in itself.
  virtual Tensor tokens_buffer(int B, int T) = 0;
  virtual Tensor targets_buffer(int B, int T) = 0;
  // Runs the model on the tokens (and targets) already in the input buffers. With targets, the mean cross-entropy
  // over non-ignored targets goes into loss(), on the device.
  virtual void forward_device(int B, int T, bool with_targets, const ForwardOptions& opt) = 0;
  // Host convenience: copies tokens (B*T) and targets (or null) in, runs forward_device and, with targets, returns
  // the mean loss (one device-to-host copy); without, 0.
  virtual double forward(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt) = 0;
  // The same without reading the loss back (loss() holds it, on the device).
  virtual void forward_async(const int32_t* tokens, const int32_t* targets, int B, int T,
                             const ForwardOptions& opt) = 0;
  // The host-side check of a batch's token ids that forward_async makes before its copy: a bad id is an Error.
  virtual void check_tokens(const int32_t* tokens, int B, int T) const = 0;
  // The mean loss of the last forward with targets: a device scalar in the stat dtype (f32; f64 in an f64 model).
  virtual Tensor loss() const = 0;
  virtual double read_loss() const = 0;

  // Accumulates into params().grad() the gradient of loss_scale * (mean loss of the last forward), which must have
  // had targets.
  virtual void backward(double loss_scale = 1.0) = 0;
  virtual void zero_grad() = 0;
  // Moves the gradients (their values are lost); call it between steps.
  virtual void set_grad_memory(GradMemory where) = 0;
  virtual GradMemory grad_memory() const = 0;
  // Called during backward() each time a range [begin, end) of the flat gradient buffer (elements, padding
  // included) holds its final gradient for this backward. The ranges descend and together cover the buffer once.
  // On a GPU the kernels that wrote a range are queued on the context's stream, not finished. Data-parallel
  // training (dist/) starts reducing a range here while backward goes on. An empty function: no calls.
  using GradReadyHook = std::function<void(size_t begin, size_t end)>;
  virtual void set_grad_ready_hook(GradReadyHook hook) = 0;

  // Logits of the last forward, in the compute dtype, on the device: (B*T, logits_stride()).
  virtual Tensor logits() const = 0;
  virtual int64_t logits_stride() const = 0;
  // Row `row` of the logits as f32 on the host (sampling).
  virtual std::vector<float> read_logits_row(int row) const = 0;
  virtual int last_B() const = 0;
  virtual int last_T() const = 0;

  // The plan: its arena's peak, how many plans were made (generation must not re-plan per token), the tokens
  // planned for, the plan itself, and its debug settings (gpt_plan.h; they take effect at the next plan).
  virtual size_t activation_peak() const = 0;
  virtual int64_t plan_count() const = 0;
  virtual int64_t planned_tokens() const = 0;
  virtual const MemoryPlan& current_plan() const = 0;
  virtual void set_plan_debug(const PlanDebug& debug) = 0;
  virtual const PlanDebug& plan_debug() const = 0;

  // Profiling ranges (NVTX, and with a tracer slices of its Chrome trace). Null stops recording.
  virtual void set_tracer(Tracer* tracer) = 0;

  // Hugging Face naming: the tensors a checkpoint writes, each a range of one parameter segment (hf_naming.h).
  virtual std::vector<ExportTensor> hf_tensors() const { return checkpoint_layout(config(), params()); }
};

// The model `cfg` describes, on ctx's device computing in `dtype` (the context must outlive it). master: whether a
// 16-bit model keeps f32 master weights.
std::unique_ptr<Model> make_model(const ModelConfig& cfg, Context& ctx, DType dtype = DType::F32,
                                  MasterWeights master = MasterWeights::On);
// A CPU model with a context of its own (the reference engine, and a checkpoint loaded before it moves).
std::unique_ptr<Model> make_model(const ModelConfig& cfg, DType dtype = DType::F32);

// The elements of the flat parameter buffers of `cfg`, padding included (params().size() of its model), without
// making one: what ZeRO-1 shards.
size_t model_flat_params(const ModelConfig& cfg);
// The parameter segments of `cfg` (names, shapes, offsets) added to an empty `pb`, nothing allocated: what a
// checkpoint check reads without building the model.
void model_describe_params(const ModelConfig& cfg, ParamBuffer& pb);
// The activation plan for (B, T): every buffer with its life (in events of the step) and offset, the planned peak.
// With GradMemory::Planned the gradients are in it too.
MemoryPlan model_activation_plan(const ModelConfig& cfg, int B, int T, DType dtype = DType::F32,
                                 const PlanDebug& debug = {}, GradMemory grads = GradMemory::Own);
// Its planned peak: the bytes of the arena.
size_t model_activation_bytes(const ModelConfig& cfg, int B, int T, DType dtype = DType::F32,
                              GradMemory grads = GradMemory::Own);
// The row stride of the logits buffer of `cfg` in `dtype` (V, or V padded to a multiple of 64 for 16-bit models).
int64_t model_logits_stride(const ModelConfig& cfg, DType dtype);
// Whether the MLP's GELU runs inside the fc GEMM's epilogue (bf16 / f16 with biases).
bool model_fuses_gelu(const ModelConfig& cfg, DType dtype);

// The events of a step of `cfg` (the plan's time axis): how many (the last is the end of the step), the first of
// the backward, and each one's name ("forward layer 3 qkv").
int model_step_events(const ModelConfig& cfg);
int model_backward_first_event(const ModelConfig& cfg);
std::string model_step_event_name(const ModelConfig& cfg, int event);

}  // namespace tessera
