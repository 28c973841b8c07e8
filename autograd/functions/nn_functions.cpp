// Differentiable neural-network functions. Each backward is one fused raw op
// (tensor/ops.h *_backward) fed with what the forward saved: the output for
// softmax, the row statistics for the norms (and the sum for add_layer_norm,
// whose node has two outputs), the log-sum-exp for attention, the scale mask
// for dropout.
#include "autograd/functions.h"
#include "autograd/functions/recording.h"
#include "autograd/recompute_memo.h"

namespace tessera {

namespace {

using autograd::needs_grad;
using autograd::Node;
using autograd::TensorList;

class SoftmaxBackward final : public Node {
 public:
  SoftmaxBackward(bool log, Tensor y, int64_t dim) : log_(log), y_(std::move(y)), dim_(dim) {}
  std::string name() const override { return log_ ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {log_ ? ops::log_softmax_backward(grads[0], y_, dim_) : ops::softmax_backward(grads[0], y_, dim_)};
  }
  void release_saved_tensors() override { y_ = Tensor(); }

 private:
  bool log_;
  Tensor y_;
  int64_t dim_;
};

class LayerNormBackward final : public Node {
 public:
  LayerNormBackward(const Tensor& x, const Tensor& weight, const ops::NormOutput& out, bool has_bias)
      : x_(x), weight_(weight), mean_(out.mean), rstd_(out.rstd), has_bias_(has_bias) {}
  std::string name() const override { return "LayerNormBackward"; }
  TensorList apply(TensorList&& grads) override {
    ops::NormGrads g = ops::layer_norm_backward(grads[0], x_, weight_, mean_, rstd_, has_bias_);
    return {std::move(g.x), std::move(g.weight), std::move(g.bias)};
  }
  void release_saved_tensors() override { x_ = weight_ = mean_ = rstd_ = Tensor(); }

 private:
  Tensor x_, weight_, mean_, rstd_;
  bool has_bias_;
};

// Outputs: 0 sum = x + delta, 1 normalized = layer_norm(sum). The sum's
// gradient is grad_sum (what reached it past the norm) plus the norm's, in
// one pass (ops::add_layer_norm_backward); x and delta both get that tensor
// (the engine copies a gradient it hands to two places before adding into it).
class AddLayerNormBackward final : public Node {
 public:
  AddLayerNormBackward(const ops::AddNormOutput& out, const Tensor& weight, bool has_bias)
      : sum_(out.sum.detach()), weight_(weight), mean_(out.norm.mean), rstd_(out.norm.rstd), has_bias_(has_bias) {}
  std::string name() const override { return "AddLayerNormBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& grad_sum = grads[0];
    const Tensor& grad_normalized = grads[1];
    ops::NormGrads g{grad_sum, Tensor(), Tensor()};
    if (grad_normalized.defined()) {
      g = ops::add_layer_norm_backward(grad_sum, grad_normalized, sum_, weight_, mean_, rstd_, has_bias_);
    }
    return {g.x, g.x, std::move(g.weight), std::move(g.bias)};
  }
  void release_saved_tensors() override { sum_ = weight_ = mean_ = rstd_ = Tensor(); }

 private:
  Tensor sum_, weight_, mean_, rstd_;
  bool has_bias_;
};

class RmsNormBackward final : public Node {
 public:
  RmsNormBackward(const Tensor& x, const Tensor& weight, Tensor rstd) : x_(x), weight_(weight), rstd_(std::move(rstd)) {}
  std::string name() const override { return "RmsNormBackward"; }
  TensorList apply(TensorList&& grads) override {
    ops::NormGrads g = ops::rms_norm_backward(grads[0], x_, weight_, rstd_);
    return {std::move(g.x), std::move(g.weight)};
  }
  void release_saved_tensors() override { x_ = weight_ = rstd_ = Tensor(); }

 private:
  Tensor x_, weight_, rstd_;
};

// The indices get no gradient; rows used several times sum their gradients.
class EmbeddingBackward final : public Node {
 public:
  EmbeddingBackward(Tensor indices, int64_t num_embeddings)
      : indices_(std::move(indices)), num_embeddings_(num_embeddings) {}
  std::string name() const override { return "EmbeddingBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {ops::embedding_backward(grads[0], indices_, num_embeddings_)};
  }
  void release_saved_tensors() override { indices_ = Tensor(); }

 private:
  Tensor indices_;
  int64_t num_embeddings_;
};

class CrossEntropyBackward final : public Node {
 public:
  CrossEntropyBackward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, int64_t classes,
                       Tensor logsumexp)
      : logits_(logits),
        targets_(targets),
        logsumexp_(std::move(logsumexp)),
        ignore_index_(ignore_index),
        classes_(classes) {}
  std::string name() const override { return "CrossEntropyBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {ops::cross_entropy_backward(grads[0], logits_, targets_, ignore_index_, logsumexp_, classes_)};
  }
  void release_saved_tensors() override { logits_ = targets_ = logsumexp_ = Tensor(); }

 private:
  Tensor logits_, targets_, logsumexp_;
  int64_t ignore_index_, classes_;
};

class AttentionBackward final : public Node {
 public:
  AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionOutput& out)
      : q_(q), k_(k), v_(v), out_(out.out.detach()), logsumexp_(out.logsumexp) {}
  std::string name() const override { return "ScaledDotProductAttentionBackward"; }
  TensorList apply(TensorList&& grads) override {
    ops::AttentionGrads g = ops::causal_attention_backward(grads[0], q_, k_, v_, out_, logsumexp_);
    TensorList result(3);
    if (needs_grad(*this, 0)) result[0] = std::move(g.q);
    if (needs_grad(*this, 1)) result[1] = std::move(g.k);
    if (needs_grad(*this, 2)) result[2] = std::move(g.v);
    return result;
  }
  void release_saved_tensors() override { q_ = k_ = v_ = out_ = logsumexp_ = Tensor(); }

 private:
  Tensor q_, k_, v_, out_, logsumexp_;
};

// y = x * mask, mask = 0 or 1/(1-p): grad = g * mask.
class DropoutBackward final : public Node {
 public:
  explicit DropoutBackward(Tensor mask) : mask_(std::move(mask)) {}
  std::string name() const override { return "DropoutBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::mul(grads[0], mask_)}; }
  void release_saved_tensors() override { mask_ = Tensor(); }

 private:
  Tensor mask_;
};

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::softmax(x, dim);
  if (autograd::any_requires_grad({&x})) autograd::record(y, std::make_shared<SoftmaxBackward>(false, y.detach(), dim), {&x});
  return y;
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::log_softmax(x, dim);
  if (autograd::any_requires_grad({&x})) autograd::record(y, std::make_shared<SoftmaxBackward>(true, y.detach(), dim), {&x});
  return y;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const GradInputsAllowed recorded_here;
  ops::NormOutput out = ops::layer_norm(x, weight, bias, eps);
  Tensor y = std::move(out.y);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(y, std::make_shared<LayerNormBackward>(x, weight, out, bias.defined()), {&x, &weight, &bias});
  }
  return y;
}

AddLayerNormOutput add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias,
                                  double eps) {
  const GradInputsAllowed recorded_here;
  ops::AddNormOutput out = ops::add_layer_norm(x, delta, weight, bias, eps);
  AddLayerNormOutput result{out.sum, out.norm.y};
  if (autograd::any_requires_grad({&x, &delta, &weight, &bias})) {
    auto node = std::make_shared<AddLayerNormBackward>(out, weight, bias.defined());
    node->set_next_edges(autograd::collect_edges({&x, &delta, &weight, &bias}));
    node->set_num_outputs(2);
    autograd::set_history(result.sum, node, 0);
    autograd::set_history(result.normalized, node, 1);
  }
  return result;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const GradInputsAllowed recorded_here;
  ops::NormOutput out = ops::rms_norm(x, weight, eps);
  Tensor y = std::move(out.y);
  if (autograd::any_requires_grad({&x, &weight})) {
    autograd::record(y, std::make_shared<RmsNormBackward>(x, weight, std::move(out.rstd)), {&x, &weight});
  }
  return y;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::embedding(weight, indices);
  if (autograd::any_requires_grad({&weight})) {
    autograd::record(y, std::make_shared<EmbeddingBackward>(indices, weight.size(0)), {&weight});
  }
  return y;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, int64_t classes) {
  const GradInputsAllowed recorded_here;
  ops::CrossEntropyOutput out = ops::cross_entropy_with_logsumexp(logits, targets, ignore_index, classes);
  if (autograd::any_requires_grad({&logits})) {
    autograd::record(out.loss,
                     std::make_shared<CrossEntropyBackward>(logits, targets, ignore_index, classes,
                                                            std::move(out.logsumexp)),
                     {&logits});
  }
  return out.loss;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const GradInputsAllowed recorded_here;
  const TensorList kept = autograd::memoized(autograd::MemoizedOp::attention, {&q, &k, &v}, [&] {
    ops::AttentionOutput computed = ops::causal_attention(q, k, v);
    return TensorList{std::move(computed.out), std::move(computed.logsumexp)};
  });
  const ops::AttentionOutput out{.out = kept[0], .logsumexp = kept[1]};
  Tensor y = out.out;
  if (autograd::any_requires_grad({&q, &k, &v})) {
    autograd::record(y, std::make_shared<AttentionBackward>(q, k, v, out), {&q, &k, &v});
  }
  return y;
}

Tensor dropout(const Tensor& x, double p, bool training, PhiloxKey key, PhiloxNumbering numbering) {
  const GradInputsAllowed recorded_here;
  TESSERA_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x;
  auto [y, mask] = ops::dropout(x, p, key, numbering);
  if (autograd::any_requires_grad({&x})) autograd::record(y, std::make_shared<DropoutBackward>(std::move(mask)), {&x});
  return y;
}

}  // namespace tessera
