// nn::Parameter: a trainable leaf tensor held in a module's registry slot.
// Layers read the tensor through the Parameter at every forward, so whoever
// owns the slot (FSDP: sharded <-> unsharded; to_empty) can swap it unseen.
#pragma once

#include "tensor/tensor.h"

namespace tessera::nn {

// Owned by shared_ptr: the same Parameter object registered in two modules is
// a tied parameter (one tensor, one gradient, listed once by named_parameters).
class Parameter {
 public:
  // `tensor` must be a leaf; requires_grad is applied to it (floating types only).
  explicit Parameter(Tensor tensor, bool requires_grad = true);

  const Tensor& tensor() const { return tensor_; }
  Tensor& tensor() { return tensor_; }
  // Replaces the tensor behind the parameter (a leaf); the requires_grad flag
  // is carried over to the new tensor.
  void set_tensor(Tensor tensor);

  bool requires_grad() const { return requires_grad_; }
  const Tensor& grad() const { return tensor_.grad(); }
  const Shape& sizes() const { return tensor_.sizes(); }
  int64_t numel() const { return tensor_.numel(); }

  // Sharding seam: FSDP (a later issue) attaches the sharding spec here (mesh,
  // placements, global shape, local offset). Until then a Parameter is always
  // the whole tensor, and nn::init's Parameter overloads fill it whole.

 private:
  Tensor tensor_;
  bool requires_grad_;
};

}  // namespace tessera::nn
