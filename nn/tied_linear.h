// nn::TiedLinear: y = x W^T where W is a parameter owned by another module
// (GPT's output head reads the token embedding's weight). Registering the
// shared Parameter makes the tie visible: named_parameters lists it once,
// state_dict under both names (like torch's lm_head.weight), and fsdp can see
// that both modules use it. It never initialises W: the owner does.
#pragma once

#include <memory>

#include "nn/module.h"

namespace tessera::nn {

class TiedLinear : public Module {
 public:
  // weight: [out_features, in_features], shared with its owner.
  explicit TiedLinear(std::shared_ptr<Parameter> weight);

  // [..., in_features] -> [..., out_features]
  Tensor forward(const Tensor& input) override;

  Parameter& weight() const { return *parameter("weight"); }
};

}  // namespace tessera::nn
