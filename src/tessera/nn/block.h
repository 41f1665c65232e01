// tessera/nn/block.h — a transformer block: self-attention, optional cross-attention, and an MLP, each a stage
// of norm + sublayer + residual add, pre-norm or post-norm.
//
//   pre-norm:   x_{k+1} = x_k + Drop(sub_k(Norm_k(x_k)) + b_k)
//   post-norm:  x_{k+1} = Norm_k(x_k + Drop(sub_k(x_k) + b_k))
//
// with stages k = self-attention, [cross-attention], MLP. An encoder block's self-attention is not causal, a
// decoder's is; a decoder block with cross-attention attends over the encoder's output in its middle stage.
//
// Every residual add runs fused with the norm that reads its output (Norm::residual_forward): in a pre-norm block
// the add of stage k computes Norm_{k+1}, and the block's last add computes the norm of whatever reads the block
// (the next block's first norm, or the final norm: set_next_norm). That op's backward (the reader's norm backward)
// runs the add's backward along (output_residual_backward), and this block's first norm is likewise computed by
// the block before it (set_producer), whose residual backward its norm backward runs. These are the same kernels
// and launches, per block, as one fused model would make.
//
// Shapes: the stream x (N, C) in the compute dtype. Buffers: each norm's output and statistics, the sums between
// the stages ("mid"), the output, and the gradient temporaries d_tmp (d of a sublayer's output) and d_ln (d of a
// sublayer's input). The sublayers' outputs go to a buffer of the model's (`tmp`), shared by every block's
// forward.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/nn/attention.h"
#include "tessera/nn/kinds.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/norm.h"

namespace tessera {

enum class NormPlacement { Pre, Post };
enum class BlockKind { Encoder, Decoder, DecoderCross };

struct BlockShape {
  BlockKind kind = BlockKind::Decoder;
  NormPlacement placement = NormPlacement::Pre;
  AttentionShape attention;                     // its `causal` is set from the kind
  CrossKvSource cross_kv = CrossKvSource::Own;  // a DecoderCross block's K and V
  MlpShape mlp;
  NormKind norm = NormKind::LayerNorm;
  float norm_eps = 1e-5f;
};

class CrossAttention;

class Block {
 public:
  // prefix "h.0." names its parameters and buffers; group "layer 0" its events.
  Block(std::string prefix, std::string group, const BlockShape& s);
  ~Block();
  Block(Block&&) noexcept;
  void add_params(ParamBuffer& pb);
  size_t param_begin() const { return param_begin_; }
  size_t param_end() const { return param_end_; }

  // Wiring (before scheduling): the norm that reads this block's output (needed by a pre-norm block), and the
  // pre-norm block whose last residual op computes this block's first norm (null: this block runs it).
  void set_next_norm(const Norm* norm) { next_norm_ = norm; }
  void set_producer(const Block* block) { producer_ = block; }
  // The norm a pre-norm block starts with (the one a producer computes).
  const Norm& input_norm() const { return stages_.front().norm; }
  // A decoder with cross-attention: the encoder output it attends over, (B * Tk, C), and its gradient (added to).
  CrossAttention* cross_attention() const { return cross_; }
  // Each step's key lengths of the self-attention ((B) int32 on the device; an encoder's source lengths), or
  // undefined: every key.
  void set_key_lens(const Tensor& key_lens) { self_->set_key_lens(key_lens); }

  void schedule_forward(StepSchedule& s);
  void schedule_backward(StepSchedule& s);
  // The block's last forward event (its output's residual add) and the last event that reads its input.
  int output_event() const { return stages_.back().res_event; }
  // The first event that writes the model's `tmp` (the first sublayer's last forward op).
  int sublayer_output_event() const { return stages_.front().res_event - 1; }
  int input_last_use() const;
  int backward_begin() const { return bwd_; }
  // The first event that writes one of the block's gradients (planned gradients are zeroed there).
  int first_grad_event() const;
  // Declares the block's buffers; its output (pre-norm: `out_name`; post-norm: the last norm's output) is read
  // last at `out_death`.
  void declare(PlanBuilder& pb, DType dtype, const std::string& out_name, int out_death);
  Tensor out(int64_t N) const;

  void draw_streams(RngState* rng, bool dropout_on, bool attn_dropout_on, bool act_dropout_on = false);
  // x: the block's input (N, C); tmp: (N, C) scratch of the model.
  void forward(const StepEnv& env, const Tensor& x, const Tensor& tmp) const;
  // d_res: the gradient of the block's output on entry (pre-norm: as the reader's fused norm backward left it),
  // of its input on return.
  void backward(const StepEnv& env, const Tensor& d_res, const Tensor& x) const;
  // The backward of the block's last residual add, for the reader's norm backward to run along.
  NormResidualBackward output_residual_backward(const StepEnv& env) const;

 private:
  struct Stage {
    std::string name;  // "attn", "cross", "mlp"
    Norm norm;
    std::unique_ptr<Sublayer> sub;
    uint64_t stream = 0;  // the residual add's dropout stream
    int res_event = -1, norm_event = -1, norm_bwd_event = -1;
    Tensor mid;  // pre-norm: x_k for k >= 1 (the stage's input); post-norm: the sum before the norm
  };
  bool pre() const { return s_.placement == NormPlacement::Pre; }
  ResidualParams residual_params(const StepEnv& env, const Stage& st) const {
    return {.N = env.N(), .C = s_.attention.C, .dropout = env.dropout, .seed = env.seed, .stream = st.stream};
  }
  Tensor stage_input(size_t k, const Tensor& x, int64_t N) const;
  void backward_post(const StepEnv& env, const Tensor& d_res, const Tensor& x) const;
  std::string prefix_, group_;
  BlockShape s_;
  std::vector<Stage> stages_;
  SelfAttention* self_ = nullptr;    // owned by its stage
  CrossAttention* cross_ = nullptr;  // owned by its stage
  const Norm* next_norm_ = nullptr;
  const Block* producer_ = nullptr;
  size_t param_begin_ = 0, param_end_ = 0;
  int bwd_ = -1;
  Tensor out_, d_tmp_, d_ln_;
};

}  // namespace tessera
