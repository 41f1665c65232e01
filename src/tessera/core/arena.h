// tessera/core/arena.h — one big allocation carved by offsets, with peak accounting.
//
// Activations are planned per (model, batch, seq): the planner asks for blocks in lifetime order, releases
// with `reset_to(mark)` the temporaries whose life ended, and `peak()` reports the high-water mark, i.e. the
// memory that the plan needs. The backing store is one Buffer on the arena's device (host or GPU).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tessera/core/buffer.h"
#include "tessera/core/tensor.h"

namespace tessera {

class Arena {
 public:
  static constexpr size_t kAlign = 256;  // matches cudaMalloc alignment, so offsets plan identically on GPU

  Arena() = default;
  explicit Arena(size_t capacity_bytes, Device device = Device::cpu());
  // An arena with no memory that only counts: a plan is run against it once to learn its size and peak.
  // The pointers it hands out must never be dereferenced.
  static Arena measuring();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;

  // Carves `bytes` (aligned). Throws Error when the arena is full, naming the sizes involved.
  void* allocate(size_t bytes);
  template <typename T>
  T* allocate_n(size_t n) { return static_cast<T*>(allocate(n * sizeof(T))); }
  // A contiguous tensor of `dtype` and `shape` carved from the arena, on its device.
  Tensor allocate_tensor(DType dtype, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return Tensor::from_shape(allocate(static_cast<size_t>(n) * dtype_size(dtype)), dtype, shape, device_);
  }
  Device device() const { return device_; }

  size_t mark() const { return offset_; }
  void reset_to(size_t mark);
  void reset() { reset_to(0); }

  size_t capacity() const { return capacity_; }
  size_t used() const { return offset_; }
  size_t peak() const { return peak_; }
  void reset_peak() { peak_ = offset_; }

  static size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

 private:
  Buffer base_;
  Device device_{};
  size_t capacity_ = 0;
  size_t offset_ = 0;
  size_t peak_ = 0;
  bool measuring_ = false;
};

}  // namespace tessera
