// Tensor: a cheap, copyable handle to a TensorImpl (shape, strides, storage
// offset, dtype, and the autograd slot). Views share Storage; copying a
// Tensor copies the handle, never the data.
//
// Math lives in free functions, not methods: `tessera::matmul(a, b)` (from
// autograd/functions.h) records the graph for backward; `tessera::ops::matmul`
// (tensor/ops.h) only computes. The tensor layer knows nothing of the graph
// beyond the slot that holds it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace tessera {

namespace autograd {
class Node;  // autograd/node.h
}

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); throws naming `op` if out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// How to create a tensor: `zeros({2, 3}, {.dtype = DType::f64})`.
struct TensorOptions {
  DType dtype = DType::f32;
  Device device = kCPU;
  bool requires_grad = false;
};

class Tensor;
class TensorImpl;

// Runs on the gradient flowing into a tensor during backward; returning a
// defined tensor replaces the gradient.
using GradHook = std::function<Tensor(const Tensor& grad)>;
// Runs on a leaf after its .grad has been accumulated.
using PostAccumulateGradHook = std::function<void(Tensor& leaf)>;

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A tensor viewing `storage` with the given geometry (no copy, no checks
  // beyond bounds).
  static Tensor make(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // Geometry.
  const Shape& sizes() const;
  int64_t size(int64_t dim) const;
  const Shape& strides() const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  int64_t storage_offset() const;
  bool is_contiguous() const;
  DType dtype() const;
  Device device() const;
  bool is_meta() const { return device().is_meta(); }
  size_t element_size() const { return tessera::element_size(dtype()); }
  int64_t nbytes() const { return numel() * static_cast<int64_t>(element_size()); }
  const std::shared_ptr<Storage>& storage() const;
  bool shares_storage_with(const Tensor& other) const;

  // Data access (CPU only: a cuda tensor's bytes are device memory, reached
  // through the copy API). data_ptr<T> checks that T matches the dtype.
  void* raw_data() const;
  // The device address of a cuda tensor's first element, for its kernels;
  // an error on any other device.
  void* cuda_data() const;
  template <typename T>
  T* data_ptr() const {
    check_data_access(dtype_of<T>::value, "data_ptr");
    return static_cast<T*>(raw_data());
  }
  // The value of a one-element tensor, converted to double.
  double item() const;
  template <typename T>
  T item() const {
    return static_cast<T>(item());
  }
  // All elements in logical (row-major) order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;

  // A new handle on the same data that does not require grad and has no history.
  Tensor detach() const;

  // Autograd slot (used by autograd/; plain data here).
  bool requires_grad() const;
  // Only leaves (tensors with no grad_fn) may have requires_grad set, and only
  // floating types; returns *this for chaining.
  Tensor& set_requires_grad(bool requires_grad);
  const Tensor& grad() const;
  Tensor& mutable_grad();
  void set_grad(Tensor grad);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  uint32_t output_nr() const;
  struct AutogradMeta& autograd_meta() const;  // created on first use

 private:
  void check_data_access(DType expected, const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

// The autograd slot of a tensor. The tensor layer only stores it; autograd/
// reads and writes it (the graph edge, the hooks, the accumulated grad).
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;      // the node that produced this tensor
  uint32_t output_nr = 0;                        // which output of grad_fn
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: their AccumulateGrad node
  std::vector<std::pair<int64_t, GradHook>> grad_hooks;  // leaves; non-leaf hooks live on grad_fn
  std::vector<std::pair<int64_t, PostAccumulateGradHook>> post_accumulate_grad_hooks;
  bool retains_grad = false;
};

class TensorImpl {
 public:
  TensorImpl(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);

  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset;  // in elements
  DType dtype;
  std::unique_ptr<AutogradMeta> autograd;  // null until first needed
};

// Copies every element of `tensor`, in logical order, converted to `as`, into
// `out` (numel * element_size(as) bytes). Defined with the copy kernels.
void read_elements(const Tensor& tensor, DType as, void* out);

template <typename T>
std::vector<T> Tensor::to_vector() const {
  if constexpr (std::is_same_v<T, bool>) {
    // std::vector<bool> packs bits and has no data(): read bytes, then widen.
    std::vector<uint8_t> bytes(static_cast<size_t>(numel()));
    read_elements(*this, DType::boolean, bytes.data());
    return std::vector<bool>(bytes.begin(), bytes.end());
  } else {
    std::vector<T> values(static_cast<size_t>(numel()));
    read_elements(*this, dtype_of<T>::value, values.data());
    return values;
  }
}

}  // namespace tessera
