// tessera/core/tensor.h — Device and Tensor, a non-owning view (pointer, dtype, shape, strides, device).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "tessera/core/dtype.h"
#include "tessera/core/error.h"

namespace tessera {

enum class DeviceKind : uint8_t { Cpu, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceKind::Cuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::Cpu; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

// A view over memory it does not own. Strides are in elements. Contiguous views come from the shape alone; a
// strided view describes, for example, Q, K and V inside the fused qkv buffer of shape (B, T, 3, H, Dh) with no
// copy: q = Tensor::strided(qkv, dtype, {B, T, H, Dh}, {T*3*C, 3*C, Dh, 1}), k at qkv + C, v at qkv + 2*C.
class Tensor {
 public:
  static constexpr int kMaxDims = 5;

  Tensor() = default;
  // A contiguous row-major view of `shape` over `data`.
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = Device::cpu())
      : data_(data), dtype_(dtype), device_(device) {
    TS_CHECK(shape.size() <= kMaxDims, "tensor rank ", shape.size(), " exceeds ", kMaxDims);
    for (int64_t s : shape) shape_[ndim_++] = s;
    set_contiguous_strides();
  }
  template <typename Container>
  static Tensor from_shape(void* data, DType dtype, const Container& shape, Device device = Device::cpu()) {
    Tensor t;
    t.data_ = data;
    t.dtype_ = dtype;
    t.device_ = device;
    TS_CHECK(shape.size() <= kMaxDims, "tensor rank ", shape.size(), " exceeds ", kMaxDims);
    for (auto s : shape) t.shape_[t.ndim_++] = static_cast<int64_t>(s);
    t.set_contiguous_strides();
    return t;
  }

  // A view with explicit strides (elements), for slices of a larger buffer.
  static Tensor strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                        std::initializer_list<int64_t> strides, Device device = Device::cpu()) {
    TS_CHECK(shape.size() == strides.size(), "tensor: ", shape.size(), " sizes but ", strides.size(), " strides");
    Tensor t = from_shape(data, dtype, shape, device);
    int i = 0;
    for (int64_t s : strides) t.strides_[i++] = s;
    return t;
  }
  // The same memory viewed with another shape (must be contiguous and hold the same number of elements).
  Tensor reshape(std::initializer_list<int64_t> shape) const {
    TS_CHECK(is_contiguous(), "tensor: cannot reshape a strided view ", shape_str());
    Tensor t = from_shape(data_, dtype_, shape, device_);
    TS_CHECK(t.numel() == numel(), "tensor: cannot view ", shape_str(), " as ", t.shape_str());
    return t;
  }
  // Element `offset` onwards, as a contiguous (n) view.
  Tensor slice1d(int64_t offset, int64_t n) const {
    TS_CHECK(is_contiguous() && offset >= 0 && offset + n <= numel(), "tensor: slice [", offset, ", ", offset + n,
             ") out of ", shape_str());
    return Tensor(static_cast<char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_)), dtype_, {n}, device_);
  }
  bool defined() const { return data_ != nullptr; }
  bool is_cuda() const { return device_.kind == DeviceKind::Cuda; }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int d) const { return shape_[d < 0 ? d + ndim_ : d]; }
  int64_t stride(int d) const { return strides_[d < 0 ? d + ndim_ : d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= shape_[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const {
    int64_t s = 1;
    for (int i = ndim_ - 1; i >= 0; --i) {
      if (strides_[i] != s) return false;
      s *= shape_[i];
    }
    return true;
  }
  std::string shape_str() const {
    std::string s = "(";
    for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(shape_[i]);
    return s + ")";
  }

 private:
  void set_contiguous_strides() {
    int64_t s = 1;
    for (int i = ndim_ - 1; i >= 0; --i) {
      strides_[i] = s;
      s *= shape_[i];
    }
  }
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Device device_{};
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace tessera
