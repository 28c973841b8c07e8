// nn::Parameter: the leaf tensor behind a registry slot.
#include "nn/parameter.h"

namespace tessera::nn {

Parameter::Parameter(Tensor tensor, bool requires_grad) : requires_grad_(requires_grad) {
  set_tensor(std::move(tensor));
}

void Parameter::set_tensor(Tensor tensor) {
  TESSERA_CHECK(tensor.defined(), "Parameter: the tensor is undefined");
  TESSERA_CHECK(tensor.is_leaf(), "Parameter: the tensor must be a leaf (it has autograd history); detach it first");
  if (tensor.requires_grad() != requires_grad_) tensor.set_requires_grad(requires_grad_);
  tensor_ = std::move(tensor);
}

}  // namespace tessera::nn
