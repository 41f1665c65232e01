// tessera/models/encdec_config.h — EncDecConfig, the description of an encoder-decoder transformer (the
// Transformer of "Attention Is All You Need" as fairseq trains it, and Hugging Face BART), and its presets.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "tessera/nn/block.h"
#include "tessera/nn/kinds.h"
#include "tessera/ops/activation/activation.h"

namespace tessera {

struct EncDecConfig {
  std::string preset = "custom";
  int vocab = 256;    // the target vocabulary (the logits' width)
  int src_vocab = 0;  // the source vocabulary; 0: vocab (required when the embeddings are shared)
  int enc_layers = 2, dec_layers = 2;
  int d_model = 128;
  int n_heads = 4;
  int n_kv_heads = 0;  // key/value heads of every attention, dividing n_heads; 0: n_heads
  int d_ff = 512;
  int max_seq = 128;                                  // positions of the source and of the target
  NormPlacement placement = NormPlacement::Post;      // Pre: fairseq's --*-normalize-before, with final norms
  Activation act = Activation::Relu;                  // Relu, Gelu (tanh form) or GeluErf (BART's exact GELU)
  PositionKind positions = PositionKind::Sinusoidal;  // Sinusoidal or Learned
  int pos_offset = 0;                                 // rows of a learned position table before position 0 (BART: 2)
  bool scale_embedding = true;                        // token embeddings times sqrt(d_model)
  bool layernorm_embedding = false;                   // a LayerNorm after each embedding (BART)
  bool shared_embeddings = true;                      // one token table for source and target
  bool tied_output = true;                            // the output projection is the target token table
  float dropout = 0.1f;                               // embeddings and every sublayer's output
  float attn_dropout = 0.0f;                          // on the attention probabilities
  float act_dropout = 0.0f;                           // after the MLP's activation
  int pad_id = 1, bos_id = 0, eos_id = 2, decoder_start_id = 2;
  float norm_eps = 1e-5f;
  // The standard deviation of the normal draw of every weight matrix and unscaled embedding table at init
  // (BartConfig's init_std). BART's 0.02 suits its width; a narrow model needs about d_model^-1/2, or its
  // attention logits start so flat that the alignment a task needs is learned late.
  float init_std = 0.02f;

  int head_dim() const { return d_model / n_heads; }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int source_vocab() const { return src_vocab > 0 ? src_vocab : vocab; }
  float emb_scale() const;
  // Throws Error "config: ..." with a one-line reason for an impossible config.
  void validate() const;
};

// "transformer-base" (6+6, 512, 8 heads, 2048: post-norm, ReLU, sinusoidal), "transformer-big" (6+6, 1024, 16,
// 4096), "bart-base" (BartForConditionalGeneration's facebook/bart-base shape: 6+6, 768, 12, 3072, post-norm, GELU,
// learned positions at offset 2, layernorm_embedding) and "tiny" (2+2, 64 wide, 4 heads, 256, BART's form without
// dropout: a model for tests that learns make-task reverse in a couple of CPU minutes).
EncDecConfig encdec_preset(std::string_view name);
std::vector<std::string> encdec_preset_names();

}  // namespace tessera
