#include "tessera/bench/decode_attention.h"

#include <string>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/ops/attention/attention_decode.h"

namespace tessera {

std::vector<BenchRow> bench_decode_attention(const BenchConfig& cfg, BenchHarness& h) {
  Context& ctx = h.context();
  const bool small = cfg.size == BenchSize::Small;
  const int H = small ? 2 : 12, Dh = small ? 16 : 64, max_seq = small ? 64 : 1024;
  const DType dt = cfg.dtype;
  const double es = static_cast<double>(dtype_size(dt));
  std::vector<BenchRow> rows;
  for (const int B : {1, small ? 2 : 16}) {
    const DecodeAttentionParams p{.B = B, .Tq = 1, .H = H, .Hkv = H, .Dh = Dh, .S = B, .max_seq = max_seq};
    const int64_t cache_n = static_cast<int64_t>(B) * H * max_seq * Dh, row_n = static_cast<int64_t>(B) * H * Dh;
    const Buffer k(static_cast<size_t>(cache_n) * dtype_size(dt), ctx.device(), "benchmark decode cache k");
    const Buffer v(static_cast<size_t>(cache_n) * dtype_size(dt), ctx.device(), "benchmark decode cache v");
    const Buffer q(static_cast<size_t>(row_n) * dtype_size(dt), ctx.device(), "benchmark decode q");
    const Buffer out(static_cast<size_t>(row_n) * dtype_size(dt), ctx.device(), "benchmark decode out");
    const Buffer pos(static_cast<size_t>(B) * 4, ctx.device(), "benchmark decode pos");
    const KvCacheView cache{.k = k.view(dt, {B, H, max_seq, Dh}), .v = v.view(dt, {B, H, max_seq, Dh})};
    const Tensor tq = q.view(dt, {B, 1, H, Dh}), tout = out.view(dt, {B, 1, H, Dh});
    // Zeros: the kernels take no data-dependent path, so the values do not change the time.
    for (const Tensor& t : {cache.k, cache.v, tq}) fill_bytes(t, 0, ctx);
    const std::vector<int32_t> host_pos(static_cast<size_t>(B), max_seq - 1);
    const Tensor tpos = pos.view(DType::I32, {B});
    copy_bytes(tpos.data(), ctx.device(), host_pos.data(), Device::cpu(), host_pos.size() * 4, ctx);
    ctx.synchronize();  // host_pos is read before it goes
    std::string kernel = "decode attention B=" + std::to_string(B);
    if (cfg.on_row) cfg.on_row(kernel);
    const Timing t = h.time([&] { attention_decode(p, tout, tq, cache, tpos, Tensor(), ctx); }, cfg.timing);
    rows.push_back({.kernel = std::move(kernel),
                    .shape = "B=" + std::to_string(B) + " H=" + std::to_string(H) + " Dh=" + std::to_string(Dh) +
                             " cache=" + std::to_string(max_seq),
                    .bytes = es * (2.0 * static_cast<double>(cache_n) + 2.0 * static_cast<double>(row_n)) + 4.0 * B,
                    .timing = t});
  }
  return rows;
}

}  // namespace tessera
