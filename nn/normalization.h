// nn::LayerNorm and nn::RMSNorm over the last dim, with a learned scale
// (init 1) and, for LayerNorm, an optional shift (init 0).
#pragma once

#include "nn/module.h"

namespace tessera::nn {

struct LayerNormOptions {
  double eps = 1e-5;
  bool bias = true;
  Device device = kCPU;
  DType dtype = DType::f32;
};

// y = (x - mean) / sqrt(var + eps) * weight + bias, statistics over the last dim.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, LayerNormOptions options = {});

  // x: [..., dim] -> [..., dim]
  Tensor forward(const Tensor& x) override;

  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }
  bool has_bias() const { return has_bias_; }
  Parameter& weight() const { return *parameter("weight"); }
  Parameter& bias() const { return *parameter("bias"); }  // throws when built without

 protected:
  void reset_own_parameters(const InitContext& context) override;

 private:
  int64_t dim_;
  double eps_;
  bool has_bias_;
};

struct RMSNormOptions {
  double eps = 1e-6;
  Device device = kCPU;
  DType dtype = DType::f32;
};

// y = x / sqrt(mean(x^2) + eps) * weight, over the last dim.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, RMSNormOptions options = {});

  // x: [..., dim] -> [..., dim]
  Tensor forward(const Tensor& x) override;

  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }
  Parameter& weight() const { return *parameter("weight"); }

 protected:
  void reset_own_parameters(const InitContext& context) override;

 private:
  int64_t dim_;
  double eps_;
};

}  // namespace tessera::nn
