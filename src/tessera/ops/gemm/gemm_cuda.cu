// GEMMs through cuBLASLt, and the deterministic bias gradient (see gemm.h for the math and the layout mapping).
#include <cublasLt.h>

#include <algorithm>
#include <string>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/gemm/gemm.h"

namespace tessera {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::to_f32;

std::string gemm_shape_str(const GemmParams& p, DType dt) {
  std::string s = "gemm " + std::string(dtype_name(dt)) + " M=" + std::to_string(p.M) + " N=" + std::to_string(p.N) +
                  " K=" + std::to_string(p.K) + (p.trans_a ? " trans_a" : "") + (p.trans_b ? " trans_b" : "");
  if (p.lda || p.ldb || p.ldc)
    s.append(" ld ")
        .append(std::to_string(p.ld_a()))
        .append("/")
        .append(std::to_string(p.ld_b()))
        .append("/")
        .append(std::to_string(p.ld_c()));
  if (p.batch > 1) s += " batch=" + std::to_string(p.batch);
  if (dt == DType::F32) s += p.allow_tf32 ? " (tf32)" : " (exact f32)";
  return s;
}

void check_lt(cublasStatus_t st, const char* call, const GemmParams& p, DType dt) {
  TS_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", call, " failed for ", gemm_shape_str(p, dt), ": ",
           cublasLtGetStatusString(st), " (status ", static_cast<int>(st), ")");
}

// RAII owners of the per-call cuBLASLt descriptors (created and destroyed on the host each call: cheap).
struct LtMatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~LtMatmulDesc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct LtLayout {
  cublasLtMatrixLayout_t d = nullptr;
  ~LtLayout() {
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};
struct LtPreference {
  cublasLtMatmulPreference_t d = nullptr;
  ~LtPreference() {
    if (d) cublasLtMatmulPreferenceDestroy(d);
  }
};

cudaDataType_t lt_data_type(DType dt) {
  switch (dt) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: TS_THROW("gemm: no cuBLASLt type for dtype ", dtype_name(dt));
  }
}

// The alignment (a power of two, at most 256 bytes, cuBLASLt's default assumption) that every product's
// pointer has: the address and, batched, the batch offset in bytes. The heuristic must be told, or it may pick a
// kernel that needs wider alignment than a slice (for example a view inside a fused buffer) has.
uint32_t alignment_bytes(const void* p, int batch, int64_t stride, size_t elem) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) v |= static_cast<uintptr_t>(stride) * elem;
  uint32_t a = 256;
  while (a > 1 && (v & (a - 1))) a >>= 1;
  return a;
}

// c (batch, rows, N), rows ldc apart, batch offset stride_c: c = beta*c + bias[n] (beta == 0: c is not read, as in the
// reference, so NaN-poisoned memory does not leak). Two uses: K == 0, where the product is empty, and adding the
// bias after a matmul whose bias epilogue cuBLASLt declined (beta = 1). Grid-stride over the elements of one
// product on x, the batch on y.
template <typename T>
__global__ void gemm_scale_add_bias_elementwise(T* __restrict__ c, const T* __restrict__ bias, int64_t per_batch, int N,
                                                int64_t ldc, int64_t stride_c, float beta) {
  T* cb = c + static_cast<int64_t>(blockIdx.y) * stride_c;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < per_batch;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T* at = cb + (i / N) * ldc + i % N;
    float v = beta == 0.0f ? 0.0f : beta * to_f32(*at);
    if (bias) v += to_f32(bias[i % N]);
    *at = from_f32<T>(v);
  }
}

template <typename T>
void launch_scale_add_bias(const GemmParams& p, T* c, const T* bias, float beta, Context& ctx) {
  const int64_t per_batch = static_cast<int64_t>(p.M) * p.N;
  constexpr int kThreads = 256;
  const unsigned blocks = std::min<unsigned>(ceil_div(per_batch, kThreads), 4u * ctx.gpu().sm_count);
  gemm_scale_add_bias_elementwise<T>
      <<<dim3(blocks, p.batch), kThreads, 0, ctx.stream()>>>(c, bias, per_batch, p.N, p.ld_c(), p.stride_c, beta);
  TS_CHECK_LAUNCH();
}

struct LtPlan {
  LtMatmulDesc desc;
  LtLayout la, lb, lc;
  LtPreference pref;
  cublasLtMatmulHeuristicResult_t heuristic{};
};

// Builds the descriptors for one call and asks the heuristic for the best algorithm. Returns false when no
// algorithm fits (the caller then retries without the bias epilogue). The heuristic query costs a few
// microseconds of host time per call (it is not cached, by design: no global state); at GPT-2 sizes that is
// well below one GEMM's GPU time, and CUDA-graph capture removes it from the step altogether.
// The epilogue of one cublasLtMatmul: none, the bias, or the bias then GELU with the pre-activation written to the
// aux matrix.
struct LtEpilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;  // (M, N) row-major, packed: column-major (N, M) with leading dimension N
};

LtEpilogue bias_epilogue(const void* bias) {
  return {.kind = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, .bias = bias};
}

bool plan_matmul(LtPlan& plan, const GemmParams& p, DType dt, const void* c, const void* a, const void* b,
                 const LtEpilogue& epi, Context& ctx) {
  auto lt = static_cast<cublasLtHandle_t>(ctx.cublaslt());
  const cudaDataType_t type = lt_data_type(dt);
  const size_t es = dtype_size(dt);
  const cublasComputeType_t compute = dt == DType::F32 && p.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                       : CUBLAS_COMPUTE_32F;
  check_lt(cublasLtMatmulDescCreate(&plan.desc.d, compute, CUDA_R_32F), "MatmulDescCreate", p, dt);
  // cuBLASLt's A is our B: stored (K, N) row-major = (N, K) column-major, already op(B)ᵀ; with trans_b it is
  // stored (N, K) row-major = (K, N) column-major and must be transposed. Likewise its B is our A.
  const cublasOperation_t op_lt_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(plan.desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)),
           "set TRANSA", p, dt);
  check_lt(cublasLtMatmulDescSetAttribute(plan.desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)),
           "set TRANSB", p, dt);
  if (const int32_t sms = ctx.gemm_sm_target(); sms > 0)
    check_lt(cublasLtMatmulDescSetAttribute(plan.desc.d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)),
             "set SM_COUNT_TARGET", p, dt);
  if (epi.kind != CUBLASLT_EPILOGUE_DEFAULT)
    check_lt(cublasLtMatmulDescSetAttribute(plan.desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi.kind, sizeof(epi.kind)),
             "set EPILOGUE", p, dt);
  if (epi.bias) {
    // The heuristic reads the pointer's alignment; the bias type defaults to the output type.
    check_lt(cublasLtMatmulDescSetAttribute(plan.desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi.bias,
                                            sizeof(epi.bias)),
             "set BIAS_POINTER", p, dt);
    const int64_t bias_stride = 0;  // one bias for every product of a batch
    check_lt(cublasLtMatmulDescSetAttribute(plan.desc.d, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride,
                                            sizeof(bias_stride)),
             "set BIAS_BATCH_STRIDE", p, dt);
  }
  if (epi.aux) {
    // The aux matrix has D's layout and type (packed rows: leading dimension N, which cuBLASLt wants divisible by 8).
    const int64_t aux_ld = p.N;
    check_lt(cublasLtMatmulDescSetAttribute(plan.desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epi.aux,
                                            sizeof(epi.aux)),
             "set EPILOGUE_AUX_POINTER", p, dt);
    check_lt(cublasLtMatmulDescSetAttribute(plan.desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
             "set EPILOGUE_AUX_LD", p, dt);
  }
  // Column-major layouts (rows, cols, leading dimension) of the memory as stored.
  // A stored matrix of r rows of c elements, ld apart, row-major, is column-major (c, r) with leading dimension ld.
  check_lt(cublasLtMatrixLayoutCreate(&plan.la.d, type, p.b_cols(), p.b_rows(), p.ld_b()), "MatrixLayoutCreate(B)", p,
           dt);
  check_lt(cublasLtMatrixLayoutCreate(&plan.lb.d, type, p.a_cols(), p.a_rows(), p.ld_a()), "MatrixLayoutCreate(A)", p,
           dt);
  check_lt(cublasLtMatrixLayoutCreate(&plan.lc.d, type, p.N, p.M, p.ld_c()), "MatrixLayoutCreate(C)", p, dt);
  if (p.batch > 1) {
    const int32_t count = p.batch;
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {{plan.la.d, p.stride_b},
                                                                  {plan.lb.d, p.stride_a},
                                                                  {plan.lc.d, p.stride_c}};
    for (const auto& [layout, stride] : layouts) {
      check_lt(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
               "set BATCH_COUNT", p, dt);
      check_lt(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                sizeof(stride)),
               "set STRIDED_BATCH_OFFSET", p, dt);
    }
  }
  check_lt(cublasLtMatmulPreferenceCreate(&plan.pref.d), "MatmulPreferenceCreate", p, dt);
  const uint64_t ws_bytes = ctx.gemm_workspace_bytes();
  check_lt(cublasLtMatmulPreferenceSetAttribute(plan.pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof(ws_bytes)),
           "set MAX_WORKSPACE_BYTES", p, dt);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_bytes(b, p.batch, p.stride_b, es)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_bytes(a, p.batch, p.stride_a, es)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_bytes(c, p.batch, p.stride_c, es)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_bytes(c, p.batch, p.stride_c, es)}};
  for (const auto& [attr, align] : alignments)
    check_lt(cublasLtMatmulPreferenceSetAttribute(plan.pref.d, attr, &align, sizeof(align)), "set MIN_ALIGNMENT", p,
             dt);
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, plan.desc.d, plan.la.d, plan.lb.d, plan.lc.d, plan.lc.d,
                                                           plan.pref.d, 1, &plan.heuristic, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  check_lt(st, "MatmulAlgoGetHeuristic", p, dt);
  return found > 0;
}

// d_c: (M, N) row-major; d_bias: (N). Block (32, 8): threadIdx.x picks a column (consecutive threads read
// consecutive addresses), threadIdx.y a row stripe inside the block's chunk of rows; each thread sums its stripe
// in order, the 8 stripes are summed in order through shared memory. With one chunk (gridDim.y == 1) the column
// sum is added to d_bias at once; otherwise each chunk writes partial[chunk][n] in fp32 for the finishing kernel.
constexpr int kBiasCols = 32, kBiasStripes = 8;
template <typename T>
__global__ void bias_grad_column_chunks(T* __restrict__ d_bias, float* __restrict__ partial, const T* __restrict__ d_c,
                                        int M, int N, int rows_per_chunk) {
  __shared__ float sums[kBiasStripes][kBiasCols + 1];
  const int n = blockIdx.x * kBiasCols + threadIdx.x;
  const int m0 = blockIdx.y * rows_per_chunk, m1 = min(M, m0 + rows_per_chunk);
  float s = 0.0f;
  // Unrolled: 8 loads in flight ahead of the ordered adds (a rolled loop waits one memory latency per row).
  if (n < N)
#pragma unroll 8
    for (int m = m0 + threadIdx.y; m < m1; m += kBiasStripes) s += to_f32(d_c[static_cast<int64_t>(m) * N + n]);
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || n >= N) return;
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kBiasStripes; ++i) total += sums[i][threadIdx.x];
  if (partial) partial[static_cast<int64_t>(blockIdx.y) * N + n] = total;
  else d_bias[n] = from_f32<T>(to_f32(d_bias[n]) + total);
}

// partial: (chunks, N) fp32. d_bias[n] += Σ_chunk partial[chunk][n], chunks in order: one thread per column.
template <typename T>
__global__ void bias_grad_sum_chunks(T* __restrict__ d_bias, const float* __restrict__ partial, int chunks, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float total = 0.0f;
#pragma unroll 8
  for (int i = 0; i < chunks; ++i) total += partial[static_cast<int64_t>(i) * N + n];
  d_bias[n] = from_f32<T>(to_f32(d_bias[n]) + total);
}

}  // namespace

void gemm_cuda(const GemmParams& p, DType dt, void* c, const void* a, const void* b, const void* bias, Context& ctx) {
  if (p.M == 0 || p.N == 0 || p.batch == 0) return;
  if (p.K == 0) {  // an empty product: C = beta*C + bias (cuBLASLt does not take k = 0)
    cuda::dispatch_float(dt, "gemm", [&](auto t) {
      using T = decltype(t);
      launch_scale_add_bias<T>(p, static_cast<T*>(c), static_cast<const T*>(bias), p.beta, ctx);
    });
    return;
  }
  LtPlan fused;
  const LtPlan* plan = &fused;
  LtPlan plain;
  bool bias_after = false;
  if (!plan_matmul(fused, p, dt, c, a, b, bias_epilogue(bias), ctx)) {
    // No algorithm with the bias epilogue for this shape / alignment: multiply, then add the bias separately.
    TS_CHECK(bias, "cuBLASLt found no algorithm for ", gemm_shape_str(p, dt));
    TS_CHECK(plan_matmul(plain, p, dt, c, a, b, bias_epilogue(nullptr), ctx), "cuBLASLt found no algorithm for ",
             gemm_shape_str(p, dt));
    plan = &plain;
    bias_after = true;
  }
  auto lt = static_cast<cublasLtHandle_t>(ctx.cublaslt());
  // cuBLASLt's A is our B, its B our A (row-major C = column-major Cᵀ = op(B)ᵀ op(A)ᵀ). C is both input and
  // output (D); with beta == 0 it is not read.
  check_lt(cublasLtMatmul(lt, plan->desc.d, &p.alpha, b, plan->la.d, a, plan->lb.d, &p.beta, c, plan->lc.d, c,
                          plan->lc.d, &plan->heuristic.algo, ctx.gemm_workspace(), ctx.gemm_workspace_bytes(),
                          ctx.stream()),
           "Matmul", p, dt);
  if (bias_after)
    cuda::dispatch_float(dt, "gemm", [&](auto t) {
      using T = decltype(t);
      launch_scale_add_bias<T>(p, static_cast<T*>(c), static_cast<const T*>(bias), /*beta=*/1.0f, ctx);
    });
}

namespace {
// One cublasLtMatmul with a GELU epilogue, or false when cuBLASLt has no algorithm for it (the caller then runs the
// unfused ops). c is D; epi.aux the GELU input matrix.
bool matmul_with_gelu_epilogue(const GemmParams& p, DType dt, void* c, const void* a, const void* b,
                               const LtEpilogue& epi, Context& ctx) {
  if (p.M == 0 || p.N == 0 || p.K == 0 || p.N % 8 != 0) return false;  // cuBLASLt: aux ld divisible by 8
  LtPlan plan;
  if (!plan_matmul(plan, p, dt, c, a, b, epi, ctx)) return false;
  auto lt = static_cast<cublasLtHandle_t>(ctx.cublaslt());
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(lt, plan.desc.d, &alpha, b, plan.la.d, a, plan.lb.d, &beta, c, plan.lc.d, c, plan.lc.d,
                          &plan.heuristic.algo, ctx.gemm_workspace(), ctx.gemm_workspace_bytes(), ctx.stream()),
           "Matmul (GELU epilogue)", p, dt);
  return true;
}
}  // namespace

bool gemm_gelu_forward_cuda(const GemmParams& p, DType dt, void* out, void* pre, const void* a, const void* b,
                            const void* bias, Context& ctx) {
  // The heuristic is told the alignment of A, B, C and D but not of the aux matrix: take the epilogue only when
  // pre is 16-byte aligned (the model's arena buffers are), else the unfused ops run.
  if (!cuda::aligned16(pre)) return false;
  return matmul_with_gelu_epilogue(p, dt, out, a, b,
                                   {.kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, .bias = bias, .aux = pre}, ctx);
}

void bias_grad_cuda(const BiasGradParams& p, DType dt, void* d_bias, const void* d_c, Context& ctx) {
  if (p.N == 0 || p.M == 0) return;
  const unsigned col_blocks = ceil_div(p.N, kBiasCols);
  // Enough row chunks for about 4 blocks per SM, each chunk at least 64 rows, at most 1024 chunks. The chunking
  // depends only on the shape and the GPU, so the sums are reproducible on a given GPU.
  const int want = static_cast<int>(ceil_div(4L * ctx.gpu().sm_count, col_blocks));
  const int chunks = std::clamp(want, 1, std::min<int>(1024, ceil_div(p.M, 64)));
  const int rows_per_chunk = static_cast<int>(ceil_div(p.M, chunks));
  const int used_chunks = static_cast<int>(ceil_div(p.M, rows_per_chunk));
  float* partial = used_chunks > 1
                       ? static_cast<float*>(ctx.scratch(static_cast<size_t>(used_chunks) * p.N * sizeof(float)))
                       : nullptr;
  cuda::dispatch_float(dt, "bias_grad", [&](auto t) {
    using T = decltype(t);
    bias_grad_column_chunks<T><<<dim3(col_blocks, used_chunks), dim3(kBiasCols, kBiasStripes), 0, ctx.stream()>>>(
        static_cast<T*>(d_bias), partial, static_cast<const T*>(d_c), p.M, p.N, rows_per_chunk);
    TS_CHECK_LAUNCH();
    if (partial) {
      bias_grad_sum_chunks<T>
          <<<ceil_div(p.N, 256), 256, 0, ctx.stream()>>>(static_cast<T*>(d_bias), partial, used_chunks, p.N);
      TS_CHECK_LAUNCH();
    }
  });
}

}  // namespace tessera
