// matmul (torch.matmul semantics) and linear, and the GELU MLP's fused GEMMs
// (linear_gelu, matmul_gelu_backward, linear_weight_backward). All hand
// strided views to the GEMM kernels as they are: linear passes weight^T as a
// transposed view, so the weight is never copied.
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  TESSERA_CHECK(a.device() == b.device(), "{}: operands on different devices: {} and {}", op, a.device().str(),
                b.device().str());
  TESSERA_CHECK(a.dtype() == b.dtype(), "{}: dtype mismatch: {} {} x {} {}", op, dtype_name(a.dtype()), a.sizes(),
                dtype_name(b.dtype()), b.sizes());
  TESSERA_CHECK(is_floating(a.dtype()), "{}: needs floating tensors, got {}", op, dtype_name(a.dtype()));
}

// out [batch..., M, N] = a [..., M, K] @ b [..., K, N] (+ bias [N]), with a's
// and b's batch dims broadcast to out's; the kernel adds the bias (on cuda,
// in the GEMM's epilogue). On cpu, bf16/f16 operands are widened to f32
// before broadcasting (so no expanded copy is made) and the result rounds
// once; cuda's GEMM takes them as they are and accumulates in f32 itself.
void matmul_into(const Tensor& out, Tensor a, Tensor b, Tensor bias) {
  const DType compute = out.device().is_cuda() ? out.dtype() : compute_dtype(out.dtype());
  const bool widen = compute != out.dtype();
  if (widen) {
    a = to(a, compute);
    b = to(b, compute);
    if (bias.defined()) bias = to(bias, compute);
  }
  const Shape batch(out.sizes().begin(), out.sizes().end() - 2);
  Shape a_full = batch, b_full = batch;
  a_full.insert(a_full.end(), {a.size(-2), a.size(-1)});
  b_full.insert(b_full.end(), {b.size(-2), b.size(-1)});
  Tensor result = widen ? empty(out.sizes(), {.dtype = compute, .device = out.device()}) : out;
  kernels(out.device()).matmul(result, expand(a, a_full), expand(b, b_full), bias.defined() ? contiguous(bias) : bias);
  if (widen) {
    Tensor target = out;
    copy_(target, result);
  }
}

// x: [..., in], weight: [out, in], bias: [out] or undefined, on one device, of one floating dtype.
void check_linear_operands(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TESSERA_CHECK(x.dim() >= 1, "{}: input needs at least 1 dim, got {}", op, x.sizes());
  TESSERA_CHECK(weight.dim() == 2, "{}: weight must be [out, in], got {}", op, weight.sizes());
  check_operands(op, x, weight);
  const int64_t in = weight.size(1), out_features = weight.size(0);
  TESSERA_CHECK(x.size(-1) == in, "{}: input {} has {} features, weight {} expects {}", op, x.sizes(), x.size(-1),
                weight.sizes(), in);
  if (!bias.defined()) return;
  TESSERA_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "{}: bias must be [{}], got {}", op, out_features,
                bias.sizes());
  TESSERA_CHECK(bias.device() == x.device(), "{}: bias on {}, input on {}", op, bias.device().str(), x.device().str());
  TESSERA_CHECK(bias.dtype() == x.dtype(), "{}: bias dtype {} differs from input dtype {}", op,
                dtype_name(bias.dtype()), dtype_name(x.dtype()));
}

// `shape` with its last dim replaced by `last`.
Shape with_last(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

// The rows of `t` as a matrix [rows, t.size(-1)]: the product of its leading dims.
int64_t leading_rows(const Tensor& t) { return shape_numel(Shape(t.sizes().begin(), t.sizes().end() - 1)); }

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_raw_op_inputs("matmul", {{"a", a}, {"b", b}});
  TESSERA_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got {} x {}", a.sizes(),
                b.sizes());
  check_operands("matmul", a, b);
  // 1-d operands become a row (left) or a column (right); the added dim is dropped from the result.
  const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;
  const Tensor b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  TESSERA_CHECK(k == b2.size(-2), "matmul: inner dims differ: {} x {}", a.sizes(), b.sizes());

  const Shape a_batch(a2.sizes().begin(), a2.sizes().end() - 2);
  const Shape b_batch(b2.sizes().begin(), b2.sizes().end() - 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  Shape full = batch, result_shape = batch;
  full.insert(full.end(), {m, n});
  if (a.dim() > 1) result_shape.push_back(m);
  if (b.dim() > 1) result_shape.push_back(n);

  Tensor out = empty(result_shape, {.dtype = a.dtype(), .device = a.device()});
  if (out.is_meta()) return out;
  matmul_into(view(out, full), a2, b2, Tensor());
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_raw_op_inputs("linear", {{"x", x}, {"weight", weight}, {"bias", bias}});
  check_linear_operands("linear", x, weight, bias);
  // x: [..., R, in] @ weight^T [in, out] -> [..., R, out]. The kernel folds
  // x's leading dims into one GEMM when they are contiguous.
  Tensor out = empty(with_last(x.sizes(), weight.size(0)), {.dtype = x.dtype(), .device = x.device()});
  if (out.is_meta()) return out;
  const Tensor rows = x.dim() == 1 ? unsqueeze(x, 0) : x;
  matmul_into(view(out, with_last(rows.sizes(), weight.size(0))), rows, transpose(weight, 0, 1), bias);
  return out;
}

// The fused kernels take 2-d operands: x's rows [R, in] (a view when they fold).
LinearGeluOutput linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_raw_op_inputs("linear_gelu", {{"x", x}, {"weight", weight}, {"bias", bias}});
  check_linear_operands("linear_gelu", x, weight, bias);
  const Shape shape = with_last(x.sizes(), weight.size(0));
  const TensorOptions options{.dtype = x.dtype(), .device = x.device()};
  if (x.is_meta()) return {empty(shape, options), empty(shape, options)};
  if (const auto fused = kernels(x.device()).matmul_gelu) {
    const Tensor y = empty(shape, options), pre = empty(shape, options);
    const int64_t rows = leading_rows(x);
    const Shape flat{rows, weight.size(0)};
    if (fused(view(y, flat), view(pre, flat), reshape(x, {rows, weight.size(1)}), transpose(weight, 0, 1),
              bias.defined() ? contiguous(bias) : bias)) {
      return {y, pre};
    }
  }
  Tensor pre = linear(x, weight, bias);
  return {gelu(pre, GeluApproximation::tanh), pre};
}

Tensor matmul_gelu_backward(const Tensor& a, const Tensor& b, const Tensor& pre) {
  check_raw_op_inputs("matmul_gelu_backward", {{"a", a}, {"b", b}, {"pre", pre}});
  TESSERA_CHECK(a.dim() >= 1 && b.dim() == 2, "matmul_gelu_backward: a must be [..., M, K] and b [K, N], got {} x {}",
                a.sizes(), b.sizes());
  check_operands("matmul_gelu_backward", a, b);
  TESSERA_CHECK(a.size(-1) == b.size(0), "matmul_gelu_backward: inner dims differ: {} x {}", a.sizes(), b.sizes());
  const Shape shape = with_last(a.sizes(), b.size(1));
  TESSERA_CHECK(pre.sizes() == shape && pre.dtype() == a.dtype() && pre.device() == a.device(),
                "matmul_gelu_backward: pre must be {} {} on {} (the product's), got {} {} on {}",
                dtype_name(a.dtype()), shape, a.device().str(), dtype_name(pre.dtype()), pre.sizes(),
                pre.device().str());
  if (a.is_meta()) return empty(shape, {.dtype = a.dtype(), .device = a.device()});
  if (const auto fused = kernels(a.device()).matmul_gelu_backward; fused && pre.is_contiguous()) {
    const Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
    const int64_t rows = leading_rows(a);
    const Shape flat{rows, b.size(1)};
    if (fused(view(out, flat), reshape(a, {rows, b.size(0)}), b, view(pre, flat))) return out;
  }
  return gelu_backward(matmul(a, b), pre, GeluApproximation::tanh);
}

// g's and x's rows: [R, out] and [R, in]; weight = g^T x, bias = sum over R of g.
LinearWeightGrads linear_weight_backward(const Tensor& grad_y, const Tensor& x, bool with_bias) {
  check_raw_op_inputs("linear_weight_backward", {{"grad_y", grad_y}, {"x", x}});
  TESSERA_CHECK(grad_y.dim() >= 1 && x.dim() >= 1 &&
                    Shape(grad_y.sizes().begin(), grad_y.sizes().end() - 1) ==
                        Shape(x.sizes().begin(), x.sizes().end() - 1),
                "linear_weight_backward: grad_y [..., out] and x [..., in] must share their leading dims, got {} "
                "and {}",
                grad_y.sizes(), x.sizes());
  check_operands("linear_weight_backward", grad_y, x);
  const int64_t out_features = grad_y.size(-1), in = x.size(-1);
  const TensorOptions options{.dtype = x.dtype(), .device = x.device()};
  if (x.is_meta()) return {empty({out_features, in}, options), with_bias ? empty({out_features}, options) : Tensor()};
  const Tensor g_rows = reshape(grad_y, {leading_rows(grad_y), out_features});
  const Tensor x_rows = reshape(x, {leading_rows(x), in});
  if (const auto fused = kernels(x.device()).matmul_row_sums; fused && with_bias) {
    LinearWeightGrads grads{empty({out_features, in}, options), empty({out_features}, options)};
    if (fused(grads.weight, grads.bias, transpose(g_rows, 0, 1), x_rows)) return grads;
  }
  return {matmul(transpose(g_rows, 0, 1), x_rows), with_bias ? sum(g_rows, {0}) : Tensor()};
}

}  // namespace tessera::ops
