// The tensor layer's ops: check inputs, infer the output's shape and dtype,
// allocate it on the inputs' device, and dispatch to that device's kernel
// table (tensor/kernels.h). On `meta` they stop after shape inference.
//
// These functions record no autograd graph, so they refuse to lose one: while
// grad mode is on, an op throws tessera::Error when an input requires grad,
// naming the op, the input and the differentiable function to call instead
// (the versions with the same names live in `tessera::`, autograd/functions.h).
// Call them on parameters and activations on purpose under
// autograd::NoGradGuard (init, optimizer steps, FSDP copy-in/out, eval);
// backward formulas are written with them (the engine runs with grad mode
// off). Not refused: creation ops (the *_like ones read only shape, dtype and
// device); the tensor an in-place op writes (only its sources are checked:
// copy_'s src, add_'s b, index_add_'s source); ops whose results carry no
// gradient (comparisons, logical_not, argmax, to_string, Tensor::item and
// to_vector). The guard and its reasons: tensor/raw_op_guard.h.
//
// Conventions: dims may be negative (counted from the end); binary ops
// broadcast like NumPy; every error is a tessera::Error naming the op and the
// shapes involved.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "tensor/copy_segment.h"
#include "tensor/philox.h"
#include "tensor/tensor.h"

namespace tessera {
// In tessera:: (not ops::) so that an unqualified gelu(x, GeluApproximation::tanh)
// finds only the differentiable tessera::gelu by argument-dependent lookup.
enum class GeluApproximation { none, tanh };  // none = exact erf form
// cross_entropy's `classes` when every column of the logits is a class.
inline constexpr int64_t kAllColumns = -1;
}  // namespace tessera

namespace tessera::ops {

// ---- creation -------------------------------------------------------------
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor empty_like(const Tensor& like);  // same shape, dtype, device; contiguous
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
Tensor full_like(const Tensor& like, double value);
// [start, end) in steps of `step` (sign of step must reach end).
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = {});
// Copies `values` into a new tensor of `shape` (numel must match), converting
// to options.dtype.
Tensor from_vector(const std::vector<float>& values, const Shape& shape, TensorOptions options = {});
Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions options = {});
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, TensorOptions options = {.dtype = DType::i64});
Tensor from_vector(const std::vector<uint8_t>& values, const Shape& shape, TensorOptions options = {.dtype = DType::u8});
Tensor scalar_tensor(double value, TensorOptions options = {});  // 0-d
// Uniform [low, high) and normal(mean, std) from Philox: element i of the
// result is value i of the sequence `key` (see tensor/philox.h).
Tensor rand(const Shape& shape, PhiloxKey key, TensorOptions options = {});
Tensor randn(const Shape& shape, PhiloxKey key, TensorOptions options = {});
// Draw from the calling thread's default generator.
Tensor rand(const Shape& shape, TensorOptions options = {});
Tensor randn(const Shape& shape, TensorOptions options = {});
// Fill in place with elements [first_index, first_index + numel) of the
// sequence `key`, in the tensor's logical order: a shard fills itself with the
// values the whole tensor would have at its offsets.
void uniform_(Tensor& out, PhiloxKey key, double low, double high, uint64_t first_index = 0);
void normal_(Tensor& out, PhiloxKey key, double mean, double std, uint64_t first_index = 0);

// ---- copies and conversions ---------------------------------------------
// dst <- src, broadcasting src to dst's shape and converting dtype. Works
// across devices (cpu <-> meta is shape-only).
void copy_(Tensor& dst, const Tensor& src);
void fill_(Tensor& dst, double value);
void zero_(Tensor& dst);
Tensor clone(const Tensor& tensor);       // contiguous copy
Tensor contiguous(const Tensor& tensor);  // the tensor itself when already contiguous
Tensor to(const Tensor& tensor, DType dtype);    // the tensor itself when dtype matches
Tensor to(const Tensor& tensor, Device device);  // the tensor itself when device matches
// A new uninitialised tensor of the same shape and dtype on `device`.
Tensor to_empty(const Tensor& tensor, Device device);
// Every segment (tensor/copy_segment.h) as if by copy_ or fill_ one after
// another, and the same bits: what FSDP moves a parameter group with. dst and
// src contiguous with one element count (shapes may differ: elements pair up
// in row-major order), f32, f64, bf16 or f16 in any pair, all on one device;
// no destination may overlap another segment's destination or any source.
// On cuda one kernel launch per 128 segments, whatever their sizes.
void copy_segments(const std::vector<CopySegment>& segments);

// ---- views (share storage) ----------------------------------------------
// view needs compatible strides; reshape copies when it must. One size may be -1.
Tensor view(const Tensor& tensor, const Shape& shape);
Tensor reshape(const Tensor& tensor, const Shape& shape);
Tensor flatten(const Tensor& tensor, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& tensor, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& tensor, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& tensor, int64_t dim, int64_t start, int64_t length);
// Python-style slice on one dim: start/end clamp to the size, step >= 1.
Tensor slice(const Tensor& tensor, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& tensor, int64_t dim, int64_t index);  // drops `dim`
Tensor squeeze(const Tensor& tensor);               // all size-1 dims
Tensor squeeze(const Tensor& tensor, int64_t dim);  // only if size 1
Tensor unsqueeze(const Tensor& tensor, int64_t dim);
// Broadcast view (stride 0 on expanded dims); -1 keeps a size.
Tensor expand(const Tensor& tensor, const Shape& shape);
Tensor as_strided(const Tensor& tensor, const Shape& shape, const Shape& strides, int64_t offset);
// The bytes of a contiguous tensor as a 1-D u8 view, and the reverse: a
// contiguous 1-D u8 tensor's bytes viewed as `dtype` of `shape` (its byte
// offset a multiple of the element size, its length the shape's bytes). No
// byte is converted: how FSDP moves payloads of mixed dtypes in one buffer.
Tensor as_bytes(const Tensor& tensor);
Tensor view_bytes_as(const Tensor& bytes, DType dtype, const Shape& shape);
// The shape both broadcast to; throws naming `op` if they do not.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// ---- joining and splitting ----------------------------------------------
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
std::vector<Tensor> split(const Tensor& tensor, int64_t split_size, int64_t dim);  // views
std::vector<Tensor> split_with_sizes(const Tensor& tensor, const std::vector<int64_t>& sizes, int64_t dim);
std::vector<Tensor> chunk(const Tensor& tensor, int64_t chunks, int64_t dim);  // ceil-sized, like torch
Tensor index_select(const Tensor& tensor, int64_t dim, const Tensor& index);  // index: 1-d i32/i64
// out[index[i]] += source[i] along `dim` (duplicates accumulate); in place.
void index_add_(Tensor& out, int64_t dim, const Tensor& index, const Tensor& source);

// ---- elementwise ----------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
// In place (out must have the broadcast shape already): out op= b.
void add_(Tensor& out, const Tensor& b, double alpha = 1.0);  // out += alpha * b
void mul_(Tensor& out, const Tensor& b);
void mul_(Tensor& out, double b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApproximation approximation = GeluApproximation::tanh);
Tensor silu(const Tensor& x);
// Fused derivatives: grad_out * f'(x).
Tensor tanh_backward(const Tensor& grad_out, const Tensor& y);  // uses the output y = tanh(x)
Tensor relu_backward(const Tensor& grad_out, const Tensor& x);
Tensor gelu_backward(const Tensor& grad_out, const Tensor& x, GeluApproximation approximation);
Tensor silu_backward(const Tensor& grad_out, const Tensor& x);
Tensor sigmoid_backward(const Tensor& grad_out, const Tensor& y);  // uses the output

// Comparisons give bool tensors.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_not(const Tensor& x);
// condition ? a : b, broadcasting all three; condition is bool.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// ---- reductions -----------------------------------------------------------
// Over `dims` (empty = all dims); floats accumulate in f64 for sum/mean
// reference accuracy where cheap, at least f32.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Maximum along one dim with the (first) index where it occurs.
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64
// Reduces `grad` (of broadcast shape) back to `shape` by summing broadcast dims.
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

// ---- linear algebra -------------------------------------------------------
// torch.matmul semantics: 1-d operands are promoted and the added dim removed;
// batch dims broadcast. Transposed (or otherwise strided) last-two-dim views
// are handed to the GEMM as-is, without copies.
Tensor matmul(const Tensor& a, const Tensor& b);
// x: [..., in], weight: [out, in], bias: [out] or undefined -> [..., out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// The GELU MLP's fused GEMMs (tessera::linear_gelu_linear is built on them).
// Each is the composition written beside it, and computes exactly that where
// the device has no fused call (cpu, f64, N not a multiple of 8; see
// KernelTable::matmul_gelu); on cuda otherwise it is one cublasLtMatmul whose
// epilogue does the elementwise or reduction pass (tensor/cuda/blas_lt.h).
// gelu is the tanh approximation throughout.
//
// y = gelu(pre), pre = linear(x, weight, bias): x [..., in], weight [out, in],
// bias [out] or undefined -> y, pre [..., out]. (GELU_AUX_BIAS: pre is the aux output.)
struct LinearGeluOutput {
  Tensor y;
  Tensor pre;
};
LinearGeluOutput linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
// gelu_backward(matmul(a, b), pre): a [..., M, K], b [K, N], pre shaped like
// the product: the gradient reaching pre through h = gelu(pre) and a linear
// layer reading h (a = grad_y, b = its weight). (DGELU.)
Tensor matmul_gelu_backward(const Tensor& a, const Tensor& b, const Tensor& pre);
// The parameter gradients of linear(x, weight, bias) for grad_y [..., out],
// x [..., in]: weight = grad_y^T x over all rows [out, in], bias = the sum of
// grad_y's rows [out] (undefined unless with_bias). (BGRADB.)
struct LinearWeightGrads {
  Tensor weight, bias;
};
LinearWeightGrads linear_weight_backward(const Tensor& grad_y, const Tensor& x, bool with_bias);

// ---- neural-network functions ---------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim);      // y = softmax(x)
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim);  // y = log_softmax(x)

// Normalises over the last dim. Returns y and the per-row statistics that the
// backward needs (mean and rstd for layer_norm; rstd for rms_norm), shaped
// like x without its last dim. weight/bias may be undefined.
struct NormOutput {
  Tensor y;
  Tensor mean;  // undefined for rms_norm
  Tensor rstd;
};
NormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
NormOutput rms_norm(const Tensor& x, const Tensor& weight, double eps);
struct NormGrads {
  Tensor x, weight, bias;  // weight/bias undefined when the forward had none
};
NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool has_bias);
NormGrads rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd);

// A pre-norm block's residual add and the LayerNorm that reads its result
// (h = x + attn(...); ln2(h)) in one pass: sum = x + delta, bit for bit what
// add(x, delta) gives, and norm = layer_norm(sum, weight, bias, eps), bit for
// bit, without a second read of the sum. x and delta: one shape (no
// broadcasting), dtype and device. Devices whose kernels widen x's dtype
// (cpu bf16/f16, cuda f16) run add then layer_norm: the same bits.
struct AddNormOutput {
  Tensor sum;
  NormOutput norm;
};
AddNormOutput add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias,
                             double eps);
// Its backward: layer_norm_backward(grad_y, sum, ...) with grad_sum, the
// gradient reaching the sum past the norm (or undefined), added to the
// gradient of the sum: x's, bit for bit add(grad_sum, layer_norm_backward(...).x),
// in the norm backward's pass (delta's gradient is the same tensor).
NormGrads add_layer_norm_backward(const Tensor& grad_sum, const Tensor& grad_y, const Tensor& sum,
                                  const Tensor& weight, const Tensor& mean, const Tensor& rstd, bool has_bias);

// weight: [num, dim], indices: any shape of i32/i64 in [0, num) -> [..., dim].
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_embeddings);

// Mean cross-entropy over rows whose target != ignore_index.
// logits: [N, C] float, targets: [N] i32/i64 in [0, classes) or ignore_index.
// Returns the 0-d loss; the backward is (softmax - onehot) / count on kept rows.
// `classes` (1 <= classes <= C) makes only the first columns classes: the
// rest are padding (a vocabulary padded for aligned GEMMs, as llm.c's Vp),
// outside the softmax and with a zero gradient; kAllColumns: all C.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     int64_t classes = kAllColumns);
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index = -100, int64_t classes = kAllColumns);
// The loss and each row's log-sum-exp [N] (f32, or f64 for f64 logits); the
// backward given it reads the logits once (the one above computes it again).
struct CrossEntropyOutput {
  Tensor loss;
  Tensor logsumexp;
};
CrossEntropyOutput cross_entropy_with_logsumexp(const Tensor& logits, const Tensor& targets,
                                                int64_t ignore_index = -100, int64_t classes = kAllColumns);
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index, const Tensor& logsumexp, int64_t classes = kAllColumns);

// Causal scaled-dot-product attention. q, k, v: [B, H, T, D] -> [B, H, T, D],
// scale 1/sqrt(D). Also returns the per-row log-sum-exp [B, H, T] of the
// scaled, masked scores, which the backward uses to rebuild the probabilities
// without storing the [T, T] matrix.
struct AttentionOutput {
  Tensor out;
  Tensor logsumexp;
};
AttentionOutput causal_attention(const Tensor& q, const Tensor& k, const Tensor& v);
struct AttentionGrads {
  Tensor q, k, v;
};
AttentionGrads causal_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& logsumexp);

// Inverted dropout: keeps each element with probability 1-p (decided by the
// Philox sequence `key` at that element's index) and scales it by 1/(1-p).
// Returns y and the scale mask (0 or 1/(1-p), dtype of x) for the backward.
// `numbering` says which indices of the sequence x's elements take (a slice
// of a larger tensor draws the whole's mask there).
std::pair<Tensor, Tensor> dropout(const Tensor& x, double p, PhiloxKey key, PhiloxNumbering numbering = {});

// ---- quantised weights --------------------------------------------------
// NF4 (tensor/nf4_format.h): a floating [rows, in] matrix packed row by row
// into u8 [rows, nf4_row_bytes(in)] (quantised on the host, returned on the
// weight's device; a non-finite element is an error naming it), and back
// into `dtype` (f32, f64, bf16 or f16) by the device's kernel. Neither op
// records a gradient: a quantised weight is frozen.
int64_t nf4_row_bytes(int64_t in_features);
Tensor nf4_quantize(const Tensor& weight);
Tensor nf4_dequantize(const Tensor& packed, int64_t in_features, DType dtype);
// The same into `out` (contiguous [rows, in] of one of those dtypes, on the
// packed rows' device), allocating nothing.
void nf4_dequantize_into(Tensor& out, const Tensor& packed);

// ---- float8 scaling (tensorwise, as torchao's float8 training) ---------------
// Scales are 0-d f32 tensors on the data's device. A scale maps a largest
// magnitude onto the format's largest finite value (448 for f8e4m3, 57344 for
// f8e5m2): max_finite / max(amax, 1e-12).
double float8_max_finite(DType format);
Tensor float8_amax(const Tensor& x);  // max |x| as a 0-d f32; 0 for no elements
Tensor float8_scale_from_amax(const Tensor& amax, DType format);
Tensor float8_scale(const Tensor& x, DType format);  // float8_scale_from_amax(float8_amax(x), format)
// (x * scale) in f32, cast to `format` (rounding to nearest even, saturating).
Tensor to_float8(const Tensor& x, const Tensor& scale, DType format);
// linear(a, b) = a [..., K] b^T ([N, K]) of float8 operands, the exact
// products summed in f32, times a_scale * b_scale (0-d f32s: the inverses of
// the scales the operands were cast at) taken as one f32 factor, rounded
// once to `dtype`. On cuda this is one cuBLASLt FP8 GEMM where the device
// has one and the shapes fit (KernelTable::float8_matmul).
Tensor float8_linear_product(const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
                             DType dtype);

// ---- printing ---------------------------------------------------------------
// "tensor([[1.0000, 2.0000], ...], shape=[2, 2], dtype=f32, device=cpu)";
// large tensors are summarised with "..." like NumPy.
std::string to_string(const Tensor& tensor);

}  // namespace tessera::ops

namespace tessera {
std::ostream& operator<<(std::ostream& stream, const Tensor& tensor);
}
