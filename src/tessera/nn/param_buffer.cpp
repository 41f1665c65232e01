#include "tessera/nn/param_buffer.h"

#include <cstring>

namespace tessera {

size_t ParamBuffer::add(const std::string& name, std::vector<int64_t> shape, bool decay) {
  TS_CHECK(!data_.data(), "internal: ParamBuffer::add after finalize");
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  const size_t offset = (total_ + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign;
  segments_.push_back(ParamSegment{name, offset, static_cast<size_t>(n), decay});
  shapes_.push_back(std::move(shape));
  // The end rounded up too, so that size() is final (the padding included) as soon as the last segment is added.
  total_ = (offset + static_cast<size_t>(n) + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign;
  num_params_ += static_cast<size_t>(n);
  return offset;
}

void ParamBuffer::finalize(Context& ctx) {
  TS_CHECK(ctx.device() == device_, "internal: ParamBuffer on ", device_.str(), " finalized with a ",
           ctx.device().str(), " context");
  const size_t es = dtype_size(dtype_);
  data_ = Buffer(total_ * es, device_, "parameters");
  fill_bytes(data(), 0, ctx);
  own_grad(ctx);
  if ((dtype_ == DType::BF16 || dtype_ == DType::F16) && master_mode_ == MasterWeights::On) {
    master_ = Buffer(total_ * 4, device_, "f32 master weights");
    fill_bytes(master(), 0, ctx);
  }
}

Tensor ParamBuffer::grad() const {
  TS_CHECK(grad_memory_,
           "internal: gradients used before the model laid them out (they live in its activation "
           "arena until Model::reserve or the first forward)");
  const int64_t n = static_cast<int64_t>(total_);
  return Tensor::from_shape(grad_memory_, dtype_, std::initializer_list<int64_t>{n}, device_);
}

void ParamBuffer::release_grad() {
  grad_ = Buffer();
  grad_memory_ = nullptr;
}

void ParamBuffer::bind_grad(void* memory) {
  TS_CHECK(!owns_grad(), "internal: ParamBuffer::bind_grad while it owns its gradients (release_grad first)");
  grad_memory_ = memory;
}

void ParamBuffer::own_grad(Context& ctx) {
  if (owns_grad()) return;
  grad_ = Buffer(grad_bytes(), device_, "gradients");
  grad_memory_ = grad_.data();
  fill_bytes(grad(), 0, ctx);
}

Tensor ParamBuffer::data_at(size_t offset, int64_t numel) const {
  if (offset == kNoParam) return {};
  return data().slice1d(static_cast<int64_t>(offset), numel);
}

Tensor ParamBuffer::grad_at(size_t offset, int64_t numel) const {
  if (offset == kNoParam) return {};
  return grad().slice1d(static_cast<int64_t>(offset), numel);
}

void* ParamBuffer::host_ptr(void* memory, size_t elem) const {
  TS_CHECK(device_.is_cpu() && dtype_size(dtype_) == elem && (dtype_ == DType::F32 || dtype_ == DType::F64),
           "internal: host pointer to parameters on ", device_.str(), " in ", dtype_name(dtype_));
  return memory;
}

std::vector<float> ParamBuffer::read_f32(Context& ctx) const {
  std::vector<float> out(total_);
  if (has_master()) {
    copy_bytes(out.data(), Device::cpu(), master_.data(), device_, total_ * 4, ctx);
    return out;
  }
  std::vector<unsigned char> raw(total_ * dtype_size(dtype_));
  copy_bytes(raw.data(), Device::cpu(), data_.data(), device_, raw.size(), ctx);
  convert_to_f32(raw.data(), dtype_, total_, out.data());
  return out;
}

std::vector<float> ParamBuffer::read_grad_f32(Context& ctx) const {
  std::vector<float> out(total_);
  std::vector<unsigned char> raw(total_ * dtype_size(dtype_));
  copy_bytes(raw.data(), Device::cpu(), grad().data(), device_, raw.size(), ctx);
  convert_to_f32(raw.data(), dtype_, total_, out.data());
  return out;
}

void ParamBuffer::write_f32(const std::vector<float>& values, Context& ctx) {
  TS_CHECK(values.size() == total_, "internal: write_f32 of ", values.size(), " values into ", total_);
  if (has_master()) copy_bytes(master_.data(), device_, values.data(), Device::cpu(), total_ * 4, ctx);
  std::vector<unsigned char> raw(total_ * dtype_size(dtype_));
  convert_from_f32(values.data(), total_, dtype_, raw.data());
  copy_bytes(data_.data(), device_, raw.data(), Device::cpu(), raw.size(), ctx);
  ctx.synchronize();  // `raw` dies here; the copy must have read it
}

int ParamBuffer::find(const std::string& name) const {
  for (size_t i = 0; i < segments_.size(); ++i)
    if (segments_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace tessera
