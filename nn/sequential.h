// nn::Sequential: a ModuleList whose forward feeds each child's output to the
// next, children named "0", "1", ... like torch.nn.Sequential:
//   nn::Sequential net({std::make_shared<nn::Linear>(4, 16), std::make_shared<nn::ReLU>(),
//                       std::make_shared<nn::Linear>(16, 3)});
#pragma once

#include <memory>
#include <vector>

#include "nn/module_list.h"

namespace tessera::nn {

class Sequential : public ModuleList {
 public:
  Sequential();
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);

  // x -> children in order; an empty Sequential returns x.
  Tensor forward(const Tensor& x) override;
};

}  // namespace tessera::nn
