// tessera/nn/param_buffer.h — every parameter of a model in one contiguous buffer, gradients in a second, and
// for 16-bit models f32 master weights in a third (unless asked not to: LightSeq's master-less mode), on the
// model's device.
//
// A segment table gives each tensor its name, shape, offset and whether weight decay applies. Every segment
// starts at a multiple of kSegmentAlign elements (16-byte aligned in every dtype, 64 bytes for f32), so kernels
// may use 16-byte accesses on any segment; the padding between segments is zero in data, grad and moments and
// stays zero under AdamW. One contiguous space is what lets one optimizer launch update every parameter, lets
// data-parallel training all-reduce the gradients in place, and lets ZeRO-1 shard by ranges.
//
// The gradient buffer is allocated here by default. A model may instead lay it out inside its activation arena
// (Model, GradMemory::Planned): it releases the buffer's own memory and binds the flat gradients to memory it owns,
// where they keep the same offsets; grad() is then valid once bound.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/ops/optim/adamw.h"

namespace tessera {

constexpr size_t kNoParam = static_cast<size_t>(-1);
constexpr size_t kSegmentAlign = 16;  // elements

// Whether a 16-bit model keeps f32 master weights. Off (LightSeq's mode): only the 16-bit parameters exist; the
// optimizer updates them in f32 registers and rounds the result back, saving 4 bytes a parameter. f32 and f64
// models are their own master either way.
enum class MasterWeights { On, Off };

class ParamBuffer {
 public:
  // dtype: the compute dtype of parameters and gradients (f32, bf16, f16 on a GPU; f32 or f64 on the CPU).
  explicit ParamBuffer(Device device = Device::cpu(), DType dtype = DType::F32,
                       MasterWeights master = MasterWeights::On)
      : device_(device), dtype_(dtype), master_mode_(master) {}

  // Reserves a segment; returns its offset. Call finalize() once all are added.
  size_t add(const std::string& name, std::vector<int64_t> shape, bool decay);
  // Allocates the buffers, zero-filled (a CPU or CUDA context).
  void finalize(Context& ctx);

  size_t size() const { return total_; }             // elements, padding included
  size_t num_params() const { return num_params_; }  // elements of the segments alone
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  bool has_master() const { return master_.data() != nullptr; }

  // Flat views over the whole buffers; master() is undefined for f32/f64 models (the data is its own master).
  Tensor data() const { return data_.view(dtype_, {static_cast<int64_t>(total_)}); }
  Tensor grad() const;
  Tensor master() const { return has_master() ? master_.view(DType::F32, {static_cast<int64_t>(total_)}) : Tensor(); }
  // The segment at `offset` (numel elements), or an undefined Tensor for kNoParam.
  Tensor data_at(size_t offset, int64_t numel) const;
  Tensor grad_at(size_t offset, int64_t numel) const;

  // Host pointers of a CPU model in its dtype (reference code and tests); an error on a GPU or a 16-bit model.
  template <typename T>
  T* host_data() const {
    return static_cast<T*>(host_ptr(data_.data(), sizeof(T)));
  }
  template <typename T>
  T* host_grad() const {
    return static_cast<T*>(host_ptr(grad().data(), sizeof(T)));
  }

  void zero_grad(Context& ctx) const { fill_bytes(grad(), 0, ctx); }
  // Where the gradients live. release_grad() frees this buffer's own gradient memory; bind_grad() then points the
  // flat gradients at grad_bytes() of someone else's memory on the same device (a model's arena), and own_grad()
  // allocates them here again, zero-filled.
  bool owns_grad() const { return grad_.data() != nullptr; }
  size_t grad_bytes() const { return total_ * dtype_size(dtype_); }
  // The memory this buffer holds: parameters, its own gradients (not bound ones) and master weights.
  size_t bytes() const { return grad_bytes() * (owns_grad() ? 2 : 1) + (has_master() ? total_ * 4 : 0); }
  void release_grad();
  void bind_grad(void* memory);
  void own_grad(Context& ctx);
  // All parameters as f32 on the host (the master weights when there are any), padding included.
  std::vector<float> read_f32(Context& ctx) const;
  // Sets all parameters from f32 host values (size() of them): the master weights when there are any, and the
  // compute-dtype copy (rounded to nearest even; without master weights that rounding is all that is kept).
  void write_f32(const std::vector<float>& values, Context& ctx);
  // The gradients as f32 on the host (for tests, metrics and the CPU optimizer path).
  std::vector<float> read_grad_f32(Context& ctx) const;

  const std::vector<ParamSegment>& segments() const { return segments_; }
  const std::vector<int64_t>& shape(size_t i) const { return shapes_[i]; }
  // Index of the segment called `name`, or -1.
  int find(const std::string& name) const;

 private:
  void* host_ptr(void* memory, size_t elem) const;
  Device device_;
  DType dtype_;
  MasterWeights master_mode_;
  std::vector<ParamSegment> segments_;
  std::vector<std::vector<int64_t>> shapes_;
  Buffer data_, grad_, master_;
  void* grad_memory_ = nullptr;  // grad_'s memory, or the memory bound by bind_grad
  size_t total_ = 0, num_params_ = 0;
};

}  // namespace tessera
