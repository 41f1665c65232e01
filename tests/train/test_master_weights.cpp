// --master-weights off (LightSeq's mode) where no GPU is needed: the parameter buffer without f32 masters, and
// the trainer's refusal where the mode does not apply. tests/cuda/test_master_weights_cuda.cpp trains with it.
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "tessera/core/error.h"
#include "tessera/nn/param_buffer.h"
#include "tessera/ops/optim/adamw.h"
#include "tessera/train/trainer.h"
#include "test_util.h"

namespace tessera {
namespace {

// Without masters a 16-bit buffer holds only its own dtype: write_f32 keeps the rounded values and read_f32
// returns exactly those; with masters read_f32 returns the f32 values as written.
TEST(MasterWeights, OffKeepsOnlyTheSixteenBitParameters) {
  Context ctx;
  for (const DType dt : {DType::BF16, DType::F16}) {
    ParamBuffer on(Device::cpu(), dt), off(Device::cpu(), dt, MasterWeights::Off);
    for (ParamBuffer* p : {&on, &off}) {
      p->add("a", {5}, true);
      p->add("b", {3, 7}, false);
      p->finalize(ctx);
    }
    EXPECT_TRUE(on.has_master());
    EXPECT_FALSE(off.has_master());
    EXPECT_FALSE(off.master().defined());
    std::vector<float> values(on.size());
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * static_cast<float>(i) + 1e-3f;
    on.write_f32(values, ctx);
    off.write_f32(values, ctx);
    EXPECT_EQ(on.read_f32(ctx), values);
    const std::vector<float> got = off.read_f32(ctx);
    for (size_t i = 0; i < values.size(); ++i) {
      std::vector<unsigned char> raw(2);
      convert_from_f32(&values[i], 1, dt, raw.data());
      float back = 0;
      convert_to_f32(raw.data(), dt, 1, &back);
      ASSERT_EQ(got[i], back) << dtype_name(dt) << " element " << i;
    }
    EXPECT_NE(got, values) << "the values must need rounding for this test to tell the modes apart";
  }
  // f32 is its own master in both modes.
  ParamBuffer f32(Device::cpu(), DType::F32, MasterWeights::On);
  f32.add("a", {4}, true);
  f32.finalize(ctx);
  EXPECT_FALSE(f32.has_master());
}

TEST(MasterWeights, AdamWSupportsSixteenBitWithoutMastersOnTheGpuOnly) {
  std::string why;
  EXPECT_FALSE(adamw_supports(DType::BF16, /*master=*/false, Device::cpu(), &why));
  if (!built_with_cuda()) GTEST_SKIP() << "built without CUDA: no GPU dtype is supported";
  EXPECT_TRUE(adamw_supports(DType::BF16, /*master=*/false, Device::cuda(0), &why)) << why;
  EXPECT_TRUE(adamw_supports(DType::F16, /*master=*/false, Device::cuda(0), &why)) << why;
}

TEST(MasterWeights, OffIsRefusedWhereItDoesNotApply) {
  TrainOptions o;
  o.model = test::small_config(/*vocab=*/256, /*d_model=*/16, /*n_layers=*/1, /*n_heads=*/2, /*d_ff=*/24,
                               /*max_seq=*/16);
  o.seq = 8;
  o.device = "cpu";
  o.master_weights = false;
  try {
    train_setup(o);
    ADD_FAILURE() << "--master-weights off on the CPU must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--master-weights off applies to bf16 or f16"), std::string::npos) << e.what();
  }
  o.master_weights = true;
  EXPECT_NO_THROW(train_setup(o));
}

}  // namespace
}  // namespace tessera
