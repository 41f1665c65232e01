// tessera/models/gpt_plan.h — the events of a GPT training step, and its activation plan.
//
// A step is a sequence of events, one per op: the embedding, then per layer the ten ops of a block, the final
// norm, the logits and the loss; then the backward of the head, per layer (last layer first) the fourteen ops of
// a block's backward, and the embedding's. Every activation buffer of Gpt declares the first and last event that
// use it, and the lifetime planner (core/planner.h) lays them out in one arena so that buffers whose lives are
// disjoint share memory: a layer's saved activations die in that layer's backward, whose gradient temporaries
// are born and die there too, written over memory whose owner has died.
//
// The model marks each event as it runs it (Gpt checks that the events come in this order), which is what the
// debug mode below hangs on.
#pragma once
#include <string>

#include "tessera/core/planner.h"

namespace tessera {

// The ops of a step in the order they run. The per-layer ops (Ln1 .. Res2 forward, FcpW .. Ln1Bwd backward)
// run once per layer; the others once per step. `End` is the moment after the step: buffers that outlive it
// (the inputs, the loss) live until End.
enum class StepOp {
  Embedding, Ln1, Qkv, Attn, Proj, Res1, Fc, Act, Fcp, Res2, LnF, Logits, Loss,
  LossBwd, LmHeadW, LmHeadX, LnFBwd,
  FcpW, FcpX, ActBwd, FcW, FcX, Ln2Bwd, ProjW, ProjX, AttnBwd, QkvW, QkvX, Ln1Bwd,
  EmbeddingBwd, End
};

// The index of (op, layer) among the events of a step of a model with n_layers (layer is ignored by the ops that
// run once per step); events are numbered 0 (Embedding) to step_num_events - 1 (End).
int step_event(int n_layers, StepOp op, int layer = 0);
int step_num_events(int n_layers);
// "forward layer 3 qkv", "backward lm_head dW", "end of step".
std::string step_event_name(int n_layers, int event);
// The op's name as a profiler range, unique across forward and backward: "qkv", "attention bwd", "fc dW".
const char* step_op_range_name(StepOp op);

// Debug and test settings of the activation plan. Gpt reads the first two from the environment when it is made
// (TESSERA_POISON_DEAD=1, TESSERA_PLAN_NO_REUSE=1), so that any run, `tessera train` included, can turn them on.
struct PlanDebug {
  // Fills every buffer with NaN (all bytes 0xff: NaN in f32, bf16, f16 and f64) at the end of its life, and
  // checks at the start of its life that it is still all NaN. A buffer read after its declared last use then
  // reads NaN, which reaches the loss or the gradients; a buffer written before its declared first use (over
  // memory that may belong to a live buffer) fails the check with an Error that names it. Every buffer but the
  // inputs and the loss is also filled before each step, so a read before the first write shows as well.
  bool poison_dead = false;
  // Gives every buffer memory of its own (peak = sum of all buffers): the reference a shared plan must match
  // bit for bit.
  bool no_reuse = false;
  // Test hooks that plant a bug in the declared lives, so that a test can show the debug mode catches it: the
  // buffer with this name is declared to die one event early, or to be born one event late.
  std::string plant_early_death = {};
  std::string plant_late_birth = {};
};
PlanDebug plan_debug_from_env();

}  // namespace tessera
