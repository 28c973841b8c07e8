// nn::Linear: parameters, init (torch default or GPT-2 normal) and forward.
#include "nn/linear.h"

#include <cmath>

#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/recompute_memo.h"
#include "nn/init.h"
#include "nn/nf4_all_gather.h"
#include "tensor/ops.h"

namespace tessera::nn {

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : Module("Linear"),
      in_features_(in_features),
      out_features_(out_features),
      has_bias_(options.bias),
      init_std_(options.init_std),
      dtype_(options.dtype) {
  TESSERA_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in {} out {}",
                in_features, out_features);
  const TensorOptions meta{.dtype = options.dtype, .device = kMeta};
  register_parameter("weight", ops::empty({out_features, in_features}, meta));
  if (has_bias_) register_parameter("bias", ops::empty({out_features}, meta));
  materialize(options.device);
}

namespace {

// The product with a packed NF4 weight outside FSDP's unshard: dequantised
// for the forward and again for the backward, so that no dense copy of the
// weight is held in between (as bitsandbytes' and torchao's NF4 linears do).
// The weight and bias are frozen: only the input gets a gradient.
class PackedWeightProduct final : public autograd::Function {
 public:
  PackedWeightProduct(Tensor packed, int64_t in_features, Tensor bias)
      : packed_(std::move(packed)), in_features_(in_features), bias_(std::move(bias)) {}
  autograd::TensorList forward(autograd::FunctionContext&, const autograd::TensorList& inputs) override {
    // Memoized as tessera::linear is: selective checkpointing keeps this product too.
    const Tensor& x = inputs[0];
    return autograd::memoized(autograd::MemoizedOp::linear, {&x, &packed_, &bias_}, [&] {
      return autograd::TensorList{ops::linear(x, ops::nf4_dequantize(packed_, in_features_, x.dtype()), bias_)};
    });
  }
  autograd::TensorList backward(autograd::FunctionContext&, const autograd::TensorList& gradients) override {
    return {ops::matmul(gradients[0], ops::nf4_dequantize(packed_, in_features_, gradients[0].dtype()))};
  }
  std::string name() const override { return "PackedWeightProduct"; }

 private:
  Tensor packed_;
  int64_t in_features_;
  Tensor bias_;
};

}  // namespace

Tensor Linear::forward(const Tensor& x) {
  const Tensor& stored = weight().tensor();
  const bool packed = stored.dtype() == DType::u8;  // else FSDP's unshard holds the dequantised weight
  const int64_t in = packed ? in_features_ : stored.size(1);
  TESSERA_CHECK(x.dim() >= 1 && x.size(-1) == in, "Linear: expected input [..., {}], got {}", in, x.sizes());
  const Tensor b = has_bias_ && !defers_bias_ ? bias().tensor() : Tensor();
  Tensor y = packed          ? autograd::Function::apply<PackedWeightProduct>({x}, stored, in_features_, b)[0]
             : float8_scale_ ? tessera::float8_linear(x, stored, b, float8_scale_->scale)
             : product_      ? product_(x, stored, b)
                             : tessera::linear(x, stored, b);
  if (!lora_) return y;
  const Tensor low_rank = tessera::linear(tessera::linear(x, lora_a().tensor(), Tensor()), lora_b().tensor(), Tensor());
  return tessera::add(y, tessera::mul(low_rank, lora_->scaling()));
}

Tensor Linear::dense_weight(DType dtype) const {
  const Tensor& w = weight().tensor();
  // Packed: outside FSDP's unshard (one rank, or a module without fully_shard).
  // Inside it the parameter holds NF4AllGather's dequantised weight already.
  if (w.dtype() != DType::u8) return w;
  return ops::nf4_dequantize(w, in_features_, dtype);
}

void Linear::quantize_nf4() {
  TESSERA_CHECK(!nf4_, "Linear: quantize_nf4: the weight is NF4 already");
  TESSERA_CHECK(!weight().is_sharded() && !weight().tensor_parallel(),
                "Linear: quantize_nf4 comes before fully_shard and without tensor parallelism (the weight's rows "
                "must be whole)");
  TESSERA_CHECK(!product_,
                "Linear: quantize_nf4: a replaced product (tensor parallelism) multiplies the weight itself");
  autograd::NoGradGuard no_grad;
  Parameter& w = weight();
  const Tensor packed = ops::nf4_quantize(w.tensor().detach());
  w.set_requires_grad(false);
  w.set_tensor(packed);
  w.set_all_gather_extension(std::make_shared<NF4AllGather>(in_features_));
  if (has_bias_) bias().set_requires_grad(false);
  nf4_ = true;
}

void Linear::use_float8() {
  TESSERA_CHECK(!float8_scale_, "Linear: use_float8: the layer trains in float8 already");
  TESSERA_CHECK(!nf4_, "Linear: use_float8: an NF4 weight is frozen in 4 bits; float8 is for trained weights");
  TESSERA_CHECK(!weight().is_sharded() && !product_,
                "Linear: use_float8 comes before fully_shard and without a replaced product (tensor parallelism)");
  float8_scale_ = std::make_shared<Float8WeightScale>();
  weight().set_all_gather_extension(std::make_shared<Float8AllGather>(float8_scale_));
}

void Linear::load_dense_weight(const Tensor& rows) {
  TESSERA_CHECK(nf4_, "Linear: load_dense_weight is for an NF4 weight; copy into weight() instead");
  Tensor& packed = weight().tensor();
  TESSERA_CHECK(rows.dim() == 2 && rows.size(0) == packed.size(0) && rows.size(1) == in_features_,
                "Linear: load_dense_weight: expected this rank's {} rows of {}, got {}", packed.size(0),
                in_features_, rows.sizes());
  autograd::NoGradGuard no_grad;
  ops::copy_(packed, ops::nf4_quantize(rows.detach()));
}

void Linear::add_lora(const LoRAOptions& options, const InitContext& context) {
  TESSERA_CHECK(!lora_, "Linear: add_lora: the layer has an adapter already");
  TESSERA_CHECK(options.rank >= 1 && options.rank <= std::min(in_features_, out_features_),
                "Linear: add_lora: rank must be in [1, min(in, out) = {}], got {}",
                std::min(in_features_, out_features_), options.rank);
  TESSERA_CHECK(std::isfinite(options.alpha) && options.alpha > 0.0, "Linear: add_lora: alpha must be positive, got {}",
                options.alpha);
  TESSERA_CHECK(!weight().is_sharded() && !weight().tensor_parallel() && !product_,
                "Linear: add_lora comes before fully_shard and without tensor parallelism");
  const Device device = weight().tensor().device();
  const TensorOptions meta{.dtype = dtype_, .device = kMeta};
  register_parameter("lora_a", ops::empty({options.rank, in_features_}, meta));
  register_parameter("lora_b", ops::empty({out_features_, options.rank}, meta));
  lora_ = options;
  if (device.is_meta()) return;
  const TensorOptions real{.dtype = dtype_, .device = device};
  lora_a().set_tensor(ops::empty({options.rank, in_features_}, real));
  lora_b().set_tensor(ops::empty({out_features_, options.rank}, real));
  autograd::NoGradGuard no_grad;
  reset_lora(context);
}

const LoRAOptions& Linear::lora() const {
  TESSERA_CHECK(lora_.has_value(), "Linear: the layer has no LoRA adapter");
  return *lora_;
}

void Linear::reset_lora(const InitContext& context) {
  // A as torch's Linear default (kaiming_uniform, a = sqrt(5)), B zero: the
  // adapter adds nothing until B has trained.
  init::kaiming_uniform_(lora_a(), context.key("lora_a"), std::sqrt(5.0));
  init::zeros_(lora_b());
}

void Linear::reset_own_parameters(const InitContext& context) {
  if (lora_) reset_lora(context);
  if (!nf4_) {
    init_dense_weight(weight(), context);
  } else if (!weight().tensor().is_meta()) {
    // The dense weight this rank's packed rows stand for, drawn as an
    // unquantised Linear draws it (the same values at every world size),
    // then packed: a freshly built NF4 layer is its dense twin quantised.
    const Tensor& packed = weight().tensor();
    Parameter dense(ops::empty({packed.size(0), in_features_}, {.dtype = dtype_, .device = packed.device()}), false);
    if (const auto& sharding = weight().sharding()) {
      auto rows = std::make_shared<ShardingSpec>(*sharding);
      rows->global_shape = {out_features_, in_features_};
      dense.set_tensor(dense.tensor(), std::move(rows));
    }
    init_dense_weight(dense, context);
    load_dense_weight(dense.tensor());
  }
  if (!has_bias_) return;
  if (init_std_) {
    init::zeros_(bias());
    return;
  }
  // torch's default: U(+-1/sqrt(in)), as the weight.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
  init::uniform_(bias(), context.key("bias"), -bound, bound);
}

void Linear::init_dense_weight(Parameter& dense, const InitContext& context) const {
  if (init_std_) {
    init::normal_(dense, context.key("weight"), 0.0, *init_std_);
    return;
  }
  // torch's default: kaiming_uniform(a = sqrt(5)) = U(+-1/sqrt(in)).
  init::kaiming_uniform_(dense, context.key("weight"), std::sqrt(5.0));
}

}  // namespace tessera::nn
