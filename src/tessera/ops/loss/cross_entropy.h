// tessera/ops/loss — softmax cross-entropy with label smoothing and an ignore index.
//
// For row n with target y (skipped when y == ignore_index), q = softmax(logits[n]) and the smoothed target
// p = (1 - eps) onehot(y) + eps / V:
//   loss_n = -Σ_j p_j log q_j = lse_n - (1 - eps) logits[n, y] - (eps / V) Σ_j logits[n, j]
//   d_logits[n] = (q - p) * d_loss_n
// The forward writes per-row losses (0 for ignored rows) and lse, and returns the number of counted rows;
// mean loss = Σ losses / count, matching torch.nn.functional.cross_entropy(label_smoothing=eps).
// logits: (N, V); targets: (N) int32; losses, lse: (N). d_logits is overwritten; for a mean loss pass
// d_loss = 1 / count.
// Two ways to run it: cross_entropy_forward (validation, and any caller that wants the loss alone), then
// cross_entropy_backward; or cross_entropy_forward_backward, which computes losses, lse and d_logits with one
// read of the logits and one write of the gradient over them (the training step's case).
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

struct CrossEntropyParams {
  int N = 0, V = 0;
  float label_smoothing = 0.0f;
  int ignore_index = -1;
  // Row stride of logits and d_logits in elements; 0: V (packed). The model stores its logits rows with a padded
  // stride (a multiple of 64) so that the lm_head GEMMs stay 16-byte aligned; the padding is neither read nor
  // written here.
  int64_t ld = 0;
  int64_t row_stride() const { return ld ? ld : V; }
};

template <typename T>
long cross_entropy_forward_ref(const CrossEntropyParams& p, T* losses, T* lse, const T* logits, const int32_t* targets);
template <typename T>
void cross_entropy_backward_ref(const CrossEntropyParams& p, T* d_logits, const T* logits, const T* lse,
                                const int32_t* targets, double d_loss);
// The two above composed, in place: losses and lse as the forward writes them, then logits[n] <- d_logits[n] with
// d_loss_n = d_loss / max(count, 1) (the gradient of d_loss × mean loss). Returns count, the rows whose target is
// not ignore_index.
template <typename T>
long cross_entropy_forward_backward_ref(const CrossEntropyParams& p, T* losses, T* lse, T* logits,
                                        const int32_t* targets, double d_loss);

}  // namespace tessera

// ---- Tensor-level entries (cross_entropy.cpp): route to the reference or the CUDA kernels by device and dtype. ----
// logits, d_logits: (N, V) in the compute dtype (rows p.row_stride() apart: N·row_stride() elements); targets: (N) i32;
// losses, lse: (N) f32 (f64 for an f64 computation), whatever the compute dtype. The count of counted rows lives on the
// device (no host round trip): cross_entropy_loss_sum writes it, and cross_entropy_backward can read it to form the
// mean loss's gradient.
namespace tessera {

bool cross_entropy_supports(const CrossEntropyParams& p, DType dtype, Device device, std::string* why = nullptr);

// losses[n], lse[n] as cross_entropy_forward_ref writes them (0 loss for an ignored row; lse for every row).
// On CUDA a target outside [0, V) that is not ignore_index gives a NaN loss (the reference throws instead).
void cross_entropy_forward(const CrossEntropyParams& p, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets, Context& ctx);

// sum_mean: (2) in the stat dtype, {Σ_n losses[n], Σ_n losses[n] / count} (mean 0 when count is 0);
// count: (1) i32, the number of rows whose target is not ignore_index (what cross_entropy_forward_ref returns).
// Summed in a fixed order (deterministic), in f64. The host reads the mean loss with one 4-byte copy of
// sum_mean[1] (sum_mean.slice1d(1, 1)). count may be undefined.
void cross_entropy_loss_sum(const CrossEntropyParams& p, const Tensor& sum_mean, const Tensor& count,
                            const Tensor& losses, const Tensor& targets, Context& ctx);

// d_logits[n] = (softmax(logits[n]) - p_smoothed) * scale; 0 for an ignored row. d_logits may alias logits (the
// model's in-place case: each gradient element needs only its own logit and the row's lse; nothing else is
// stored). scale = d_loss when count is undefined, else d_loss / max(count[0], 1) read on the device — pass the
// count tensor cross_entropy_loss_sum wrote and d_loss = loss_scale for the gradient of loss_scale * mean loss.
void cross_entropy_backward(const CrossEntropyParams& p, const Tensor& d_logits, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, double d_loss, const Tensor& count, Context& ctx);

// The training step's loss and gradient in one op: losses and lse as cross_entropy_forward writes them, then the
// logits are overwritten with d_logits = (softmax(logits[n]) - p_smoothed) * d_loss / max(count, 1) (0 for an
// ignored row; the padding columns [V, ld) are neither read nor written). count: (1) i32, written first (on the
// device, before any gradient, so that the scale is known when a row's gradient is written): the rows whose
// target is not ignore_index. Pass d_loss = loss_scale for the gradient of loss_scale * mean loss. The result
// equals cross_entropy_forward, cross_entropy_loss_sum (for the count), then cross_entropy_backward in place;
// cross_entropy_loss_sum still forms Σ losses and the mean from the losses written here. cross_entropy_supports
// answers for it.
void cross_entropy_forward_backward(const CrossEntropyParams& p, const Tensor& losses, const Tensor& lse,
                                    const Tensor& logits, const Tensor& targets, double d_loss, const Tensor& count,
                                    Context& ctx);

// ---- CUDA launchers (cross_entropy.cu), on ctx's stream; pointers are device memory in `dtype` unless typed. ----
// Forward: one block per row, one pass over the vocabulary with an online max and sum (plus Σ logits for the
// smoothing term); 16-byte loads over the row's aligned body, scalar loads for the unaligned head and the tail
// (rows of V = 50257 bf16 start at every 2-byte offset). Backward: one block per row, the same head/body/tail
// split, each element read once and written once (in place when d_logits == logits).
void cross_entropy_forward_cuda(const CrossEntropyParams& p, DType dtype, float* losses, float* lse, const void* logits,
                                const int32_t* targets, Context& ctx);
// One block, fixed order: sum_mean[0] = Σ losses, sum_mean[1] = mean; count[0] = counted rows (count may be null).
void cross_entropy_loss_sum_cuda(const CrossEntropyParams& p, float* sum_mean, int32_t* count, const float* losses,
                                 const int32_t* targets, Context& ctx);
// count may be null (scale = d_loss).
void cross_entropy_backward_cuda(const CrossEntropyParams& p, DType dtype, void* d_logits, const void* logits,
                                 const float* lse, const int32_t* targets, float d_loss, const int32_t* count,
                                 Context& ctx);
// Forward + backward: first one block counts the non-ignored targets into count[0] (a separate launch: every row's
// scale needs the count of all rows, and 4N bytes of targets are little beside N·V of logits). Then one block
// per row copies the row into shared memory (cp.async, 16 bytes a thread, the whole row in flight at once; scalar
// head and tail as above), takes the max and then Σ exp(z − max) over shared memory (each merged over the block in a
// fixed order), writes loss and lse, and writes the gradient over the row from shared memory: the logits are read once
// and written once (2 passes instead of the separate ops' 3). A bf16 row of V = 50257 takes ~100 KB, so 2 blocks of 512
// threads share an SM and one block's copy overlaps the other's math and stores. A row that does not fit in a block's
// shared memory (cross_entropy_fused_row_fits false: f32 beyond ~56K columns, 16-bit beyond ~113K) runs the forward and
// backward kernels above instead (3 passes, same results up to rounding).
void cross_entropy_forward_backward_cuda(const CrossEntropyParams& p, DType dtype, float* losses, float* lse,
                                         void* logits, const int32_t* targets, float d_loss, int32_t* count,
                                         Context& ctx);
bool cross_entropy_fused_row_fits(const CrossEntropyParams& p, DType dtype, const Context& ctx);

}  // namespace tessera
