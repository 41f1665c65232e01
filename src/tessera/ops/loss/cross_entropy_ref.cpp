#include <algorithm>
#include <cmath>

#include "tessera/core/error.h"
#include "tessera/core/parallel.h"
#include "tessera/ops/loss/cross_entropy.h"

namespace tessera {

template <typename T>
long cross_entropy_forward_ref(const CrossEntropyParams& p, T* losses, T* lse, const T* logits,
                               const int32_t* targets) {
  long count = 0;
  for (long n = 0; n < p.N; ++n) {
    const int32_t y = targets[n];
    TS_CHECK(y == p.ignore_index || (y >= 0 && y < p.V), "cross_entropy: target ", y, " at row ", n,
             " is outside the vocab [0, ", p.V, ")");
    count += y != p.ignore_index;
  }
#pragma omp parallel for schedule(static) if (static_cast <long>(p.N) * p.V >= kParallelMinWork)
  for (long n = 0; n < p.N; ++n) {
    const T* z = logits + n * p.row_stride();
    double mx = z[0];
    for (int j = 1; j < p.V; ++j) mx = z[j] > mx ? z[j] : mx;
    double sum = 0, zsum = 0;
    for (int j = 0; j < p.V; ++j) {
      sum += std::exp(z[j] - mx);
      zsum += z[j];
    }
    const double l = mx + std::log(sum);
    lse[n] = static_cast<T>(l);
    const int32_t y = targets[n];
    if (y == p.ignore_index) {
      losses[n] = T(0);
      continue;
    }
    const double eps = p.label_smoothing;
    losses[n] = static_cast<T>(l - (1.0 - eps) * z[y] - eps / p.V * zsum);
  }
  return count;
}

template <typename T>
void cross_entropy_backward_ref(const CrossEntropyParams& p, T* d_logits, const T* logits, const T* lse,
                                const int32_t* targets, double d_loss) {
  const double eps = p.label_smoothing;
#pragma omp parallel for schedule(static) if (static_cast <long>(p.N) * p.V >= kParallelMinWork)
  for (long n = 0; n < p.N; ++n) {
    T* d = d_logits + n * p.row_stride();
    const int32_t y = targets[n];
    if (y == p.ignore_index) {
      for (int j = 0; j < p.V; ++j) d[j] = T(0);
      continue;
    }
    const T* z = logits + n * p.row_stride();
    const double l = lse[n];
    for (int j = 0; j < p.V; ++j) {
      const double q = std::exp(z[j] - l);
      const double target = (j == y ? 1.0 - eps : 0.0) + eps / p.V;
      d[j] = static_cast<T>((q - target) * d_loss);
    }
  }
}

template <typename T>
long cross_entropy_forward_backward_ref(const CrossEntropyParams& p, T* losses, T* lse, T* logits,
                                        const int32_t* targets, double d_loss) {
  const long count = cross_entropy_forward_ref<T>(p, losses, lse, logits, targets);
  // In place is safe: each gradient element needs only its own logit and the row's lse.
  cross_entropy_backward_ref<T>(p, logits, logits, lse, targets, d_loss / static_cast<double>(std::max(count, 1L)));
  return count;
}

template long cross_entropy_forward_ref<float>(const CrossEntropyParams&, float*, float*, const float*, const int32_t*);
template long cross_entropy_forward_ref<double>(const CrossEntropyParams&, double*, double*, const double*,
                                                const int32_t*);
template void cross_entropy_backward_ref<float>(const CrossEntropyParams&, float*, const float*, const float*,
                                                const int32_t*, double);
template void cross_entropy_backward_ref<double>(const CrossEntropyParams&, double*, const double*, const double*,
                                                 const int32_t*, double);
template long cross_entropy_forward_backward_ref<float>(const CrossEntropyParams&, float*, float*, float*,
                                                        const int32_t*, double);
template long cross_entropy_forward_backward_ref<double>(const CrossEntropyParams&, double*, double*, double*,
                                                         const int32_t*, double);

}  // namespace tessera
