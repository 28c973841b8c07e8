// Reduction ops: sum, mean, amax and amin over any set of dims, max/argmax
// along one dim, and sum_to_shape, the inverse of broadcasting that the
// backward of every broadcasting op uses. Integer and bool sums give i64;
// f32 sums accumulate in f64 inside the kernel.
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

struct ReductionPlan {
  std::vector<bool> reduced;  // per dim of x
  Shape keep_shape;           // x's shape with 1 on every reduced dim (what the kernel writes)
  Shape out_shape;            // keep_shape, or without the reduced dims
  int64_t count = 1;          // elements reduced into each output
};

// dims empty = every dim. A 0-d tensor accepts dim 0 / -1 and reduces to itself.
ReductionPlan plan_reduction(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  check_raw_op_inputs(op, {{"x", x}});
  TESSERA_CHECK(x.defined(), "{}: x is an undefined tensor", op);
  const int64_t ndim = x.dim();
  ReductionPlan plan;
  plan.reduced.assign(static_cast<size_t>(ndim), dims.empty());
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(ndim, 1)), false);
  for (int64_t dim : dims) {
    const int64_t d = wrap_dim(dim, ndim, op);
    TESSERA_CHECK(!seen[d], "{}: dim {} appears more than once in dims {} of a {}-d tensor", op, dim, dims, ndim);
    seen[d] = true;
    if (ndim > 0) plan.reduced[d] = true;
  }
  for (int64_t d = 0; d < ndim; ++d) {
    const int64_t size = x.size(d);
    plan.keep_shape.push_back(plan.reduced[d] ? 1 : size);
    if (plan.reduced[d]) plan.count *= size;
    if (!plan.reduced[d] || keepdim) plan.out_shape.push_back(plan.reduced[d] ? 1 : size);
  }
  return plan;
}

// Runs the reduce kernel on x (in the kernels' dtype) into an `out_dtype`
// tensor, then converts to `result` and drops reduced dims unless kept.
Tensor run_reduction(ReduceOp op, const Tensor& x, const ReductionPlan& plan, DType out_dtype, DType result) {
  if (x.is_meta()) return empty(plan.out_shape, {.dtype = result, .device = x.device()});
  const Tensor out = empty(plan.keep_shape, {.dtype = out_dtype, .device = x.device()});
  kernels(x.device()).reduce(op, out, to(x, kernel_dtype(x.device(), x.dtype())), plan.reduced);
  return reshape(to(out, result), plan.out_shape);
}

Tensor extremum(ReduceOp op, const char* name, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const ReductionPlan plan = plan_reduction(x, dims, keepdim, name);
  TESSERA_CHECK(plan.count > 0, "{}: cannot reduce over an empty dim (x of shape {}, dims {})", name, x.sizes(),
                dims);
  return run_reduction(op, x, plan, compute_dtype(x.dtype()), x.dtype());
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const ReductionPlan plan = plan_reduction(x, dims, keepdim, "sum");
  const DType result = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  return run_reduction(ReduceOp::sum, x, plan, compute_dtype(result), result);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const ReductionPlan plan = plan_reduction(x, dims, keepdim, "mean");
  // Integer and bool inputs average to f32 (the fraction of true values for bool).
  const DType result = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  if (x.is_meta()) return empty(plan.out_shape, {.dtype = result, .device = x.device()});
  // The sum stays in f64 until divided: one rounding into f32, not two.
  const Tensor total = run_reduction(ReduceOp::sum, x, plan, DType::f64, DType::f64);
  return to(div(total, static_cast<double>(plan.count)), result);
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(ReduceOp::max, "amax", x, dims, keepdim);
}

Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(ReduceOp::min, "amin", x, dims, keepdim);
}

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  const ReductionPlan plan = plan_reduction(x, {dim}, keepdim, "max");
  TESSERA_CHECK(plan.count > 0, "max: cannot take the max over dim {} of size 0 (x of shape {})", dim, x.sizes());
  const int64_t d = wrap_dim(dim, x.dim(), "max");
  if (x.is_meta()) {
    return {empty(plan.out_shape, {.dtype = x.dtype(), .device = x.device()}),
            empty(plan.out_shape, {.dtype = DType::i64, .device = x.device()})};
  }
  const DType compute = compute_dtype(x.dtype());
  const Tensor values = empty(plan.keep_shape, {.dtype = compute, .device = x.device()});
  const Tensor indices = empty(plan.keep_shape, {.dtype = DType::i64, .device = x.device()});
  kernels(x.device()).max_along(values, indices, to(x, compute), d);
  return {reshape(to(values, x.dtype()), plan.out_shape), reshape(indices, plan.out_shape)};
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  const GradInputsAllowed indices_have_no_gradient;
  return max(x, dim, keepdim).second;
}

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  check_raw_op_inputs("sum_to_shape", {{"grad", grad}});
  TESSERA_CHECK(grad.defined(), "sum_to_shape: grad is an undefined tensor");
  if (grad.sizes() == shape) return grad;
  const int64_t leading = grad.dim() - static_cast<int64_t>(shape.size());
  bool broadcasts = leading >= 0;
  for (size_t i = 0; broadcasts && i < shape.size(); ++i) {
    broadcasts = shape[i] == 1 || shape[i] == grad.size(leading + static_cast<int64_t>(i));
  }
  TESSERA_CHECK(broadcasts, "sum_to_shape: shape {} does not broadcast to the grad's shape {}", shape, grad.sizes());
  // Leading dims that broadcasting added, and dims that it stretched from 1.
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < leading; ++d) dims.push_back(d);
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = leading + static_cast<int64_t>(i);
    if (shape[i] == 1 && grad.size(d) != 1) dims.push_back(d);
  }
  return reshape(sum(grad, dims, /*keepdim=*/true), shape);
}

}  // namespace tessera::ops
