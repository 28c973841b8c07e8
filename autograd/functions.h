// The differentiable tensor API: the ops of tensor/ops.h that record a node
// for backward when grad mode is on and an input requires grad. They live in
// `tessera::` because they are the tensor API users write models with; their
// backward formulas (autograd/functions/*.cpp) are written with tessera::ops.
// Model code has one op namespace, this one: a raw ops:: call on an input
// that requires grad, with grad mode on, throws an error naming the function
// here to call instead (tensor/raw_op_guard.h), rather than silently cutting
// the gradient.
//
// Creation ops and in-place ops do not record: use tessera::ops for those.
// In-place is raw only (ops::add_, copy_, fill_, ...): it records nothing and
// refuses only a source that requires grad (with grad mode on), never the
// tensor it writes, so use it on parameters and grads under NoGradGuard
// (optimizer steps, FSDP copy-in/out), never on a tensor that a recorded op
// saved for its backward (there is no version counter; the gradient would
// silently use the new values).
//
// Choices where torch leaves room: amax shares the gradient equally among
// tied maxima, max(x, dim) gives it all to the first maximum (its index);
// pow(a, b) gives b's gradient only where a > 0 (0 elsewhere); dropout and
// contiguous/to return their input itself (no node) when they would not
// change it.
#pragma once

#include <vector>

#include "tensor/ops.h"

namespace tessera {

// views
Tensor view(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);
Tensor to(const Tensor& x, DType dtype);
Tensor to(const Tensor& x, Device device);

// joining and splitting
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

// elementwise
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApproximation approximation = GeluApproximation::tanh);
Tensor silu(const Tensor& x);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);

// reductions
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);  // values differentiable
using ops::argmax;

// linear algebra
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// float8 training's product (torchao's tensorwise recipe): x and weight cast
// to f8e4m3 at scales from their amax (weight_scale, when given, for the
// weight: FSDP's float8 all-gather computes it over every rank's shard), the
// output's gradient to f8e5m2, each GEMM of float8 operands summed in f32
// and unscaled; the bias and its gradient in x's dtype. Not exact: a float8
// layer is checked against this formula, not by finite differences.
Tensor float8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& weight_scale = Tensor());
// linear(gelu(linear(x, fc_weight, fc_bias), tanh), proj_weight, proj_bias):
// GPT-2's MLP core as one node, so that its backward can fuse the GELU into
// the GEMMs around it (cuda: cuBLASLt epilogues; see tensor/ops.h,
// linear_gelu). x [..., in], fc_weight [hidden, in], proj_weight [out,
// hidden], biases [hidden] / [out] or undefined -> [..., out].
Tensor linear_gelu_linear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                          const Tensor& proj_weight, const Tensor& proj_bias);

// neural-network functions
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// sum = x + delta and normalized = layer_norm(sum, weight, bias, eps) as one
// node with two outputs: the bits of add then layer_norm, forward and
// backward, in one pass over the rows each way (ops::add_layer_norm).
// x and delta: one shape, dtype and device; delta's gradient is x's tensor.
struct AddLayerNormOutput {
  Tensor sum;
  Tensor normalized;
};
AddLayerNormOutput add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias,
                                  double eps = 1e-5);
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Columns of logits from `classes` on are padding: outside the softmax, zero gradient (ops::cross_entropy).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     int64_t classes = kAllColumns);
// Causal attention, q/k/v: [B, H, T, D].
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v);
// Identity when !training or p == 0; otherwise inverted dropout with `key`.
Tensor dropout(const Tensor& x, double p, bool training, PhiloxKey key, PhiloxNumbering numbering = {});

}  // namespace tessera
