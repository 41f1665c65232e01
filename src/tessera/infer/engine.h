// tessera/infer/engine.h — the inference engine: a decoder-only Model run with a KV cache, a prefill of the prompts
// and a decode step of one new token per row, captured once as a CUDA graph on the GPU and replayed per token.
//
// The engine reads the model's weights in place, by segment name (the nn layers' pb.add names: "wte", "wpe",
// "h.<l>.ln1.w", "h.<l>.qkv.w", ..., "lnf.w", "lm_head"), and runs its own forward with the ops: it keeps nothing
// for a backward, so ONE set of activation buffers serves every layer, sized once for the largest prefill
// (batch x max_prompt rows) or the decode rows, whichever is more. Nothing is allocated per token.
//
// Rows: the cache has S = batch x beams slots. A prefill runs n <= S prompts (right-padded in an (n, T) batch, each
// with its own length) into rows 0 .. n-1; a decode step runs all S rows. With beams > 1 the cache has a slot
// table (attention_decode.h), and reorder(parents) makes row b a child of row parents[b] (no K or V moves).
//
// Prefill: embedding; per layer: norm, qkv GEMM, kv_append with Tq = T at positions 0 .. T-1 (RoPE of q and k
//   there), attention_forward (the general call) of q against strided views of the cache (causal, key_lens =
//   the lengths), proj, residual add, norm, MLP, residual add; then only row len_b - 1 of each sequence goes
//   through the final norm and the head: logits (n, V) with the model's row stride. pos[b] = len_b after it.
// Decode: decode_embedding at pos[b] (read on the device); per layer the same with Tq = 1 and attention_decode;
//   final norm and head: logits (S, V); greedy: the argmax of each row is the next step's input token; then
//   pos += 1 on the device. The host reads the new tokens through pinned memory, one stream sync a step.
// PDL (EngineOptions::pdl, on the GPU): from the first norm of the decode step to pos += 1, and over the prefill's
//   layers, the Context's pdl flag is set, so the ops' own kernels launch as programmatic dependents (cuda_util.cuh)
//   and overlap their launch with the kernel before; the library's (cuBLASLt) launch as always. decode_embedding
//   and the head of a prefill launch the ordinary way: what comes before them is the caller's work or a copy.
//   The results are the same bits either way.
// Supported: learned positions (GPT-2) or RoPE (Llama), LayerNorm or RMSNorm, GELU / ReLU / SwiGLU, with or
//   without biases, tied or not, grouped KV heads. Sinusoidal positions are refused (Engine::unsupported).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/infer/kv_cache.h"
#include "tessera/infer/sampler.h"
#include "tessera/models/model.h"

namespace tessera {

struct EngineOptions {
  int batch = 1;            // prompts per prefill
  int beams = 1;            // cache slots per prompt: S = batch x beams (beams > 1: with a slot table)
  int max_prompt = 0;       // the longest prompt a prefill takes; 0: max_seq
  int max_seq = 0;          // cache positions per slot; 0: the model's max_seq (never more)
  bool slot_table = false;  // a slot table even with beams == 1 (tests alias rows through it)
  bool cuda_graph = true;   // capture the decode step on the GPU (falls back to eager where capture fails)
  bool pdl = false;         // the GPU kernels of the decode step and the prefill's layers as programmatic
                            // dependents (Context::pdl): each launches while the one before it finishes. Off by
                            // default until tests/cuda/test_pdl_cuda.cpp and the engine's PDL tests pass on a GPU
};

// The bytes an engine holds beside nothing else: the weights (the model's parameters, read in place), the KV
// cache and the shared activation buffers.
struct EngineMemory {
  size_t weights = 0, cache = 0, buffers = 0;
};

class Engine {
 public:
  // The model must outlive the engine; its weights are not copied. Throws Error (one line) for a config the engine
  // does not run, or options out of range.
  Engine(Model& model, const EngineOptions& opt);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Why the engine cannot run `cfg`, or "" when it can.
  static std::string unsupported(const ModelConfig& cfg);
  // What an engine for (cfg, dtype, opt) holds, exactly as allocated.
  static EngineMemory memory(const ModelConfig& cfg, DType dtype, const EngineOptions& opt);
  EngineMemory memory() const;

  int rows() const { return S_; }
  // Row `row`'s cache length: the position its next input token takes.
  int position(int row) const { return host_pos_.at(static_cast<size_t>(row)); }
  int max_seq() const { return max_seq_; }
  int vocab() const { return V_; }
  int64_t logits_stride() const { return ld_; }
  KvCache& cache() { return cache_; }
  Context& context() const { return ctx_; }  // the model's

  // Runs the prompts (each 1 .. max_prompt tokens; at most rows() of them) into rows 0 .. n-1; the other rows are
  // reset to position 0. Logits (n, V) of each prompt's last token.
  void prefill(const std::vector<std::vector<int32_t>>& prompts);
  // The input tokens of the next decode step, one per row (rows() of them), from the host.
  void set_tokens(const std::vector<int32_t>& tokens);
  // The same from the device: tokens (rows()) i32 on the engine's device, copied on the stream (no host sync;
  // graph-capturable). Ids are not checked on the host: decode_embedding clamps them to the vocab on the GPU.
  void set_tokens(const Tensor& tokens);
  // One decode step over every row: the tokens set (or the last greedy step's) at each row's position; logits
  // (rows(), V). With greedy, each row's argmax becomes the next input token. Throws Error before running when a
  // row's position would pass max_seq.
  void decode(bool greedy);
  // One decode step (no greedy argmax) with the caller's work queued on the stream before it (a beam step's reorder
  // and token feed) and after it (the beam step over the new logits), all of which must be graph-capturable: on the
  // GPU the whole is one CUDA graph, captured on the second call after a prefill and replayed after. From one
  // prefill to the next, every call must queue the same work on the same tensors (a prefill drops the graph).
  void decode_with(const std::function<void()>& before, const std::function<void()>& after);
  // The argmax of each row of the last logits (prefill or decode), through pinned memory on the GPU; also sets them
  // as the next step's input tokens (the rows a prefill did not run keep theirs).
  std::vector<int32_t> greedy_tokens();
  // The input tokens the last greedy decode wrote (its argmax), read back to the host.
  std::vector<int32_t> read_tokens();
  // The next decode step's input tokens, (rows()) int32 on the model's device: a device sampler writes its draws
  // here (no host copy), read_tokens() reads them back.
  Tensor next_tokens() const;
  // Beam step: row b becomes a child of row parents[b] (S of them, host values; the device kernel does the work).
  void reorder(const std::vector<int32_t>& parents);
  // The same from the device: parents (rows()) i32 on the engine's device, queued on the stream (no host sync;
  // graph-capturable). The host cannot see the values, so each parents[b] must be a row at b's position (beam
  // search: a row of the same entry, whose rows all share one position): the positions the host knows stay.
  void reorder(const Tensor& parents);
  // Row `row` of the last logits as f32 on the host.
  std::vector<float> read_logits_row(int row) const;
  // The last logits: (rows of the last call, logits_stride()) on the model's device.
  Tensor logits() const;
  int last_rows() const { return last_rows_; }
  // How many decode steps replayed a captured graph, and how many graphs were captured (tests).
  int64_t graph_replays() const { return graph_replays_; }
  int64_t graph_captures() const { return graph_captures_; }
  bool graph_failed() const { return graph_failed_; }

 private:
  struct Weights;
  struct Acts;
  // Queues the layers and the head for n rows of T tokens (prefill: T > 1 or a prefill of one token; decode: T = 1
  // through attention_decode).
  void run_layers(int n, int T, bool decode);
  // The final norm and the head over n rows of the residual stream (`last`: (n, C)) into the logits.
  void run_head(const Tensor& last, int n);
  void enqueue_decode(bool greedy);
  // The step kinds, each with its own graph: decode(false), decode(true), decode_with.
  static constexpr int kStepPlain = 0, kStepGreedy = 1, kStepWith = 2;
  void run_step(int kind, const std::function<void()>& before, const std::function<void()>& after);
  void read_tokens_to(int n, int32_t* host);

  Model& model_;
  Context& ctx_;
  ModelConfig cfg_;
  DType dtype_;
  EngineOptions opt_;
  int S_ = 0, max_seq_ = 0, max_prompt_ = 0, V_ = 0;
  int64_t ld_ = 0;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Acts> a_;
  KvCache cache_;
  Buffer acts_;
  PinnedStaging pinned_;
  CudaGraph graph_[3];  // [kind]
  int64_t graph_scratch_[3] = {-1, -1, -1};
  int eager_steps_[3] = {0, 0, 0};
  bool graph_failed_ = false;
  int64_t graph_replays_ = 0, graph_captures_ = 0;
  std::vector<int> host_pos_;  // each row's position as the host knows it (the bound on the device's)
  int last_rows_ = 0;
};

// Appends max_new tokens to `tokens` with a batch-1 engine whose prompts take max_seq tokens: what generate()
// (sampler.h) gives for the same params, token for token. The prompt (its last max_seq tokens) runs as one prefill,
// each new token as one decode step; once the context fills the cache, each token is drawn from a prefill of the
// last max_seq tokens (generate()'s sliding context). Greedy (temperature 0) takes the argmax on the device;
// otherwise the logits row is sampled on the host with sample_token, draw i for the i-th new token. on_token sees
// each new token as soon as it is drawn.
std::vector<int32_t> engine_generate(Engine& engine, std::vector<int32_t> tokens, int max_new, const SamplerParams& p,
                                     const std::function<void(int32_t)>& on_token = {});

}  // namespace tessera
