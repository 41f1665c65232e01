#include "tessera/train/memory_record.h"

namespace tessera {

std::vector<MemoryTimelinePoint> memory_timeline_points(const Model& model, size_t optimizer_state_bytes,
                                                        const std::vector<size_t>& measured_at_phase_end) {
  // The legend names what the band holds: not "params, grads, adamw state" where the gradients are planned in the
  // arena (train without --accum, bench model), and so counted in the live activations, not here.
  const ParamBuffer& params = model.params();
  const size_t static_bytes = params.bytes() + optimizer_state_bytes;
  std::string holds = "params";
  if (params.has_master()) holds += ", f32 master weights";
  if (params.owns_grad()) holds += ", grads";
  if (optimizer_state_bytes > 0) holds += ", adamw m and v";
  const std::vector<size_t> live = model.current_plan().live_bytes();
  const ModelConfig& cfg = model.config();
  const int end = model_step_events(cfg) - 1, bwd0 = model_backward_first_event(cfg);
  std::vector<MemoryTimelinePoint> points;
  for (int e = 0; e <= end; ++e) {
    MemoryTimelinePoint p;
    p.event = e;
    const int phase = e < bwd0 ? 0 : e < end ? 1 : 2;
    p.phase = phase == 0 ? "forward" : phase == 1 ? "backward" : "optimizer";
    p.name = model_step_event_name(cfg, e);
    p.activations_live = e < static_cast<int>(live.size()) ? live[static_cast<size_t>(e)] : 0;
    p.static_bytes = static_bytes;
    p.static_holds = holds;
    p.arena = model.activation_peak();
    if (static_cast<size_t>(phase) < measured_at_phase_end.size()) p.measured = measured_at_phase_end[phase];
    points.push_back(std::move(p));
  }
  return points;
}

}  // namespace tessera
