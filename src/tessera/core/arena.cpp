#include "tessera/core/arena.h"

#include "tessera/core/error.h"

namespace tessera {

Arena::Arena(size_t capacity_bytes, Device device, const char* what)
    : device_(device), capacity_(align_up(capacity_bytes)) {
  if (capacity_ > 0) base_ = Buffer(capacity_, device, what);
}

void* Arena::at(size_t offset, size_t bytes) const {
  TS_CHECK(offset <= capacity_ && bytes <= capacity_ - offset, "arena: the block [", offset, ", ", offset + bytes,
           ") does not lie inside the ", capacity_, " bytes planned");
  // A zero-size block of an empty arena has no memory behind it; any non-null address serves, never read.
  if (!base_.data()) return reinterpret_cast<void*>(kAlign);
  return static_cast<char*>(base_.data()) + offset;
}

Tensor Arena::tensor_at(size_t offset, DType dtype, const std::vector<int64_t>& shape) const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  TS_CHECK(n >= 0, "arena: negative shape");
  return Tensor::from_shape(at(offset, static_cast<size_t>(n) * dtype_size(dtype)), dtype, shape, device_);
}

}  // namespace tessera
