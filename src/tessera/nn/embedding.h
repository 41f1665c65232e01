// tessera/nn/embedding.h — token embedding, positions, scale and dropout, in one op (ops/embedding):
//
//   out[b,t,:] = Drop(scale * wte[tokens[b,t], :] + pos[t, :])
//
// pos: the learned table wpe (pos_offset + max_seq, C) in the ParamBuffer, position t reading row pos_offset + t
// (BART's learned positions start at row 2), a fixed sinusoidal table the layer keeps on the
// device (PE[pos, 2i] = sin(pos / 10000^(2i/C)), PE[pos, 2i+1] = cos(...)), or none (RoPE rotates inside the
// attention). tokens: (B*T) int32; out: (B*T, C). wte (V, C) is also the LM head of a tied model.
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/buffer.h"
#include "tessera/core/philox.h"
#include "tessera/nn/kinds.h"
#include "tessera/nn/step.h"
#include "tessera/ops/embedding/embedding.h"

namespace tessera {

struct EmbeddingShape {
  int V = 0, C = 0, max_seq = 0;
  PositionKind positions = PositionKind::Learned;
  float scale = 1.0f;
  int padding_id = -1;
  int pos_offset = 0;  // rows of a learned table before position 0 (BART: 2); 0 for other positions
};

class Embedding {
 public:
  // prefix: "" gives the segments "wte" and "wpe" (both with weight decay) and the output "res.0".
  Embedding(std::string prefix, const EmbeddingShape& s) : prefix_(std::move(prefix)), s_(s) {}
  // shared_wte: the offset of another embedding's token table to read (and add gradients to) instead of a table
  // of its own (an encoder-decoder's shared source and target embeddings); kNoParam: its own.
  void add_params(ParamBuffer& pb, size_t shared_wte = kNoParam);
  // The sinusoidal table on ctx's device, in `dtype` (f64 for an f64 model, else rounded from f32). A no-op for
  // other positions.
  void make_tables(DType dtype, Context& ctx);
  size_t wte_offset() const { return wte_; }
  int64_t wte_numel() const { return int64_t{s_.V} * s_.C; }

  void schedule_forward(StepSchedule& s) { fwd_ = s.add(Phase::Forward, "", {"embedding"}); }
  void schedule_backward(StepSchedule& s) { bwd_ = s.add(Phase::Backward, "", {"embedding"}); }
  int forward_event() const { return fwd_; }
  int backward_event() const { return bwd_; }
  // The output, read last at `out_death` (the backward of the first layer's norm).
  void declare(PlanBuilder& pb, DType dtype, int out_death);
  Tensor out(int64_t N) const { return rows(out_, N, s_.C); }

  // The host-side check of a batch's token ids: a bad id is an Error here, before it reaches a kernel.
  void check_tokens(const int32_t* tokens, int B, int T) const;
  // Takes the dropout stream of this step from `rng` when dropout is on.
  void draw_streams(RngState* rng, bool dropout_on) { stream_ = dropout_on ? rng->take() : 0; }
  void forward(const StepEnv& env, const Tensor& tokens) const;
  // d_wte (and d_wpe) += the gradient of d_out, the gradient of out.
  void backward(const StepEnv& env, const Tensor& d_out, const Tensor& tokens) const;

 private:
  EmbeddingParams params(const StepEnv& env) const;
  int table_rows() const;  // rows of the position table (learned: pos_offset + max_seq)
  std::string prefix_;
  EmbeddingShape s_;
  size_t wte_ = kNoParam, wpe_ = kNoParam;
  Buffer sinusoid_;
  DType table_dtype_ = DType::F32;
  int fwd_ = -1, bwd_ = -1;
  uint64_t stream_ = 0;
  Tensor out_;
};

}  // namespace tessera
