// matmul (torch.matmul semantics) and linear. Both hand strided views to the
// GEMM kernel as they are: linear passes weight^T as a transposed view, so
// the weight is never copied.
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
  TESSERA_CHECK(x.dim() >= 1, "linear: input needs at least 1 dim, got {}", x.sizes());
  TESSERA_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got {}", weight.sizes());
  check_operands("linear", x, weight);
  const int64_t in = weight.size(1), out_features = weight.size(0);
  TESSERA_CHECK(x.size(-1) == in, "linear: input {} has {} features, weight {} expects {}", x.sizes(), x.size(-1),
                weight.sizes(), in);
  if (bias.defined()) {
    TESSERA_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "linear: bias must be [{}], got {}", out_features,
                  bias.sizes());
    TESSERA_CHECK(bias.device() == x.device(), "linear: bias on {}, input on {}", bias.device().str(),
                  x.device().str());
    TESSERA_CHECK(bias.dtype() == x.dtype(), "linear: bias dtype {} differs from input dtype {}",
                  dtype_name(bias.dtype()), dtype_name(x.dtype()));
  }

  // x: [..., R, in] @ weight^T [in, out] -> [..., R, out]. The kernel folds
  // x's leading dims into one GEMM when they are contiguous.
  Shape out_shape = x.sizes();
  out_shape.back() = out_features;
  Tensor out = empty(out_shape, {.dtype = x.dtype(), .device = x.device()});
  if (out.is_meta()) return out;
  const Tensor rows = x.dim() == 1 ? unsqueeze(x, 0) : x;
  Shape full = rows.sizes();
  full.back() = out_features;
  matmul_into(view(out, full), rows, transpose(weight, 0, 1), bias);
  return out;
}

}  // namespace tessera::ops
