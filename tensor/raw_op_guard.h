// The guard that stops a raw op (tensor/ops.h) from silently losing a
// gradient. Decision (issue 15, "one op namespace for model code"): while
// grad mode is on, a raw op refuses an input that requires grad, with an
// error naming the op, the input and the differentiable tessera:: function to
// call instead. Without it, a model that wrote ops::relu(x) where it meant
// tessera::relu(x) compiled, ran, and never trained the layers before it.
//
// Grad mode (on by default, one flag per thread) lives here, below autograd,
// because the raw ops read it; autograd::GradMode and NoGradGuard set it.
// Code that runs raw ops on such inputs and answers for their gradient itself
// opens a GradInputsAllowed scope: every differentiable function (it records
// the node), and the raw ops whose results carry no gradient at all
// (comparisons, logical_not, argmax, printing, item/to_vector) or that only
// write their destination (fill_; in-place ops check their sources only).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/tensor.h"

namespace tessera {

// Whether the differentiable functions record the graph on this thread.
bool grad_mode_enabled();
void set_grad_mode_enabled(bool enabled);

// For its lifetime, raw ops on this thread accept inputs that require grad.
class GradInputsAllowed {
 public:
  GradInputsAllowed();
  ~GradInputsAllowed();
  GradInputsAllowed(const GradInputsAllowed&) = delete;
  GradInputsAllowed& operator=(const GradInputsAllowed&) = delete;

 private:
  bool previous_;
};

// One input of a raw op, by the name its parameter has in tensor/ops.h.
struct RawOpInput {
  const char* name;
  const Tensor& tensor;
};

// What every raw op runs first: throws tessera::Error if grad mode is on, no
// GradInputsAllowed scope is open and an input requires grad. Undefined
// inputs pass (the op's own checks report them). Costs one thread-local read
// and one requires_grad() test per input.
void check_raw_op_inputs(const char* op, std::initializer_list<RawOpInput> inputs);
// The same for a list input (cat, stack): the message names tensors[i].
void check_raw_op_inputs(const char* op, const char* name, const std::vector<Tensor>& inputs);

// The differentiable function the refusal of raw op `op` names
// ("tessera::relu" for ops::relu), or "" when it has none: the function of
// the same name in autograd/functions.h (the list is read from both headers
// at build time), and tessera::scaled_dot_product_attention for
// causal_attention.
std::string differentiable_twin(std::string_view op);

}  // namespace tessera
