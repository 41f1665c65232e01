// tessera/core/buffer.h — owned memory on the host or a GPU (RAII), and copies and fills between Tensors.
//
// Buffer is the only owner of memory in tessera; Tensor is a view. Host memory is 256-byte aligned; device
// memory comes from cudaMalloc (256-byte aligned too). A failed device allocation is a one-line "out of GPU
// memory" error naming what was asked for and what was free.
#pragma once
#include <cstddef>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

class Buffer {
 public:
  Buffer() = default;
  // `what` names the allocation in an out-of-memory error ("activations", "parameters", ...).
  Buffer(size_t bytes, Device device, const char* what = "a buffer");
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // A contiguous view of the whole buffer, or of its first elements, as `dtype` with `shape`.
  Tensor view(DType dtype, std::initializer_list<int64_t> shape, size_t byte_offset = 0) const;

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_{};
};

// Copies src into dst (same dtype and element count, both contiguous), between any two devices. Copies that
// land on the host wait for the Context's stream, so the host may read dst at once; copies to a device are
// queued on the stream.
void copy(const Tensor& dst, const Tensor& src, const Context& ctx);
// Raw byte copy with the same rules.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const Context& ctx);
// Sets every byte of a contiguous tensor to `byte` (0 gives +0.0 in every float type; 0xff gives NaN in
// f32/bf16/f16, which tests use to poison outputs).
void fill_bytes(const Tensor& t, unsigned char byte, const Context& ctx);

}  // namespace tessera
