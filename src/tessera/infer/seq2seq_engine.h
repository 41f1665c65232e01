// tessera/infer/seq2seq_engine.h — the inference engine of the encoder-decoder (models/encoder_decoder.h): the
// encoder once per batch of sources, then one decoder step per target token over a self-attention KV cache, with
// greedy and beam search (infer/beam_search.h) on top.
//
// Encode: n <= batch sources run through the model's own forward (encoder, then the layer-batched cross K/V
//   projection of every decoder layer: ONE GEMM over the batch's source tokens, nn/cross_kv.h) with a one-token
//   target; the engine then reads each layer's cross K and V in place (EncoderDecoder::cross_k / cross_v). Every
//   decode row is reset to position 0, its next input token decoder_start_id.
// Rows: R = n x beams decode rows, row r = e * beams + i is beam i of source e (beam_search.h's layout). The cross
//   K/V of a beam is its entry's: the cross-attention of a step is ONE general attention call with B = n, Tq =
//   beams (the entry's beams as its queries, non-causal) and Tk = Ts, key_lens = the source lengths. Nothing is
//   copied per beam.
// Decode step (R rows, one token each, at the position pos[r] of the cache, all rows at the same position):
//   x = decode_embedding(token, pos) [LayerNorm_emb]; per decoder layer l:
//     post-norm: x = LN1(x + SelfAttn(x)); x = LN2(x + CrossAttn(x, m)); x = LN3(x + MLP(x))
//     pre-norm:  x = x + SelfAttn(LN1(x)); x = x + CrossAttn(LN2(x), m); x = x + MLP(LN3(x))
//   SelfAttn: qkv GEMM, kv_append at pos, attention_decode over the cache (slot table with beams), proj GEMM.
//   logits = [LN_f] x Wᵀ, (R, logits_stride()); then pos += 1 on the device.
// One set of activation buffers serves every layer; nothing is allocated per step. Learned positions (BART's offset
// included) read the model's table; sinusoidal ones the engine's own copy of the same table.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/infer/beam_search.h"
#include "tessera/infer/kv_cache.h"
#include "tessera/models/encoder_decoder.h"

namespace tessera {

struct Seq2SeqEngineOptions {
  int batch = 1;    // sources per encode
  int beams = 1;    // decode rows per source (beams > 1: the cache has a slot table)
  int max_src = 0;  // the longest source; 0: the model's max_seq
  int max_tgt = 0;  // decoder positions (cache length); 0: the model's max_seq (never more)
};

class Seq2SeqEngine {
 public:
  // The model must outlive the engine; its weights are read in place. Throws Error (one line) for options out of
  // range.
  Seq2SeqEngine(EncoderDecoder& model, const Seq2SeqEngineOptions& opt);
  ~Seq2SeqEngine();
  Seq2SeqEngine(const Seq2SeqEngine&) = delete;
  Seq2SeqEngine& operator=(const Seq2SeqEngine&) = delete;

  // Encodes 1 .. batch sources (each 1 .. max_src ids); rows() becomes n x beams, all at position 0 with input
  // token decoder_start_id.
  void encode(const std::vector<std::vector<int32_t>>& sources);
  int rows() const { return R_; }
  int entries() const { return n_; }
  int beams() const { return opt_.beams; }
  int batch() const { return opt_.batch; }
  const EncDecConfig& config() const { return cfg_; }
  int position() const { return pos_; }  // the position the next decode step's tokens take
  int max_tgt() const { return max_tgt_; }
  int vocab() const { return V_; }
  int64_t logits_stride() const { return ld_; }
  Context& context() const { return ctx_; }

  // The next step's input tokens, one per row: from the host, or (rows()) int32 on the device (no host sync).
  void set_tokens(const std::vector<int32_t>& tokens);
  void set_tokens(const Tensor& tokens);
  // Beam step: row r continues row parents[r] ((rows()) int32 on the device, rows of the same entry); no K or V
  // moves (the slot table). A no-op with beams == 1.
  void reorder(const Tensor& parents);
  // One decoder step over every row; logits (rows(), logits_stride()). Throws Error when position() == max_tgt().
  void decode();
  Tensor logits() const;
  std::vector<float> read_logits_row(int row) const;
  // The argmax of each row of the last logits, read to the host; also set as the next step's input tokens.
  std::vector<int32_t> greedy_tokens();

 private:
  struct Weights;
  struct Acts;
  void embed();
  void self_attention(int l, const Tensor& in);
  void cross_attention(int l, const Tensor& in);
  void mlp(int l, const Tensor& in);
  // x = norm(x + y) (post-norm) or x = x + y (pre-norm) after a sublayer of norm `k` (0-based) of layer l.
  void residual(int l, int k);
  const Tensor& sublayer_input(int l, int k);

  EncoderDecoder& model_;
  Context& ctx_;
  EncDecConfig cfg_;
  DType dtype_;
  Seq2SeqEngineOptions opt_;
  int S_ = 0, max_src_ = 0, max_tgt_ = 0, V_ = 0;
  int64_t ld_ = 0;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Acts> a_;
  KvCache cache_;
  Buffer acts_, sinusoid_;
  int n_ = 0, R_ = 0, Ts_ = 0, pos_ = 0;
};

// Greedy decoding of the sources (at most rows of the engine at once, in order): each output stops at EOS (not
// included) or after max_len[i] tokens. max_len[i] >= 1 and <= engine.max_tgt().
std::vector<std::vector<int32_t>> seq2seq_greedy(Seq2SeqEngine& engine,
                                                 const std::vector<std::vector<int32_t>>& sources,
                                                 const std::vector<int>& max_len);

// Beam search over one encoded batch of the sources (sources.size() <= the engine's batch; its beams = o.beams):
// Hugging Face generate(num_beams)'s sequences for an encoder-decoder (decoder_start_id stripped, EOS last where a
// hypothesis ended with it) and scores, best first, [source][j]. o.batch and o.vocab are set here; o.max_new_tokens
// <= engine.max_tgt().
std::vector<std::vector<BeamSequence>> seq2seq_beam(Seq2SeqEngine& engine,
                                                    const std::vector<std::vector<int32_t>>& sources,
                                                    BeamSearchOptions o);

}  // namespace tessera
