// tessera/models/gpt_plan.h — the events of a GPT training step, by name.
//
// Gpt's layers schedule a step's events (nn/step.h): the embedding, then per layer the ten ops of a block, the
// final norm, the logits and the loss; then the backward of the head, per layer (last layer first) the twelve
// ops of a block's backward, and the embedding's. The layers declare their activation buffers' lives over those
// events, and the lifetime planner (core/planner.h) lays them out in one arena. StepOp names the same events for
// the tools that print or draw a GPT step (info, the memory timeline) and for the tests;
// tests/models/test_gpt.cpp checks that the layers' schedule matches it event for event.
#pragma once
#include <string>

#include "tessera/core/planner.h"
#include "tessera/nn/step.h"

namespace tessera {

// The ops of a step in the order they run. The per-layer ops (Ln1 .. Res2 forward, FcpW .. Ln1Bwd backward)
// run once per layer; the others once per step. `End` is the moment after the step: buffers that outlive it
// (the inputs, the loss) live until End.
enum class StepOp {
  Embedding,
  Ln1,
  Qkv,
  Attn,
  Proj,
  Res1,
  Fc,
  Act,
  Fcp,
  Res2,
  LnF,
  Logits,
  Loss,
  LossBwd,
  LmHeadW,
  LmHeadX,
  LnFBwd,
  FcpW,
  FcpX,
  ActBwd,
  FcW,
  FcX,
  Ln2Bwd,
  ProjW,
  ProjX,
  AttnBwd,
  QkvW,
  QkvX,
  Ln1Bwd,
  EmbeddingBwd,
  End
};

// The index of (op, layer) among the events of a step of a model with n_layers (layer is ignored by the ops that
// run once per step); events are numbered 0 (Embedding) to step_num_events - 1 (End).
int step_event(int n_layers, StepOp op, int layer = 0);
int step_num_events(int n_layers);
// "forward layer 3 qkv", "backward lm_head dW", "end of step".
std::string step_event_name(int n_layers, int event);
// The op's name as a profiler range, unique across forward and backward: "qkv", "attention bwd", "fc dW".
const char* step_op_range_name(StepOp op);

}  // namespace tessera
