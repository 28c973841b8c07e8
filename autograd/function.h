// User-defined differentiable functions: subclass Function with a forward
// (plain computation on tensors, graph not recorded) and a backward (output
// grads -> input grads); Function::apply records one node for the whole call.
//
//   struct Square : Function {
//     TensorList forward(FunctionContext& ctx, const TensorList& in) override {
//       ctx.save_for_backward({in[0]});
//       return {ops::mul(in[0], in[0])};
//     }
//     TensorList backward(FunctionContext& ctx, const TensorList& grad) override {
//       return {ops::mul(grad[0], ops::mul(ctx.saved()[0], 2.0))};
//     }
//   };
//   Tensor y = Function::apply<Square>({x})[0];
#pragma once

#include <memory>
#include <string>

#include "autograd/node.h"

namespace tessera::autograd {

class FunctionContext {
 public:
  void save_for_backward(TensorList tensors) { saved_ = std::move(tensors); }
  const TensorList& saved() const;
  void release() {
    saved_.clear();
    released_ = true;
  }

 private:
  TensorList saved_;
  bool released_ = false;
};

class Function {
 public:
  virtual ~Function() = default;
  virtual TensorList forward(FunctionContext& ctx, const TensorList& inputs) = 0;
  // Returns one gradient per input (undefined where none).
  virtual TensorList backward(FunctionContext& ctx, const TensorList& grad_outputs) = 0;
  virtual std::string name() const { return "CustomFunction"; }

  // Runs F's forward with recording off, then records one node whose backward
  // calls F's backward.
  template <typename F, typename... Args>
  static TensorList apply(const TensorList& inputs, Args&&... args) {
    return run(std::make_shared<F>(std::forward<Args>(args)...), inputs);
  }

 private:
  static TensorList run(std::shared_ptr<Function> function, const TensorList& inputs);
};

}  // namespace tessera::autograd
