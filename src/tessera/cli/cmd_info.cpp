// tessera info: a model's config and parameter count, then the memory of training it (parameters, master weights,
// moments, the planned activation arena, ZeRO-1's shards) or, with --inference, of generating with it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/planner.h"
#include "tessera/core/units.h"
#include "tessera/dist/zero.h"
#include "tessera/infer/engine.h"
#include "tessera/models/model.h"
#include "tessera/ops/gemm/gemm.h"
#include "tessera/train/checkpoint.h"

namespace tessera::cli {

namespace fs = std::filesystem;

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
           (g[i].count > 1 && g[i].each
                ? std::to_string(g[i].count) + " x " + human_bytes(static_cast<double>(g[i].each))
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

void add_info_flags(Flags& a) {
  add_model_flags(a);
  a.add("checkpoint", "DIR", "describe a checkpoint's model instead of a preset");
  a.add("batch", "N", "batch size for the activation plan (default 16)");
  a.add("seq", "N", "sequence length for the activation plan (default: max_seq)");
  a.add("precision", "f32|bf16|f16", "training precision for the memory figures (default f32)");
  a.add("master-weights", "on|off",
        "bf16/f16: with f32 master weights (on, the default) or without (off, as "
        "train --master-weights off)");
  a.add("accum", "N",
        "micro-batches per step, as train --accum (default 1): with 1 the gradients are planned in the "
        "activation arena, with more they keep a buffer of their own");
  a.add_switch("plan", "list every activation buffer: offset, size, and the ops where its life starts and ends");
  a.add("world", "N", "data-parallel ranks, for the optimizer memory of each rank (default 1)");
  a.add("zero", "1", "with --world: ZeRO-1, the optimizer state sharded over the ranks");
  a.add_switch("inference",
               "the memory of generation instead: the weights, the KV cache and the engine's buffers, "
               "for --batch prompts (default 1) of up to --seq tokens, each with --beams cache slots");
  a.add("beams", "N", "with --inference: beams per prompt (default 1)");
}

// What info's flags ask for, checked.
struct InfoArgs {
  ModelConfig cfg;
  int B = 0, T = 0, world = 1, zero = 0, accum = 1, beams = 1;
  std::string prec;  // "f32", "bf16" or "f16", as given
  DType dtype = DType::F32;
  bool master = true;  // bf16/f16: with f32 master weights
  bool inference = false, list_plan = false;
};

// --world, --zero, --accum, and the flags that apply to training or to --inference only.
void check_parallel_flags(const Flags& a, InfoArgs& o) {
  TS_CHECK(!a.has("beams") || a.has("inference"), "--beams applies to --inference (the memory of generation)");
  if (a.has("inference"))
    for (const char* f : {"master-weights", "accum", "plan", "world", "zero"})
      TS_CHECK(!a.has(f), "--", f, " is a figure of training; --inference shows the memory of generation");
  o.world = a.integer("world", 1);
  o.zero = a.integer("zero", 0);
  o.accum = a.integer("accum", 1);
  TS_CHECK(o.world >= 1, "--world must be >= 1, got ", o.world);
  TS_CHECK(o.accum >= 1, "--accum must be >= 1, got ", o.accum);
  TS_CHECK(o.zero == 0 || o.zero == 1, "--zero: only stage 1 is built (--zero 1), got ", o.zero);
  // Without --world the figures would be for one rank holding everything, printed as if sharded.
  TS_CHECK(!o.zero || a.has("world"),
           "--zero 1 shards the optimizer state over data-parallel ranks: give their "
           "number with --world N");
}

// The model: a checkpoint's (its tensors checked against its config, as generate's load does: info described a
// checkpoint whose config says one model and whose tensors hold another), else the model flags'.
ModelConfig info_model(const Flags& a) {
  if (a.has("checkpoint")) {
    // As with train --resume: the checkpoint fixes the model, and a model flag would silently be ignored.
    for (const auto& f : model_flag_names())
      TS_CHECK(!a.has(f), "--", f, " cannot be combined with --checkpoint (the checkpoint fixes the model)");
    const std::string given = a.str("checkpoint");
    TS_CHECK(!given.empty(), "--checkpoint is empty");
    TS_CHECK(fs::exists(resolve_checkpoint_dir(given)), "checkpoint ", given, " does not exist",
             dangling_link_note(given));
  }
  return a.has("checkpoint") ? check_checkpoint_model(a.str("checkpoint")) : model_from_flags(a);
}

InfoArgs info_args(const Flags& a) {
  InfoArgs o;
  check_parallel_flags(a, o);
  o.cfg = info_model(a);
  o.inference = a.has("inference");
  o.list_plan = a.has("plan");
  o.B = a.integer("batch", o.inference ? 1 : 16);
  o.T = a.integer("seq", o.cfg.max_seq);
  TS_CHECK(o.B > 0 && o.T > 0, "--batch and --seq must be positive");
  TS_CHECK(o.T <= o.cfg.max_seq, "--seq ", o.T, " is longer than the model's max_seq ", o.cfg.max_seq);
  o.prec = a.str("precision", "f32");
  const std::string& prec = o.prec;
  o.dtype = prec == "f32" ? DType::F32 : prec == "bf16" ? DType::BF16 : prec == "f16" ? DType::F16 : DType::U8;
  TS_CHECK(o.dtype != DType::U8, "--precision: unknown precision '", prec, "' (expected f32, bf16 or f16)");
  const std::string master_flag = a.str("master-weights", "on");
  TS_CHECK(master_flag == "on" || master_flag == "off", "--master-weights must be on or off, got '", master_flag, "'");
  TS_CHECK(master_flag == "on" || o.dtype != DType::F32,
           "--master-weights off applies to bf16 or f16 (f32 "
           "parameters are their own master)");
  o.master = master_flag == "on";
  o.beams = a.integer("beams", 1);
  return o;
}

// The training figures, in bytes: the flat buffers as they hold the parameters (with each segment's padding), the
// f32 master weights (master_on: what they would take; master: what they take), the AdamW moments, the planned
// activation arena, and the gradients as the arena holds them (when planned there).
struct TrainingBytes {
  double params = 0, master_on = 0, master = 0, moments = 0, act = 0, grads = 0;
};

TrainingBytes training_bytes(const InfoArgs& o, size_t flat, const MemoryPlan& plan) {
  TrainingBytes t;
  for (const PlanBuffer& b : plan.buffers())
    if (b.fixed) t.grads += static_cast<double>(b.bytes);
  t.params = static_cast<double>(flat) * static_cast<double>(dtype_size(o.dtype));
  t.master_on = o.dtype == DType::F32 ? 0.0 : 4.0 * static_cast<double>(flat);
  t.master = o.master ? t.master_on : 0.0;
  t.moments = 8.0 * static_cast<double>(flat);
  t.act = static_cast<double>(plan.peak());
  return t;
}

void print_model_config(const ModelConfig& cfg) {
  const int64_t n = cfg.num_params();
  std::printf("model      %s\n", cfg.preset.c_str());
  std::printf(
      "config     vocab %d, d_model %d, n_layers %d, n_heads %d (head dim %d), n_kv_heads %d, d_ff %d, max_seq %d\n",
      cfg.vocab, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.head_dim(), cfg.kv_heads(), cfg.d_ff, cfg.max_seq);
  std::printf(
      "           norm %s, mlp %s, positions %s, bias %s, tied %s, dropout %g, attn_dropout %g, emb_scale %g, "
      "padding_id %d\n",
      norm_kind_name(cfg.norm).c_str(), std::string(activation_name(cfg.mlp)).c_str(),
      position_kind_name(cfg.positions).c_str(), cfg.bias ? "on" : "off", cfg.tied ? "on" : "off", cfg.dropout,
      cfg.attn_dropout, cfg.emb_scale, cfg.padding_id);
  const char* naming = cfg.is_gpt2_compatible()    ? "Hugging Face GPT2LMHeadModel"
                       : cfg.is_llama_compatible() ? "Hugging Face LlamaForCausalLM"
                                                   : "tessera";
  std::printf("checkpoint %s names\n", naming);
  std::printf("params     %lld (%s)\n", static_cast<long long>(n), human_count(static_cast<double>(n)).c_str());
}

// The memory block: parameters, gradients, master weights, moments and activations, and their total.
void print_training_memory(const InfoArgs& o, const TrainingBytes& t, bool planned_grads) {
  const double p = t.params, master = t.master, moments = t.moments, act = t.act;
  std::printf("memory     %s training%s, batch %d x seq %d%s:\n", o.prec.c_str(),
              master > 0             ? " with f32 master weights"
              : t.master_on > master ? (" without master weights (saves " + human_bytes(t.master_on) + ")").c_str()
                                     : "",
              o.B, o.T, o.accum > 1 ? (", " + std::to_string(o.accum) + " micro-batches a step").c_str() : "");
  const std::string master_part = master > 0 ? "master " + human_bytes(master) + ", " : "";
  if (planned_grads) {
    // What the same step would need with the gradients in a buffer of their own (as with --accum > 1).
    const double own = t.grads + static_cast<double>(model_activation_bytes(o.cfg, o.B, o.T, o.dtype, GradMemory::Own));
    // On a tiny model the plan's alignment can cost a few bytes more than a buffer of their own: said as "more".
    std::printf(
        "             params %s, %sAdamW m+v %s, activations and grads %s (planned together; grads %s, "
        "%s %s than in a buffer of their own)\n",
        human_bytes(p).c_str(), master_part.c_str(), human_bytes(moments).c_str(), human_bytes(act).c_str(),
        human_bytes(t.grads).c_str(), human_bytes(std::abs(own - act)).c_str(), own >= act ? "less" : "more");
    std::printf("             total %s\n", human_bytes(p + master + moments + act).c_str());
  } else {
    std::printf("             params %s, grads %s, %sAdamW m+v %s, activations %s (planned)\n", human_bytes(p).c_str(),
                human_bytes(p).c_str(), master_part.c_str(), human_bytes(moments).c_str(), human_bytes(act).c_str());
    std::printf("             total %s\n", human_bytes(2 * p + master + moments + act).c_str());
  }
}

// The arena's peak beside the sum of its buffers, the biggest live set, and with --plan every buffer's life.
void print_activation_plan(const InfoArgs& o, const MemoryPlan& plan, const PlanDebug& debug, bool planned_grads) {
  const ModelConfig& cfg = o.cfg;
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
  if (o.list_plan) {
    std::printf("%-20s %14s %12s  %s\n", "buffer", "offset", "bytes", "life");
    for (const PlanBuffer& b : plan.buffers())
      std::printf("%-20s %14zu %12zu  %s .. %s\n", b.name.c_str(), b.offset, b.bytes,
                  model_step_event_name(cfg, b.first).c_str(), model_step_event_name(cfg, b.last).c_str());
  }
}

// The AdamW moments on each of `world` data-parallel ranks, sharded by ZeRO-1 or not.
void print_data_parallel(const InfoArgs& o, size_t flat, double moments) {
  const int world = o.world;
  // ZeRO-1 gives each rank one contiguous range of the flat buffers (dist/zero.h): a block of c elements, c a
  // multiple of 16 rounded down, and the last rank its block and the tail left over.
  // The tail is below 16 elements a rank: with a small world it is noise, and the last rank's figure stands for
  // all. A world near the limit leaves the last rank a tail that outweighs its block: both figures are shown.
  const ZeroLayout z = zero_layout(flat, world);
  const size_t each = z.count(0), last = z.count(world - 1);
  const std::string sharded = last - each <= each / 100
                                  ? human_bytes(8.0 * static_cast<double>(last)) + " on each rank (ZeRO-1: 1/" +
                                        std::to_string(world) + " of " + human_bytes(moments) + ")"
                                  : human_bytes(8.0 * static_cast<double>(each)) + " on each rank, " +
                                        human_bytes(8.0 * static_cast<double>(last)) +
                                        " on the last (ZeRO-1: " + human_bytes(moments) + " in one block of " +
                                        std::to_string(z.chunk) + " parameters a rank, and the " +
                                        std::to_string(z.total - z.tail_begin()) + " left over on the last)";
  std::printf("           data parallel over %s: AdamW m+v %s\n", counted(world, "rank").c_str(),
              o.zero ? sharded.c_str()
                     : (human_bytes(moments) + " on each rank (unsharded; --zero 1 shards it)").c_str());
}

// info without --inference: the model, the memory of a training step, its activation plan, the data-parallel
// shards and the backend.
int print_training_info(const InfoArgs& o) {
  // ZeRO-1 shards the flat buffers (the parameters with each segment's padding to 16) in blocks of 16, at least one
  // a rank: the same size and check as train's, so that info refuses what train refuses and no more.
  const size_t flat = model_flat_params(o.cfg);
  TS_CHECK(!o.zero || o.world <= zero_max_world(flat), "--world ", o.world,
           " --zero 1: ZeRO-1 shards the optimizer "
           "state in blocks of ",
           kSegmentAlign, " parameters, and the model's ", flat, " make ", zero_max_world(flat),
           ": give at most that many ranks");
  // The plan the model itself would make for this (B, T) in this environment: the same function, with the same
  // debug settings (TESSERA_PLAN_NO_REUSE), lays out the model's arena. Made before anything is printed: a plan past
  // 1 EiB is an error, which came after the config block.
  const PlanDebug debug = plan_debug_from_env();
  const GradMemory grads = train_grad_memory(o.accum);
  const bool planned_grads = grads == GradMemory::Planned;
  const MemoryPlan plan = model_activation_plan(o.cfg, o.B, o.T, o.dtype, debug, grads);
  const TrainingBytes t = training_bytes(o, flat, plan);
  print_model_config(o.cfg);
  print_training_memory(o, t, planned_grads);
  print_activation_plan(o, plan, debug, planned_grads);
  if (o.world > 1 || o.zero) print_data_parallel(o, flat, t.moments);
  const GpuInfo gpu = probe_gpu();
  std::printf("backend    CPU (GEMM: %s)%s\n", gemm_uses_blas() ? "OpenBLAS" : "plain loops",
              gpu.available ? ("; GPU found: " + gpu.name).c_str() : "; no GPU found");
  return 0;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  Flags a("info", "Shows a model's config, parameter count, training memory and activation plan.");
  add_info_flags(a);
  if (!a.parse(argc, argv, 2)) return 0;
  const InfoArgs o = info_args(a);
  if (o.inference) return print_inference_memory(o.cfg, o.B, o.beams, o.T, o.dtype, o.prec);
  return print_training_info(o);
}

}  // namespace tessera::cli
