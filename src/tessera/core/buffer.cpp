#include "tessera/core/buffer.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "tessera/core/memory.h"

namespace tessera {

// Device primitives: defined in buffer_cuda.cu when the CUDA backend is built.
void* device_malloc(size_t bytes, int device, const char* what);
void device_free(void* p, int device) noexcept;
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const Context& ctx);
void device_fill(void* dst, unsigned char byte, size_t bytes, const Context& ctx);

#ifndef TESSERA_WITH_CUDA
void* device_malloc(size_t, int, const char*) { TS_THROW("this tessera was built without CUDA"); }
void device_free(void*, int) noexcept {}
void device_copy(void*, Device, const void*, Device, size_t, const Context&) {
  TS_THROW("this tessera was built without CUDA");
}
void device_fill(void*, unsigned char, size_t, const Context&) { TS_THROW("this tessera was built without CUDA"); }
#endif

Buffer::Buffer(size_t bytes, Device device, const char* what) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    check_host_memory(bytes, what);
    const size_t rounded = (bytes + 255) / 256 * 256;
    data_ = std::aligned_alloc(256, rounded);
    // "out of memory", as check_host_memory says it: is_out_of_memory knows these failures by that start.
    TS_CHECK(data_, "out of memory: ", what, " needs ", bytes / (1024.0 * 1024 * 1024),
             " GiB, and allocating it "
             "failed");
  } else {
    data_ = device_malloc(bytes, device.index, what);
  }
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (!data_) return;
  if (device_.is_cpu()) std::free(data_);
  else device_free(data_, device_.index);
  data_ = nullptr;
  bytes_ = 0;
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
  }
  return *this;
}

Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape, size_t byte_offset) const {
  Tensor t = Tensor::from_shape(static_cast<char*>(data_) + byte_offset, dtype, shape, device_);
  TS_CHECK(byte_offset + t.nbytes() <= bytes_, "internal: view ", t.shape_str(), " at ", byte_offset,
           " exceeds a buffer of ", bytes_, " bytes");
  return t;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const Context& ctx) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  device_copy(dst, dst_device, src, src_device, bytes, ctx);
}

void copy(const Tensor& dst, const Tensor& src, const Context& ctx) {
  TS_CHECK(dst.dtype() == src.dtype(), "copy: dtype ", dtype_name(src.dtype()), " into ", dtype_name(dst.dtype()));
  TS_CHECK(dst.numel() == src.numel(), "copy: ", src.shape_str(), " into ", dst.shape_str());
  TS_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy: strided views are not supported");
  copy_bytes(dst.data(), dst.device(), src.data(), src.device(), src.nbytes(), ctx);
}

void fill_bytes(const Tensor& t, unsigned char byte, const Context& ctx) {
  TS_CHECK(t.is_contiguous(), "fill: strided views are not supported");
  if (t.device().is_cpu()) std::memset(t.data(), byte, t.nbytes());
  else device_fill(t.data(), byte, t.nbytes(), ctx);
}

}  // namespace tessera
