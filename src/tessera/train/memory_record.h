// tessera/train/memory_record.h — the memory of one training step, op by op: the data of --memory-timeline and of
// `bench model --memory-timeline`, which bench/memory_timeline.h draws.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "tessera/models/model.h"

namespace tessera {

// One point of the memory timeline of a training step: one per event of the step's plan (model_step_events), the last
// (the end of the step) being where AdamW runs.
struct MemoryTimelinePoint {
  int event = 0;
  std::string phase;            // "forward", "backward", "optimizer"
  std::string name;             // model_step_event_name
  size_t activations_live = 0;  // the plan's live bytes at the event (planned gradients included)
  size_t static_bytes = 0;      // parameters, own gradients, master weights, AdamW state: held for the whole step
  std::string static_holds;     // what static_bytes holds, for the plot's legend (the same at every point)
  size_t arena = 0;             // the activation arena allocated (the plan's peak)
  // GPU: the device memory in use above the baseline, measured (cudaMemGetInfo) at the end of the event's phase;
  // nullopt on the CPU.
  std::optional<size_t> measured;
  size_t planned_total() const { return static_bytes + activations_live; }
};

// One point per event of a training step of `model` (its current plan): the plan's live bytes at the event (the
// gradients among them when planned), the static bytes (ParamBuffer::bytes(): parameters, their own gradients if
// any, master weights; and `optimizer_state_bytes`, AdamW's m and v, 0 without an optimizer) and what they hold,
// the arena; measured_at_phase_end: the device memory at the end of the forward, the backward and the optimizer
// (GPU), or empty.
std::vector<MemoryTimelinePoint> memory_timeline_points(const Model& model, size_t optimizer_state_bytes,
                                                        const std::vector<size_t>& measured_at_phase_end);

}  // namespace tessera
