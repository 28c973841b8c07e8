// Neural-network ops: softmax, layer/RMS norm, embedding, cross-entropy and
// causal attention, forward and backward. Each checks its inputs, reshapes to
// the row layout the kernels want ([rows, C] contiguous, in the kernels'
// dtype: f32 or f64, or bf16 where the table computes it) and converts back,
// so kernels see one simple case. Statistics (mean, rstd, logsumexp, loss)
// stay in the compute dtype (f32 for 16-bit floats).
#include <algorithm>

#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

void check_float(const char* op, const char* what, const Tensor& t) {
  TESSERA_CHECK(t.defined(), "{}: {} is undefined", op, what);
  TESSERA_CHECK(is_floating(t.dtype()), "{}: {} must be floating, got {}", op, what, dtype_name(t.dtype()));
}

void check_like(const char* op, const char* what, const Tensor& t, const Tensor& like) {
  check_float(op, what, t);
  TESSERA_CHECK(t.device() == like.device(), "{}: {} is on {}, expected {}", op, what, t.device().str(),
                like.device().str());
  TESSERA_CHECK(t.dtype() == like.dtype(), "{}: {} has dtype {}, expected {}", op, what, dtype_name(t.dtype()),
                dtype_name(like.dtype()));
}

void check_shape(const char* op, const char* what, const Tensor& t, const Shape& shape) {
  TESSERA_CHECK(t.sizes() == shape, "{}: {} has shape {}, expected {}", op, what, t.sizes(), shape);
}

// The kernels' view of a tensor: contiguous, in the kernels' dtype for it
// (f32 for 16-bit floats, unless the device's kernels take bf16).
Tensor compute_input(const Tensor& t) {
  return t.defined() ? contiguous(to(t, kernel_dtype(t.device(), t.dtype()))) : Tensor();
}

// Contiguous in exactly `dtype` (statistics saved by a forward may differ from the input's dtype).
Tensor compute_input(const Tensor& t, DType dtype) { return contiguous(to(t, dtype)); }

Tensor to_dtype(const Tensor& t, DType dtype) { return t.defined() ? to(t, dtype) : Tensor(); }

Shape without_last(const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end() - (t.dim() > 0 ? 1 : 0)); }

// The index values of `indices` (i32/i64), checked to lie in [0, count).
void check_indices(const char* op, const Tensor& indices, int64_t count, const char* what) {
  TESSERA_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64,
                "{}: indices must be i32 or i64, got {}", op, dtype_name(indices.dtype()));
  if (indices.is_meta()) return;
  kernels(indices.device()).check_index_range(indices, count, std::nullopt, [op, count, what](int64_t, int64_t index) {
    return fmt::format("{}: index {} out of range for {} {}", op, index, count, what);
  });
}

// Moves `dim` last (when it is not), runs `rowwise` on contiguous compute-dtype
// rows, and moves it back in the dtype of `like`.
template <typename Rowwise>
Tensor along_last(const std::vector<Tensor>& inputs, int64_t dim, const Tensor& like, const Rowwise& rowwise) {
  if (like.is_meta()) return empty(like.sizes(), {.dtype = like.dtype(), .device = like.device()});
  const int64_t last = std::max<int64_t>(like.dim() - 1, 0);
  std::vector<Tensor> rows;
  for (const Tensor& input : inputs) rows.push_back(compute_input(dim == last ? input : transpose(input, dim, last)));
  Tensor out = empty(rows[0].sizes(), {.dtype = rows[0].dtype(), .device = like.device()});
  rowwise(out, rows);
  if (dim != last) out = contiguous(transpose(out, dim, last));
  return to(out, like.dtype());
}

Tensor softmax_forward(const char* op, const Tensor& x, int64_t dim, bool log) {
  check_float(op, "input", x);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  return along_last({x}, d, x, [&](const Tensor& out, const std::vector<Tensor>& rows) {
    kernels(out.device()).softmax(out, rows[0], log);
  });
}

Tensor softmax_grad(const char* op, const Tensor& grad_out, const Tensor& y, int64_t dim, bool log) {
  check_float(op, "output", y);
  check_like(op, "grad_out", grad_out, y);
  check_shape(op, "grad_out", grad_out, y.sizes());
  const int64_t d = wrap_dim(dim, y.dim(), op);
  return along_last({grad_out, y}, d, y, [&](const Tensor& out, const std::vector<Tensor>& rows) {
    kernels(out.device()).softmax_backward(out, rows[0], rows[1], log);
  });
}

void check_norm_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_float(op, "input", x);
  TESSERA_CHECK(x.dim() >= 1, "{}: input needs at least 1 dim, got {}", op, x.sizes());
  const Shape features{x.size(-1)};
  if (weight.defined()) {
    check_like(op, "weight", weight, x);
    check_shape(op, "weight", weight, features);
  }
  if (bias.defined()) {
    check_like(op, "bias", bias, x);
    check_shape(op, "bias", bias, features);
  }
  TESSERA_CHECK(eps >= 0, "{}: eps must be >= 0, got {}", op, eps);
}

// Empty outputs of a norm of x: y in `y_dtype`, the statistics in the
// compute dtype (f32 for bf16/f16 inputs), mean only when `centre`.
NormOutput empty_norm_output(const Tensor& x, DType y_dtype, bool centre) {
  const TensorOptions stats{.dtype = compute_dtype(x.dtype()), .device = x.device()};
  const Shape rows = without_last(x);
  return {empty(x.sizes(), {.dtype = y_dtype, .device = x.device()}), centre ? empty(rows, stats) : Tensor(),
          empty(rows, stats)};
}

NormOutput norm_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        bool centre) {
  check_norm_forward(op, x, weight, bias, eps);
  if (x.is_meta()) return empty_norm_output(x, x.dtype(), centre);
  const Tensor x_rows = compute_input(x);
  NormOutput result = empty_norm_output(x, x_rows.dtype(), centre);
  kernels(x.device()).norm(result.y, result.mean, result.rstd, x_rows, compute_input(weight), compute_input(bias),
                           eps);
  result.y = to(result.y, x.dtype());
  return result;
}

// Whether the kernels of x's device compute x's dtype itself, so that what
// they round to is x's dtype: the fused residual-add kernels need it (a
// kernel given f32 for bf16 values would normalise a sum that add rounds).
bool kernels_keep_dtype(const Tensor& x) { return kernel_dtype(x.device(), x.dtype()) == x.dtype(); }

void check_residual(const char* op, const char* what, const Tensor& t, const char* like_name, const Tensor& like) {
  check_float(op, what, t);
  TESSERA_CHECK(t.device() == like.device(), "{}: {} is on {}, {} on {}", op, what, t.device().str(), like_name,
                like.device().str());
  TESSERA_CHECK(t.dtype() == like.dtype(), "{}: {} has dtype {}, {} has {}", op, what, dtype_name(t.dtype()),
                like_name, dtype_name(like.dtype()));
  TESSERA_CHECK(t.sizes() == like.sizes(), "{}: {} has shape {}, {} has {} (no broadcasting)", op, what, t.sizes(),
                like_name, like.sizes());
}

// The norm's gradients; with grad_residual (add_layer_norm_backward), x's
// gets it added: add(grad_residual, grad_x)'s bits.
NormGrads norm_backward(const char* op, const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, bool has_bias,
                        const Tensor& grad_residual = Tensor()) {
  check_float(op, "input", x);
  TESSERA_CHECK(x.dim() >= 1, "{}: input needs at least 1 dim, got {}", op, x.sizes());
  check_like(op, "grad_y", grad_y, x);
  check_shape(op, "grad_y", grad_y, x.sizes());
  if (weight.defined()) {
    check_like(op, "weight", weight, x);
    check_shape(op, "weight", weight, {x.size(-1)});
  }
  for (const auto& [what, stat] : {std::pair{"mean", mean}, std::pair{"rstd", rstd}}) {
    if (!stat.defined()) continue;
    check_float(op, what, stat);
    TESSERA_CHECK(stat.device() == x.device(), "{}: {} is on {}, expected {}", op, what, stat.device().str(),
                  x.device().str());
    check_shape(op, what, stat, without_last(x));
  }
  if (grad_residual.defined()) check_residual(op, "grad_sum", grad_residual, "sum", x);
  if (x.is_meta()) {
    const TensorOptions options{.dtype = x.dtype(), .device = x.device()};
    return {empty(x.sizes(), options), weight.defined() ? empty({x.size(-1)}, options) : Tensor(),
            has_bias ? empty({x.size(-1)}, options) : Tensor()};
  }
  if (grad_residual.defined() && !kernels_keep_dtype(x)) {
    // Widened rows: the norm's gradient rounds to x's dtype before the add.
    NormGrads grads = norm_backward(op, grad_y, x, weight, mean, rstd, has_bias);
    grads.x = add(grad_residual, grads.x);
    return grads;
  }
  const DType stats = compute_dtype(x.dtype());
  const TensorOptions options{.dtype = kernel_dtype(x.device(), x.dtype()), .device = x.device()};
  NormGrads grads{empty(x.sizes(), options), weight.defined() ? empty({x.size(-1)}, options) : Tensor(),
                  has_bias ? empty({x.size(-1)}, options) : Tensor()};
  const Tensor mean_rows = mean.defined() ? compute_input(mean, stats) : Tensor();
  const KernelTable& table = kernels(x.device());
  if (grad_residual.defined()) {
    table.norm_backward_add(grads.x, grads.weight, grads.bias, compute_input(grad_residual), compute_input(grad_y),
                            compute_input(x), compute_input(weight), mean_rows, compute_input(rstd, stats));
  } else {
    table.norm_backward(grads.x, grads.weight, grads.bias, compute_input(grad_y), compute_input(x),
                        compute_input(weight), mean_rows, compute_input(rstd, stats));
  }
  return {to(grads.x, x.dtype()), to_dtype(grads.weight, x.dtype()), to_dtype(grads.bias, x.dtype())};
}

// Checks the operands and returns the number of classes: all of logits'
// columns for kAllColumns, else the first `classes` (the rest are padding).
int64_t check_cross_entropy(const char* op, const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                            int64_t classes) {
  check_float(op, "logits", logits);
  TESSERA_CHECK(logits.dim() == 2, "{}: logits must be [N, C], got {}", op, logits.sizes());
  TESSERA_CHECK(classes == kAllColumns || (classes >= 1 && classes <= logits.size(1)),
                "{}: classes must be in [1, {}] for logits {} (or kAllColumns), got {}", op, logits.size(1),
                logits.sizes(), classes);
  if (classes == kAllColumns) classes = logits.size(1);
  TESSERA_CHECK(targets.defined() && targets.dim() == 1 && targets.size(0) == logits.size(0),
                "{}: targets must be [{}] for logits {}, got {}", op, logits.size(0), logits.sizes(),
                targets.defined() ? targets.sizes() : Shape{});
  TESSERA_CHECK(targets.device() == logits.device(), "{}: targets on {}, logits on {}", op,
                targets.device().str(), logits.device().str());
  TESSERA_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64,
                "{}: targets must be i32 or i64, got {}", op, dtype_name(targets.dtype()));
  if (targets.is_meta()) return classes;
  kernels(targets.device()).check_index_range(
      targets, classes, ignore_index, [op, classes, ignore_index](int64_t, int64_t target) {
        return fmt::format("{}: target {} out of range for {} classes (ignore_index is {})", op, target, classes,
                           ignore_index);
      });
  return classes;
}

// A [B, H, T, D] attention operand as the kernels take it: in the kernels'
// dtype with rows of D contiguous; other strides stay (no copy of a view of
// a packed projection).
Tensor attention_operand(const Tensor& t) {
  const Tensor converted = to(t, kernel_dtype(t.device(), t.dtype()));
  return converted.stride(3) == 1 || converted.size(3) == 1 ? converted : contiguous(converted);
}

// An empty [B, H, T, D] tensor laid out as [B, T, H, D]: the order the heads
// merge back into [B, T, C], so the merge is a view, not a copy.
Tensor empty_heads(const Shape& shape, const TensorOptions& options) {
  return transpose(empty({shape[0], shape[2], shape[1], shape[3]}, options), 1, 2);
}

// The extent in elements of a view with non-negative strides.
int64_t span_of(const Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return last + 1;
}

// Whether q, k and v are the heads of the three slices of one packed
// [B, T, 3C] projection of `dtype` (C = H D, any row and batch pitch): each
// (b, t) row holds q's H D values, then k's `gap` later, then v's, and rows
// and batches do not interleave, so the three are disjoint.
bool packed_in_one_buffer(const Tensor& q, const Tensor& k, const Tensor& v, DType dtype) {
  if (q.dtype() != dtype || k.dtype() != dtype || v.dtype() != dtype || q.numel() == 0) return false;
  if (k.storage() != q.storage() || v.storage() != q.storage()) return false;
  if (k.strides() != q.strides() || v.strides() != q.strides()) return false;
  const int64_t batches = q.size(0), heads = q.size(1), seq = q.size(2), dim = q.size(3);
  const int64_t row_width = heads * dim, gap = k.storage_offset() - q.storage_offset();
  const bool rows_of_heads = q.stride(3) == 1 && (heads == 1 || q.stride(1) == dim);
  const bool slices_apart = gap >= row_width && v.storage_offset() - k.storage_offset() == gap;
  const bool rows_apart = seq == 1 || q.stride(2) >= 2 * gap + row_width;
  const bool batches_apart = batches == 1 || q.stride(0) >= (seq - 1) * q.stride(2) + 2 * gap + row_width;
  return rows_of_heads && slices_apart && rows_apart && batches_apart && q.stride(2) >= 0 && q.stride(0) >= 0;
}

// Empty gradients for q, k and v: packed into one new buffer the way q, k and
// v are when they are (so the split's backward joins them as a view), else
// each in the [B, T, H, D] order.
AttentionGrads empty_attention_grads(const Tensor& q, const Tensor& k, const Tensor& v, const TensorOptions& options) {
  if (!packed_in_one_buffer(q, k, v, options.dtype)) {
    return {empty_heads(q.sizes(), options), empty_heads(q.sizes(), options), empty_heads(q.sizes(), options)};
  }
  const int64_t gap = k.storage_offset() - q.storage_offset();
  const std::shared_ptr<Storage> buffer = empty({2 * gap + span_of(q)}, options).storage();
  const auto slice = [&](int64_t index) { return Tensor::make(buffer, q.sizes(), q.strides(), index * gap, options.dtype); };
  return {slice(0), slice(1), slice(2)};
}

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_float(op, "q", q);
  TESSERA_CHECK(q.dim() == 4, "{}: q, k, v must be [B, H, T, D], got q {}", op, q.sizes());
  TESSERA_CHECK(q.size(3) > 0, "{}: head dim D must be positive, got q {}", op, q.sizes());
  check_like(op, "k", k, q);
  check_like(op, "v", v, q);
  TESSERA_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "{}: q, k, v shapes differ: {}, {}, {}", op,
                q.sizes(), k.sizes(), v.sizes());
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  check_raw_op_inputs("softmax", {{"x", x}});
  return softmax_forward("softmax", x, dim, false);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  check_raw_op_inputs("log_softmax", {{"x", x}});
  return softmax_forward("log_softmax", x, dim, true);
}

Tensor softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim) {
  check_raw_op_inputs("softmax_backward", {{"grad_out", grad_out}, {"y", y}});
  return softmax_grad("softmax_backward", grad_out, y, dim, false);
}

Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim) {
  check_raw_op_inputs("log_softmax_backward", {{"grad_out", grad_out}, {"y", y}});
  return softmax_grad("log_softmax_backward", grad_out, y, dim, true);
}

NormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_raw_op_inputs("layer_norm", {{"x", x}, {"weight", weight}, {"bias", bias}});
  return norm_forward("layer_norm", x, weight, bias, eps, true);
}

NormOutput rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_raw_op_inputs("rms_norm", {{"x", x}, {"weight", weight}});
  return norm_forward("rms_norm", x, weight, Tensor(), eps, false);
}

NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool has_bias) {
  check_raw_op_inputs("layer_norm_backward",
                      {{"grad_y", grad_y}, {"x", x}, {"weight", weight}, {"mean", mean}, {"rstd", rstd}});
  TESSERA_CHECK(mean.defined() && rstd.defined(), "layer_norm_backward: needs the forward's mean and rstd");
  return norm_backward("layer_norm_backward", grad_y, x, weight, mean, rstd, has_bias);
}

NormGrads rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  check_raw_op_inputs("rms_norm_backward", {{"grad_y", grad_y}, {"x", x}, {"weight", weight}, {"rstd", rstd}});
  TESSERA_CHECK(rstd.defined(), "rms_norm_backward: needs the forward's rstd");
  return norm_backward("rms_norm_backward", grad_y, x, weight, Tensor(), rstd, false);
}

AddNormOutput add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias,
                             double eps) {
  const char* op = "add_layer_norm";
  check_raw_op_inputs(op, {{"x", x}, {"delta", delta}, {"weight", weight}, {"bias", bias}});
  check_float(op, "x", x);
  check_residual(op, "delta", delta, "x", x);
  check_norm_forward(op, x, weight, bias, eps);
  if (!x.is_meta() && !kernels_keep_dtype(x)) {
    Tensor sum = add(x, delta);
    return {sum, norm_forward(op, sum, weight, bias, eps, true)};
  }
  // x, delta: [..., C] -> sum, y: [..., C]; mean, rstd: [...]
  AddNormOutput result{empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()}),
                       empty_norm_output(x, x.dtype(), true)};
  if (x.is_meta()) return result;
  kernels(x.device()).add_norm(result.sum, result.norm.y, result.norm.mean, result.norm.rstd, compute_input(x),
                               compute_input(delta), compute_input(weight), compute_input(bias), eps);
  return result;
}

NormGrads add_layer_norm_backward(const Tensor& grad_sum, const Tensor& grad_y, const Tensor& sum,
                                  const Tensor& weight, const Tensor& mean, const Tensor& rstd, bool has_bias) {
  const char* op = "add_layer_norm_backward";
  check_raw_op_inputs(op, {{"grad_sum", grad_sum}, {"grad_y", grad_y}, {"sum", sum}, {"weight", weight},
                           {"mean", mean}, {"rstd", rstd}});
  TESSERA_CHECK(mean.defined() && rstd.defined(), "{}: needs the forward's mean and rstd", op);
  return norm_backward(op, grad_y, sum, weight, mean, rstd, has_bias, grad_sum);
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_raw_op_inputs("embedding", {{"weight", weight}});
  check_float("embedding", "weight", weight);
  TESSERA_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got {}", weight.sizes());
  TESSERA_CHECK(indices.defined(), "embedding: indices are undefined");
  TESSERA_CHECK(indices.device() == weight.device(), "embedding: indices on {}, weight on {}",
                indices.device().str(), weight.device().str());
  check_indices("embedding", indices, weight.size(0), "embeddings");
  Shape out_shape = indices.sizes();
  out_shape.push_back(weight.size(1));
  // indices: [...] -> flat [n]; rows of weight [n, dim] -> [..., dim]
  return reshape(index_select(weight, 0, reshape(indices, {-1})), out_shape);
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_embeddings) {
  check_raw_op_inputs("embedding_backward", {{"grad_out", grad_out}});
  check_float("embedding_backward", "grad_out", grad_out);
  TESSERA_CHECK(indices.defined(), "embedding_backward: indices are undefined");
  TESSERA_CHECK(num_embeddings >= 0, "embedding_backward: num_embeddings must be >= 0, got {}", num_embeddings);
  TESSERA_CHECK(grad_out.dim() == indices.dim() + 1 && without_last(grad_out) == indices.sizes(),
                "embedding_backward: grad_out {} does not match indices {} plus an embedding dim", grad_out.sizes(),
                indices.sizes());
  TESSERA_CHECK(indices.device() == grad_out.device(), "embedding_backward: indices on {}, grad_out on {}",
                indices.device().str(), grad_out.device().str());
  check_indices("embedding_backward", indices, num_embeddings, "embeddings");
  const int64_t dim = grad_out.size(-1);
  // Accumulate in the compute dtype so repeated indices round once, not per add.
  Tensor grad = zeros({num_embeddings, dim}, {.dtype = compute_dtype(grad_out.dtype()), .device = grad_out.device()});
  if (grad.is_meta()) return empty({num_embeddings, dim}, {.dtype = grad_out.dtype(), .device = grad_out.device()});
  index_add_(grad, 0, reshape(indices, {-1}), reshape(to(grad_out, grad.dtype()), {-1, dim}));
  return to(grad, grad_out.dtype());
}

CrossEntropyOutput cross_entropy_with_logsumexp(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                                int64_t classes) {
  check_raw_op_inputs("cross_entropy", {{"logits", logits}});
  classes = check_cross_entropy("cross_entropy", logits, targets, ignore_index, classes);
  const TensorOptions stats{.dtype = compute_dtype(logits.dtype()), .device = logits.device()};
  if (logits.is_meta()) {
    return {empty({}, {.dtype = logits.dtype(), .device = logits.device()}), empty({logits.size(0)}, stats)};
  }
  const Tensor rows = compute_input(logits);
  CrossEntropyOutput result{empty({}, stats), empty({logits.size(0)}, stats)};
  kernels(rows.device()).cross_entropy(result.loss, result.logsumexp, rows, targets, ignore_index, classes);
  result.loss = to(result.loss, logits.dtype());
  return result;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, int64_t classes) {
  return cross_entropy_with_logsumexp(logits, targets, ignore_index, classes).loss;
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index, const Tensor& logsumexp, int64_t classes) {
  const char* op = "cross_entropy_backward";
  check_raw_op_inputs(op, {{"grad_loss", grad_loss}, {"logits", logits}});
  classes = check_cross_entropy(op, logits, targets, ignore_index, classes);
  check_float(op, "grad_loss", grad_loss);
  TESSERA_CHECK(grad_loss.numel() == 1, "cross_entropy_backward: grad_loss must hold one value, got shape {}",
                grad_loss.sizes());
  TESSERA_CHECK(grad_loss.device() == logits.device(), "cross_entropy_backward: grad_loss on {}, logits on {}",
                grad_loss.device().str(), logits.device().str());
  check_float(op, "logsumexp", logsumexp);
  TESSERA_CHECK(logsumexp.device() == logits.device(), "cross_entropy_backward: logsumexp on {}, logits on {}",
                logsumexp.device().str(), logits.device().str());
  check_shape(op, "logsumexp", logsumexp, {logits.size(0)});
  if (logits.is_meta()) return empty(logits.sizes(), {.dtype = logits.dtype(), .device = logits.device()});
  const Tensor rows = compute_input(logits);
  Tensor grad = empty(rows.sizes(), {.dtype = rows.dtype(), .device = rows.device()});
  kernels(rows.device()).cross_entropy_backward(grad, grad_loss, rows,
                                                compute_input(logsumexp, compute_dtype(logits.dtype())), targets,
                                                ignore_index, classes);
  return to(grad, logits.dtype());
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index, int64_t classes) {
  check_raw_op_inputs("cross_entropy_backward", {{"grad_loss", grad_loss}, {"logits", logits}});
  classes = check_cross_entropy("cross_entropy_backward", logits, targets, ignore_index, classes);
  // Without the forward's logsumexp: one more read of the logits to get it.
  return cross_entropy_backward(grad_loss, logits, targets, ignore_index,
                                cross_entropy_with_logsumexp(logits, targets, ignore_index, classes).logsumexp,
                                classes);
}

AttentionOutput causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  check_raw_op_inputs("causal_attention", {{"q", q}, {"k", k}, {"v", v}});
  check_attention("causal_attention", q, k, v);
  const DType compute = compute_dtype(q.dtype());
  if (q.is_meta()) {
    return {empty(q.sizes(), {.dtype = q.dtype(), .device = q.device()}),
            empty(without_last(q), {.dtype = compute, .device = q.device()})};
  }
  const TensorOptions stats{.dtype = compute, .device = q.device()};
  AttentionOutput result{empty_heads(q.sizes(), {.dtype = kernel_dtype(q.device(), q.dtype()), .device = q.device()}),
                         empty(without_last(q), stats)};
  kernels(q.device()).causal_attention(result.out, result.logsumexp, attention_operand(q), attention_operand(k),
                                       attention_operand(v));
  result.out = to(result.out, q.dtype());
  return result;
}

AttentionGrads causal_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& logsumexp) {
  const char* op = "causal_attention_backward";
  check_raw_op_inputs(op, {{"grad_out", grad_out}, {"q", q}, {"k", k}, {"v", v}, {"out", out},
                           {"logsumexp", logsumexp}});
  check_attention(op, q, k, v);
  check_like(op, "grad_out", grad_out, q);
  check_shape(op, "grad_out", grad_out, q.sizes());
  check_like(op, "out", out, q);
  check_shape(op, "out", out, q.sizes());
  check_float(op, "logsumexp", logsumexp);
  TESSERA_CHECK(logsumexp.device() == q.device(), "{}: logsumexp on {}, q on {}", op, logsumexp.device().str(),
                q.device().str());
  check_shape(op, "logsumexp", logsumexp, without_last(q));
  if (q.is_meta()) {
    const TensorOptions options{.dtype = q.dtype(), .device = q.device()};
    return {empty(q.sizes(), options), empty(q.sizes(), options), empty(q.sizes(), options)};
  }
  const TensorOptions options{.dtype = kernel_dtype(q.device(), q.dtype()), .device = q.device()};
  AttentionGrads grads = empty_attention_grads(q, k, v, options);
  kernels(q.device()).causal_attention_backward(
      grads.q, grads.k, grads.v, attention_operand(grad_out), attention_operand(q), attention_operand(k),
      attention_operand(v), attention_operand(out), compute_input(logsumexp, compute_dtype(q.dtype())));
  return {to(grads.q, q.dtype()), to(grads.k, q.dtype()), to(grads.v, q.dtype())};
}

}  // namespace tessera::ops
