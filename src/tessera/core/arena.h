// tessera/core/arena.h — one big allocation carved by offsets, with peak accounting.
//
// Activations are planned per (model, batch, seq): the planner asks for blocks in lifetime order, releases
// with `reset_to(mark)` the temporaries whose life ended, and `peak()` reports the high-water mark, i.e. the
// memory that the plan needs. On the CPU the backing store is host memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tessera/core/tensor.h"

namespace tessera {

class Arena {
 public:
  static constexpr size_t kAlign = 256;  // matches cudaMalloc alignment, so offsets plan identically on GPU

  Arena() = default;
  explicit Arena(size_t capacity_bytes);
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

  size_t mark() const { return offset_; }
  void reset_to(size_t mark);
  void reset() { reset_to(0); }

  size_t capacity() const { return capacity_; }
  size_t used() const { return offset_; }
  size_t peak() const { return peak_; }
  void reset_peak() { peak_ = offset_; }

  static size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> base_;
  size_t capacity_ = 0;
  size_t offset_ = 0;
  size_t peak_ = 0;
  bool measuring_ = false;
};

}  // namespace tessera
