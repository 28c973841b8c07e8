// Grad mode and the raw-op input check: two flags per thread (each simulated
// rank is a thread and may be inside its own no-grad scope), and the error
// that names the differentiable function to call instead.
#include "tensor/raw_op_guard.h"

#include <algorithm>

#include "tensor/raw_op_twins.h"  // kTwinsOfTheSameName, written at build time by tensor/raw_op_twins.py

namespace tessera {

namespace {

struct RawOpState {
  bool grad_mode = true;
  bool grad_inputs_allowed = false;
};

thread_local RawOpState raw_op_state;

[[noreturn]] void refuse(const char* op, const std::string& input) {
  const std::string twin = differentiable_twin(op);
  if (!twin.empty()) {
    fail("ops::{}: input {} requires grad while grad mode is on, so its gradient would be lost: call {} "
         "(autograd/functions.h), or compute under autograd::NoGradGuard",
         op, input, twin);
  }
  fail("ops::{}: input {} requires grad while grad mode is on, so its gradient would be lost: ops::{} has no "
       "differentiable version, so call it under autograd::NoGradGuard (or on {}.detach()) where no gradient "
       "should flow",
       op, input, op, input);
}

bool refuses_grad_inputs() { return raw_op_state.grad_mode && !raw_op_state.grad_inputs_allowed; }

bool requires_grad(const Tensor& tensor) { return tensor.defined() && tensor.requires_grad(); }

}  // namespace

// The error path and tests are the only readers, so a linear search is fine.
std::string differentiable_twin(std::string_view op) {
  if (op == "causal_attention") return "tessera::scaled_dot_product_attention";
  if (std::ranges::find(kTwinsOfTheSameName, op) != std::end(kTwinsOfTheSameName)) {
    return "tessera::" + std::string(op);
  }
  return {};
}

bool grad_mode_enabled() { return raw_op_state.grad_mode; }
void set_grad_mode_enabled(bool enabled) { raw_op_state.grad_mode = enabled; }

GradInputsAllowed::GradInputsAllowed() : previous_(raw_op_state.grad_inputs_allowed) {
  raw_op_state.grad_inputs_allowed = true;
}
GradInputsAllowed::~GradInputsAllowed() { raw_op_state.grad_inputs_allowed = previous_; }

void check_raw_op_inputs(const char* op, std::initializer_list<RawOpInput> inputs) {
  if (!refuses_grad_inputs()) return;
  for (const RawOpInput& input : inputs) {
    if (requires_grad(input.tensor)) refuse(op, input.name);
  }
}

void check_raw_op_inputs(const char* op, const char* name, const std::vector<Tensor>& inputs) {
  if (!refuses_grad_inputs()) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (requires_grad(inputs[i])) refuse(op, fmt::format("{}[{}]", name, i));
  }
}

}  // namespace tessera
