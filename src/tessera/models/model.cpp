#include "tessera/models/model.h"

#include "tessera/models/gpt.h"

namespace tessera {

// Every config describes a decoder-only transformer today: Gpt.
std::unique_ptr<Model> make_model(const ModelConfig& cfg, Context& ctx, DType dtype, MasterWeights master) {
  return std::make_unique<Gpt>(cfg, ctx, dtype, master);
}

std::unique_ptr<Model> make_model(const ModelConfig& cfg, DType dtype) { return std::make_unique<Gpt>(cfg, dtype); }

size_t model_flat_params(const ModelConfig& cfg) { return Gpt::flat_params(cfg); }

void model_describe_params(const ModelConfig& cfg, ParamBuffer& pb) { Gpt::describe_params(cfg, pb); }

MemoryPlan model_activation_plan(const ModelConfig& cfg, int B, int T, DType dtype, const PlanDebug& debug,
                                 GradMemory grads) {
  return Gpt::activation_plan(cfg, B, T, dtype, debug, grads);
}

size_t model_activation_bytes(const ModelConfig& cfg, int B, int T, DType dtype, GradMemory grads) {
  return Gpt::activation_bytes(cfg, B, T, dtype, grads);
}

int64_t model_logits_stride(const ModelConfig& cfg, DType dtype) { return Gpt::logits_stride(cfg, dtype); }

bool model_fuses_gelu(const ModelConfig& cfg, DType dtype) { return Gpt::fuses_gelu(cfg, dtype); }

int model_step_events(const ModelConfig& cfg) { return step_num_events(cfg.n_layers); }

int model_backward_first_event(const ModelConfig& cfg) { return step_event(cfg.n_layers, StepOp::LossBwd); }

std::string model_step_event_name(const ModelConfig& cfg, int event) { return step_event_name(cfg.n_layers, event); }

}  // namespace tessera
