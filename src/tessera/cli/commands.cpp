#include "tessera/cli/commands.h"

#include <cstdio>
#include <filesystem>
#include <string>

#include "tessera/cli/args.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/infer/sampler.h"
#include "tessera/models/gpt.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/trainer.h"

#ifndef TESSERA_DEFAULT_CORPUS
#define TESSERA_DEFAULT_CORPUS "data/corpus.txt"
#endif

namespace tessera::cli {

namespace fs = std::filesystem;

namespace {

std::string dashed(std::string s) {
  for (char& c : s)
    if (c == '_') c = '-';
  return s;
}

// --preset plus one flag per ModelConfig field.
std::vector<FlagSpec> model_flags() {
  std::vector<FlagSpec> f{{"preset", "NAME", "model preset: tiny, gpt2-124m, cs336-small|medium|large|xl|2.7b (default tiny)"}};
  for (const auto& field : model_config_fields()) f.push_back({dashed(field), "V", "override the preset's " + field});
  return f;
}

ModelConfig model_from_args(const Args& a) {
  ModelConfig cfg = model_preset(a.str("preset", "tiny"));
  for (const auto& field : model_config_fields()) {
    if (a.has(dashed(field))) model_config_set(cfg, field, a.str(dashed(field)));
  }
  cfg.validate();
  return cfg;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.3fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

std::vector<int32_t> encode_prompt(const std::string& prompt, int vocab) {
  std::vector<int32_t> tokens;
  for (uint16_t t : byte_encode(prompt)) {
    TS_CHECK(t < vocab, "the prompt holds byte ", t, ", outside the model's vocab ", vocab);
    tokens.push_back(t);
  }
  return tokens;
}

}  // namespace

int cmd_train(int argc, char** argv) {
  std::vector<FlagSpec> specs = model_flags();
  const std::vector<FlagSpec> train_specs{
      {"data", "DIR|FILE", "token shards (default: the bundled corpus, prepared into OUT/data)"},
      {"out", "DIR", "output directory for metrics.jsonl and checkpoint/ (default runs/tiny)"},
      {"resume", "DIR", "continue from a training checkpoint directory"},
      {"steps", "N", "optimizer steps in total (default 1000; with --resume, the saved run's)"},
      {"batch", "N", "sequences per micro-batch (default 8)"},
      {"seq", "N", "tokens per sequence (default: the model's max_seq)"},
      {"accum", "N", "micro-batches per step, gradient accumulation (default 1)"},
      {"lr", "X", "peak learning rate (default 3e-3)"},
      {"warmup", "N", "linear warm-up steps (default 20)"},
      {"min-lr-ratio", "X", "final lr as a fraction of the peak, cosine decay (default 0.1)"},
      {"weight-decay", "X", "AdamW weight decay on matrices and embeddings (default 0.1)"},
      {"grad-clip", "X", "clip the global gradient norm, 0 = off (default 1.0)"},
      {"label-smoothing", "X", "cross-entropy label smoothing (default 0)"},
      {"seed", "N", "seed for init, dropout and data (default 1337)"},
      {"val-every", "N", "validation loss every N steps (default 100)"},
      {"val-batches", "N", "batches per validation (default 4)"},
      {"ckpt-every", "N", "checkpoint every N steps (default: at the end only)"},
      {"stop-after", "N", "stop with a checkpoint after step N, as if interrupted (resume later with --resume)"},
      {"sample-tokens", "N", "tokens to sample after training (default 300, 0 = none)"},
      {"prompt", "TEXT", "prompt for that sample (default \"The \")"},
      {"no-progress", "", "no progress bar"},
  };
  specs.insert(specs.end(), train_specs.begin(), train_specs.end());
  Args a("train", specs, argc, argv, 2);
  if (a.help()) {
    std::fputs(Args::usage("train", "Trains a GPT model. With no flags: the tiny preset on the bundled corpus, on the CPU\n"
                                     "(the CUDA path arrives with the CUDA backend).", specs).c_str(), stdout);
    return 0;
  }
  TrainOptions o;
  o.resume = a.str("resume");
  if (o.resume.empty()) {
    o.model = model_from_args(a);
  } else {
    // A resumed run continues the saved run: model and data flags would silently be ignored, so refuse them.
    for (const auto& f : model_flags())
      TS_CHECK(!a.has(f.name), "--", f.name, " cannot be combined with --resume (the checkpoint fixes the model)");
    for (const char* f : {"data", "batch", "seq", "accum", "lr", "warmup", "min-lr-ratio", "weight-decay", "grad-clip",
                          "label-smoothing", "seed", "val-every", "val-batches", "ckpt-every"})
      TS_CHECK(!a.has(f), "--", f, " cannot be combined with --resume (the checkpoint records the run's settings)");
  }
  o.out = a.str("out", "runs/tiny");
  o.steps = a.integer("steps", o.resume.empty() ? o.steps : 0);
  o.stop_after = a.integer("stop-after", 0);
  TS_CHECK(o.stop_after >= 0, "--stop-after must be >= 0");
  o.batch = a.integer("batch", o.batch);
  o.seq = a.integer("seq", 0);
  o.accum = a.integer("accum", o.accum);
  o.lr = a.number("lr", o.lr);
  o.warmup = a.integer("warmup", o.warmup);
  o.min_lr_ratio = a.number("min-lr-ratio", o.min_lr_ratio);
  o.weight_decay = a.number("weight-decay", o.weight_decay);
  o.grad_clip = a.number("grad-clip", o.grad_clip);
  o.label_smoothing = a.number("label-smoothing", o.label_smoothing);
  o.seed = a.u64("seed", o.seed);
  o.val_every = a.integer("val-every", o.val_every);
  o.val_batches = a.integer("val-batches", o.val_batches);
  o.ckpt_every = a.integer("ckpt-every", o.ckpt_every);
  o.progress = !a.has("no-progress");
  const int sample_tokens = a.integer("sample-tokens", 300);
  TS_CHECK(sample_tokens >= 0, "--sample-tokens must be >= 0");

  ensure_writable_dir(o.out);
  if (o.resume.empty()) {
    o.data = a.str("data");
    if (o.data.empty()) {
      TS_CHECK(o.model.vocab >= kByteVocab, "--data is required: the bundled corpus is byte-level (vocab 256) and the "
                                            "model's vocab is ", o.model.vocab);
      const std::string corpus = TESSERA_DEFAULT_CORPUS;
      o.data = (fs::path(o.out) / "data").string();
      const auto [n_train, n_val] = prepare_text(read_file_text(corpus, "corpus"), o.data);
      std::printf("prepared %s: %zu train / %zu val tokens in %s\n", corpus.c_str(), n_train, n_val, o.data.c_str());
    }
  }
  const GpuInfo gpu = probe_gpu();
  const std::string what = o.resume.empty() ? o.model.preset + " (" + human_count(static_cast<double>(o.model.num_params())) + " params)"
                                            : "from checkpoint " + o.resume;
  const std::string steps = o.steps > 0 ? std::to_string(o.steps) + " steps" : "the saved run's steps";
  std::printf("training %s on the CPU for %s -> %s\n", what.c_str(), steps.c_str(), o.out.c_str());
  if (gpu.available) std::printf("(GPU %s found; the CUDA kernels come with the CUDA backend)\n", gpu.name.c_str());
  std::fflush(stdout);
  TrainResult r = train(o);
  std::printf("done: %lld steps in %.1fs, loss %.4f -> %.4f", static_cast<long long>(r.steps), r.seconds, r.first_loss,
              r.last_loss);
  if (r.last_val_loss > 0) std::printf(", val loss %.4f", r.last_val_loss);
  std::printf("\ncheckpoint: %s\nmetrics:    %s/metrics.jsonl\n", r.checkpoint.c_str(), o.out.c_str());
  // Sample from the model still in memory (it equals the checkpoint just written) rather than reloading it.
  if (sample_tokens > 0 && r.model->config().vocab >= kByteVocab) {
    const std::string prompt = a.str("prompt", "The ");
    const auto out = generate(*r.model, encode_prompt(prompt, r.model->config().vocab), sample_tokens,
                              {.temperature = 0.7f, .top_k = 40, .seed = o.seed});
    std::printf("\nsample (temperature 0.7, top-k 40):\n%s\n", byte_decode(out).c_str());
  }
  return 0;
}

int cmd_generate(int argc, char** argv) {
  const std::vector<FlagSpec> specs{
      {"checkpoint", "DIR", "checkpoint directory (default runs/tiny/checkpoint)"},
      {"prompt", "TEXT", "text to continue (default \"The \")"},
      {"tokens", "N", "tokens to generate (default 200)"},
      {"temperature", "X", "softmax temperature; 0 = greedy (default 0.8)"},
      {"top-k", "N", "sample from the k most likely tokens, 0 = all (default 40)"},
      {"top-p", "X", "sample from the smallest set with this much mass (default 1.0)"},
      {"greedy", "", "always take the most likely token"},
      {"seed", "N", "sampling seed (default 0)"},
  };
  Args a("generate", specs, argc, argv, 2);
  if (a.help()) {
    std::fputs(Args::usage("generate", "Continues a prompt with a trained model. Text in and out is byte-level.", specs).c_str(),
               stdout);
    return 0;
  }
  const std::string ckpt = a.str("checkpoint", "runs/tiny/checkpoint");
  TS_CHECK(fs::exists(ckpt), "checkpoint ", ckpt, " does not exist (train one first: tessera train)");
  SamplerParams p{.temperature = a.number("temperature", 0.8f), .top_k = a.integer("top-k", 40),
                  .top_p = a.number("top-p", 1.0f), .seed = a.u64("seed", 0)};
  if (a.has("greedy")) p.temperature = 0;
  sampler_check(p);
  const int n = a.integer("tokens", 200);
  TS_CHECK(n >= 0, "--tokens must be >= 0");
  auto model = load_checkpoint_model(ckpt);
  const std::string prompt = a.str("prompt", "The ");
  const auto out = generate(*model, encode_prompt(prompt, model->config().vocab), n, p);
  std::printf("%s\n", byte_decode(out).c_str());
  return 0;
}

int cmd_prepare(int argc, char** argv) {
  const std::vector<FlagSpec> specs{
      {"text", "FILE", "UTF-8 text to tokenize (byte-level, vocab 256)"},
      {"out", "DIR", "where to write train_000000.bin and val_000000.bin"},
      {"val-fraction", "X", "share of the text held out for validation (default 0.1)"},
  };
  Args a("prepare", specs, argc, argv, 2);
  if (a.help()) {
    std::fputs(Args::usage("prepare", "Turns a text file into llm.c-format token shards.", specs).c_str(), stdout);
    return 0;
  }
  TS_CHECK(a.has("text"), "tessera prepare: --text FILE is required");
  TS_CHECK(a.has("out"), "tessera prepare: --out DIR is required");
  const auto [n_train, n_val] =
      prepare_text(read_file_text(a.str("text"), "text"), a.str("out"), a.number("val-fraction", 0.1f));
  std::printf("wrote %zu train and %zu val tokens to %s\n", n_train, n_val, a.str("out").c_str());
  return 0;
}

int cmd_info(int argc, char** argv) {
  std::vector<FlagSpec> specs = model_flags();
  specs.push_back({"checkpoint", "DIR", "describe a checkpoint's model instead of a preset"});
  specs.push_back({"batch", "N", "batch size for the activation estimate (default 16)"});
  specs.push_back({"seq", "N", "sequence length for the activation estimate (default: max_seq)"});
  Args a("info", specs, argc, argv, 2);
  if (a.help()) {
    std::fputs(Args::usage("info", "Shows a model's config, parameter count and training memory estimate.", specs).c_str(),
               stdout);
    return 0;
  }
  const ModelConfig cfg = a.has("checkpoint") ? load_checkpoint_config(a.str("checkpoint")) : model_from_args(a);
  const int B = a.integer("batch", 16), T = a.integer("seq", cfg.max_seq);
  TS_CHECK(B > 0 && T > 0, "--batch and --seq must be positive");
  TS_CHECK(T <= cfg.max_seq, "--seq ", T, " is longer than the model's max_seq ", cfg.max_seq);
  const int64_t n = cfg.num_params();
  std::printf("model      %s\n", cfg.preset.c_str());
  std::printf("config     vocab %d, d_model %d, n_layers %d, n_heads %d (head dim %d), d_ff %d, max_seq %d\n", cfg.vocab,
              cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.head_dim(), cfg.d_ff, cfg.max_seq);
  std::printf("           norm %s, mlp %s, positions %s, bias %s, tied %s, dropout %g, emb_scale %g, padding_id %d\n",
              norm_kind_name(cfg.norm).c_str(), std::string(activation_name(cfg.mlp)).c_str(),
              position_kind_name(cfg.positions).c_str(), cfg.bias ? "on" : "off", cfg.tied ? "on" : "off", cfg.dropout,
              cfg.emb_scale, cfg.padding_id);
  const char* naming = cfg.is_gpt2_compatible() ? "Hugging Face GPT2LMHeadModel"
                       : cfg.is_llama_compatible() ? "Hugging Face LlamaForCausalLM"
                                                   : "tessera";
  std::printf("checkpoint %s names\n", naming);
  std::printf("params     %lld (%s)\n", static_cast<long long>(n), human_count(static_cast<double>(n)).c_str());
  const double p = 4.0 * n;
  const double act = static_cast<double>(Gpt::activation_bytes(cfg, B, T));
  std::printf("memory     f32 training, batch %d x seq %d:\n", B, T);
  std::printf("             params %s, grads %s, AdamW m+v %s, activations %s (planned)\n", human_bytes(p).c_str(),
              human_bytes(p).c_str(), human_bytes(2 * p).c_str(), human_bytes(act).c_str());
  std::printf("             total %s\n", human_bytes(4 * p + act).c_str());
  const GpuInfo gpu = probe_gpu();
  std::printf("backend    CPU (GEMM: %s)%s\n", gemm_uses_blas() ? "OpenBLAS" : "plain loops",
              gpu.available ? ("; GPU found: " + gpu.name).c_str() : "; no GPU found");
  return 0;
}

}  // namespace tessera::cli
