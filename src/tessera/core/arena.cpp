#include "tessera/core/arena.h"

#include <cstdlib>

namespace tessera {

Arena::Arena(size_t capacity_bytes, Device device) : device_(device), capacity_(align_up(capacity_bytes)) {
  if (capacity_ > 0) base_ = Buffer(capacity_, device, "activations");
}

Arena Arena::measuring() {
  Arena a;
  a.capacity_ = static_cast<size_t>(-1) / 2;
  a.measuring_ = true;
  return a;
}

void* Arena::allocate(size_t bytes) {
  const size_t need = align_up(bytes);
  if (measuring_) {
    const size_t at = offset_;
    offset_ += need;
    if (offset_ > peak_) peak_ = offset_;
    return reinterpret_cast<void*>(kAlign + at);  // non-null placeholder, never dereferenced
  }
  TS_CHECK(offset_ + need <= capacity_, "arena exhausted: asked for ", need, " bytes with ", capacity_ - offset_,
           " of ", capacity_, " left");
  void* p = static_cast<char*>(base_.data()) + offset_;
  offset_ += need;
  if (offset_ > peak_) peak_ = offset_;
  return p;
}

void Arena::reset_to(size_t mark) {
  TS_CHECK(mark <= offset_, "arena reset to ", mark, " beyond the used ", offset_);
  offset_ = mark;
}

}  // namespace tessera
