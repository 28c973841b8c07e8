// User-defined functions: Function::apply runs the user's forward without
// recording, then records one node whose apply calls the user's backward and
// checks what it returns against the inputs.
#include "autograd/function.h"

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace tessera::autograd {

namespace {

struct TensorShapeInfo {
  bool defined = false;
  Shape shape;
  DType dtype;
  Device device;
};

class CustomFunctionNode : public Node {
 public:
  explicit CustomFunctionNode(std::shared_ptr<Function> function) : function_(std::move(function)) {}

  FunctionContext& context() { return context_; }
  std::vector<TensorShapeInfo>& inputs() { return inputs_; }
  std::vector<TensorShapeInfo>& outputs() { return outputs_; }

  std::string name() const override { return function_->name(); }
  void release_saved_tensors() override { context_.release(); }

  TensorList apply(TensorList&& grad_outputs) override {
    // The user's backward sees a gradient for every output: zeros where none came.
    for (size_t i = 0; i < grad_outputs.size(); ++i) {
      const TensorShapeInfo& out = outputs_[i];
      if (!grad_outputs[i].defined() && out.defined) {
        grad_outputs[i] = ops::zeros(out.shape, {.dtype = out.dtype, .device = out.device});
      }
    }
    TensorList grads = function_->backward(context_, grad_outputs);
    TESSERA_CHECK(grads.size() == inputs_.size(), "{}: backward returned {} gradients for {} inputs", name(),
                  grads.size(), inputs_.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined() || !next_edges()[i].is_valid()) {
        grads[i] = Tensor();
        continue;
      }
      TESSERA_CHECK(grads[i].sizes() == inputs_[i].shape,
                    "{}: backward returned a gradient of shape {} for input {} of shape {}", name(), grads[i].sizes(),
                    i, inputs_[i].shape);
      grads[i] = ops::to(grads[i], inputs_[i].dtype);
    }
    return grads;
  }

 private:
  std::shared_ptr<Function> function_;
  FunctionContext context_;
  std::vector<TensorShapeInfo> inputs_;
  std::vector<TensorShapeInfo> outputs_;
};

}  // namespace

const TensorList& FunctionContext::saved() const {
  TESSERA_CHECK(!released_,
                "FunctionContext::saved: the saved tensors were freed by an earlier backward pass; pass "
                "retain_graph = true to the first backward to run backward twice");
  return saved_;
}

TensorList Function::run(std::shared_ptr<Function> function, const TensorList& inputs) {
  auto node = std::make_shared<CustomFunctionNode>(function);
  TensorList outputs;
  {
    NoGradGuard no_grad;
    outputs = function->forward(node->context(), inputs);
  }
  if (!any_requires_grad(inputs)) return outputs;

  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& input : inputs) {
    edges.push_back(gradient_edge(input));
    if (input.defined()) {
      node->inputs().push_back({true, input.sizes(), input.dtype(), input.device()});
    } else {
      node->inputs().push_back({});
    }
  }
  node->set_next_edges(std::move(edges));
  node->set_num_outputs(static_cast<uint32_t>(outputs.size()));

  // Saved outputs would hold the node that holds them: keep them as plain
  // data (detached handles on the same storage).
  TensorList saved = node->context().saved();
  bool saved_output = false;
  for (Tensor& tensor : saved) {
    for (const Tensor& output : outputs) {
      if (tensor.defined() && tensor.is_same(output)) {
        tensor = tensor.detach();
        saved_output = true;
        break;
      }
    }
  }
  if (saved_output) node->context().save_for_backward(std::move(saved));

  for (uint32_t i = 0; i < outputs.size(); ++i) {
    Tensor& output = outputs[i];
    // An input handed back as an output gets its own handle, so the input
    // keeps its own history.
    for (const Tensor& input : inputs) {
      if (output.defined() && output.is_same(input)) output = output.detach();
    }
    if (output.defined()) {
      node->outputs().push_back({true, output.sizes(), output.dtype(), output.device()});
    } else {
      node->outputs().push_back({});
    }
    if (output.defined() && is_floating(output.dtype())) set_history(output, node, i);
  }
  return outputs;
}

}  // namespace tessera::autograd
