// Helpers for the CUDA training tests: the bundled corpus, the options of a short `tiny` run, and a planted f16
// overflow.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tessera/core/buffer.h"
#include "tessera/models/config.h"
#include "tessera/models/gpt.h"
#include "tessera/train/trainer.h"

namespace tessera::test {

// data/corpus.txt of the source tree, whole.
inline std::string bundled_corpus() {
  std::ifstream f(std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// `tiny` for `steps` steps on d/data into d/out, on `device` in `precision`: no validation, a checkpoint at the end.
inline TrainOptions tiny_run(const std::filesystem::path& d, const std::string& out, const std::string& device,
                             const std::string& precision, int steps) {
  TrainOptions o;
  o.model = model_preset("tiny");
  o.data = (d / "data").string();
  o.out = (d / out).string();
  o.steps = steps;
  o.progress = false;
  o.val_every = 0;
  o.ckpt_every = 0;
  o.device = device;
  o.precision = precision;
  return o;
}

// Writes an f16 +inf into an element of the first parameter segment's gradient (on the device).
inline void plant_inf_f16(Model& m) {
  ASSERT_EQ(m.params().dtype(), DType::F16);
  const size_t at = m.params().segments().front().offset + 3;
  const uint16_t inf = 0x7c00u;
  copy_bytes(static_cast<char*>(m.params().grad().data()) + at * sizeof inf, m.params().device(), &inf, Device::cpu(),
             sizeof inf, m.context());
  m.context().synchronize();
}

}  // namespace tessera::test
