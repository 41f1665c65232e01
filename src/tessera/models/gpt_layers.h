// tessera/models/gpt_layers.h — Gpt's nn layers (private to gpt.cpp and gpt_plan.cpp).
//
// Every block is pre-norm: its first norm is computed by the block below's last residual op (block 0's by
// itself), and its last residual op computes the norm above (the next block's first, or the final norm).
#pragma once
#include <vector>

#include "tessera/models/gpt.h"
#include "tessera/nn/block.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/lm_head.h"

namespace tessera {

struct Gpt::Layers {
  Embedding emb;
  std::vector<Block> blocks;
  LmHead head;
  StepSchedule sched;
};

}  // namespace tessera
