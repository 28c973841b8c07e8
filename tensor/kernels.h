// The kernel table: what a device must implement for the ops in tensor/ops.h
// to run on it. Ops check inputs, infer shapes and allocate outputs, then call
// kernels(device).entry(...). A device is a table: adding CUDA means filling a
// second one (tensor/cuda/), never touching an op or a call site. Meta has no
// table: ops on meta return after shape inference.
//
// Every entry receives outputs already allocated with their final shape and
// dtype (contiguous unless stated); inputs are on the same device. Tensor
// parameters are handles, so `const Tensor& out` is written through.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tensor/copy_segment.h"
#include "tensor/op_kinds.h"
#include "tensor/philox.h"
#include "tensor/tensor.h"

namespace tessera {

// One tensor of an AdamW step: param (the f32/f64 master), grad, exp_avg and
// exp_avg_sq, contiguous, of one shape and dtype; working_copy, when defined,
// a contiguous bf16 tensor of that shape that receives the updated param.
// The scalars are the host's, in f64 (the step count lives on the host):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p * decay - step_size * m / (sqrt(v) * inv_sqrt_bias2 + eps)
// with decay = 1 - lr wd, step_size = lr / (1 - b1^t),
// inv_sqrt_bias2 = 1 / sqrt(1 - b2^t), each rounded to the param's dtype.
struct AdamWTensor {
  Tensor param, grad, exp_avg, exp_avg_sq, working_copy;
  double decay = 1.0, step_size = 0.0, inv_sqrt_bias2 = 1.0;
};
// Shared by every tensor of a step: b1, b2 and eps, with 1 - b1 and 1 - b2
// taken in f64 (in f32, 1 - float(0.999) is 1.3e-5 off).
struct AdamWMoments {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

struct KernelTable {
  // out[...] = value (converted to out's dtype).
  void (*fill)(const Tensor& out, double value);
  // dst = src elementwise; same shape (src may be a broadcast view with zero
  // strides), any strides and dtypes on both sides.
  void (*copy)(const Tensor& dst, const Tensor& src);
  // Every segment's dst <- src, or <- value where src is undefined (see
  // tensor/copy_segment.h), converting as copy and fill do: dst and src 1-D
  // and contiguous, of one length, f32, f64, bf16 or f16 in any pair; no
  // destination overlaps another segment's destination or any source
  // (ops::copy_segments checks), so they may run in any order (cuda: one
  // launch per 128 segments, its blocks spread over them by size).
  void (*copy_segments)(const std::vector<CopySegment>& segments);
  // out = start + i * step for flat index i.
  void (*arange)(const Tensor& out, double start, double step);
  // out (contiguous) = element [first_index + i] of the sequence, mapped to
  // [a, b) for uniform or to mean a, std b for normal.
  void (*random)(const Tensor& out, RandomDistribution distribution, PhiloxKey key, double a, double b,
                 uint64_t first_index);

  // out = f(x); x has out's shape (any strides, dtype of out, or bool for
  // logical_not, whose out is bool).
  void (*unary)(UnaryOp op, const Tensor& out, const Tensor& x);
  // grad_in = grad_out * f'(saved), where saved is y for tanh/sigmoid and x
  // otherwise. All of one shape.
  void (*unary_backward)(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved);
  // out = a op b; a and b are already expanded to out's shape and converted to
  // the compute dtype; comparisons write a bool out.
  void (*binary)(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
  // out = condition ? a : b, all expanded to out's shape.
  void (*where)(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b);

  // out (keepdim shape: size 1 on every reduced dim) = reduction of x over
  // the dims where reduced[d] is true.
  void (*reduce)(ReduceOp op, const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
  // values, indices (i64): max of x along dim and its first index (keepdim shapes).
  void (*max_along)(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim);

  // out = x gathered along dim at index (i32/i64, validated in range).
  void (*index_select)(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index);
  // out[index[i]] += source[i] along dim.
  void (*index_add)(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& source);

  // out = a @ b (+ bias) over the last two dims: a [..., M, K], b [..., K, N],
  // out [..., M, N] contiguous, all of out's dtype. Leading (batch) dims are
  // already broadcast to out's. a and b may have any strides; a kernel uses
  // transposed-GEMM modes where one of the last two strides is 1, and copies
  // otherwise. bias is undefined or [N] (contiguous), added to every row
  // before out's one rounding (cuda: the GEMM's bias epilogue, one launch).
  void (*matmul)(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias);
  // Optional GEMM epilogues (cuBLASLt's), null where a device has none: one
  // launch where matmul and an elementwise or reduction entry take two or
  // three. Operands as in matmul but 2-d: a [M, K], b [K, N] (any strides),
  // outputs contiguous, all of one dtype. Each returns false, having launched
  // nothing, when its operands do not fit the fused call (cuda: f64, or an
  // aux matrix of N not a multiple of 8); the op then composes the entries
  // above: the same math in more passes over memory.
  // pre = a @ b (+ bias [N]) and out = gelu_tanh(pre), both [M, N].
  bool (*matmul_gelu)(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b,
                      const Tensor& bias) = nullptr;
  // out = (a @ b) * gelu_tanh'(pre), pre [M, N] contiguous.
  bool (*matmul_gelu_backward)(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& pre) = nullptr;
  // out = a @ b and row_sums [M] = sum over k of a[m, k]: a linear layer's
  // weight and bias gradients (a = g^T, b = x) from one read of g.
  bool (*matmul_row_sums)(const Tensor& out, const Tensor& row_sums, const Tensor& a, const Tensor& b) = nullptr;

  // Row-wise over the last dim of contiguous x.
  // out [M, N] = a [M, K] b^T ([N, K]), a and b contiguous float8 (f8e4m3
  // or f8e5m2, not both f8e5m2), times a_scale * b_scale (0-d f32 on the
  // device) as one f32 factor, rounded once to out's dtype (f32, bf16, f16).
  // Returns false (nothing done) where the device has no FP8 GEMM for these
  // operands; ops::float8_linear_product computes the same contract then.
  bool (*float8_matmul)(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_scale,
                        const Tensor& b_scale) = nullptr;

  void (*softmax)(const Tensor& out, const Tensor& x, bool log);
  void (*softmax_backward)(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y, bool log);
  // x [rows, C] contiguous; weight/bias [C] or undefined; mean may be
  // undefined (rms_norm). Writes y, mean (layer norm) and rstd [rows].
  void (*norm)(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
               const Tensor& bias, double eps);
  // Gradients of norm; grad_weight/grad_bias may be undefined.
  void (*norm_backward)(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                        const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd);
  // A residual stream's add fused into the norm beside it (x [rows, C] and
  // the rest as in norm and norm_backward, all of one dtype; ops call these
  // only where that dtype is the tensors' own, so each rounding below is
  // the one a separate binary add makes):
  // sum = x + delta (delta [rows, C]), rounded to x's dtype, then norm of
  // that rounded sum: the bits of binary add then norm, with one read of x
  // and delta where those two read the sum again.
  void (*add_norm)(const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                   const Tensor& delta, const Tensor& weight, const Tensor& bias, double eps);
  // norm_backward whose grad_x also takes grad_residual [rows, C], the
  // gradient reaching x past the norm: norm's gradient rounded to x's dtype,
  // plus grad_residual, rounded again (binary add's bits), in one pass.
  void (*norm_backward_add)(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                            const Tensor& grad_residual, const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd);
  // loss (0-d) = mean over kept rows of logsumexp[n] - logits[n, target[n]],
  // also writing logsumexp [N] of every row (ignored ones too) for the
  // backward; loss and logsumexp in f32, or f64 for f64 logits. Only the
  // first `classes` columns of logits [N, C] are classes; the rest are
  // padding (a padded vocabulary), left out of the softmax.
  void (*cross_entropy)(const Tensor& loss, const Tensor& logsumexp, const Tensor& logits, const Tensor& targets,
                        int64_t ignore_index, int64_t classes);
  // grad_logits = grad_loss * (exp(logits - logsumexp) - onehot(target)) / kept,
  // zero on ignored rows and padding columns: with the forward's logsumexp
  // the logits are read once.
  void (*cross_entropy_backward)(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                                 const Tensor& logsumexp, const Tensor& targets, int64_t ignore_index,
                                 int64_t classes);
  // q, k, v, out (and the gradients): [B, H, T, D] with rows of D
  // contiguous and any other strides (views of a packed projection, or the
  // [B, T, H, D] order); logsumexp [B, H, T] contiguous.
  void (*causal_attention)(const Tensor& out, const Tensor& logsumexp, const Tensor& q, const Tensor& k,
                           const Tensor& v);
  void (*causal_attention_backward)(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                                    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& logsumexp);
  // y = x * mask, mask = keep ? 1/(1-p) : 0, keep decided by Philox at each flat index.
  void (*dropout)(const Tensor& y, const Tensor& mask, const Tensor& x, double p, PhiloxKey key,
                  PhiloxNumbering numbering);

  // out [rows, in] (contiguous f32, f64, bf16 or f16) = the NF4 rows of
  // `packed` (contiguous u8 [rows, nf4::RowLayout::of(in).row_bytes()])
  // dequantised as tensor/nf4_format.h says, each rounded once to out's dtype.
  void (*nf4_dequantize)(const Tensor& out, const Tensor& packed);

  // One AdamW step over many tensors of one device (cuda: one fused launch
  // per batch of tensors, not one per parameter); see AdamWTensor.
  void (*adamw_step)(const std::vector<AdamWTensor>& tensors, const AdamWMoments& moments);
  // total (0-d f64) = sum of squares of every element of `tensors` (f32 or
  // f64, contiguous), accumulated in f64 in a fixed order: the same bits on
  // every run. The cpu sums blocks of 2^15 elements in order, then tensors in
  // order (what clip_grad_norm_ always did).
  void (*sum_of_squares)(const Tensor& total, const std::vector<Tensor>& tensors);
  // Every tensor *= max_norm / (sqrt(total) + 1e-6) (rounded to the tensor's
  // dtype) when that factor is < 1 and sqrt(total) is finite; total (0-d f64)
  // is read where it lives, so a device never waits for the host.
  void (*scale_to_max_norm)(const std::vector<Tensor>& tensors, const Tensor& total, double max_norm);

  // Checks that every value of `indices` (i32/i64) lies in [0, count) or is
  // also_allowed; the error is describe(position, value). The cpu throws
  // here. cuda checks on the device and raises at the host's next read of the
  // stream (tensor/cuda/deferred_errors.h), and its gather and scatter
  // kernels skip such values meanwhile: asking now would cost a
  // synchronisation per op.
  void (*check_index_range)(const Tensor& indices, int64_t count, std::optional<int64_t> also_allowed,
                            const std::function<std::string(int64_t position, int64_t value)>& describe);

  // Whether unary, unary_backward, binary, reduce, softmax, the norms,
  // cross_entropy and causal_attention take bf16 operands themselves
  // (computing in f32, rounding each bf16 result once, statistics in f32).
  // Ops widen bf16 to f32 around a table without it: the same bits, two
  // more passes over memory.
  bool computes_bf16 = false;
};

// The dtype ops hand the kernels of `device` for values of `dtype`: bf16
// itself where the table computes bf16, else compute_dtype(dtype).
DType kernel_dtype(Device device, DType dtype);

// The table of `device`; throws tessera::Error for a device this build has no
// kernels for (cuda without the CUDA build, or meta, which has no data).
const KernelTable& kernels(Device device);

namespace cpu {
const KernelTable& kernel_table();  // tensor/cpu/kernel_table.cpp
}
namespace cuda {
// tensor/cuda/kernel_table.cpp, handed out by the cuda device's runtime
// table (tensor/device_runtime.h) in a build with a cuda runtime.
const KernelTable& kernel_table();
}

}  // namespace tessera
