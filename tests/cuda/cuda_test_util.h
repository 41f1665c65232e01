// Helpers for the CUDA op tests: device uploads with dtype conversion, NaN poisoning, per-dtype tolerances.
//
// Every CUDA op test follows one recipe: draw fresh random inputs on the host, round them to the compute dtype
// (so that the reference and the kernel see the same values), run the f64 reference on the host, upload, poison
// every output with NaN and prefill every accumulated output with random values, run the kernel, download, and
// compare ‖got − ref‖ / ‖ref‖ against the dtype's tolerance below.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "test_util.h"

namespace tessera::test {

// Relative error allowed for a kernel against the f64 reference, per compute dtype, in one place.
// f32: accumulation order only. bf16 / f16: one rounding of the output (8 / 11 mantissa bits) plus the rounding
// of intermediates that the kernel stores in 16 bits, as the reference does not.
inline double cuda_tolerance(DType dt) {
  switch (dt) {
    case DType::F32: return 1e-5;
    case DType::BF16: return 1.5e-2;
    case DType::F16: return 2e-3;
    default: return 0;
  }
}

inline const char* dtype_label(DType dt) { return dt == DType::F32 ? "f32" : dt == DType::BF16 ? "bf16" : "f16"; }

// A CUDA context for the test, or a skip when no GPU is visible.
#define TS_CUDA_CONTEXT_OR_SKIP(ctx) \
  if (!::tessera::probe_gpu().available) GTEST_SKIP() << "no GPU visible"; \
  ::tessera::Context ctx(::tessera::Device::cuda(0))

inline float round_to(DType dt, double v) {
  const float f = static_cast<float>(v);
  if (dt == DType::BF16) return bf16_to_f32(f32_to_bf16(f));
  if (dt == DType::F16) return f16_to_f32(f32_to_f16(f));
  return f;
}

// Values rounded to dt, as doubles (for the reference).
inline std::vector<double> rounded(DType dt, const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(dt, v[i]);
  return r;
}

// Device memory kept alive for a test; each upload returns a Tensor viewing it.
class DeviceArena {
 public:
  explicit DeviceArena(Context& ctx) : ctx_(ctx) {}
  Tensor upload(DType dt, const std::vector<double>& v) {
    Tensor t = alloc(dt, static_cast<int64_t>(v.size()));
    const size_t es = dtype_size(dt);
    std::vector<unsigned char> bytes(v.size() * es);
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::F32) {
        const float f = static_cast<float>(v[i]);
        std::memcpy(&bytes[i * 4], &f, 4);
      } else if (dt == DType::BF16 || dt == DType::F16) {
        const uint16_t h = dt == DType::BF16 ? f32_to_bf16(static_cast<float>(v[i]))
                                             : f32_to_f16(static_cast<float>(v[i]));
        std::memcpy(&bytes[i * 2], &h, 2);
      } else if (dt == DType::I32) {
        const int32_t k = static_cast<int32_t>(v[i]);
        std::memcpy(&bytes[i * 4], &k, 4);
      } else {
        ADD_FAILURE() << "upload: unsupported dtype";
      }
    }
    copy_bytes(t.data(), t.device(), bytes.data(), Device::cpu(), bytes.size(), ctx_);
    return t;
  }
  Tensor upload_i32(const std::vector<int32_t>& v) {
    Tensor t = alloc(DType::I32, static_cast<int64_t>(v.size()));
    copy_bytes(t.data(), t.device(), v.data(), Device::cpu(), v.size() * 4, ctx_);
    return t;
  }
  // Filled with NaN (every byte 0xff), so that unwritten elements show.
  Tensor poisoned(DType dt, int64_t n) {
    Tensor t = alloc(dt, n);
    fill_bytes(t, 0xff, ctx_);
    return t;
  }
  Tensor alloc(DType dt, int64_t n) {
    buffers_.push_back(
        std::make_unique<Buffer>(static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(dt), ctx_.device()));
    return Tensor(buffers_.back()->data(), dt, {n}, ctx_.device());
  }
  std::vector<double> download(const Tensor& t) {
    const size_t n = static_cast<size_t>(t.numel()), es = dtype_size(t.dtype());
    std::vector<unsigned char> bytes(n * es);
    copy_bytes(bytes.data(), Device::cpu(), t.data(), t.device(), bytes.size(), ctx_);
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
      if (t.dtype() == DType::F32) {
        float f;
        std::memcpy(&f, &bytes[i * 4], 4);
        out[i] = f;
      } else if (t.dtype() == DType::I32) {
        int32_t k;
        std::memcpy(&k, &bytes[i * 4], 4);
        out[i] = k;
      } else {
        uint16_t h;
        std::memcpy(&h, &bytes[i * 2], 2);
        out[i] = t.dtype() == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    return out;
  }

 private:
  Context& ctx_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

inline double norm2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// Fails with the relative error, the tolerance and the seed when got is not close to ref (NaN never passes).
// The error is ‖got − ref‖ / max(‖ref‖, floor): a floor measures a result that cancels or vanishes (dQ at T = 1,
// GELU far below zero, a V = 1 loss) against the size of its terms instead of against rounding noise.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& ref, DType dt,
                         const std::string& what, double scale = 1.0, double floor = 0.0) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  std::vector<double> diff(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": element " << i << " is NaN (unwritten?) seed " << test_seed();
    diff[i] = got[i] - ref[i];
  }
  const double err = norm2(diff) / std::max({norm2(ref), floor, 1e-30}), tol = scale * cuda_tolerance(dt);
  EXPECT_LE(err, tol) << what << " (" << dtype_label(dt) << "): relative error " << err << " > " << tol << ", seed "
                      << test_seed();
}

// An upload (or a NaN-poisoned buffer) that starts one element past a 16-byte boundary when `misalign`, so that
// the kernels' scalar paths for unaligned views run.
inline Tensor upload_at(DeviceArena& dev, DType dt, const std::vector<double>& v, bool misalign) {
  if (!misalign) return dev.upload(dt, v);
  std::vector<double> padded(v.size() + 1, 0.0);
  std::copy(v.begin(), v.end(), padded.begin() + 1);
  return dev.upload(dt, padded).slice1d(1, static_cast<int64_t>(v.size()));
}
inline Tensor poisoned_at(DeviceArena& dev, DType dt, size_t n, bool misalign) {
  const int64_t m = static_cast<int64_t>(n);
  return misalign ? dev.poisoned(dt, m + 1).slice1d(1, m) : dev.poisoned(dt, m);
}

inline constexpr DType kCudaFloatTypes[] = {DType::F32, DType::BF16, DType::F16};

}  // namespace tessera::test
