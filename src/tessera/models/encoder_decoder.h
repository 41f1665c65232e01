// tessera/models/encoder_decoder.h — EncoderDecoder: the encoder-decoder transformer, composed of the nn layers.
//
//   encoder: e = Embed_src(src) [LayerNorm_emb],  x_{l+1} = EncoderBlock_l(x_l) (self-attention over the source,
//            source padding masked by key lengths),  m = x_L [final norm, pre-norm]
//   decoder: h = Embed_tgt(tgt_in) [LayerNorm_emb],  h_{l+1} = DecoderBlock_l(h_l, m) (causal self-attention,
//            cross-attention over m with the same key lengths),  logits = [final norm] h_L Wᵀ
//   loss = mean over the target tokens that count of CE_ε(logits, tgt_out)  (label smoothing ε; a target equal to
//          pad_id, or at t >= tgt_lens[b], is ignored)
//
// Blocks are post-norm (the Transformer, BART) or pre-norm (fairseq's normalize-before, with a final norm on each
// side). The K and V projections of m for every decoder layer are one GEMM (CrossKvProjection: LightSeq's
// layer-batched cross-attention), its weights one parameter range. Shared embeddings: one token table reads both
// sides; tied: it is the output projection too.
//
// The interface is its own, not models/model.h's Model: a step takes a pair of sequences per row (source and
// target, each with its lengths), where Model's forward takes one (B, T) token batch; the parameters, gradients
// and the one-arena activation plan work as they do for Gpt. Gradients live in their own buffer (accumulated until
// zero_grad()). Activations: one MemoryPlan over the step's events, the encoder's buffers sized for B*Ts tokens and
// the decoder's for B*Tt, planned once for the largest batch seen.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tessera/core/arena.h"
#include "tessera/core/context.h"
#include "tessera/models/encdec_config.h"
#include "tessera/models/hf_naming.h"
#include "tessera/models/model.h"
#include "tessera/nn/param_buffer.h"
#include "tessera/nn/step.h"

namespace tessera {

// A batch of B sentence pairs on the host, row-major, padded: sources (B, Ts) and targets (B, Tt). tgt_in is what
// the decoder reads (decoder_start_id, y_0, y_1, ...), tgt_out what it predicts (y_0, y_1, ..., eos_id); null
// tgt_out: a forward without a loss. Lengths in [1, Ts] and [1, Tt]; positions past them are padding.
struct Seq2SeqBatch {
  int B = 0, Ts = 0, Tt = 0;
  const int32_t* src = nullptr;
  const int32_t* src_lens = nullptr;
  const int32_t* tgt_in = nullptr;
  const int32_t* tgt_out = nullptr;
  const int32_t* tgt_lens = nullptr;
};

class EncoderDecoder {
 public:
  // On ctx's device computing in `dtype` (f32 or f64 on the CPU; f32, bf16, f16 on a GPU); ctx must outlive it.
  EncoderDecoder(const EncDecConfig& cfg, Context& ctx, DType dtype = DType::F32);
  ~EncoderDecoder();
  EncoderDecoder(const EncoderDecoder&) = delete;
  EncoderDecoder& operator=(const EncoderDecoder&) = delete;

  const EncDecConfig& config() const { return cfg_; }
  Context& context() const { return *ctx_; }
  DType dtype() const { return dtype_; }
  ParamBuffer& params() { return params_; }
  const ParamBuffer& params() const { return params_; }
  // N(0, 0.02) weights (N(0, C^-1/2) token embeddings when scaled), zero biases and pad row, unit norm gains; each
  // tensor from its own Philox stream of `seed`.
  void init_weights(uint64_t seed);

  // Plans the activations for up to B sources of Ts tokens and targets of Tt (smaller batches reuse the plan).
  void reserve(int B, int Ts, int Tt);
  // Checks the batch (a bad id or length is an Error naming it), copies it in and runs the model; with targets
  // returns the mean loss.
  double forward(const Seq2SeqBatch& batch, const ForwardOptions& opt = {});
  // Accumulates into params().grad() the gradient of loss_scale * (mean loss of the last forward with targets).
  void backward(double loss_scale = 1.0);
  void zero_grad() { params_.zero_grad(*ctx_); }
  double read_loss() const;

  // The logits of the last forward, (B*Tt, logits_stride()) in the compute dtype; row b*Tt + t predicts
  // tgt_out[b, t].
  Tensor logits() const;
  int64_t logits_stride() const;
  std::vector<float> read_logits_row(int row) const;

  // Of the last forward, for the inference engine (infer/seq2seq_engine.h): decoder layer l's cross-attention K and
  // V from the one batched projection, each (B*Ts, KV) with row b*Ts + t, and the source lengths (B) int32, all on
  // the model's device; valid until the next forward.
  Tensor cross_k(int l) const;
  Tensor cross_v(int l) const;
  Tensor source_lens() const;

  // The step's events (the plan's time axis) and the plan's peak.
  const StepSchedule& schedule() const;
  size_t activation_peak() const { return arena_.capacity(); }
  int64_t plan_count() const { return plan_count_; }

 private:
  struct Layers;
  struct Acts;
  class Clock final : public StepClock {
   public:
    const StepSchedule* sched = nullptr;
    int last = -1;
    void at(int event) override;
  };
  void build();
  void check_batch(const Seq2SeqBatch& b) const;
  StepEnv env(int T) const;
  void run_encoder(const StepEnv& ee);
  void run_decoder(const StepEnv& ed);
  void backward_decoder(const StepEnv& ed, bool fused, double loss_scale);
  void backward_encoder(const StepEnv& ee);
  Tensor enc_input(int l, int64_t N) const;
  Tensor dec_input(int l, int64_t N) const;
  Tensor memory(int64_t N) const;

  EncDecConfig cfg_;
  Context* ctx_;
  DType dtype_;
  ParamBuffer params_;
  std::unique_ptr<Layers> layers_;
  std::unique_ptr<Acts> acts_;
  Arena arena_;
  mutable Clock clock_;
  int planned_B_ = 0, planned_Ts_ = 0, planned_Tt_ = 0;
  int64_t plan_count_ = 0;
  int B_ = 0, Ts_ = 0, Tt_ = 0;
  bool has_targets_ = false;
  float label_smoothing_ = 0.0f;
  std::optional<double> fused_scale_;
  float dropout_p_ = 0.0f, attn_dropout_p_ = 0.0f, act_dropout_p_ = 0.0f;
  uint64_t seed_ = 0;
};

}  // namespace tessera
