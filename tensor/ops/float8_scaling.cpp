// Tensorwise float8 scaling (torchao's float8 training recipe): a scale that
// maps a tensor's largest magnitude onto the format's largest finite value,
// the scaled cast, and the product of two scaled float8 operands in f32.
// Scales are 0-d f32 tensors on the data's device: nothing waits for the host.
#include "tensor/float8_bits.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

// Below this amax a tensor is treated as zero: its scale stays finite.
constexpr double kSmallestAmax = 1e-12;

bool is_float8(DType dtype) { return dtype == DType::f8e4m3 || dtype == DType::f8e5m2; }

float8_bits::Format format_of(DType format, const char* op) {
  TESSERA_CHECK(format == DType::f8e4m3 || format == DType::f8e5m2, "{}: the format must be f8e4m3 or f8e5m2, got {}",
                op, dtype_name(format));
  return format == DType::f8e4m3 ? float8_bits::e4m3() : float8_bits::e5m2();
}

void check_scale(const Tensor& scale, const Tensor& like, const char* op) {
  TESSERA_CHECK(scale.defined() && scale.dim() == 0 && scale.dtype() == DType::f32 && scale.device() == like.device(),
                "{}: the scale must be a 0-d f32 tensor on {}, got {}", op, like.device().str(),
                scale.defined() ? fmt::format("{} {} on {}", dtype_name(scale.dtype()), scale.sizes(),
                                              scale.device().str())
                                : std::string("none"));
}

}  // namespace

double float8_max_finite(DType format) {
  const float8_bits::Format bits = format_of(format, "float8_max_finite");
  return static_cast<double>(float8_bits::float_from_code(static_cast<uint8_t>(bits.max_finite_code), bits));
}

Tensor float8_amax(const Tensor& x) {
  check_raw_op_inputs("float8_amax", {{"x", x}});
  TESSERA_CHECK(is_floating(x.dtype()) && !is_float8(x.dtype()),
                "float8_amax: measures a wider floating tensor, got {}", dtype_name(x.dtype()));
  // No elements (an FSDP rank past the last row) have no magnitude: 0.
  if (x.numel() == 0) return zeros({}, {.dtype = DType::f32, .device = x.device()});
  return to(amax(abs(x)), DType::f32);
}

Tensor float8_scale_from_amax(const Tensor& amax_value, DType format) {
  check_raw_op_inputs("float8_scale_from_amax", {{"amax", amax_value}});
  check_scale(amax_value, amax_value, "float8_scale_from_amax");
  const Tensor floor = full({}, kSmallestAmax, {.dtype = DType::f32, .device = amax_value.device()});
  return div(full({}, float8_max_finite(format), {.dtype = DType::f32, .device = amax_value.device()}),
             maximum(amax_value, floor));
}

Tensor float8_scale(const Tensor& x, DType format) { return float8_scale_from_amax(float8_amax(x), format); }

Tensor to_float8(const Tensor& x, const Tensor& scale, DType format) {
  check_raw_op_inputs("to_float8", {{"x", x}, {"scale", scale}});
  format_of(format, "to_float8");
  check_scale(scale, x, "to_float8");
  return to(mul(to(x, DType::f32), scale), format);
}

Tensor float8_linear_product(const Tensor& a, const Tensor& b, const Tensor& a_scale, const Tensor& b_scale,
                             DType dtype) {
  check_raw_op_inputs("float8_linear_product", {{"a", a}, {"b", b}, {"a_scale", a_scale}, {"b_scale", b_scale}});
  TESSERA_CHECK(is_float8(a.dtype()) && is_float8(b.dtype()),
                "float8_linear_product: multiplies float8 operands, got {} and {}", dtype_name(a.dtype()),
                dtype_name(b.dtype()));
  TESSERA_CHECK(a.dim() >= 1 && b.dim() == 2 && a.size(-1) == b.size(1),
                "float8_linear_product: expected a [..., K] and b [N, K], got {} and {}", a.sizes(), b.sizes());
  check_scale(a_scale, a, "float8_linear_product");
  check_scale(b_scale, a, "float8_linear_product");
  Shape out_shape = a.sizes();
  out_shape.back() = b.size(0);
  // The device's FP8 GEMM where it has one for these operands (cuBLASLt on sm_89+ and its simulator twin) ...
  const KernelTable* table = a.is_meta() ? nullptr : &kernels(a.device());
  const bool both_e5m2 = a.dtype() == DType::f8e5m2 && b.dtype() == DType::f8e5m2;  // no FP8 GEMM takes these
  if (table != nullptr && table->float8_matmul != nullptr && !both_e5m2) {
    const Tensor rows = contiguous(reshape(a, {-1, a.size(-1)}));
    const Tensor out = empty({rows.size(0), b.size(0)}, {.dtype = dtype, .device = a.device()});
    if (table->float8_matmul(out, rows, contiguous(b), a_scale, b_scale)) return reshape(out, out_shape);
  }
  // ... else the same contract from ops: the exact float8 products summed in
  // f32, times a_scale * b_scale as one f32 factor, rounded once to dtype.
  return to(mul(linear(to(a, DType::f32), to(b, DType::f32), Tensor()), mul(a_scale, b_scale)), dtype);
}

}  // namespace tessera::ops
