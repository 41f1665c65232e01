// The attention family's kernel choice and the Hopper kernels' TMA descriptors, apart from the kernels (as
// FlashAttention-3's hopper/heuristics.h): which family takes a call (flash.h, flash_hopper.h, attention.h), and
// the tensor maps the wgmma kernels load through.
//
// Coverage, by family:
//   tiled f32-FMA (attention.cu): every case: f32 / bf16 / f16, any Dh up to 128, any alignment, grouped KV heads,
//     Tq != Tk, causal offsets, key lengths, dropout; the general call and the packed one.
//   mma.sync flash (flash.h), bf16 / f16, Dh % 8 == 0 up to 128, H and B at most 65535, 16-byte aligned bases:
//     the packed call's plain case (flash_forward.cu, flash_backward_*.cu), and every other call (flash_general.cu):
//     the general call's separate views with strides that are multiples of 8 elements, the packed call with
//     grouped KV heads or key lengths; GQA / MQA, Tq != Tk, causal with q_offset or not, key lengths, dropout, and
//     RoPE (rotated around the kernels by the entries), forward and backward.
//   Hopper wgmma + TMA (flash_hopper.h), on sm_90a under TESSERA_FLASH_PATH auto or hopper: the packed call's
//     plain case, forward and backward (flash_hopper_forward.cu, flash_hopper_backward.cu); and every other call
//     the mma.sync kernels take, forward and backward (flash_hopper_general.cu, flash_hopper_general_backward.cu:
//     GQA / MQA, Tq != Tk, q_offset, key lengths, dropout), where TMA takes each view (make_view_map: strides
//     multiples of 16 bytes) and Tq, Tk > 0, else mma.sync. TESSERA_FLASH_PATH=mma runs mma.sync throughout.
//   The rest (f32, Dh not a multiple of 8, misaligned views or strides) runs the tiled kernels.
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <cudaTypedefs.h>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_hopper.h"
#include "tessera/ops/attention/flash_hopper_kernel.cuh"

namespace tessera {

namespace flash_hopper {
namespace {
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const char* op) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    else (void)cudaGetLastError();  // leave no sticky runtime error behind
  });
  TS_CHECK(fn != nullptr, op, ": the driver has no cuTensorMapEncodeTiled");
  return fn;
}
}  // namespace

CUtensorMap make_heads_map(const char* op, DType dtype, const void* base, int Dh, int heads, int T, int B,
                           int box_rows) {
  const uint64_t row = static_cast<uint64_t>(heads) * Dh * 2;  // bytes
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(Dh), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(T),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(Dh) * 2, row, row * T};  // bytes, dims 1 .. 3
  const cuuint32_t box[4] = {kBoxCols, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  const CUresult r = tensor_map_encoder(
      op)(&map, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
          const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TS_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed with CUresult ", static_cast<int>(r), " for (B=", B,
           ", T=", T, ", ", heads, " heads of ", Dh, ")");
  return map;
}

bool make_view_map(CUtensorMap* map, DType dtype, const void* base, int Dh, int heads, int T, int B, int64_t sb,
                   int64_t st, int64_t sh, int box_rows) {
  if (!cuda::aligned16(base) || sb < 0 || st < 0 || sh < 0) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(Dh), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(T),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(sh) * 2, static_cast<cuuint64_t>(st) * 2,
                                 static_cast<cuuint64_t>(sb) * 2};  // bytes, dims 1 .. 3
  for (cuuint64_t s : strides)
    if (s % 16 != 0 || s >= (cuuint64_t{1} << 40)) return false;
  const cuuint32_t box[4] = {kBoxCols, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  std::memset(map, 0, sizeof(*map));
  const CUresult r = tensor_map_encoder("attention_forward (Hopper path)")(
      map, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace flash_hopper

int flash_attention_head_pad(int Dh) {
  if (Dh <= 0 || Dh % 8 != 0) return 0;
  if (Dh <= 32) return 32;
  if (Dh <= 64) return 64;
  if (Dh <= 80) return 80;
  if (Dh <= 128) return 128;
  return 0;
}

bool flash_attention_eligible(const AttentionParams& p, DType dtype, std::initializer_list<const void*> ptrs) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (!attention_is_plain(p)) return false;  // grouped heads, Tq != Tk, offsets and key lengths: tiled kernels
  if (flash_attention_head_pad(p.Dh) == 0) return false;
  for (const void* ptr : ptrs)
    if (!cuda::aligned16(ptr)) return false;
  return true;
}

bool flash_general_eligible(const AttentionParams& p, DType dtype,
                            std::initializer_list<AttentionView<const void>> views) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (flash_attention_head_pad(p.Dh) == 0) return false;
  if (p.H > 65535 || p.B > 65535) return false;
  for (const AttentionView<const void>& v : views) {
    if (!cuda::aligned16(v.data)) return false;
    if (v.sb % 8 != 0 || v.st % 8 != 0 || v.sh % 8 != 0) return false;  // 16-byte rows for 16-bit elements
  }
  return true;
}

FlashForwardPath flash_forward_path_requested() {
  const char* v = std::getenv("TESSERA_FLASH_PATH");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return FlashForwardPath::Auto;
  if (std::strcmp(v, "mma") == 0) return FlashForwardPath::Mma;
  if (std::strcmp(v, "hopper") == 0) return FlashForwardPath::Hopper;
  TS_THROW("TESSERA_FLASH_PATH must be auto, mma or hopper, not '", v, "'");
}

bool flash_hopper_forward_eligible(const AttentionParams& p, DType dtype, const Context& ctx) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (!attention_is_plain(p)) return false;
  if (flash_hopper_head_pad(p.Dh) == 0) return false;  // a multiple of 8 up to 128, zero-padded to 64 or 128
  if (p.H > 65535 || p.B > 65535) return false;
  return flash_hopper_available(ctx);
}

bool flash_path_takes_hopper(const char* op, FlashEligibility eligible, const AttentionParams& p, DType dtype,
                             const Context& ctx) {
  switch (flash_forward_path_requested()) {
    case FlashForwardPath::Mma: return false;
    case FlashForwardPath::Auto: return eligible(p, dtype, ctx);
    case FlashForwardPath::Hopper:
      TS_CHECK(flash_hopper_available(ctx), op, ": TESSERA_FLASH_PATH=hopper, but this device or build has no sm_90a ",
               "Hopper kernels (device compute capability ", ctx.gpu().sm_major, ".", ctx.gpu().sm_minor, ")");
      return eligible(p, dtype, ctx);
  }
  return false;
}

bool flash_forward_uses_hopper(const AttentionParams& p, DType dtype, const Context& ctx) {
  // Auto takes both Hopper kernels wherever eligible: with exp2 on the MUFU unit alone (flash::exp2_approx) they
  // measured faster than mma.sync, forward and backward, at Dh 64 and 128 and in the gpt2-124m step
  // (bench/results/2026-11-30-fast-exp2-h200.md); the other head widths run zero-padded in the 64 and 128 kernels
  // and measured faster than mma.sync too (bench/results/2026-12-02-padded-heads-hopper-h200.md).
  return flash_path_takes_hopper("attention_forward", flash_hopper_forward_eligible, p, dtype, ctx);
}

bool flash_hopper_general_forward_eligible(const AttentionParams& p, DType dtype, const Context& ctx) {
  return flash_hopper_head_pad(p.Dh) != 0 && flash_general_eligible(p, dtype, {}) && flash_hopper_available(ctx);
}

bool flash_general_forward_uses_hopper(const AttentionParams& p, DType dtype, const Context& ctx) {
  // The packed forward's rule; the views' tensor maps are built at the launch, which falls back to mma.sync
  // where one cannot be (flash_general_forward_hopper_cuda).
  return flash_path_takes_hopper("attention_forward", flash_hopper_general_forward_eligible, p, dtype, ctx);
}

bool flash_hopper_general_backward_eligible(const AttentionParams& p, DType dtype, const Context& ctx) {
  return flash_hopper_general_forward_eligible(p, dtype, ctx);
}

bool flash_general_backward_uses_hopper(const AttentionParams& p, DType dtype, const Context& ctx) {
  // The general forward's rule; the views' tensor maps are built at the launch, which falls back to mma.sync where
  // one cannot be (flash_general_backward_hopper_cuda).
  return flash_path_takes_hopper("attention_backward", flash_hopper_general_backward_eligible, p, dtype, ctx);
}

bool flash_hopper_backward_eligible(const AttentionParams& p, DType dtype, const Context& ctx) {
  return flash_hopper_forward_eligible(p, dtype, ctx);
}

bool flash_backward_uses_hopper(const AttentionParams& p, DType dtype, const Context& ctx) {
  // The forward's rule (flash_forward_uses_hopper has the measurements).
  return flash_path_takes_hopper("attention_backward", flash_hopper_backward_eligible, p, dtype, ctx);
}

}  // namespace tessera
