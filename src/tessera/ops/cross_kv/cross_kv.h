// tessera/ops/cross_kv — the layer-batched K/V projection of an encoder's output for every cross-attention layer
// of a decoder (LightSeq's "continuous" encoder-decoder attention): one GEMM for all L layers, then one kernel
// that adds the bias and lays out each layer's K and V as the attention op reads them.
//
//   P = m Wᵀ                                    m (Nk, C) the encoder's output, W (2 L KV, C), P (Nk, 2 L KV)
//   kv[2l + s][n, j] = P[n, (2l + s) KV + j] + bias[(2l + s) KV + j]       s = 0: layer l's K, s = 1: its V
//
// KV = Hkv Dh. W's rows are [k_0 | v_0 | k_1 | v_1 | ...]: layer l's K and V projections, adjacent, each
// (KV, C) as a Linear stores its weight, so one contiguous parameter range holds every layer's. kv: 2L slices,
// slice i at kv + i * slice_stride, each (Nk, KV) row-major, i.e. (B, Tk, Hkv, Dh) contiguous: the attention
// op's general K or V view. Nk = B Tk, the source tokens of the batch (padding included: key lengths mask it).
//
// Backward: every layer's attention backward writes its dK and dV into the slices of one shared d_kv (same
// layout, overwritten, so nothing needs zeroing), then
//   dP[n, (2l + s) KV + j] = d_kv[2l + s][n, j]            (the layout kernel, backwards)
//   d_bias += Σ_n dP[n, :],   d_W += dPᵀ m,   d_m = dP W   (or += with accumulate)
// so d_m is the encoder output's gradient summed over all L layers, from one GEMM.
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

struct CrossKvParams {
  int Nk = 0;  // source tokens (rows of m)
  int C = 0;   // the encoder's width
  int L = 0;   // decoder layers
  int KV = 0;  // Hkv Dh, the width of one K or V
  // Elements from one kv slice to the next; 0: Nk KV (packed). A plan made for more tokens keeps its stride.
  int64_t slice_stride = 0;
  // f32 on CUDA: TF32 tensor cores in the GEMMs (false: exact f32, which follows the reference).
  bool allow_tf32 = true;
  int64_t width() const { return 2 * int64_t{L} * KV; }  // P's row width, W's rows
  int64_t stride() const { return slice_stride ? slice_stride : int64_t{Nk} * KV; }
};

// The references, written for clarity: the whole projection straight from m, W and b in loops (the oracle of the
// tests), and the layout step alone (bias + layout of P, its backward), which the CPU path runs after its GEMM.
template <typename T>
void cross_kv_forward_ref(const CrossKvParams& p, T* kv, const T* m, const T* w, const T* bias);
// d_w, d_bias accumulated; d_m overwritten, or accumulated with `accumulate`.
template <typename T>
void cross_kv_backward_ref(const CrossKvParams& p, T* d_w, T* d_bias, T* d_m, const T* d_kv, const T* m, const T* w,
                           bool accumulate);
template <typename T>
void cross_kv_layout_forward_ref(const CrossKvParams& p, T* kv, const T* proj, const T* bias);
template <typename T>
void cross_kv_layout_backward_ref(const CrossKvParams& p, T* d_proj, const T* d_kv);

}  // namespace tessera

// ---- Tensor-level entries (cross_kv.cpp): the GEMMs through ops/gemm, the layout step by the reference (CPU) or
// its CUDA kernel. All float tensors in the compute dtype, contiguous. m, d_m: (Nk, C); w, d_w: (2 L KV, C); bias,
// d_bias: (2 L KV) or undefined (no bias); kv, d_kv: at least (2L - 1) slice_stride + Nk KV elements; proj,
// d_proj: (Nk, 2 L KV), the GEMM's output, a scratch the caller owns (it may share memory with nothing else
// here). ----
namespace tessera {

bool cross_kv_supports(const CrossKvParams& p, DType dtype, Device device, std::string* why = nullptr);

void cross_kv_forward(const CrossKvParams& p, const Tensor& kv, const Tensor& proj, const Tensor& m, const Tensor& w,
                      const Tensor& bias, Context& ctx);
void cross_kv_backward(const CrossKvParams& p, const Tensor& d_w, const Tensor& d_bias, const Tensor& d_m,
                       const Tensor& d_proj, const Tensor& d_kv, const Tensor& m, const Tensor& w, bool accumulate,
                       Context& ctx);

// ---- CUDA launchers (cross_kv.cu), on ctx's stream; pointers are device memory in `dtype`. ----
// Forward: one thread per 16-byte pack of one kv slice row (scalar when KV is not a multiple of the pack or a
// pointer is not 16-byte aligned): reads P's pack and the bias's, adds in f32, stores once. Backward: the same
// grid, copying d_kv's packs back into dP's rows. Both are pure data movement, one read and one write of each
// element; the bias gradient is bias_grad's deterministic column sum over dP afterwards.
void cross_kv_layout_forward_cuda(const CrossKvParams& p, DType dtype, void* kv, const void* proj, const void* bias,
                                  Context& ctx);
void cross_kv_layout_backward_cuda(const CrossKvParams& p, DType dtype, void* d_proj, const void* d_kv, Context& ctx);

}  // namespace tessera
