// tessera/ops/dispatch.h — the checks and the device/dtype routing shared by every Tensor-level op entry.
//
// An op entry `<op>(const Params&, Tensor..., Context&)` first asks `<op>_supports(params, dtype, device, &why)`
// (ggml's split between asking and running), then checks its tensors with expect(), then routes:
//   CPU, f32 or f64  -> <op>_ref<float|double>  (the readable reference; f64 exists for gradient checks)
//   CUDA, f32/bf16/f16 -> <op>_cuda             (the fused kernels; statistics always f32)
// That routing is written here once: dispatch() (CUDA launcher or CPU reference) and on_cuda() (the CUDA branch
// alone, for an entry whose CPU side is not one reference call). They hold the build's only
// `#ifdef TESSERA_WITH_CUDA` for the entries: without CUDA the launcher lambda is never called, so the *_cuda
// functions (declared in every build, defined in the .cu files) are never referenced.
#pragma once
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/tensor.h"

namespace tessera {

// Fails with "<op>: <why>" unless `ok`.
inline void require_supported(bool ok, const char* op, const std::string& why) {
  TS_CHECK(ok, op, ": not supported: ", why);
}

// A tensor argument's contract: on the context's device, of `dtype`, contiguous, with `numel` elements.
// An undefined tensor passes when `optional`.
inline void expect(const Tensor& t, const char* op, const char* name, DType dtype, int64_t numel, const Context& ctx,
                   bool optional = false) {
  if (!t.defined()) {
    TS_CHECK(optional, op, ": ", name, " is required");
    return;
  }
  TS_CHECK(t.device() == ctx.device(), op, ": ", name, " is on ", t.device().str(), " but the context is ",
           ctx.device().str());
  TS_CHECK(t.dtype() == dtype, op, ": ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(dtype));
  TS_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  TS_CHECK(t.numel() == numel, op, ": ", name, " has ", t.numel(), " elements ", t.shape_str(), ", expected ", numel);
}

// The dtype of saved statistics (mean, rstd, logsumexp): f32, or f64 in the CPU gradient-check build.
inline DType stat_dtype(DType compute) { return compute == DType::F64 ? DType::F64 : DType::F32; }

// The standard supports() answer on dtype and device; ops add their shape rules on top.
inline bool supports_dtype(DType dtype, Device device, std::string* why) {
  if (device.is_cpu()) {
    if (dtype == DType::F32 || dtype == DType::F64) return true;
    if (why) *why = "the CPU reference computes in f32 or f64, not " + std::string(dtype_name(dtype));
    return false;
  }
#ifdef TESSERA_WITH_CUDA
  if (dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16) return true;
  if (why) *why = "the CUDA kernels compute in f32, bf16 or f16, not " + std::string(dtype_name(dtype));
  return false;
#else
  if (why) *why = "this tessera was built without CUDA";
  return false;
#endif
}

// Calls f(float{}) or f(double{}) for a CPU reference dtype.
template <typename F>
void dispatch_ref(DType dtype, const char* op, F&& f) {
  if (dtype == DType::F32) f(float{});
  else if (dtype == DType::F64) f(double{});
  else TS_THROW(op, ": no CPU reference for dtype ", dtype_name(dtype));
}

// On a CUDA context: runs `cuda` and returns true, or returns what `cuda` returns where that is a bool (false: the
// launcher declined the shape and the caller falls back). Elsewhere, and in a build without CUDA: returns false.
template <typename F>
bool on_cuda(const Context& ctx, F&& cuda) {
#ifdef TESSERA_WITH_CUDA
  if (ctx.is_cuda()) {
    if constexpr (std::is_same_v<std::invoke_result_t<F>, bool>) {
      return cuda();
    } else {
      cuda();
      return true;
    }
  }
#else
  (void)ctx;
  (void)cuda;
#endif
  return false;
}

// An op entry's routing: `cuda()` on a CUDA context, else `ref(float{})` or `ref(double{})` by dtype.
template <typename Cuda, typename Ref>
void dispatch(const Context& ctx, DType dtype, const char* op, Cuda&& cuda, Ref&& ref) {
  if (on_cuda(ctx, std::forward<Cuda>(cuda))) return;
  dispatch_ref(dtype, op, std::forward<Ref>(ref));
}

}  // namespace tessera
