// nn::Linear: y = x W^T + b with W: [out, in], b: [out] (optional).
//
// Adaptations, set before fully_shard; two for fine-tuning (QLoRA: Dettmers et al. 2023; LoRA: Hu et
// al. 2021), set before fully_shard:
// - quantize_nf4(): W is frozen and stored packed in NF4 (u8 rows,
//   tensor/nf4_format.h), dequantised for each product; FSDP gathers the
//   packed rows (nn/nf4_all_gather.h).
// - add_lora({r, alpha}): y += (alpha / r) (x A^T) B^T with trainable
//   A [r, in] ~ U(+-1/sqrt(in)) and B [out, r] = 0, so that training starts
//   from the unadapted model's outputs exactly (the LoRA paper's init).
#pragma once

#include <functional>
#include <optional>

#include "nn/float8_all_gather.h"
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

struct LoRAOptions {
  int64_t rank = 8;
  double alpha = 16.0;
  double scaling() const { return alpha / static_cast<double>(rank); }
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

  // Packs the weight into NF4 and freezes it (the bias too: a quantised
  // layer is a frozen base). A materialised weight is quantised from its
  // values; a meta one is laid out (its values come from a checkpoint
  // through load_dense_weight, or are zeros after reset_parameters).
  void quantize_nf4();
  bool is_nf4() const { return nf4_; }
  // Quantises `rows` (this rank's rows of the dense weight: the rows the
  // packed weight's FSDP shard holds, or all of them) into the packed weight.
  void load_dense_weight(const Tensor& rows);
  // The weight as the product uses it: dequantised into `dtype` when packed
  // (no gradient), else the weight's tensor itself.
  Tensor dense_weight(DType dtype) const;

  // Adds a LoRA adapter (lora_a, lora_b); `context` names and seeds its
  // init, done now unless the module is on meta (then reset_parameters).
  void add_lora(const LoRAOptions& options, const InitContext& context);
  bool has_lora() const { return lora_.has_value(); }
  const LoRAOptions& lora() const;  // throws without an adapter
  Parameter& lora_a() const { return *parameter("lora_a"); }
  Parameter& lora_b() const { return *parameter("lora_b"); }
  // float8 training (torchao's tensorwise recipe, autograd float8_linear):
  // the product casts input and weight to f8e4m3 and the output's gradient
  // to f8e5m2; under fully_shard the weight is gathered in float8 at a scale
  // fsdp::precompute_float8_scales computes over every rank's shard
  // (nn/float8_all_gather.h). Without that scale, the product takes the
  // weight's own amax. Before fully_shard; not with NF4.
  void use_float8();
  bool uses_float8() const { return float8_scale_ != nullptr; }

  // No adapter, no packed weight, no float8, no replaced product: what fused
  // callers (MLP's GELU fusion) may multiply with the weight directly.
  bool is_plain() const { return !nf4_ && !lora_ && !product_ && !float8_scale_; }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return has_bias_; }
  Parameter& weight() const { return *parameter("weight"); }
  Parameter& bias() const { return *parameter("bias"); }  // throws when built without

 protected:
  void reset_own_parameters(const InitContext& context) override;

 private:
  void reset_lora(const InitContext& context);
  // The weight's init (torch's default or GPT-2's normal) into `dense`: the
  // weight, or the dense rows an NF4 weight packs.
  void init_dense_weight(Parameter& dense, const InitContext& context) const;

  int64_t in_features_;
  int64_t out_features_;
  bool has_bias_;
  bool defers_bias_ = false;
  Product product_;
  std::optional<double> init_std_;
  DType dtype_;
  bool nf4_ = false;
  std::optional<LoRAOptions> lora_;
  std::shared_ptr<Float8WeightScale> float8_scale_;
};

}  // namespace tessera::nn
