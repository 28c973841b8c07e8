// nn::Linear: y = x W^T + b with W: [out, in], b: [out] (optional).
#pragma once

#include <functional>
#include <optional>

#include "nn/module.h"

namespace tessera::nn {

struct LinearOptions {
  bool bias = true;
  // Unset: torch's default, W and b ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform
  // with a = sqrt(5)). Set: W ~ N(0, init_std) and b = 0 (GPT-2).
  std::optional<double> init_std = std::nullopt;
  Device device = kCPU;
  DType dtype = DType::f32;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});

  // x: [..., in] -> [..., out]. Under tensor parallelism in and out are the
  // weight piece's (a column-wise piece has fewer outputs, a row-wise one
  // fewer inputs); in_features() and out_features() stay the logical sizes.
  Tensor forward(const Tensor& x) override;

  // Row-wise tensor parallelism: forward leaves the bias out, so that the
  // style that set this adds it once, after the ranks' partial products are
  // summed (added on every rank before the sum, it would count tp times).
  void set_defers_bias(bool defers) { defers_bias_ = defers; }
  bool defers_bias() const { return defers_bias_; }

  // How forward multiplies: tessera::linear(x, W, b) unless a style replaced
  // it with a product that fuses a collective (async tensor parallelism,
  // tp/collective_matmul.h). b is undefined when the bias is deferred.
  using Product = std::function<Tensor(const Tensor& x, const Tensor& weight, const Tensor& bias)>;
  void set_product(Product product) { product_ = std::move(product); }
  bool has_product() const { return static_cast<bool>(product_); }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return has_bias_; }
  Parameter& weight() const { return *parameter("weight"); }
  Parameter& bias() const { return *parameter("bias"); }  // throws when built without

 protected:
  void reset_own_parameters(const InitContext& context) override;

 private:
  int64_t in_features_;
  int64_t out_features_;
  bool has_bias_;
  bool defers_bias_ = false;
  Product product_;
  std::optional<double> init_std_;
};

}  // namespace tessera::nn
