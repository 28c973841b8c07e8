// nn::MLP: the two-layer feed-forward network every model has somewhere,
//   x: [..., in] -> fc [..., hidden] -> activation -> proj [..., out] -> dropout.
// GPT-2's block MLP is MLP(C, 4C, C, GELU(tanh)); a classifier is
// MLP(features, hidden, classes, ReLU). With a GELU(tanh) activation (exactly
// nn::GELU) and no forward hooks on fc, act or proj, forward runs fc, act
// and proj as one tessera::linear_gelu_linear: the same parameters, values
// and gradients, with the GELU fused into the GEMMs around it on cuda.
#pragma once

#include <memory>
#include <optional>

#include "nn/dropout.h"
#include "nn/linear.h"

namespace tessera::nn {

struct MLPOptions {
  bool bias = true;
  // Unset: Linear's default (torch's kaiming-uniform); set: N(0, std), zero bias.
  std::optional<double> init_std = std::nullopt;
  // proj's std when set (GPT-2 scales the residual projections by 1/sqrt(2 L));
  // unset: init_std.
  std::optional<double> proj_init_std = std::nullopt;
  double dropout = 0.0;  // on the output
  Device device = kCPU;
  DType dtype = DType::f32;
};

class MLP : public Module {
 public:
  // Children: fc, act (the given activation module), proj, drop.
  MLP(int64_t in_features, int64_t hidden_features, int64_t out_features, std::shared_ptr<Module> activation,
      MLPOptions options = {});

  // x: [..., in] -> [..., out]
  Tensor forward(const Tensor& x) override;

  Linear& fc() const { return *fc_; }
  Module& activation() const { return *activation_; }
  Linear& proj() const { return *proj_; }

 private:
  // Whether forward may run fc -> act -> proj as linear_gelu_linear.
  bool fuses_gelu() const;

  std::shared_ptr<Linear> fc_;
  std::shared_ptr<Module> activation_;
  std::shared_ptr<Linear> proj_;
  std::shared_ptr<Dropout> drop_;
};

}  // namespace tessera::nn
