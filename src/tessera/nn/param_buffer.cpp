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
  total_ = offset + static_cast<size_t>(n);
  num_params_ += static_cast<size_t>(n);
  return offset;
}

void ParamBuffer::finalize(Context& ctx) {
  TS_CHECK(ctx.device() == device_, "internal: ParamBuffer on ", device_.str(), " finalized with a ",
           ctx.device().str(), " context");
  total_ = (total_ + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign;
  const size_t es = dtype_size(dtype_);
  data_ = Buffer(total_ * es, device_, "parameters");
  grad_ = Buffer(total_ * es, device_, "gradients");
  fill_bytes(data(), 0, ctx);
  fill_bytes(grad(), 0, ctx);
  if (dtype_ == DType::BF16 || dtype_ == DType::F16) {
    master_ = Buffer(total_ * 4, device_, "f32 master weights");
    fill_bytes(master(), 0, ctx);
  }
}

Tensor ParamBuffer::data_at(size_t offset, int64_t numel) const {
  if (offset == kNoParam) return {};
  return data().slice1d(static_cast<int64_t>(offset), numel);
}

Tensor ParamBuffer::grad_at(size_t offset, int64_t numel) const {
  if (offset == kNoParam) return {};
  return grad().slice1d(static_cast<int64_t>(offset), numel);
}

void* ParamBuffer::host_ptr(const Buffer& b, size_t elem) const {
  TS_CHECK(device_.is_cpu() && dtype_size(dtype_) == elem && (dtype_ == DType::F32 || dtype_ == DType::F64),
           "internal: host pointer to parameters on ", device_.str(), " in ", dtype_name(dtype_));
  return b.data();
}

namespace {
// Converts n elements of `dtype` (on the host) to f32.
void to_f32(const void* src, DType dtype, size_t n, float* dst) {
  if (dtype == DType::F32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  if (dtype == DType::F64) {
    const double* s = static_cast<const double*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = dtype == DType::BF16 ? bf16_to_f32(s[i]) : f16_to_f32(s[i]);
}

std::vector<unsigned char> from_f32(const std::vector<float>& v, DType dtype) {
  std::vector<unsigned char> out(v.size() * dtype_size(dtype));
  if (dtype == DType::F32) {
    std::memcpy(out.data(), v.data(), out.size());
  } else if (dtype == DType::F64) {
    double* d = reinterpret_cast<double*>(out.data());
    for (size_t i = 0; i < v.size(); ++i) d[i] = v[i];
  } else {
    uint16_t* d = reinterpret_cast<uint16_t*>(out.data());
    for (size_t i = 0; i < v.size(); ++i) d[i] = dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  }
  return out;
}
}  // namespace

std::vector<float> ParamBuffer::read_f32(Context& ctx) const {
  std::vector<float> out(total_);
  if (has_master()) {
    copy_bytes(out.data(), Device::cpu(), master_.data(), device_, total_ * 4, ctx);
    return out;
  }
  std::vector<unsigned char> raw(total_ * dtype_size(dtype_));
  copy_bytes(raw.data(), Device::cpu(), data_.data(), device_, raw.size(), ctx);
  to_f32(raw.data(), dtype_, total_, out.data());
  return out;
}

std::vector<float> ParamBuffer::read_grad_f32(Context& ctx) const {
  std::vector<float> out(total_);
  std::vector<unsigned char> raw(total_ * dtype_size(dtype_));
  copy_bytes(raw.data(), Device::cpu(), grad_.data(), device_, raw.size(), ctx);
  to_f32(raw.data(), dtype_, total_, out.data());
  return out;
}

void ParamBuffer::write_f32(const std::vector<float>& values, Context& ctx) {
  TS_CHECK(values.size() == total_, "internal: write_f32 of ", values.size(), " values into ", total_);
  if (has_master()) copy_bytes(master_.data(), device_, values.data(), Device::cpu(), total_ * 4, ctx);
  const std::vector<unsigned char> raw = from_f32(values, dtype_);
  copy_bytes(data_.data(), device_, raw.data(), Device::cpu(), raw.size(), ctx);
  ctx.synchronize();  // `raw` dies here; the copy must have read it
}

int ParamBuffer::find(const std::string& name) const {
  for (size_t i = 0; i < segments_.size(); ++i)
    if (segments_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace tessera
