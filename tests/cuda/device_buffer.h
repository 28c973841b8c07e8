// A typed device allocation for simulator tests, filled from and read back to
// host vectors with memcpy outside kernels: the simulator's device memory is
// host memory, so these tests need no stream or copy API. A filled buffer is
// marked written for initcheck, as a copy to the device would be; a buffer
// made by size alone is unwritten, as cudaMalloc's is. Elements are copied
// as bytes, as a copy to the device would: the toolkit's bf16 and f16 types
// are not trivially copyable, but their bits are their value (the copies go
// through void*, which tells g++ so: -Wclass-memaccess).
#pragma once

#include <cstring>
#include <vector>

#include "tensor/cuda/sim/device_heap.h"
#include "tensor/error.h"

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    data_ = static_cast<T*>(tessera::cuda::sim::device_malloc(0, static_cast<int64_t>(count * sizeof(T))));
    TESSERA_CHECK(data_ != nullptr, "test: device_malloc of {} elements failed", count);
  }
  explicit DeviceBuffer(const std::vector<T>& values) : DeviceBuffer(values.size()) {
    std::memcpy(static_cast<void*>(data_), values.data(), values.size() * sizeof(T));
    tessera::cuda::sim::mark_device_written(data_, static_cast<int64_t>(values.size() * sizeof(T)));
  }
  ~DeviceBuffer() { tessera::cuda::sim::device_free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  std::vector<T> read() const {
    std::vector<T> values(count_);
    std::memcpy(static_cast<void*>(values.data()), data_, count_ * sizeof(T));
    return values;
  }

 private:
  size_t count_;
  T* data_;
};
