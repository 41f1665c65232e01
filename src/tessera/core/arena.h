// tessera/core/arena.h — one big allocation carved at planned offsets.
//
// Activations are planned per (model, batch, seq) by a MemoryPlan (core/planner.h), which gives every buffer an
// offset from its lifetime; buffers whose lives do not overlap get the same bytes. The Arena is the memory the
// plan is laid over: one Buffer on the model's device (host or GPU) of the plan's peak size, and checked views
// of it at the planned offsets.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/tensor.h"

namespace tessera {

class Arena {
 public:
  static constexpr size_t kAlign = 256;  // matches cudaMalloc alignment, so offsets plan identically on GPU

  Arena() = default;
  // `what` names the allocation in an out-of-memory error.
  explicit Arena(size_t capacity_bytes, Device device = Device::cpu(), const char* what = "activations");
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;

  // The block [offset, offset + bytes). Throws Error when it does not lie inside the arena.
  void* at(size_t offset, size_t bytes) const;
  // A contiguous tensor of `dtype` and `shape` at `offset`, on the arena's device.
  Tensor tensor_at(size_t offset, DType dtype, const std::vector<int64_t>& shape) const;
  Device device() const { return device_; }
  size_t capacity() const { return capacity_; }

  static size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

 private:
  Buffer base_;
  Device device_{};
  size_t capacity_ = 0;
};

}  // namespace tessera
