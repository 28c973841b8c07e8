// A model whose FSDP groups have known, different sizes: Linear layers of the
// given widths built on meta, each its own group under a root that owns no
// parameters, so the only unsharded memory is the layers' (test_memory,
// test_plan).
#pragma once

#include <memory>
#include <vector>

#include "autograd/functions.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/module_list.h"

namespace tessera::fsdp::testing {

class LayerStack : public nn::Module {
 public:
  explicit LayerStack(const std::vector<int64_t>& widths) : Module("LayerStack") {
    layers_ = register_module("layers", std::make_shared<nn::ModuleList>());
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      layers_->push_back(std::make_shared<nn::Linear>(widths[i], widths[i + 1], nn::LinearOptions{.device = kMeta}));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (const auto& layer : *layers_) y = tessera::tanh((*layer)(y));
    return tessera::mean(tessera::mul(y, y));
  }
  nn::ModuleList& layers() { return *layers_; }

 private:
  std::shared_ptr<nn::ModuleList> layers_;
};

}  // namespace tessera::fsdp::testing
