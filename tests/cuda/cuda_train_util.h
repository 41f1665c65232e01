// Helpers for the CUDA training tests: the bundled corpus and the options of a short `tiny` run.
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tessera/models/config.h"
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

}  // namespace tessera::test
