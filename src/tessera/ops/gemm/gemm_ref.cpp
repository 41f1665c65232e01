#include "tessera/core/parallel.h"
#include "tessera/ops/gemm/gemm.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/memory.h"

#include <omp.h>

#ifdef TESSERA_WITH_OPENBLAS
#include <cblas.h>
#endif

namespace tessera {

template <typename T>
void gemm_loop_ref(const GemmParams& p, T* c, const T* a, const T* b, const T* bias) {
  const long lda = p.ld_a(), ldb = p.ld_b(), ldc = p.ld_c();
  std::vector<double> row(p.N);
  for (int m = 0; m < p.M; ++m) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int k = 0; k < p.K; ++k) {
      const double av = p.trans_a ? a[k * lda + m] : a[m * lda + k];
      if (av == 0) continue;
      if (p.trans_b) {
        for (int n = 0; n < p.N; ++n) row[n] += av * b[n * ldb + k];
      } else {
        const T* br = b + k * ldb;
        for (int n = 0; n < p.N; ++n) row[n] += av * br[n];
      }
    }
    T* cr = c + m * ldc;
    for (int n = 0; n < p.N; ++n) {
      const double prev = p.beta == 0 ? 0.0 : p.beta * static_cast<double>(cr[n]);
      cr[n] = static_cast<T>(p.alpha * row[n] + prev + (bias ? bias[n] : T(0)));
    }
  }
}

namespace {
#ifdef TESSERA_WITH_OPENBLAS
// Splits C's rows into blocks, each a single-threaded BLAS call, spread over the OpenMP threads: on small and
// mid-sized GEMMs (a training step's shapes) this uses the cores far better than OpenBLAS's own threads. The
// blocks depend on the shape alone, never on the thread count: OpenBLAS rounds an element differently with the
// number of rows a call has (a product split in two calls differs from the one call in some of its elements), so a
// split per thread would make the CPU's results depend on OMP_NUM_THREADS. Each element is computed by exactly one
// call, so they do not depend on timing either.
constexpr int kBlasBlockMinRows = 128;  // rows of a block, at least (fewer rows than this and packing B dominates)
constexpr int kBlasMaxBlocks = 64;      // blocks of a GEMM, at most: enough for 64 threads

// OpenBLAS gives each thread that calls it a work buffer of its own, 128 MiB of address space mapped at the thread's
// first call (the calling thread's at start-up when OpenBLAS starts single-threaded, as after OMP_NUM_THREADS=1
// OPENBLAS_NUM_THREADS=1) and never unmapped. When that mapping fails it tries again, forever: under an address-space
// limit (ulimit -v) a GEMM would spin at full CPU in its first call and never end, deaf to Ctrl-C. So a thread's
// first BLAS call checks the address space left first, under a lock (two threads' checks could both pass with room
// for one buffer), and a thread without room skips its block; the GEMM then fails as out of memory, in one line.
// The check asks for the buffer and a new thread's malloc arena (glibc reserves 64 MiB); a thread that calls BLAS
// with room for that keeps its buffer for every later call.
constexpr size_t kBlasFirstCallBytes = size_t{192} << 20;
thread_local bool blas_buffer_mapped = false;
std::mutex blas_first_call;

// Runs `call` on this thread; on its first BLAS call, only when the address space has room for its buffer. False
// when it had not (call skipped).
template <typename Call>
bool blas_call_with_room(Call&& call) {
  if (blas_buffer_mapped) {
    call();
    return true;
  }
  std::lock_guard<std::mutex> lock(blas_first_call);
  if (address_space_left() < kBlasFirstCallBytes) return false;
  call();
  blas_buffer_mapped = true;
  return true;
}

template <typename T, typename Blas>
void gemm_blas_blocked(const GemmParams& p, T* c, const T* a, const T* b, Blas blas) {
  static const bool single = [] {
    // Started single-threaded, OpenBLAS mapped the calling (main) thread's buffer at start-up.
    blas_buffer_mapped = openblas_get_num_threads() == 1;
    openblas_set_num_threads(1);
    return true;
  }();
  (void)single;
  const long work = static_cast<long>(p.M) * p.N * p.K;
  const int blocks = work < 4 * kParallelMinWork ? 1 : std::clamp(p.M / kBlasBlockMinRows, 1, kBlasMaxBlocks);
  std::atomic<bool> no_room{false};
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int blk = 0; blk < blocks; ++blk) {
    if (no_room.load(std::memory_order_relaxed)) continue;
    const int m0 = static_cast<int>(static_cast<long>(p.M) * blk / blocks);
    const int m1 = static_cast<int>(static_cast<long>(p.M) * (blk + 1) / blocks);
    // Rows [m0, m1) of op(A): row m0 of A, or column m0 of the stored (K, M) A when transposed.
    const T* a_blk = p.trans_a ? a + m0 : a + m0 * p.ld_a();
    const bool ran = blas_call_with_room([&] {
      blas(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans, p.trans_b ? CblasTrans : CblasNoTrans, m1 - m0, p.N,
           p.K, p.alpha, a_blk, p.ld_a(), b, p.ld_b(), p.beta, c + m0 * p.ld_c(), p.ld_c());
    });
    if (!ran) no_room.store(true, std::memory_order_relaxed);
  }
  TS_CHECK(!no_room.load(), "out of memory: the CPU GEMMs need ", kBlasFirstCallBytes >> 20,
           " MiB of address space "
           "for each thread's BLAS work buffer, ",
           address_space_left() >> 20,
           " MiB are left under the limit (ulimit "
           "-v); raise it, or run fewer threads (OMP_NUM_THREADS)");
}
#endif

template <typename T>
void add_bias(const GemmParams& p, T* c, const T* bias) {
  if (!bias) return;
  for (long m = 0; m < p.M; ++m)
    for (int n = 0; n < p.N; ++n) c[m * p.ld_c() + n] += bias[n];
}
}  // namespace

template <>
void gemm_ref<float>(const GemmParams& p, float* c, const float* a, const float* b, const float* bias) {
#ifdef TESSERA_WITH_OPENBLAS
  if (p.M == 0 || p.N == 0) return;
  gemm_blas_blocked(p, c, a, b, cblas_sgemm);
  add_bias(p, c, bias);
#else
  gemm_loop_ref(p, c, a, b, bias);
#endif
}

template <>
void gemm_ref<double>(const GemmParams& p, double* c, const double* a, const double* b, const double* bias) {
#ifdef TESSERA_WITH_OPENBLAS
  if (p.M == 0 || p.N == 0) return;
  gemm_blas_blocked(p, c, a, b, cblas_dgemm);
  add_bias(p, c, bias);
#else
  gemm_loop_ref(p, c, a, b, bias);
#endif
}

bool gemm_uses_blas() {
#ifdef TESSERA_WITH_OPENBLAS
  return true;
#else
  return false;
#endif
}

template <typename T>
void bias_grad_ref(int M, int N, T* d_bias, const T* d_c) {
  for (long m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) d_bias[n] += d_c[m * N + n];
}

template void gemm_loop_ref<float>(const GemmParams&, float*, const float*, const float*, const float*);
template void gemm_loop_ref<double>(const GemmParams&, double*, const double*, const double*, const double*);
template void bias_grad_ref<float>(int, int, float*, const float*);
template void bias_grad_ref<double>(int, int, double*, const double*);

}  // namespace tessera
