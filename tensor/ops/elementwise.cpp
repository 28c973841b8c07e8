// Elementwise ops: NumPy broadcasting and type promotion, scalar forms,
// in-place add_/mul_, unary maths and their fused derivatives, comparisons,
// where, masked_fill and dropout. Each op checks its inputs and infers the
// output, then hands the kernel operands expanded to the output's shape and
// in the kernels' dtype (kernel_dtype: 16-bit floats compute in f32 and
// convert back once, on the host side of a kernel that takes bf16 itself).
#include <cmath>

#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

void check_defined(const Tensor& tensor, const char* op, const char* what) {
  TESSERA_CHECK(tensor.defined(), "{}: {} is an undefined tensor", op, what);
}

Device common_device(const char* op, const Tensor& a, const Tensor& b) {
  TESSERA_CHECK(a.device() == b.device(), "{}: operands are on different devices: {} and {}", op, a.device().str(),
                b.device().str());
  return a.device();
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::eq || op == BinaryOp::ne || op == BinaryOp::lt || op == BinaryOp::le ||
         op == BinaryOp::gt || op == BinaryOp::ge;
}

// The dtype an arithmetic op produces from operands promoting to `promoted`.
DType arithmetic_dtype(BinaryOp op, DType promoted, const char* name) {
  if (op == BinaryOp::div && !is_floating(promoted)) return DType::f32;  // true division, as in torch
  TESSERA_CHECK(promoted != DType::boolean || (op != BinaryOp::sub && op != BinaryOp::pow),
                "{}: not defined for bool tensors (convert them to an integer or floating dtype first)", name);
  return promoted;
}

// The dtype of a scalar operand next to a tensor of dtype `tensor`: floats
// keep the tensor's dtype; an integral value keeps an integer dtype (bool
// tensors go to i64); a fractional value gives f32.
DType scalar_dtype(DType tensor, double value, const char* name) {
  if (is_floating(tensor)) return tensor;
  if (!std::isfinite(value) || std::trunc(value) != value) return DType::f32;
  const DType dtype = tensor == DType::boolean ? DType::i64 : tensor;
  const double limit = dtype == DType::i32 ? 2147483648.0 : 9223372036854775808.0;
  TESSERA_CHECK(value >= -limit && value < limit, "{}: scalar {} does not fit in {}", name, value,
                dtype_name(dtype));
  return dtype;
}

// The dtype a scalar joins an op of `result` in: the compute dtype, so a
// bf16 tensor + 0.1 adds 0.1f, not 0.1 rounded to bf16; bf16 when the
// kernels take bf16 and the scalar as f32 is a bf16 value too (0.5, -1).
DType scalar_operand_dtype(Device device, DType result, double value) {
  const auto as_f32 = static_cast<float>(value);
  const bool exact_in_bf16 = static_cast<float>(BFloat16(as_f32)) == as_f32;
  return kernel_dtype(device, result) == DType::bf16 && exact_in_bf16 ? DType::bf16 : compute_dtype(result);
}

// The dtype a binary op of `result` computes in on `device`: the kernels'
// dtype when both operands already have it (a bf16 kernel), else the compute
// dtype, so an f32 operand is never rounded to bf16 before the op.
DType binary_compute_dtype(Device device, DType result, const Tensor& a, const Tensor& b) {
  const DType kernel = kernel_dtype(device, result);
  if (kernel == compute_dtype(result) || (a.dtype() == kernel && b.dtype() == kernel)) return kernel;
  return compute_dtype(result);
}

// out = a op b with both operands already on one device and `result` the
// arithmetic dtype (comparisons write bool).
Tensor binary_op(BinaryOp op, const char* name, const Tensor& a, const Tensor& b, DType result) {
  const Device device = common_device(name, a, b);
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  const DType compute = binary_compute_dtype(device, result, a, b);
  const DType out_dtype = is_comparison(op) ? DType::boolean : result;
  Tensor out = empty(shape, {.dtype = out_dtype, .device = device});
  if (out.is_meta() || out.numel() == 0) return out;
  const Tensor a_compute = expand(to(a, compute), shape);
  const Tensor b_compute = expand(to(b, compute), shape);
  if (out_dtype == compute || is_comparison(op)) {
    kernels(device).binary(op, out, a_compute, b_compute);
    return out;
  }
  const Tensor computed = empty(shape, {.dtype = compute, .device = device});
  kernels(device).binary(op, computed, a_compute, b_compute);
  kernels(device).copy(out, computed);
  return out;
}

Tensor binary_tensors(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  check_raw_op_inputs(name, {{"a", a}, {"b", b}});
  check_defined(a, name, "a");
  check_defined(b, name, "b");
  const DType promoted = promote_types(a.dtype(), b.dtype());
  return binary_op(op, name, a, b, is_comparison(op) ? promoted : arithmetic_dtype(op, promoted, name));
}

Tensor binary_scalar(BinaryOp op, const char* name, const Tensor& a, double b) {
  check_raw_op_inputs(name, {{"a", a}});
  check_defined(a, name, "a");
  const DType promoted = scalar_dtype(a.dtype(), b, name);
  const DType result = is_comparison(op) ? promoted : arithmetic_dtype(op, promoted, name);
  const Tensor scalar = full({}, b, {.dtype = scalar_operand_dtype(a.device(), result, b), .device = a.device()});
  return binary_op(op, name, a, scalar, result);
}

// A comparison gives a bool tensor, which carries no gradient: it may read
// inputs that require grad, as torch's `x > 0` does.
Tensor compare(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  const GradInputsAllowed result_has_no_gradient;
  return binary_tensors(op, name, a, b);
}

Tensor compare(BinaryOp op, const char* name, const Tensor& a, double b) {
  const GradInputsAllowed result_has_no_gradient;
  return binary_scalar(op, name, a, b);
}

// Checks an in-place update `out op= b` and returns b ready for the kernel:
// expanded to out's shape, in the dtype the op computes in, detached from
// out's memory when the two overlap differently.
Tensor in_place_operand(const char* name, const Tensor& out, const Tensor& b, DType result) {
  check_defined(out, name, "out");
  common_device(name, out, b);
  const Shape shape = broadcast_shapes(out.sizes(), b.sizes(), name);
  TESSERA_CHECK(shape == out.sizes(), "{}: b of shape {} would broadcast out of shape {} to {}", name, b.sizes(),
                out.sizes(), shape);
  for (int64_t d = 0; d < out.dim(); ++d) {
    TESSERA_CHECK(out.size(d) <= 1 || out.stride(d) != 0,
                  "{}: out of shape {} and strides {} has elements that share memory (an expanded view)", name,
                  out.sizes(), out.strides());
  }
  TESSERA_CHECK(is_floating(out.dtype()) || !is_floating(result),
                "{}: a {} result cannot be written into {} out in place", name, dtype_name(result),
                dtype_name(out.dtype()));
  TESSERA_CHECK(out.dtype() != DType::boolean || result == DType::boolean,
                "{}: a {} result cannot be written into bool out in place", name, dtype_name(result));
  Tensor operand = to(b, binary_compute_dtype(out.device(), result, out, b));
  const bool same_view = operand.is_same(out) || (operand.storage_offset() == out.storage_offset() &&
                                                   operand.strides() == out.strides() && operand.dtype() == out.dtype());
  if (operand.shares_storage_with(out) && !same_view) operand = clone(operand);
  return expand(operand, shape);
}

void in_place_binary(BinaryOp op, Tensor& out, const Tensor& b_compute) {
  if (out.is_meta() || out.numel() == 0) return;
  const KernelTable& table = kernels(out.device());
  if (out.dtype() == b_compute.dtype()) {
    table.binary(op, out, out, b_compute);
    return;
  }
  const Tensor computed = to(out, b_compute.dtype());  // a new tensor: the dtypes differ
  table.binary(op, computed, computed, b_compute);
  table.copy(out, computed);
}

// out = f(x) computed in `result`'s compute dtype.
Tensor unary_op(UnaryOp op, const Tensor& x, DType result) {
  Tensor out = empty(x.sizes(), {.dtype = result, .device = x.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  const DType compute = kernel_dtype(x.device(), result);
  const Tensor x_compute = to(x, compute);
  if (compute == result) {
    kernels(x.device()).unary(op, out, x_compute);
    return out;
  }
  const Tensor computed = empty(x.sizes(), {.dtype = compute, .device = x.device()});
  kernels(x.device()).unary(op, computed, x_compute);
  kernels(x.device()).copy(out, computed);
  return out;
}

// Floating maths; integer inputs compute in f32; neg, abs and relu keep integers.
Tensor unary_math(UnaryOp op, const char* name, const Tensor& x) {
  check_raw_op_inputs(name, {{"x", x}});
  check_defined(x, name, "x");
  TESSERA_CHECK(x.dtype() != DType::boolean, "{}: not defined for bool tensors", name);
  const bool keeps_integers = op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::relu;
  return unary_op(op, x, is_floating(x.dtype()) || keeps_integers ? x.dtype() : DType::f32);
}

// grad_out * f'(saved), where saved is y for tanh/sigmoid and x otherwise.
Tensor unary_backward(UnaryOp op, const char* name, const Tensor& grad_out, const char* saved_name,
                      const Tensor& saved) {
  check_raw_op_inputs(name, {{"grad_out", grad_out}, {saved_name, saved}});
  check_defined(grad_out, name, "grad_out");
  check_defined(saved, name, "the saved tensor");
  const Device device = common_device(name, grad_out, saved);
  TESSERA_CHECK(grad_out.sizes() == saved.sizes(), "{}: grad_out of shape {} differs from the saved shape {}", name,
                grad_out.sizes(), saved.sizes());
  TESSERA_CHECK(is_floating(grad_out.dtype()) && is_floating(saved.dtype()),
                "{}: needs floating tensors, got {} and {}", name, dtype_name(grad_out.dtype()),
                dtype_name(saved.dtype()));
  const DType result = promote_types(grad_out.dtype(), saved.dtype());
  Tensor grad_in = empty(grad_out.sizes(), {.dtype = result, .device = device});
  if (grad_in.is_meta() || grad_in.numel() == 0) return grad_in;
  const DType compute = kernel_dtype(device, result);
  const Tensor computed = compute == result ? grad_in : empty(grad_out.sizes(), {.dtype = compute, .device = device});
  kernels(device).unary_backward(op, computed, to(grad_out, compute), to(saved, compute));
  if (!computed.is_same(grad_in)) kernels(device).copy(grad_in, computed);
  return grad_in;
}

UnaryOp gelu_op(GeluApproximation approximation) {
  return approximation == GeluApproximation::tanh ? UnaryOp::gelu_tanh : UnaryOp::gelu_erf;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_tensors(BinaryOp::add, "add", a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_tensors(BinaryOp::sub, "sub", a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_tensors(BinaryOp::mul, "mul", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_tensors(BinaryOp::div, "div", a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary_tensors(BinaryOp::pow, "pow", a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_tensors(BinaryOp::maximum, "maximum", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_tensors(BinaryOp::minimum, "minimum", a, b); }

Tensor add(const Tensor& a, double b) { return binary_scalar(BinaryOp::add, "add", a, b); }
Tensor sub(const Tensor& a, double b) { return binary_scalar(BinaryOp::sub, "sub", a, b); }
Tensor mul(const Tensor& a, double b) { return binary_scalar(BinaryOp::mul, "mul", a, b); }
Tensor div(const Tensor& a, double b) { return binary_scalar(BinaryOp::div, "div", a, b); }

Tensor pow(const Tensor& a, double exponent) {
  check_raw_op_inputs("pow", {{"a", a}});
  check_defined(a, "pow", "a");
  TESSERA_CHECK(is_floating(a.dtype()) || std::trunc(exponent) != exponent || exponent >= 0,
                "pow: integer tensors to negative integer powers are not allowed (got exponent {})", exponent);
  if (exponent == 2.0 && a.dtype() != DType::boolean) return mul(a, a);  // exact, and no libm call per element
  return binary_scalar(BinaryOp::pow, "pow", a, exponent);
}

// In place: only the source b is checked; out is written (see ops.h).
void add_(Tensor& out, const Tensor& b, double alpha) {
  check_raw_op_inputs("add_", {{"b", b}});
  const GradInputsAllowed out_is_only_written;
  check_defined(b, "add_", "b");
  check_defined(out, "add_", "out");
  DType result = promote_types(out.dtype(), b.dtype());
  if (alpha != 1.0) result = promote_types(result, scalar_dtype(result, alpha, "add_"));
  result = arithmetic_dtype(BinaryOp::add, result, "add_");
  Tensor operand = in_place_operand("add_", out, b, result);
  if (out.is_meta()) return;
  // b * alpha rounds once, in the compute dtype (never first to bf16).
  if (alpha != 1.0) operand = mul(to(operand, compute_dtype(result)), alpha);
  in_place_binary(BinaryOp::add, out, operand);
}

void mul_(Tensor& out, const Tensor& b) {
  check_raw_op_inputs("mul_", {{"b", b}});
  const GradInputsAllowed out_is_only_written;
  check_defined(b, "mul_", "b");
  check_defined(out, "mul_", "out");
  const DType result = arithmetic_dtype(BinaryOp::mul, promote_types(out.dtype(), b.dtype()), "mul_");
  in_place_binary(BinaryOp::mul, out, in_place_operand("mul_", out, b, result));
}

void mul_(Tensor& out, double b) {
  const GradInputsAllowed out_is_only_written;
  check_defined(out, "mul_", "out");
  const DType result = scalar_dtype(out.dtype(), b, "mul_");
  const Tensor scalar = full({}, b, {.dtype = scalar_operand_dtype(out.device(), result, b), .device = out.device()});
  in_place_binary(BinaryOp::mul, out, in_place_operand("mul_", out, scalar, result));
}

Tensor neg(const Tensor& x) { return unary_math(UnaryOp::neg, "neg", x); }
Tensor exp(const Tensor& x) { return unary_math(UnaryOp::exp, "exp", x); }
Tensor log(const Tensor& x) { return unary_math(UnaryOp::log, "log", x); }
Tensor sqrt(const Tensor& x) { return unary_math(UnaryOp::sqrt, "sqrt", x); }
Tensor rsqrt(const Tensor& x) { return unary_math(UnaryOp::rsqrt, "rsqrt", x); }
Tensor abs(const Tensor& x) { return unary_math(UnaryOp::abs, "abs", x); }
Tensor tanh(const Tensor& x) { return unary_math(UnaryOp::tanh, "tanh", x); }
Tensor sigmoid(const Tensor& x) { return unary_math(UnaryOp::sigmoid, "sigmoid", x); }
Tensor relu(const Tensor& x) { return unary_math(UnaryOp::relu, "relu", x); }
Tensor gelu(const Tensor& x, GeluApproximation approximation) { return unary_math(gelu_op(approximation), "gelu", x); }
Tensor silu(const Tensor& x) { return unary_math(UnaryOp::silu, "silu", x); }

Tensor tanh_backward(const Tensor& grad_out, const Tensor& y) {
  return unary_backward(UnaryOp::tanh, "tanh_backward", grad_out, "y", y);
}
Tensor relu_backward(const Tensor& grad_out, const Tensor& x) {
  return unary_backward(UnaryOp::relu, "relu_backward", grad_out, "x", x);
}
Tensor gelu_backward(const Tensor& grad_out, const Tensor& x, GeluApproximation approximation) {
  return unary_backward(gelu_op(approximation), "gelu_backward", grad_out, "x", x);
}
Tensor silu_backward(const Tensor& grad_out, const Tensor& x) {
  return unary_backward(UnaryOp::silu, "silu_backward", grad_out, "x", x);
}
Tensor sigmoid_backward(const Tensor& grad_out, const Tensor& y) {
  return unary_backward(UnaryOp::sigmoid, "sigmoid_backward", grad_out, "y", y);
}

Tensor eq(const Tensor& a, const Tensor& b) { return compare(BinaryOp::eq, "eq", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare(BinaryOp::ne, "ne", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare(BinaryOp::lt, "lt", a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare(BinaryOp::le, "le", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare(BinaryOp::gt, "gt", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare(BinaryOp::ge, "ge", a, b); }
Tensor eq(const Tensor& a, double b) { return compare(BinaryOp::eq, "eq", a, b); }
Tensor ne(const Tensor& a, double b) { return compare(BinaryOp::ne, "ne", a, b); }
Tensor lt(const Tensor& a, double b) { return compare(BinaryOp::lt, "lt", a, b); }
Tensor le(const Tensor& a, double b) { return compare(BinaryOp::le, "le", a, b); }
Tensor gt(const Tensor& a, double b) { return compare(BinaryOp::gt, "gt", a, b); }
Tensor ge(const Tensor& a, double b) { return compare(BinaryOp::ge, "ge", a, b); }

Tensor logical_not(const Tensor& x) {
  const GradInputsAllowed result_has_no_gradient;
  check_defined(x, "logical_not", "x");
  // A non-bool input counts as true where it is nonzero.
  const Tensor truth = x.dtype() == DType::boolean ? x : ne(x, 0.0);
  return unary_op(UnaryOp::logical_not, truth, DType::boolean);
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  check_raw_op_inputs("where", {{"a", a}, {"b", b}});
  check_defined(condition, "where", "condition");
  check_defined(a, "where", "a");
  check_defined(b, "where", "b");
  TESSERA_CHECK(condition.dtype() == DType::boolean, "where: condition must be bool, got {}",
                dtype_name(condition.dtype()));
  common_device("where", condition, a);
  const Device device = common_device("where", a, b);
  const Shape shape = broadcast_shapes(broadcast_shapes(condition.sizes(), a.sizes(), "where"), b.sizes(), "where");
  const DType result = promote_types(a.dtype(), b.dtype());
  Tensor out = empty(shape, {.dtype = result, .device = device});
  if (out.is_meta() || out.numel() == 0) return out;
  kernels(device).where(out, expand(condition, shape), expand(to(a, result), shape), expand(to(b, result), shape));
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_raw_op_inputs("masked_fill", {{"x", x}});
  check_defined(x, "masked_fill", "x");
  check_defined(mask, "masked_fill", "mask");
  TESSERA_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be bool, got {}", dtype_name(mask.dtype()));
  const Device device = common_device("masked_fill", x, mask);
  TESSERA_CHECK(broadcast_shapes(x.sizes(), mask.sizes(), "masked_fill") == x.sizes(),
                "masked_fill: mask of shape {} does not broadcast to x of shape {}", mask.sizes(), x.sizes());
  Tensor out = empty(x.sizes(), {.dtype = x.dtype(), .device = device});
  if (out.is_meta() || out.numel() == 0) return out;
  const Tensor fill = full({}, value, {.dtype = x.dtype(), .device = device});
  kernels(device).where(out, expand(mask, x.sizes()), expand(fill, x.sizes()), x);
  return out;
}

std::pair<Tensor, Tensor> dropout(const Tensor& x, double p, PhiloxKey key, PhiloxNumbering numbering) {
  check_raw_op_inputs("dropout", {{"x", x}});
  check_defined(x, "dropout", "x");
  TESSERA_CHECK(is_floating(x.dtype()), "dropout: needs a floating tensor, got {}", dtype_name(x.dtype()));
  TESSERA_CHECK(p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got {}", p);
  if (x.is_meta()) return {empty_like(x), empty_like(x)};
  if (p == 0.0) return {clone(x), ones_like(x)};
  const DType compute = compute_dtype(x.dtype());
  const Tensor y = empty(x.sizes(), {.dtype = compute, .device = x.device()});
  const Tensor mask = empty(x.sizes(), {.dtype = compute, .device = x.device()});
  if (x.numel() > 0) kernels(x.device()).dropout(y, mask, to(x, compute), p, key, numbering);
  return {to(y, x.dtype()), to(mask, x.dtype())};
}

}  // namespace tessera::ops
