// GPU tests (ctest label "cuda"): they skip themselves where no GPU is visible.
#include <gtest/gtest.h>

#include "tessera/core/context.h"
#include "tessera/core/philox.h"
#include "tessera/core/philox_cuda.h"

namespace tessera {
namespace {

TEST(CudaPhilox, DeviceDrawsEqualHostDraws) {
  const GpuInfo gpu = probe_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU visible";
  for (uint64_t seed : {0ull, 42ull, 0xdeadbeefcafef00dull}) {
    const size_t n = 100003;  // not a multiple of the block size
    const auto dev = philox_u32_cuda(seed, 7, n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(dev[i], philox_u32(seed, 7, i)) << "seed " << seed << " word " << i;
  }
}

}  // namespace
}  // namespace tessera
