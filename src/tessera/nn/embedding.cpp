#include "tessera/nn/embedding.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace tessera {

void Embedding::add_params(ParamBuffer& pb, size_t shared_wte) {
  wte_ = shared_wte != kNoParam ? shared_wte : pb.add(prefix_ + "wte", {s_.V, s_.C}, true);
  if (s_.positions == PositionKind::Learned)
    wpe_ = pb.add(prefix_ + "wpe", {int64_t{s_.pos_offset} + s_.max_seq, s_.C}, true);
}

void Embedding::make_tables(DType dtype, Context& ctx) {
  if (s_.positions != PositionKind::Sinusoidal) return;
  const int64_t C = s_.C;
  // PE[pos, 2i] = sin(pos / 10000^(2i/C)), PE[pos, 2i+1] = cos(pos / 10000^(2i/C)), made on the host in f64.
  std::vector<double> table(static_cast<size_t>(s_.max_seq) * C, 0.0);
  for (int pos = 0; pos < s_.max_seq; ++pos) {
    for (int64_t i = 0; i < C / 2; ++i) {
      const double a = pos / std::pow(10000.0, 2.0 * i / C);
      table[pos * C + 2 * i] = std::sin(a);
      table[pos * C + 2 * i + 1] = std::cos(a);
    }
  }
  // An f64 model keeps the table in f64 (its gradient checks need it); the others round it from f32.
  std::vector<unsigned char> raw(table.size() * dtype_size(dtype));
  if (dtype == DType::F64) {
    std::memcpy(raw.data(), table.data(), raw.size());
  } else {
    const std::vector<float> f32(table.begin(), table.end());
    convert_from_f32(f32.data(), f32.size(), dtype, raw.data());
  }
  sinusoid_ = Buffer(raw.size(), ctx.device(), "the sinusoid table");
  table_dtype_ = dtype;
  copy_bytes(sinusoid_.data(), ctx.device(), raw.data(), Device::cpu(), raw.size(), ctx);
  ctx.synchronize();
}

void Embedding::declare(PlanBuilder& pb, DType dt, int out_death) {
  pb.add(out_, prefix_ + "res.0", dt, {pb.N(), s_.C}, fwd_, out_death);
}

int Embedding::table_rows() const { return s_.max_seq + (s_.positions == PositionKind::Learned ? s_.pos_offset : 0); }

EmbeddingParams Embedding::params(const StepEnv& env) const {
  const int offset = s_.positions == PositionKind::Learned ? s_.pos_offset : 0;
  return {.B = env.B,
          .T = env.T,
          .C = s_.C,
          .V = s_.V,
          .max_seq = table_rows(),
          .pos_offset = offset,
          .scale = s_.scale,
          .padding_id = s_.padding_id,
          .dropout = env.dropout,
          .seed = env.seed,
          .stream = stream_};
}

void Embedding::check_tokens(const int32_t* tokens, int B, int T) const {
  const int offset = s_.positions == PositionKind::Learned ? s_.pos_offset : 0;
  embedding_check({.B = B,
                   .T = T,
                   .C = s_.C,
                   .V = s_.V,
                   .max_seq = table_rows(),
                   .pos_offset = offset,
                   .padding_id = s_.padding_id},
                  tokens, s_.positions == PositionKind::Learned);
}

void Embedding::forward(const StepEnv& env, const Tensor& tokens) const {
  const int64_t table = static_cast<int64_t>(table_rows()) * s_.C;
  const Tensor pos = s_.positions == PositionKind::Learned      ? env.p(wpe_, table)
                     : s_.positions == PositionKind::Sinusoidal ? sinusoid_.view(table_dtype_, {table})
                                                                : Tensor();
  env.at(fwd_);
  embedding_forward(params(env), out(env.N()), tokens.slice1d(0, env.N()), env.p(wte_, wte_numel()), pos, *env.ctx);
}

void Embedding::backward(const StepEnv& env, const Tensor& d_out, const Tensor& tokens) const {
  env.at(bwd_);
  embedding_backward(params(env), env.g(wte_, wte_numel()), env.g(wpe_, int64_t{table_rows()} * s_.C), d_out,
                     tokens.slice1d(0, env.N()), *env.ctx);
}

}  // namespace tessera
