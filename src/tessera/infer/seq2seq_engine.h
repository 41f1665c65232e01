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
//   SelfAttn: qkv product, kv_append at pos, attention_decode over the cache (slot table with beams), proj product.
//   logits = [LN_f] x Wᵀ, (R, logits_stride()); then pos += 1 on the device.
// Its form on the GPU: every product through decode_linear (gemv up to kDecodeGemvRows rows, the fc's bias and
//   activation in its epilogue; the GEMM above); each residual add fused with the norm that reads its sum
//   (norm_residual_forward: post-norm, the sublayer's own norm; pre-norm, the next sublayer's norm or LN_f), the
//   stream alternating between two buffers; and the whole step one CUDA graph (Seq2SeqEngineOptions::cuda_graph),
//   with the caller's beam step inside it through decode_with. The CPU runs the same ops' references.
// One set of activation buffers serves every layer; nothing is allocated per step. Learned positions (BART's offset
// included) read the model's table; sinusoidal ones the engine's own copy of the same table.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/infer/beam_search.h"
#include "tessera/infer/kv_cache.h"
#include "tessera/models/encoder_decoder.h"

namespace tessera {

struct Seq2SeqEngineOptions {
  int batch = 1;            // sources per encode
  int beams = 1;            // decode rows per source (beams > 1: the cache has a slot table)
  int max_src = 0;          // the longest source; 0: the model's max_seq
  int max_tgt = 0;          // decoder positions (cache length); 0: the model's max_seq (never more)
  bool cuda_graph = false;  // replay the decode step as a CUDA graph on the GPU (eager where capture fails); off by
                            // default until the graph tests of test_seq2seq_engine_cuda.cpp pass on a GPU
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
  // The same step with the caller's work queued on the stream before it (a beam step's reorder and token feed) and
  // after it (the beam step over the new logits), all of which must be graph-capturable (no host copy or sync): on
  // the GPU the whole is one CUDA graph, captured on the second call after an encode and replayed after. From one
  // encode to the next, every call must queue the same work on the same tensors (an encode drops the graph).
  void decode_with(const std::function<void()>& before, const std::function<void()>& after);
  Tensor logits() const;
  std::vector<float> read_logits_row(int row) const;
  // The argmax of each row of the last logits, read to the host; also set as the next step's input tokens.
  std::vector<int32_t> greedy_tokens();
  // How many decode steps replayed a captured graph, and how many graphs were captured (tests).
  int64_t graph_replays() const { return graph_replays_; }
  int64_t graph_captures() const { return graph_captures_; }
  bool graph_failed() const { return graph_failed_; }

 private:
  struct Weights;
  struct Acts;
  // The step kinds, each with its own graph: decode() and decode_with().
  static constexpr int kStepPlain = 0, kStepWith = 1;
  void run_step(int kind, const std::function<void()>& before, const std::function<void()>& after);
  void enqueue_step();
  void embed();
  void self_attention(int l, const Tensor& in);
  void cross_attention(int l, const Tensor& in);
  void mlp(int l, const Tensor& in);
  // The residual stream (x or x2 of Acts) and the other half, which the next fused add writes.
  const Tensor& stream() const;
  const Tensor& stream_other() const;
  // Sublayer k's input: the stream itself (post-norm) or its norm_k, which h holds (pre-norm).
  const Tensor& sublayer_input() const;
  // After sublayer k (0-based) of layer l, its output in y: post-norm, stream = LN_k(stream + y); pre-norm,
  // stream += y and h = the next norm of the new stream (layer l's LN_{k+1}, layer l+1's LN_1, or LN_f). One
  // norm_residual_forward into the other half of the stream, which becomes the stream.
  void add_norm(int l, int k);
  void drop_graphs(bool all);

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
  int cur_ = 0;  // the stream's half: 0 x, 1 x2 (host state of the step as it is queued)
  // What a decode() graph froze that an encode may change: n, Ts, and the addresses of every layer's cross K and V
  // and of the source lengths. An encode that changes it drops that graph.
  std::vector<uintptr_t> graph_key_;
  CudaGraph graph_[2];  // [kind]
  int64_t graph_scratch_[2] = {-1, -1};
  int eager_steps_[2] = {0, 0};
  bool graph_failed_ = false;
  int64_t graph_replays_ = 0, graph_captures_ = 0;
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
