#include "tessera/cli/commands.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/planner.h"
#include "tessera/core/signals.h"
#include "tessera/core/units.h"
#include "tessera/dist/zero.h"
#include "tessera/infer/engine.h"
#include "tessera/infer/sampler.h"
#include "tessera/models/model.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/text.h"

namespace tessera::cli {

namespace fs = std::filesystem;

int cmd_generate(int argc, char** argv) {
  Flags a("generate", "Continues a prompt with a trained model. Text in and out is byte-level: a generated id\n"
                      "above 255 (a model with a wider vocab) is no byte and is printed as <id N>.");
  a.add("checkpoint", "DIR", "checkpoint directory (default runs/tiny/checkpoint)");
  a.add("prompt", "TEXT", "text to continue (default \"The \")");
  a.add("max-new-tokens", "N", "tokens to generate (default 200)");
  a.add("tokens", "N", "the same as --max-new-tokens");
  a.add("device", "cpu|cuda|auto", "where the model runs: auto takes the GPU when there is one (default auto)");
  a.add("precision", "f32|bf16|f16", "the compute dtype: bf16 or f16 on the GPU; the CPU computes in f32 (default "
        "bf16 on the GPU, f32 on the CPU)");
  a.add("temperature", "X", "softmax temperature, >= 0; 0 = greedy (default 0.8)");
  a.add("top-k", "N", "sample from the k most likely tokens, 0 = all (default 40)");
  a.add("top-p", "X", "sample from the smallest set with this much mass, in (0, 1] (default 1.0)");
  a.add_switch("greedy", "always take the most likely token");
  a.add("seed", "N", "sampling seed (default 0)");
  if (!a.parse(argc, argv, 2)) return 0;
  // Every flag before the checkpoint is read; none is quietly turned into another.
  SamplerParams p{.temperature = a.number_f32("temperature", 0.8f), .top_k = a.integer("top-k", 40),
                  .top_p = a.number_f32("top-p", 1.0f), .seed = a.u64("seed", 0)};
  TS_CHECK(p.temperature >= 0, "--temperature must be >= 0 (0 or --greedy: greedy), got ", a.str("temperature"));
  TS_CHECK(p.top_k >= 0, "--top-k must be >= 0 (0 = all tokens), got ", p.top_k);
  TS_CHECK(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1], got ", a.str("top-p"));
  TS_CHECK(!a.has("greedy") || !a.has("temperature") || p.temperature == 0, "--greedy takes the most likely token, "
           "and --temperature ", a.str("temperature"), " samples: give one of them");
  if (a.has("greedy")) p.temperature = 0;
  // Greedy decoding (--greedy, or --temperature 0) takes the argmax: a top-k or top-p cut would be ignored. --top-k 0
  // (all tokens) and --top-p 1 (all the mass) cut nothing, so they go with it.
  const std::pair<const char*, bool> cuts[] = {{"top-k", p.top_k != 0}, {"top-p", p.top_p != 1}};
  for (const auto& [f, cut] : cuts)
    TS_CHECK(p.temperature != 0 || !a.has(f) || !cut, a.has("greedy") ? "--greedy" : "--temperature 0",
             " takes the most likely token, and --", f, " ", a.str(f), " limits what is sampled: give one of them");
  // Greedy decoding draws no random number: a seed would be ignored.
  TS_CHECK(p.temperature != 0 || !a.has("seed"), a.has("greedy") ? "--greedy" : "--temperature 0",
           " takes the most likely token, and --seed ", a.str("seed"), " seeds sampling: give one of them");
  TS_CHECK(!a.has("tokens") || !a.has("max-new-tokens"), "--tokens is another name for --max-new-tokens: give one of "
           "them");
  const char* count_flag = a.has("tokens") ? "tokens" : "max-new-tokens";
  const int n = a.integer(count_flag, 200);
  TS_CHECK(n >= 0, "--", count_flag, " must be >= 0, got ", n);
  const std::string device = a.str("device", "auto");
  TS_CHECK(device == "cpu" || device == "cuda" || device == "auto", "--device must be cpu, cuda or auto, got '", device,
           "'");
  const bool gpu = device == "cuda" || (device == "auto" && probe_gpu().available);
  TS_CHECK(!gpu || probe_gpu().available, "--device cuda: ",
           built_with_cuda() ? "no GPU is visible" : "this tessera was built without CUDA");
  const std::string prec = a.str("precision", gpu ? "bf16" : "f32");
  const DType dtype = prec == "f32" ? DType::F32 : prec == "bf16" ? DType::BF16 : prec == "f16" ? DType::F16 : DType::U8;
  TS_CHECK(dtype != DType::U8, "--precision: unknown precision '", prec, "' (expected f32, bf16 or f16)");
  TS_CHECK(gpu || dtype == DType::F32, "--precision ", prec, " runs on the GPU; the CPU computes in f32",
           device == "auto" ? " (and no GPU is visible)" : "");
  const std::string given = a.str("checkpoint", "runs/tiny/checkpoint");
  TS_CHECK(!given.empty(), "--checkpoint is empty");
  // A crash between the two renames of a checkpoint swap leaves it at <dir>.old: the loaders read that.
  const std::string ckpt = resolve_checkpoint_dir(given);
  if (!fs::exists(ckpt)) {
    // "Train one first" fits only the default path, runs/tiny's: elsewhere it would train another model.
    std::string why = dangling_link_note(given);
    if (why.empty()) why = unfinished_checkpoint_note(given);
    if (why.empty() && !a.has("checkpoint")) why = " (train one first: tessera train)";
    TS_THROW("checkpoint ", given, " does not exist", why);
  }
  sampler_check(p);
  auto model = load_checkpoint_model(ckpt);
  // Weights that are NaN or inf (a diverged run's) printed the prompt and then failed at the first logit: refused
  // before anything is printed. The loaded model is f32 on the CPU, so they are read in place (no 10.6 GB copy for
  // cs336-2.7b).
  size_t non_finite = 0;
  const float* weights = model->params().host_data<float>();
  for (size_t i = 0; i < model->params().size(); ++i) non_finite += !std::isfinite(weights[i]);
  TS_CHECK(non_finite == 0, "checkpoint ", given, ": ", counted(non_finite, "weight"), " of the model ",
           non_finite == 1 ? "is" : "are",
           " NaN or infinite (the run that wrote it diverged): nothing to generate from");
  // Byte-level text in and out: a model whose vocab is narrower than the bytes (trained on other ids) is refused
  // here, about the model, rather than by the default prompt's "byte 84, outside the model's vocab", about a prompt
  // the user never gave.
  const int vocab = model->config().vocab;
  TS_CHECK(vocab >= kByteVocab || a.has("prompt"), "checkpoint ", given, ": the model's vocab of ", vocab, " tokens is "
           "not the byte vocabulary (256), and generate reads and writes byte-level text (a --prompt of bytes below ",
           vocab, " can still be given)");
  const std::string prompt = a.str("prompt", "The ");
  const std::vector<int32_t> tokens = encode_prompt(prompt, vocab);
  if (!gpu) {
    generate_streamed(*model, tokens, n, p);
    return 0;
  }
  // The GPU model in the compute dtype, without master weights or gradients (inference keeps neither); the CPU copy
  // is freed before generation.
  Context ctx(Device::cuda(0));
  auto on_gpu = make_model(model->config(), ctx, dtype, MasterWeights::Off);
  on_gpu->set_grad_memory(GradMemory::Planned);
  on_gpu->params().write_f32(model->params().read_f32(model->context()), ctx);
  model.reset();
  generate_streamed(*on_gpu, tokens, n, p);
  return 0;
  return 0;
}

}  // namespace tessera::cli
