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

namespace {

// The buffers live at `event`, grouped by kind (a layer's "h.3.fc_pre" is "fc_pre", "res.7" is "res"), largest
// group first: "logits 3.07 GiB, fc_pre 12 x 192.00 MiB, ...".
std::string live_set_summary(const MemoryPlan& plan, int event, size_t groups) {
  struct Group {
    std::string kind;
    size_t count = 0, bytes = 0, each = 0;
  };
  std::vector<Group> g;
  for (const PlanBuffer& b : plan.buffers()) {
    if (!b.live_at(event) || b.size == 0) continue;
    std::string kind = b.name;
    if (kind.rfind("h.", 0) == 0) kind = kind.substr(kind.find('.', 2) + 1);
    if (kind.rfind("res.", 0) == 0) kind = "res";
    auto it = std::find_if(g.begin(), g.end(), [&](const Group& x) { return x.kind == kind; });
    if (it == g.end()) it = g.insert(g.end(), Group{kind, 0, 0, b.size});
    ++it->count;
    it->bytes += b.size;
    if (it->each != b.size) it->each = 0;  // sizes differ within the group: print the total only
  }
  std::stable_sort(g.begin(), g.end(), [](const Group& a, const Group& b) { return a.bytes > b.bytes; });
  std::string out;
  for (size_t i = 0; i < g.size() && i < groups; ++i) {
    if (!out.empty()) out += ", ";
    out += g[i].kind + " " +
           (g[i].count > 1 && g[i].each ? std::to_string(g[i].count) + " x " + human_bytes(static_cast<double>(g[i].each))
                                        : human_bytes(static_cast<double>(g[i].bytes)));
  }
  if (g.size() > groups) out += ", and " + std::to_string(g.size() - groups) + " smaller kinds";
  return out;
}

// info --inference: what the inference engine (infer/engine.h) allocates for B prompts of up to T tokens with
// `beams` cache slots each, beside the model's weights.
int print_inference_memory(const ModelConfig& cfg, int B, int beams, int T, DType dtype, const std::string& prec) {
  TS_CHECK(beams >= 1, "--beams must be >= 1, got ", beams);
  const std::string why = Engine::unsupported(cfg);
  TS_CHECK(why.empty(), why);
  const EngineMemory m = Engine::memory(cfg, dtype, {.batch = B, .beams = beams, .max_prompt = T, .max_seq = T});
  const int64_t n = cfg.num_params();
  std::printf("model      %s\n", cfg.preset.c_str());
  std::printf("params     %lld (%s)\n", static_cast<long long>(n), human_count(static_cast<double>(n)).c_str());
  std::printf("inference  %s, batch %d x %s (%s), %d positions each:\n", prec.c_str(), B,
              counted(beams, "beam").c_str(), counted(static_cast<int64_t>(B) * beams, "cache slot").c_str(), T);
  auto line = [](const char* what, size_t bytes, const char* note) {
    std::printf("             %-9s %11s (%zu bytes)%s\n", what, human_bytes(static_cast<double>(bytes)).c_str(), bytes,
                note);
  };
  line("weights", m.weights, ": the parameters, read in place");
  line("KV cache", m.cache, ": K and V of every layer, the positions and any slot table");
  line("buffers", m.buffers, ": one set of activations shared by all layers, for the largest prefill");
  line("total", m.weights + m.cache + m.buffers, "");
  return 0;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  Flags a("info", "Shows a model's config, parameter count, training memory and activation plan.");
  add_model_flags(a);
  a.add("checkpoint", "DIR", "describe a checkpoint's model instead of a preset");
  a.add("batch", "N", "batch size for the activation plan (default 16)");
  a.add("seq", "N", "sequence length for the activation plan (default: max_seq)");
  a.add("precision", "f32|bf16|f16", "training precision for the memory figures (default f32)");
  a.add("master-weights", "on|off", "bf16/f16: with f32 master weights (on, the default) or without (off, as "
        "train --master-weights off)");
  a.add("accum", "N", "micro-batches per step, as train --accum (default 1): with 1 the gradients are planned in the "
        "activation arena, with more they keep a buffer of their own");
  a.add_switch("plan", "list every activation buffer: offset, size, and the ops where its life starts and ends");
  a.add("world", "N", "data-parallel ranks, for the optimizer memory of each rank (default 1)");
  a.add("zero", "1", "with --world: ZeRO-1, the optimizer state sharded over the ranks");
  a.add_switch("inference", "the memory of generation instead: the weights, the KV cache and the engine's buffers, "
               "for --batch prompts (default 1) of up to --seq tokens, each with --beams cache slots");
  a.add("beams", "N", "with --inference: beams per prompt (default 1)");
  if (!a.parse(argc, argv, 2)) return 0;
  TS_CHECK(!a.has("beams") || a.has("inference"), "--beams applies to --inference (the memory of generation)");
  if (a.has("inference"))
    for (const char* f : {"master-weights", "accum", "plan", "world", "zero"})
      TS_CHECK(!a.has(f), "--", f, " is a figure of training; --inference shows the memory of generation");
  const int world = a.integer("world", 1), zero = a.integer("zero", 0), accum = a.integer("accum", 1);
  TS_CHECK(world >= 1, "--world must be >= 1, got ", world);
  TS_CHECK(accum >= 1, "--accum must be >= 1, got ", accum);
  TS_CHECK(zero == 0 || zero == 1, "--zero: only stage 1 is built (--zero 1), got ", zero);
  // Without --world the figures would be for one rank holding everything, printed as if sharded.
  TS_CHECK(!zero || a.has("world"), "--zero 1 shards the optimizer state over data-parallel ranks: give their number "
           "with --world N");
  if (a.has("checkpoint")) {
    // As with train --resume: the checkpoint fixes the model, and a model flag would silently be ignored.
    for (const auto& f : model_flag_names())
      TS_CHECK(!a.has(f), "--", f, " cannot be combined with --checkpoint (the checkpoint fixes the model)");
    const std::string given = a.str("checkpoint");
    TS_CHECK(!given.empty(), "--checkpoint is empty");
    TS_CHECK(fs::exists(resolve_checkpoint_dir(given)), "checkpoint ", given, " does not exist",
             dangling_link_note(given));
  }
  // A checkpoint's tensors are checked against its config, as generate's load does: info described a checkpoint
  // whose config says one model and whose tensors hold another.
  const ModelConfig cfg = a.has("checkpoint") ? check_checkpoint_model(a.str("checkpoint")) : model_from_flags(a);
  const int B = a.integer("batch", a.has("inference") ? 1 : 16), T = a.integer("seq", cfg.max_seq);
  TS_CHECK(B > 0 && T > 0, "--batch and --seq must be positive");
  TS_CHECK(T <= cfg.max_seq, "--seq ", T, " is longer than the model's max_seq ", cfg.max_seq);
  const std::string prec = a.str("precision", "f32");
  const DType dtype = prec == "f32" ? DType::F32 : prec == "bf16" ? DType::BF16 : prec == "f16" ? DType::F16 : DType::U8;
  TS_CHECK(dtype != DType::U8, "--precision: unknown precision '", prec, "' (expected f32, bf16 or f16)");
  const std::string master_flag = a.str("master-weights", "on");
  TS_CHECK(master_flag == "on" || master_flag == "off", "--master-weights must be on or off, got '", master_flag, "'");
  TS_CHECK(master_flag == "on" || dtype != DType::F32, "--master-weights off applies to bf16 or f16 (f32 parameters "
           "are their own master)");
  if (a.has("inference")) return print_inference_memory(cfg, B, a.integer("beams", 1), T, dtype, prec);
  const int64_t n = cfg.num_params();
  // ZeRO-1 shards the flat buffers (the parameters with each segment's padding to 16) in blocks of 16, at least one
  // a rank: the same size and check as train's, so that info refuses what train refuses and no more.
  const size_t flat = model_flat_params(cfg);
  TS_CHECK(!zero || world <= zero_max_world(flat), "--world ", world, " --zero 1: ZeRO-1 shards the optimizer state in "
           "blocks of ", kSegmentAlign, " parameters, and the model's ", flat, " make ", zero_max_world(flat),
           ": give at most that many ranks");
  // The plan the model itself would make for this (B, T) in this environment: the same function, with the same
  // debug settings (TESSERA_PLAN_NO_REUSE), lays out the model's arena. Made before anything is printed: a plan past
  // 1 EiB is an error, which came after the config block.
  const PlanDebug debug = plan_debug_from_env();
  const GradMemory grads = train_grad_memory(accum);
  const bool planned_grads = grads == GradMemory::Planned;
  const MemoryPlan plan = model_activation_plan(cfg, B, T, dtype, debug, grads);
  // The gradients as the arena holds them: the flat buffer, with its padding between tensors.
  double grad_bytes = 0;
  for (const PlanBuffer& b : plan.buffers())
    if (b.fixed) grad_bytes += static_cast<double>(b.bytes);
  // Parameters, master weights and moments as their flat buffers hold them, with the padding (as the gradients).
  const double p = static_cast<double>(flat) * static_cast<double>(dtype_size(dtype));
  const double master_on = dtype == DType::F32 ? 0.0 : 4.0 * static_cast<double>(flat);
  const double master = master_flag == "on" ? master_on : 0.0;
  const double moments = 8.0 * static_cast<double>(flat), act = static_cast<double>(plan.peak());
  std::printf("model      %s\n", cfg.preset.c_str());
  std::printf("config     vocab %d, d_model %d, n_layers %d, n_heads %d (head dim %d), d_ff %d, max_seq %d\n", cfg.vocab,
              cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.head_dim(), cfg.d_ff, cfg.max_seq);
  std::printf("           norm %s, mlp %s, positions %s, bias %s, tied %s, dropout %g, attn_dropout %g, emb_scale %g, "
              "padding_id %d\n",
              norm_kind_name(cfg.norm).c_str(), std::string(activation_name(cfg.mlp)).c_str(),
              position_kind_name(cfg.positions).c_str(), cfg.bias ? "on" : "off", cfg.tied ? "on" : "off", cfg.dropout,
              cfg.attn_dropout, cfg.emb_scale, cfg.padding_id);
  const char* naming = cfg.is_gpt2_compatible() ? "Hugging Face GPT2LMHeadModel"
                       : cfg.is_llama_compatible() ? "Hugging Face LlamaForCausalLM"
                                                   : "tessera";
  std::printf("checkpoint %s names\n", naming);
  std::printf("params     %lld (%s)\n", static_cast<long long>(n), human_count(static_cast<double>(n)).c_str());

  std::printf("memory     %s training%s, batch %d x seq %d%s:\n", prec.c_str(),
              master > 0             ? " with f32 master weights"
              : master_on > master ? (" without master weights (saves " + human_bytes(master_on) + ")").c_str()
                                     : "",
              B, T, accum > 1 ? (", " + std::to_string(accum) + " micro-batches a step").c_str() : "");
  const std::string master_part = master > 0 ? "master " + human_bytes(master) + ", " : "";
  if (planned_grads) {
    // What the same step would need with the gradients in a buffer of their own (as with --accum > 1).
    const double own = grad_bytes + static_cast<double>(model_activation_bytes(cfg, B, T, dtype, GradMemory::Own));
    // On a tiny model the plan's alignment can cost a few bytes more than a buffer of their own: said as "more".
    std::printf("             params %s, %sAdamW m+v %s, activations and grads %s (planned together; grads %s, "
                "%s %s than in a buffer of their own)\n",
                human_bytes(p).c_str(), master_part.c_str(), human_bytes(moments).c_str(), human_bytes(act).c_str(),
                human_bytes(grad_bytes).c_str(), human_bytes(std::abs(own - act)).c_str(),
                own >= act ? "less" : "more");
    std::printf("             total %s\n", human_bytes(p + master + moments + act).c_str());
  } else {
    std::printf("             params %s, grads %s, %sAdamW m+v %s, activations %s (planned)\n", human_bytes(p).c_str(),
                human_bytes(p).c_str(), master_part.c_str(), human_bytes(moments).c_str(), human_bytes(act).c_str());
    std::printf("             total %s\n", human_bytes(2 * p + master + moments + act).c_str());
  }

  const LiveSet live = plan.max_live();
  auto line = [](const char* what, size_t bytes) {
    std::printf("             %-17s %11s (%zu bytes)", what, human_bytes(static_cast<double>(bytes)).c_str(), bytes);
  };
  std::printf("activation plan%s, by lifetime over the %d ops of a training step (forward and backward)%s:\n",
              planned_grads ? " with the gradients" : "", model_step_events(cfg) - 1,
              debug.no_reuse ? ", without reuse (TESSERA_PLAN_NO_REUSE)" : "");
  line("planned peak", plan.peak());
  std::printf(": the arena the model allocates\n");
  line("sum of buffers", plan.total());
  std::printf(": what its %zu buffers need without sharing\n", plan.size());
  line("biggest live set", live.bytes);
  std::printf(" at %s\n", model_step_event_name(cfg, live.event).c_str());
  std::printf("             live there: %s\n", live_set_summary(plan, live.event, 6).c_str());
  if (a.has("plan")) {
    std::printf("%-20s %14s %12s  %s\n", "buffer", "offset", "bytes", "life");
    for (const PlanBuffer& b : plan.buffers())
      std::printf("%-20s %14zu %12zu  %s .. %s\n", b.name.c_str(), b.offset, b.bytes,
                  model_step_event_name(cfg, b.first).c_str(), model_step_event_name(cfg, b.last).c_str());
  }
  if (world > 1 || zero) {
    // ZeRO-1 gives each rank one contiguous range of the flat buffers (dist/zero.h): a block of c elements, c a
    // multiple of 16 rounded down, and the last rank its block and the tail left over.
    // The tail is below 16 elements a rank: with a small world it is noise, and the last rank's figure stands for
    // all. A world near the limit leaves the last rank a tail that outweighs its block: both figures are shown.
    const ZeroLayout z = zero_layout(flat, world);
    const size_t each = z.count(0), last = z.count(world - 1);
    const std::string sharded =
        last - each <= each / 100
            ? human_bytes(8.0 * static_cast<double>(last)) + " on each rank (ZeRO-1: 1/" + std::to_string(world) +
                  " of " + human_bytes(moments) + ")"
            : human_bytes(8.0 * static_cast<double>(each)) + " on each rank, " +
                  human_bytes(8.0 * static_cast<double>(last)) + " on the last (ZeRO-1: " + human_bytes(moments) +
                  " in one block of " + std::to_string(z.chunk) + " parameters a rank, and the " +
                  std::to_string(z.total - z.tail_begin()) + " left over on the last)";
    std::printf("           data parallel over %s: AdamW m+v %s\n", counted(world, "rank").c_str(),
                zero ? sharded.c_str()
                     : (human_bytes(moments) + " on each rank (unsharded; --zero 1 shards it)").c_str());
  }
  const GpuInfo gpu = probe_gpu();
  std::printf("backend    CPU (GEMM: %s)%s\n", gemm_uses_blas() ? "OpenBLAS" : "plain loops",
              gpu.available ? ("; GPU found: " + gpu.name).c_str() : "; no GPU found");
  return 0;
}

}  // namespace tessera::cli
