// Writes what tests/oracle/torch_oracle.py checks with PyTorch: for a tiny GPT-2-style and a tiny Llama-style
// model, the initial weights (Hugging Face names), a batch, tessera's logits and loss, every parameter gradient,
// and the weights after 3 AdamW steps (with gradient clipping and label smoothing). And the same for a small
// llama-gqa-small-shaped model (grouped-query attention), which tests/oracle/hf_check.py
// also continues greedily with `tessera generate`.
//   usage: tessera_oracle_dump OUT_DIR
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include "tessera/core/error.h"
#include "tessera/models/gpt.h"
#include "tessera/ops/optim/adamw.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/safetensors.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

constexpr int kB = 2, kT = 9;
constexpr float kLabelSmoothing = 0.1f, kLr = 1e-2f, kWeightDecay = 0.1f, kClip = 1.0f;

void dump(const std::string& dir, const ModelConfig& cfg, uint64_t seed) {
  fs::create_directories(dir);
  Gpt m(cfg);
  m.init_weights(seed);
  // Wider weights than the init so that every path, biases included, carries signal.
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (size_t i = 0; i < m.params().size(); ++i) m.params().host_data<float>()[i] += nd(rng);
  save_checkpoint(dir + "/init", m, nullptr);

  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab - 1);
  std::vector<int32_t> tokens(kB * kT), targets(kB * kT);
  for (auto& t : tokens) t = tok(rng);
  for (auto& t : targets) t = tok(rng);
  targets[4] = -1;  // ignored (the ignore index of a model without padding id)

  const double loss = m.forward(tokens.data(), targets.data(), kB, kT, {.label_smoothing = kLabelSmoothing});
  SafetensorsWriter batch;
  batch.add("tokens", DType::I32, {kB, kT}, tokens.data());
  batch.add("targets", DType::I32, {kB, kT}, targets.data());
  batch.add("logits", DType::F32, {kB, kT, cfg.vocab}, m.logits().as<float>());
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", loss);
  batch.set_metadata("loss", buf);
  batch.set_metadata("label_smoothing", std::to_string(kLabelSmoothing));
  batch.set_metadata("lr", std::to_string(kLr));
  batch.set_metadata("weight_decay", std::to_string(kWeightDecay));
  batch.set_metadata("clip", std::to_string(kClip));
  batch.set_metadata("norm_eps", std::to_string(cfg.norm_eps));
  batch.write(dir + "/batch.safetensors");

  m.zero_grad();
  m.backward(1.0);
  // The gradients, exported through the same name mapping as the weights.
  Gpt g(cfg);
  std::copy(m.params().host_grad<float>(), m.params().host_grad<float>() + m.params().size(),
            g.params().host_data<float>());
  save_checkpoint(dir + "/grads", g, nullptr);

  // Three AdamW steps on the same batch.
  std::vector<float> mom(m.params().size(), 0.0f), var(m.params().size(), 0.0f);
  for (int step = 1; step <= 3; ++step) {
    m.zero_grad();
    m.forward(tokens.data(), targets.data(), kB, kT, {.label_smoothing = kLabelSmoothing});
    m.backward(1.0);
    clip_grad_norm_ref(m.params().host_grad<float>(), m.params().size(), kClip);
    adamw_update_ref(
        {.lr = kLr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = kWeightDecay, .step = step},
        m.params().segments(), m.params().host_data<float>(), m.params().host_grad<float>(), mom.data(), var.data());
  }
  save_checkpoint(dir + "/after3", m, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tessera_oracle_dump OUT_DIR\n");
    return 2;
  }
  try {
    ModelConfig gpt2;
    gpt2.vocab = 37;
    gpt2.d_model = 16;
    gpt2.n_layers = 2;
    gpt2.n_heads = 2;
    gpt2.d_ff = 40;
    gpt2.max_seq = 12;
    ModelConfig llama = llama_style(gpt2);
    llama.d_ff = 24;
    llama.norm_eps = 1e-6f;
    dump(std::string(argv[1]) + "/gpt2", gpt2, 11);
    dump(std::string(argv[1]) + "/llama", llama, 12);
    // llama-gqa-small's shape (RMSNorm, SwiGLU, RoPE, untied, grouped KV heads: 2 query heads per key/value
    // head), with the small dims of the Llama above.
    ModelConfig gqa = model_preset("llama-gqa-small");
    gqa.vocab = llama.vocab;
    gqa.d_model = llama.d_model;
    gqa.n_layers = llama.n_layers;
    gqa.d_ff = llama.d_ff;
    gqa.max_seq = llama.max_seq;
    gqa.norm_eps = llama.norm_eps;
    gqa.n_heads = 4;
    gqa.n_kv_heads = 2;
    dump(std::string(argv[1]) + "/llama-gqa", gqa, 13);
  } catch (const Error& e) {
    std::fprintf(stderr, "tessera_oracle_dump: %s\n", e.what());
    return 2;
  }
  return 0;
}
