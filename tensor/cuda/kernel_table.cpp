// The cuda kernel table: each entry declares the bytes its launch reads and
// writes (for the simulator's memcheck and stream-ordering checker) and runs
// on the current stream of the tensors' device.
#include <algorithm>
#include <atomic>
#include <optional>

#include "tensor/cuda/attention.h"
#include "tensor/cuda/attention_mma.h"
#include "tensor/cuda/blas_lt.h"
#include "tensor/cuda/cross_entropy.h"
#include "tensor/cuda/dropout.h"
#include "tensor/cuda/quantization.h"
#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/indexing.h"
#include "tensor/cuda/multi_tensor.h"
#include "tensor/cuda/normalization.h"
#include "tensor/cuda/operands.h"
#include "tensor/cuda/optimizer.h"
#include "tensor/cuda/random.h"
#include "tensor/cuda/reduction.h"
#include "tensor/cuda/softmax.h"
#include "tensor/cuda/transfer.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

namespace tessera::cuda {

namespace {

constexpr BufferAccess kRead = BufferAccess::read;
constexpr BufferAccess kWrite = BufferAccess::write;

Operand optional_operand(const Tensor& tensor) { return tensor.defined() ? operand(tensor) : Operand{}; }

// Declares `tensor` among `buffers` when the op has it.
void declare(std::vector<BufferUse>& buffers, const char* role, const Tensor& tensor, BufferAccess access) {
  if (tensor.defined()) buffers.push_back(buffer_use(role, tensor, access));
}

void fill_kernel(const Tensor& out, double value) {
  fill(operand(out), value, launch_on_current_stream(out.device(), {buffer_use("out", out, kWrite)}));
}

void copy_kernel(const Tensor& dst, const Tensor& src) {
  if (src.device().is_cpu()) return copy_host_to_device(dst, src);
  if (dst.device().is_cpu()) return copy_device_to_host(dst, src);
  if (src.device() != dst.device()) {
    // Peer access is not modelled (the simulator) or assumed (GPUs without
    // NVLink): a copy between devices goes through pinned host memory, as
    // cudaMemcpyPeer does without peer access. Checkpoints and tests use it;
    // training moves data between devices by collectives.
    const Tensor staged = pinned_host_empty(src.sizes(), src.dtype());
    copy_device_to_host(staged, src);
    return copy_host_to_device(dst, staged);
  }
  copy(operand(dst), operand(src),
       launch_on_current_stream(dst.device(), {buffer_use("in", src, kRead), buffer_use("out", dst, kWrite)}));
}

// One launch per kSegmentsPerLaunch segments (ops::copy_segments has
// checked them: dense, of float dtypes, on one device, not overlapping).
void copy_segments_kernel(const std::vector<CopySegment>& segments) {
  if (segments.empty()) return;
  std::vector<SegmentOperand> operands;
  operands.reserve(segments.size());
  for (const CopySegment& segment : segments) {
    if (segment.dst.numel() == 0) continue;
    SegmentOperand piece{.dst = segment.dst.cuda_data(),
                         .dst_dtype = segment.dst.dtype(),
                         .value = segment.value,
                         .count = segment.dst.numel(),
                         .buffers = {buffer_use("out", segment.dst, kWrite)}};
    if (segment.src.defined()) {
      piece.src = segment.src.cuda_data();
      piece.src_dtype = segment.src.dtype();
      piece.buffers.push_back(buffer_use("in", segment.src, kRead));
    }
    operands.push_back(std::move(piece));
  }
  copy_segments(operands, current_stream(segments.front().dst.device()).get());
}

void arange_kernel(const Tensor& out, double start, double step) {
  arange(operand(out), start, step, launch_on_current_stream(out.device(), {buffer_use("out", out, kWrite)}));
}

void unary_kernel(UnaryOp op, const Tensor& out, const Tensor& x) {
  unary(op, operand(out), operand(x),
        launch_on_current_stream(out.device(), {buffer_use("x", x, kRead), buffer_use("out", out, kWrite)}));
}

void unary_backward_kernel(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved) {
  unary_backward(op, operand(grad_in), operand(grad_out), operand(saved),
                 launch_on_current_stream(grad_in.device(),
                                          {buffer_use("grad_out", grad_out, kRead), buffer_use("saved", saved, kRead),
                                           buffer_use("grad_in", grad_in, kWrite)}));
}

void binary_kernel(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  binary(op, operand(out), operand(a), operand(b),
         launch_on_current_stream(out.device(), {buffer_use("a", a, kRead), buffer_use("b", b, kRead),
                                                 buffer_use("out", out, kWrite)}));
}

void random_kernel(const Tensor& out, RandomDistribution distribution, PhiloxKey key, double a, double b,
                   uint64_t first_index) {
  random(operand(out), distribution, key, a, b, first_index,
         launch_on_current_stream(out.device(), {buffer_use("out", out, kWrite)}));
}

// Dims of x (sizes and strides) where `reduced` is `which`.
Layout dims_where(const Tensor& x, const std::vector<bool>& reduced, bool which) {
  Layout layout;
  for (int64_t dim = 0; dim < x.dim(); ++dim) {
    if (reduced[dim] != which) continue;
    layout.sizes[layout.dims] = x.sizes()[dim];
    layout.strides[layout.dims] = x.strides()[dim];
    ++layout.dims;
  }
  return layout;
}

void reduce_kernel(ReduceOp op, const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  TESSERA_CHECK(static_cast<int64_t>(reduced.size()) == x.dim() && out.dim() == x.dim() && out.is_contiguous(),
                "cuda::reduce: x of shape {}, out of shape {} (contiguous) and {} reduce flags", x.sizes(),
                out.sizes(), reduced.size());
  TESSERA_CHECK(x.dim() <= kMaxDims, "cuda::reduce: {} dims (shape {}); cuda kernels take up to {}", x.dim(),
                x.sizes(), kMaxDims);
  if (x.dtype() == DType::boolean) return reduce_kernel(op, out, ops::to(x, DType::i32), reduced);  // any / all
  ReduceGeometry geometry;
  geometry.kept = dims_where(x, reduced, false);
  geometry.reduced = dims_where(x, reduced, true);
  geometry.outputs = out.numel();
  geometry.reduced_count = 1;
  for (int32_t dim = 0; dim < geometry.reduced.dims; ++dim) geometry.reduced_count *= geometry.reduced.sizes[dim];
  // The chunk partials of a column sum (the caching allocator makes this
  // free in steady state; stream order keeps it alive).
  Tensor workspace;
  if (const int64_t slots = reduce_workspace_elements(geometry); slots > 0) {
    workspace = ops::empty({slots}, {.dtype = DType::f64, .device = x.device()});
  }
  std::vector<BufferUse> buffers{buffer_use("x", x, kRead), buffer_use("out", out, kWrite)};
  declare(buffers, "workspace", workspace, BufferAccess::read_write);
  reduce(op, operand(out), optional_operand(workspace), operand(x), geometry,
         launch_on_current_stream(out.device(), std::move(buffers)));
}

void max_along_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim) {
  TESSERA_CHECK(values.dtype() == x.dtype() && indices.dtype() == DType::i64,
                "cuda::max_along: values must be {} and indices i64, got {} and {}", dtype_name(x.dtype()),
                dtype_name(values.dtype()), dtype_name(indices.dtype()));
  if (values.numel() == 0) return;
  const int64_t length = x.dim() == 0 ? 1 : x.size(dim);
  const int64_t step = x.dim() == 0 ? 0 : x.stride(dim);
  // x at index 0 along dim, shaped like values: each output's first element.
  const Tensor first = Tensor::make(x.storage(), values.sizes(), x.strides(), x.storage_offset(), x.dtype());
  max_along(operand(values), operand(indices), operand(first), length, step,
            launch_on_current_stream(values.device(), {buffer_use("x", x, kRead),
                                                       buffer_use("values", values, kWrite),
                                                       buffer_use("indices", indices, kWrite)}));
}

// [outer, size, inner] around `dim` of `tensor`, for `count` indices.
IndexGeometry rows_around(const Tensor& tensor, int64_t dim, int64_t count) {
  IndexGeometry geometry;
  for (int64_t d = 0; d < dim; ++d) geometry.outer *= tensor.sizes()[d];
  for (int64_t d = dim + 1; d < tensor.dim(); ++d) geometry.inner *= tensor.sizes()[d];
  geometry.size = tensor.sizes()[dim];
  geometry.count = count;
  return geometry;
}

void check_contiguous(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* tensor : tensors) {
    TESSERA_CHECK(tensor->is_contiguous(), "cuda::{}: expects contiguous operands, got shape {} strides {}", op,
                  tensor->sizes(), tensor->strides());
  }
}

void index_select_kernel(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  check_contiguous("index_select", {&out, &x, &index});
  index_select(operand(out), operand(x), operand(index), rows_around(x, dim, index.numel()),
               launch_on_current_stream(out.device(), {buffer_use("x", x, kRead), buffer_use("index", index, kRead),
                                                       buffer_use("out", out, kWrite)}));
}

void index_add_kernel(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& source) {
  check_contiguous("index_add", {&out, &index, &source});
  TESSERA_CHECK(out.dtype() == source.dtype(), "cuda::index_add: out is {}, source {}", dtype_name(out.dtype()),
                dtype_name(source.dtype()));
  const IndexGeometry geometry = rows_around(out, dim, index.numel());
  constexpr int64_t kRowLimit = int64_t{1} << 31;
  if (geometry.outer == 1 && is_floating(out.dtype()) && geometry.size < kRowLimit && geometry.count < kRowLimit) {
    // The embedding backward's case: sort the rows on the device, then sum
    // each row's run in order (parallel over tokens, not only columns).
    const Tensor keys = ops::empty({sort_key_capacity(geometry.count)}, {.dtype = DType::i64, .device = out.device()});
    return index_add_rows(operand(out), operand(index), operand(source), geometry,
                          static_cast<uint64_t*>(operand(keys).data),
                          launch_on_current_stream(out.device(), {buffer_use("source", source, kRead),
                                                                  buffer_use("index", index, kRead),
                                                                  buffer_use("keys", keys, BufferAccess::read_write),
                                                                  buffer_use("out", out, BufferAccess::read_write)}));
  }
  index_add(operand(out), operand(index), operand(source), geometry,
            launch_on_current_stream(out.device(), {buffer_use("source", source, kRead),
                                                    buffer_use("index", index, kRead),
                                                    buffer_use("out", out, BufferAccess::read_write)}));
}

// --- training: dropout and the optimizer step (tensor/cuda/dropout.cu, optimizer.cu) ---

void dropout_kernel(const Tensor& y, const Tensor& mask, const Tensor& x, double p, PhiloxKey key,
                    PhiloxNumbering numbering) {
  TESSERA_CHECK(y.dtype() == x.dtype() && mask.dtype() == x.dtype() && y.is_contiguous() && mask.is_contiguous(),
                "cuda::dropout: y and mask must be contiguous and of x's dtype {}, got {} and {}",
                dtype_name(x.dtype()), dtype_name(y.dtype()), dtype_name(mask.dtype()));
  TESSERA_CHECK(x.dim() <= kMaxDims, "cuda::dropout: {} dims (shape {}); cuda kernels take up to {}", x.dim(),
                x.sizes(), kMaxDims);
  // The cpu's scale, rounded to the dtype the same way.
  dropout(operand(y), operand(mask), operand(x), p, 1.0 / (1.0 - p), key, numbering,
          launch_on_current_stream(y.device(), {buffer_use("x", x, kRead), buffer_use("y", y, kWrite),
                                                buffer_use("mask", mask, kWrite)}));
}

void nf4_dequantize_kernel(const Tensor& out, const Tensor& packed) {
  TESSERA_CHECK(out.is_contiguous() && packed.is_contiguous() && packed.dtype() == DType::u8,
                "cuda::nf4_dequantize: needs a contiguous output and contiguous u8 rows, got {} and {} {}",
                out.sizes(), dtype_name(packed.dtype()), packed.sizes());
  nf4_dequantize(operand(out), operand(packed), out.size(1),
                 launch_on_current_stream(out.device(), {buffer_use("packed", packed, kRead),
                                                         buffer_use("out", out, kWrite)}));
}

// A tensor an optimizer kernel reads or writes in place: contiguous f32 or
// f64 (bf16 for the working copy), `like`'s shape, on the device.
void check_optimizer_operand(const char* kernel, const char* role, const Tensor& tensor, const Tensor& like,
                             DType dtype) {
  TESSERA_CHECK(tensor.defined() && tensor.is_contiguous() && tensor.dtype() == dtype && tensor.sizes() == like.sizes() &&
                    tensor.device() == like.device(),
                "cuda::{}: {} must be a contiguous {} tensor of shape {} on {}, got {} {} on {}", kernel, role,
                dtype_name(dtype), like.sizes(), like.device().str(), tensor.defined() ? dtype_name(tensor.dtype()) : "undefined",
                tensor.sizes(), tensor.device().str());
}

void check_float_dtype(const char* kernel, const Tensor& tensor) {
  TESSERA_CHECK(tensor.dtype() == DType::f32 || tensor.dtype() == DType::f64,
                "cuda::{}: computes in f32 or f64, got {}", kernel, dtype_name(tensor.dtype()));
}

void adamw_step_kernel(const std::vector<AdamWTensor>& tensors, const AdamWMoments& moments) {
  if (tensors.empty()) return;
  const Device device = tensors.front().param.device();
  std::vector<AdamWOperands> operands;
  operands.reserve(tensors.size());
  for (const AdamWTensor& tensor : tensors) {
    check_float_dtype("adamw_step", tensor.param);
    const DType dtype = tensor.param.dtype();
    TESSERA_CHECK(tensor.param.device() == device && tensor.param.is_contiguous(),
                  "cuda::adamw_step: params must be contiguous and on {}, got one of shape {} on {}", device.str(),
                  tensor.param.sizes(), tensor.param.device().str());
    check_optimizer_operand("adamw_step", "grad", tensor.grad, tensor.param, dtype);
    check_optimizer_operand("adamw_step", "exp_avg", tensor.exp_avg, tensor.param, dtype);
    check_optimizer_operand("adamw_step", "exp_avg_sq", tensor.exp_avg_sq, tensor.param, dtype);
    std::vector<BufferUse> buffers = {buffer_use("param", tensor.param, BufferAccess::read_write),
                                      buffer_use("grad", tensor.grad, kRead),
                                      buffer_use("exp_avg", tensor.exp_avg, BufferAccess::read_write),
                                      buffer_use("exp_avg_sq", tensor.exp_avg_sq, BufferAccess::read_write)};
    void* working = nullptr;
    if (tensor.working_copy.defined()) {
      check_optimizer_operand("adamw_step", "working_copy", tensor.working_copy, tensor.param, DType::bf16);
      buffers.push_back(buffer_use("working_copy", tensor.working_copy, kWrite));
      working = operand(tensor.working_copy).data;
    }
    operands.push_back(AdamWOperands{.param = operand(tensor.param).data,
                                     .grad = operand(tensor.grad).data,
                                     .exp_avg = operand(tensor.exp_avg).data,
                                     .exp_avg_sq = operand(tensor.exp_avg_sq).data,
                                     .working_copy = working,
                                     .dtype = dtype,
                                     .count = tensor.param.numel(),
                                     .decay = tensor.decay,
                                     .step_size = tensor.step_size,
                                     .inv_sqrt_bias2 = tensor.inv_sqrt_bias2,
                                     .buffers = std::move(buffers)});
  }
  adamw_step(operands, moments.beta1, moments.beta2, moments.eps, current_stream(device).get());
}

std::vector<DenseOperand> dense_operands(const char* kernel, const std::vector<Tensor>& tensors, const Tensor& total,
                                         BufferAccess access) {
  std::vector<DenseOperand> operands;
  for (const Tensor& tensor : tensors) {
    check_float_dtype(kernel, tensor);
    check_optimizer_operand(kernel, "a tensor", tensor, tensor, tensor.dtype());
    TESSERA_CHECK(tensor.device() == total.device(), "cuda::{}: a tensor is on {}, the total on {}", kernel,
                  tensor.device().str(), total.device().str());
    operands.push_back(DenseOperand{.data = operand(tensor).data,
                                    .dtype = tensor.dtype(),
                                    .count = tensor.numel(),
                                    .buffer = buffer_use("tensor", tensor, access)});
  }
  return operands;
}

void check_total(const char* kernel, const Tensor& total) {
  TESSERA_CHECK(total.dtype() == DType::f64 && total.numel() == 1 && total.is_contiguous(),
                "cuda::{}: the total must be one contiguous f64 value, got {} {}", kernel, dtype_name(total.dtype()),
                total.sizes());
}

void sum_of_squares_kernel(const Tensor& total, const std::vector<Tensor>& tensors) {
  check_total("sum_of_squares", total);
  const std::vector<DenseOperand> operands = dense_operands("sum_of_squares", tensors, total, kRead);
  int64_t chunks = 0;
  for (const DenseOperand& operand : operands) chunks += chunks_of(operand.count);
  const Tensor partials = ops::empty({std::max<int64_t>(chunks, 1)}, {.dtype = DType::f64, .device = total.device()});
  sum_of_squares(operands, static_cast<double*>(operand(partials).data),
                 buffer_use("partials", partials, BufferAccess::read_write), static_cast<double*>(operand(total).data),
                 buffer_use("total", total, kWrite), current_stream(total.device()).get());
}

void check_index_range_kernel(const Tensor& indices, int64_t count, std::optional<int64_t> also_allowed,
                              const std::function<std::string(int64_t, int64_t)>& describe) {
  if (indices.numel() == 0) return;
  const Tensor dense = ops::contiguous(indices);
  const std::shared_ptr<Stream> stream = current_stream(dense.device());
  DeviceErrorRecord* record = error_record(*stream);
  const int64_t check = register_check(*stream, describe);
  KernelLaunch launch = launch_on_current_stream(dense.device(), {buffer_use("indices", dense, kRead)});
  launch.buffers.push_back({"error record", record, sizeof(DeviceErrorRecord), BufferAccess::read_write});
  check_index_range(operand(dense), count, also_allowed.has_value(), also_allowed.value_or(0), record, check, launch);
}

void scale_to_max_norm_kernel(const std::vector<Tensor>& tensors, const Tensor& total, double max_norm) {
  check_total("scale_to_max_norm", total);
  scale_to_max_norm(dense_operands("scale_to_max_norm", tensors, total, BufferAccess::read_write),
                    static_cast<const double*>(operand(total).data), buffer_use("total", total, kRead), max_norm,
                    current_stream(total.device()).get());
}

// --- causal attention: flash-style tiles (tensor/cuda/attention.cu) ---

// The [B * H, T, D] geometry of q, after checking that every operand named
// in `like_q` is q's shape, dtype (f32, f64 or bf16) and device with rows of
// D contiguous (other strides are free), and logsumexp is [B, H, T]
// contiguous in the accumulation dtype (f32 for bf16).
AttentionShape attention_shape(const char* op, const Tensor& q,
                               std::initializer_list<std::pair<const char*, const Tensor*>> like_q,
                               const Tensor& logsumexp) {
  TESSERA_CHECK(q.dim() == 4, "cuda::{}: q must be [B, H, T, D], got {}", op, q.sizes());
  TESSERA_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::f64 || q.dtype() == DType::bf16,
                "cuda::{}: computes f32, f64 or bf16 (with f32 accumulation), got q {}", op, dtype_name(q.dtype()));
  TESSERA_CHECK(q.size(3) <= kMaxAttentionHeadDim, "cuda::{}: head dim {} is above the {} the kernels take (q {})",
                op, q.size(3), kMaxAttentionHeadDim, q.sizes());
  TESSERA_CHECK(q.size(2) <= INT32_MAX, "cuda::{}: a sequence of {} is above 2^31 - 1", op,
                q.size(2));
  for (const auto& [name, tensor] : like_q) {
    TESSERA_CHECK(tensor->sizes() == q.sizes(), "cuda::{}: {} must be q's shape {}, got {}", op, name, q.sizes(),
                  tensor->sizes());
    TESSERA_CHECK(tensor->dtype() == q.dtype(), "cuda::{}: {} is {}, q is {}", op, name,
                  dtype_name(tensor->dtype()), dtype_name(q.dtype()));
    TESSERA_CHECK(tensor->device() == q.device(), "cuda::{}: {} on {}, q on {}", op, name, tensor->device().str(),
                  q.device().str());
    TESSERA_CHECK(tensor->stride(3) == 1 || tensor->size(3) == 1,
                  "cuda::{}: {} needs contiguous rows (a unit stride along D), got shape {} strides {}", op, name,
                  tensor->sizes(), tensor->strides());
  }
  const DType accumulation = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Shape rows{q.size(0), q.size(1), q.size(2)};
  TESSERA_CHECK(logsumexp.sizes() == rows && logsumexp.dtype() == accumulation && logsumexp.is_contiguous() &&
                    logsumexp.device() == q.device(),
                "cuda::{}: logsumexp must be {} {} (contiguous, on {}), got {} {} on {}", op,
                dtype_name(accumulation), rows, q.device().str(), dtype_name(logsumexp.dtype()), logsumexp.sizes(),
                logsumexp.device().str());
  TESSERA_CHECK(q.size(1) <= INT32_MAX, "cuda::{}: {} heads are above 2^31 - 1", op, q.size(1));
  // attention_mma launches one block per head and kAttentionMmaTile rows, a 1-D grid
  // (a logsumexp this large would take over 512 GiB: a bound, not a case to test).
  const int64_t tiles = (q.size(2) + kAttentionMmaTile - 1) / kAttentionMmaTile;
  TESSERA_CHECK(q.size(0) * q.size(1) <= INT32_MAX / std::max<int64_t>(tiles, 1),
                "cuda::{}: {} heads of {} positions need more than 2^31 - 1 blocks of {} rows", op,
                q.size(0) * q.size(1), q.size(2), kAttentionMmaTile);
  return {q.size(0) * q.size(1), static_cast<int32_t>(std::max<int64_t>(q.size(1), 1)), static_cast<int32_t>(q.size(2)),
          static_cast<int32_t>(q.size(3))};
}

void causal_attention_kernel(const Tensor& out, const Tensor& logsumexp, const Tensor& q, const Tensor& k,
                             const Tensor& v) {
  const AttentionShape shape =
      attention_shape("causal_attention", q, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}}, logsumexp);
  causal_attention(operand(out), operand(logsumexp), operand(q), operand(k), operand(v), shape,
                   launch_on_current_stream(q.device(), {buffer_use("q", q, kRead), buffer_use("k", k, kRead),
                                                         buffer_use("v", v, kRead), buffer_use("out", out, kWrite),
                                                         buffer_use("logsumexp", logsumexp, kWrite)}));
}

std::atomic<int64_t> score_grads_budget{kDefaultScoreGradsBudget};

// Three launches on the current stream. Scratch, freed for reuse on this
// stream once enqueued: delta ([B, H, T], accumulation dtype), and on tensor
// cores within attention_score_grads_budget score_grads (bf16 dS of every
// causal 64 x 64 tile: T^2 / 2 + O(T) bytes a head), which the dK/dV kernel
// writes and the dQ kernel reads.
void causal_attention_backward_kernel(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                                      const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& out, const Tensor& logsumexp) {
  const AttentionShape shape = attention_shape(
      "causal_attention_backward", q,
      {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"grad_out", &grad_out}, {"grad_q", &grad_q},
       {"grad_k", &grad_k}, {"grad_v", &grad_v}},
      logsumexp);
  const Operand q_rows = operand(q), k_rows = operand(k), v_rows = operand(v), grad_out_rows = operand(grad_out);
  const Operand grad_q_rows = operand(grad_q), grad_k_rows = operand(grad_k), grad_v_rows = operand(grad_v);
  const bool on_tensor_cores = attention_on_tensor_cores(
      shape, q.dtype(), {&q_rows, &k_rows, &v_rows, &grad_out_rows, &grad_q_rows, &grad_k_rows, &grad_v_rows});
  const bool hands_over_scores = on_tensor_cores && attention_hands_over_scores(shape);
  const Tensor score_grads =
      hands_over_scores
          ? ops::empty({attention_score_grads_elements(shape)}, {.dtype = DType::bf16, .device = q.device()})
          : Tensor();
  const Operand score_grads_rows = score_grads.defined() ? operand(score_grads) : Operand{};
  const Tensor delta = ops::empty(logsumexp.sizes(), {.dtype = logsumexp.dtype(), .device = q.device()});
  attention_row_dots(operand(delta), grad_out_rows, operand(out), shape,
                     launch_on_current_stream(q.device(), {buffer_use("grad_out", grad_out, kRead),
                                                           buffer_use("out", out, kRead),
                                                           buffer_use("delta", delta, kWrite)}));
  const Operand lse_rows = operand(logsumexp), delta_rows = operand(delta);
  // What both gradient kernels read when each recomputes the scores.
  const std::vector<BufferUse> recompute_reads{buffer_use("grad_out", grad_out, kRead), buffer_use("q", q, kRead),
                                               buffer_use("k", k, kRead), buffer_use("v", v, kRead),
                                               buffer_use("logsumexp", logsumexp, kRead),
                                               buffer_use("delta", delta, kRead)};
  std::vector<BufferUse> key_buffers = recompute_reads;
  key_buffers.push_back(buffer_use("grad_k", grad_k, kWrite));
  key_buffers.push_back(buffer_use("grad_v", grad_v, kWrite));
  if (hands_over_scores) key_buffers.push_back(buffer_use("score_grads", score_grads, kWrite));
  attention_key_grads(grad_k_rows, grad_v_rows, score_grads_rows, grad_out_rows, q_rows, k_rows, v_rows, lse_rows,
                      delta_rows, shape, launch_on_current_stream(q.device(), std::move(key_buffers)));
  std::vector<BufferUse> query_buffers = recompute_reads;
  if (hands_over_scores) {
    query_buffers = {buffer_use("k", k, kRead), buffer_use("score_grads", score_grads, kRead)};
  }
  query_buffers.push_back(buffer_use("grad_q", grad_q, kWrite));
  attention_query_grads(grad_q_rows, score_grads_rows, grad_out_rows, q_rows, k_rows, v_rows, lse_rows, delta_rows,
                        shape, launch_on_current_stream(q.device(), std::move(query_buffers)));
}

void where_kernel(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  where(operand(out), operand(condition), operand(a), operand(b),
        launch_on_current_stream(out.device(), {buffer_use("condition", condition, kRead), buffer_use("a", a, kRead),
                                                buffer_use("b", b, kRead), buffer_use("out", out, kWrite)}));
}

// --- matmul through cuBLASLt: row-major tensors as column-major descriptors ---
//
// out [M, N] row-major is cuBLASLt's column-major D [N x M] (ld N), so out =
// a b is D = op(A) op(B) with A := b (op(A) = b^T, [N x K]) and B := a
// (op(B) = a^T, [K x M]). A row-major matrix is a column-major one of its
// transpose (op N); a transposed view is column-major already (op T).

std::atomic<bool> tf32_allowed{false};

// The [rows, cols] matrix in the last two dims of `t`, as a GemmMatrix whose
// op gives its transpose ([cols x rows], column-major); none when neither of
// its last two strides is a usable unit stride.
std::optional<std::pair<GemmMatrix, GemmOp>> transposed_operand(const Tensor& t, int64_t rows, int64_t row_stride) {
  const int64_t cols = t.size(-1), col_stride = t.stride(-1);
  const GemmMatrix base{t.cuda_data(), t.dtype(), 0, 0, 0, 0};
  // Row-major: column-major [cols x rows] with ld = row_stride (a size-1 dim may have any stride).
  const int64_t row_ld = rows == 1 ? std::max<int64_t>(1, cols) : row_stride;
  if ((col_stride == 1 || cols == 1) && row_ld >= std::max<int64_t>(1, cols)) {
    GemmMatrix matrix = base;
    matrix.rows = cols, matrix.cols = rows, matrix.ld = row_ld;
    return std::pair{matrix, GemmOp::none};
  }
  // A transposed view: column-major [rows x cols] with ld = col_stride, read through op T.
  const int64_t col_ld = cols == 1 ? std::max<int64_t>(1, rows) : col_stride;
  if ((row_stride == 1 || rows == 1) && col_ld >= std::max<int64_t>(1, rows)) {
    GemmMatrix matrix = base;
    matrix.rows = rows, matrix.cols = cols, matrix.ld = col_ld;
    return std::pair{matrix, GemmOp::transpose};
  }
  return std::nullopt;
}

// The one element stride between consecutive batch matrices of `t` over its
// first `batch_dims` dims (0 when they are all broadcast); none when the
// batch dims do not merge into one stride, as cuBLASLt's strided batches need.
std::optional<int64_t> single_batch_stride(const Tensor& t, int64_t batch_dims) {
  std::optional<int64_t> stride;
  int64_t expected = 0;
  for (int64_t d = batch_dims - 1; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (!stride) {
      stride = t.stride(d);
      expected = t.stride(d) * t.size(d);
    } else if (t.stride(d) == expected) {
      expected *= t.size(d);
    } else {
      return std::nullopt;
    }
  }
  return stride.value_or(0);
}

// Returns `t` (or a dense copy of it, when its layout does not fit cuBLASLt)
// with its matrix and batch stride.
struct GemmOperand {
  Tensor tensor;  // keeps a copy alive until the GEMM is enqueued
  GemmMatrix matrix;
  GemmOp op;
};

GemmOperand gemm_operand(const Tensor& t, int64_t batch_dims) {
  const std::optional<int64_t> batch_stride = single_batch_stride(t, batch_dims);
  const auto matrix = transposed_operand(t, t.size(-2), t.stride(-2));
  if (batch_stride && matrix) {
    GemmOperand result{t, matrix->first, matrix->second};
    result.matrix.batch_stride = *batch_stride;
    return result;
  }
  const Tensor dense = ops::contiguous(t);
  GemmOperand result{dense, transposed_operand(dense, dense.size(-2), dense.stride(-2))->first, GemmOp::none};
  result.matrix.batch_stride = dense.size(-2) * dense.size(-1);
  return result;
}

// The GEMM of out [..., M, N] (contiguous) = a [..., M, K] @ b [..., K, N] as
// one cublasLtMatmul descriptor without an epilogue: a strided batch, or one
// taller GEMM when b is shared by every batch and a's batch rows follow each
// other (x [B, T, C] @ W^T). Needs M, N, K > 0. The operands (or the dense
// copies made of them) stay alive with it until the call is enqueued.
struct MatmulGemm {
  GemmDescriptor descriptor;
  GemmOperand left, right;
};

MatmulGemm matmul_gemm(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t batch_dims = out.dim() - 2, m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int64_t batches = out.numel() / (m * n);
  GemmOperand left = gemm_operand(b, batch_dims);  // cuBLASLt's A: op(A) = b^T [N x K]
  std::optional<GemmOperand> right;                // cuBLASLt's B: op(B) = a^T [K x M * rows]
  int64_t gemm_columns = m, batch_count = batches;
  if (batches > 1 && left.matrix.batch_stride == 0) {
    const std::optional<int64_t> a_batch = single_batch_stride(a, batch_dims);
    const int64_t row_stride = m == 1 && a_batch ? *a_batch : a.stride(-2);
    const auto tall = transposed_operand(a, m * batches, row_stride);
    if (a_batch && *a_batch == m * row_stride && tall && tall->second == GemmOp::none) {
      right = GemmOperand{a, tall->first, GemmOp::none};
      gemm_columns = m * batches, batch_count = 1;
    }
  }
  if (!right) right = gemm_operand(a, batch_dims);
  GemmDescriptor descriptor;
  descriptor.op_a = left.op, descriptor.op_b = right->op;
  descriptor.m = n, descriptor.n = gemm_columns, descriptor.k = k, descriptor.batch_count = batch_count;
  descriptor.a = left.matrix, descriptor.b = right->matrix;
  descriptor.d = GemmMatrix{out.cuda_data(), out.dtype(), n, gemm_columns, n, n * gemm_columns};
  descriptor.c = GemmMatrix{nullptr, out.dtype(), n, gemm_columns, n, n * gemm_columns};
  descriptor.compute = out.dtype() == DType::f64                   ? GemmCompute::f64
                       : out.dtype() == DType::f32 && allow_tf32() ? GemmCompute::f32_fast_tf32
                                                                   : GemmCompute::f32;
  return MatmulGemm{descriptor, std::move(left), std::move(*right)};
}

// out [..., M, N] (contiguous) = a [..., M, K] @ b [..., K, N] (+ bias [N])
// as one cublasLtMatmul, the bias in its epilogue.
void matmul_kernel(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  TESSERA_CHECK(out.is_contiguous() && a.dtype() == out.dtype() && b.dtype() == out.dtype() &&
                    (!bias.defined() || (bias.dtype() == out.dtype() && bias.is_contiguous())),
                "cuda::matmul: out {} {} (contiguous), a {} and b {} of its dtype, bias (contiguous) {}",
                dtype_name(out.dtype()), out.sizes(), dtype_name(a.dtype()), dtype_name(b.dtype()),
                bias.defined() ? dtype_name(bias.dtype()) : "none");
  if (out.numel() == 0) return;
  if (a.size(-1) == 0) {  // the sum over nothing, which cuBLASLt's layouts cannot describe
    fill_kernel(out, 0.0);
    if (bias.defined()) binary_kernel(BinaryOp::add, out, out, ops::expand(bias, out.sizes()));
    return;
  }
  MatmulGemm gemm = matmul_gemm(out, a, b);
  if (bias.defined()) {
    if (gemm.descriptor.compute == GemmCompute::f64) {  // no f64 epilogues (blas_lt.h): the bias is a second launch
      cuda::gemm(gemm.descriptor, current_stream(out.device()));
      return binary_kernel(BinaryOp::add, out, out, ops::expand(bias, out.sizes()));
    }
    gemm.descriptor.epilogue = GemmEpilogue::bias;
    gemm.descriptor.bias = bias.cuda_data();
  }
  cuda::gemm(gemm.descriptor, current_stream(out.device()));
}

// --- the GELU MLP's epilogues: KernelTable::matmul_gelu, matmul_gelu_backward, matmul_row_sums ---
//
// 2-d only, so each is one GEMM (batch_count 1). They decline (return false,
// launching nothing) what cuBLASLt's epilogues do not take: f64 (no f64
// epilogues, blas_lt.h), an aux matrix [M, N] (cuBLASLt's [N x M], ld N) whose
// N is not a multiple of 8 (cublasLt.h: EPILOGUE_AUX_LD), and empty products
// (K = 0 is a fill, not a GEMM).

// `tensor` is contiguous, of `like`'s dtype, with `shape`.
void check_epilogue_operand(const char* kernel, const char* role, const Tensor& tensor, const Tensor& like,
                            const Shape& shape) {
  TESSERA_CHECK(tensor.is_contiguous() && tensor.dtype() == like.dtype() && tensor.sizes() == shape,
                "cuda::{}: {} must be contiguous {} of shape {}, got {} {} strides {}", kernel, role,
                dtype_name(like.dtype()), shape, dtype_name(tensor.dtype()), tensor.sizes(), tensor.strides());
}

// Checks a [M, K] @ b [K, N] = out [M, N] and whether the epilogue takes them.
bool epilogue_takes(const char* kernel, const Tensor& out, const Tensor& a, const Tensor& b, bool with_aux) {
  TESSERA_CHECK(a.dim() == 2 && b.dim() == 2 && a.dtype() == out.dtype() && b.dtype() == out.dtype() &&
                    a.size(1) == b.size(0),
                "cuda::{}: a [M, K] and b [K, N] of out's dtype {}, got a {} {} and b {} {}", kernel,
                dtype_name(out.dtype()), dtype_name(a.dtype()), a.sizes(), dtype_name(b.dtype()), b.sizes());
  check_epilogue_operand(kernel, "out", out, out, {a.size(0), b.size(1)});
  if (out.dtype() == DType::f64 || out.numel() == 0 || a.size(1) == 0) return false;
  return !with_aux || out.size(1) % 8 == 0;
}

bool matmul_gelu_kernel(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b, const Tensor& bias) {
  if (!epilogue_takes("matmul_gelu", out, a, b, true)) return false;
  check_epilogue_operand("matmul_gelu", "pre", pre, out, out.sizes());
  if (bias.defined()) check_epilogue_operand("matmul_gelu", "bias", bias, out, {out.size(1)});
  MatmulGemm gemm = matmul_gemm(out, a, b);
  gemm.descriptor.epilogue = bias.defined() ? GemmEpilogue::gelu_aux_bias : GemmEpilogue::gelu_aux;
  gemm.descriptor.bias = bias.defined() ? bias.cuda_data() : nullptr;
  gemm.descriptor.aux = pre.cuda_data(), gemm.descriptor.aux_ld = out.size(1);
  cuda::gemm(gemm.descriptor, current_stream(out.device()));
  return true;
}

bool matmul_gelu_backward_kernel(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& pre) {
  if (!epilogue_takes("matmul_gelu_backward", out, a, b, true)) return false;
  check_epilogue_operand("matmul_gelu_backward", "pre", pre, out, out.sizes());
  MatmulGemm gemm = matmul_gemm(out, a, b);
  gemm.descriptor.epilogue = GemmEpilogue::dgelu;
  gemm.descriptor.aux = pre.cuda_data(), gemm.descriptor.aux_ld = out.size(1);
  cuda::gemm(gemm.descriptor, current_stream(out.device()));
  return true;
}

// FP8 on cuBLASLt: out [M, N] row-major is the column-major [N x M]
// op(A) op(B) with A = b ([N, K] row-major: a column-major [K x N], op T)
// and B = a (a column-major [K x M], op N): "TN", K contiguous on both sides
// as cuBLASLt's FP8 kernels want it.
bool float8_matmul_kernel(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_scale,
                          const Tensor& b_scale) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const bool fits = m % 16 == 0 && n % 16 == 0 && k % 16 == 0 && out.is_contiguous() &&
                    (out.dtype() == DType::f32 || out.dtype() == DType::bf16 || out.dtype() == DType::f16);
  if (!fits || !has_fp8_gemm(out.device().index)) return false;
  TESSERA_CHECK(a.is_contiguous() && b.is_contiguous() && b.size(1) == k && out.size(0) == m && out.size(1) == n,
                "cuda::float8_matmul: needs contiguous a [M, K], b [N, K], out [M, N], got {}, {}, {}", a.sizes(),
                b.sizes(), out.sizes());
  GemmDescriptor descriptor;
  descriptor.op_a = GemmOp::transpose, descriptor.op_b = GemmOp::none;
  descriptor.m = n, descriptor.n = m, descriptor.k = k;
  descriptor.a = GemmMatrix{b.cuda_data(), b.dtype(), k, n, k, 0};
  descriptor.b = GemmMatrix{a.cuda_data(), a.dtype(), k, m, k, 0};
  descriptor.d = GemmMatrix{out.cuda_data(), out.dtype(), n, m, n, 0};
  descriptor.c = GemmMatrix{nullptr, out.dtype(), n, m, n, 0};
  descriptor.a_scale = b_scale.cuda_data(), descriptor.b_scale = a_scale.cuda_data();
  cuda::gemm(descriptor, current_stream(out.device()));
  return true;
}

// cuBLASLt's B is a (op(B) = a^T, [K x M]): BGRADB's sum over k of op(B) is
// the row sums of a.
bool matmul_row_sums_kernel(const Tensor& out, const Tensor& row_sums, const Tensor& a, const Tensor& b) {
  if (!epilogue_takes("matmul_row_sums", out, a, b, false)) return false;
  check_epilogue_operand("matmul_row_sums", "row_sums", row_sums, out, {out.size(0)});
  MatmulGemm gemm = matmul_gemm(out, a, b);
  gemm.descriptor.epilogue = GemmEpilogue::bgradb;
  gemm.descriptor.bias = row_sums.cuda_data();
  cuda::gemm(gemm.descriptor, current_stream(out.device()));
  return true;
}


// ---- row-wise kernels: softmax, norms, cross-entropy (contiguous rows) ----

DType accumulator_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

int64_t row_length(const Tensor& x) { return x.dim() == 0 ? 1 : x.size(-1); }
int64_t row_total(const Tensor& x) { return row_length(x) == 0 ? 0 : x.numel() / row_length(x); }

// `tensor` is contiguous, of `dtype`, with `count` elements (a row-wise operand or statistic).
void check_row_operand(const char* op, const char* role, const Tensor& tensor, DType dtype, int64_t count) {
  TESSERA_CHECK(tensor.is_contiguous() && tensor.dtype() == dtype && tensor.numel() == count,
                "cuda::{}: {} must be contiguous {} with {} elements, got {} of shape {} strides {}", op, role,
                dtype_name(dtype), count, dtype_name(tensor.dtype()), tensor.sizes(), tensor.strides());
}

void softmax_kernel(const Tensor& out, const Tensor& x, bool log) {
  check_row_operand("softmax", "x", x, x.dtype(), x.numel());
  check_row_operand("softmax", "out", out, x.dtype(), x.numel());
  softmax(operand(out), operand(x), row_total(x), row_length(x), log,
          launch_on_current_stream(out.device(), {buffer_use("x", x, kRead), buffer_use("out", out, kWrite)}));
}

void softmax_backward_kernel(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y, bool log) {
  for (const auto& [role, tensor] : {std::pair{"y", &y}, std::pair{"grad_out", &grad_out}, std::pair{"grad_in", &grad_in}}) {
    check_row_operand("softmax_backward", role, *tensor, y.dtype(), y.numel());
  }
  softmax_backward(operand(grad_in), operand(grad_out), operand(y), row_total(y), row_length(y), log,
                   launch_on_current_stream(y.device(), {buffer_use("grad_out", grad_out, kRead),
                                                         buffer_use("y", y, kRead),
                                                         buffer_use("grad_in", grad_in, kWrite)}));
}

// The shapes a norm kernel takes: x [rows, cols] with cols <= kNormMaxColumns,
// weight/bias [cols] of x's dtype, statistics [rows] in the arithmetic dtype.
void check_norm_operands(const char* op, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd) {
  TESSERA_CHECK(x.dim() >= 1 && row_length(x) <= kNormMaxColumns,
                "cuda::{}: x of shape {}: the cuda kernels take rows of at most {} features", op, x.sizes(),
                kNormMaxColumns);
  check_row_operand(op, "x", x, x.dtype(), x.numel());
  if (weight.defined()) check_row_operand(op, "weight", weight, x.dtype(), row_length(x));
  const DType stats = accumulator_dtype(x.dtype());
  if (mean.defined()) check_row_operand(op, "mean", mean, stats, row_total(x));
  check_row_operand(op, "rstd", rstd, stats, row_total(x));
}

// norm, or add_norm where sum and delta are defined.
void launch_norm(const char* op, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& sum,
                 const Tensor& x, const Tensor& delta, const Tensor& weight, const Tensor& bias, double eps) {
  check_norm_operands(op, x, weight, mean, rstd);
  check_row_operand(op, "y", y, x.dtype(), x.numel());
  if (bias.defined()) check_row_operand(op, "bias", bias, x.dtype(), row_length(x));
  if (delta.defined()) {
    check_row_operand(op, "delta", delta, x.dtype(), x.numel());
    check_row_operand(op, "sum", sum, x.dtype(), x.numel());
  }
  std::vector<BufferUse> buffers{buffer_use("x", x, kRead), buffer_use("y", y, kWrite),
                                 buffer_use("rstd", rstd, kWrite)};
  declare(buffers, "delta", delta, kRead);
  declare(buffers, "sum", sum, kWrite);
  declare(buffers, "weight", weight, kRead);
  declare(buffers, "bias", bias, kRead);
  declare(buffers, "mean", mean, kWrite);
  norm(operand(y), optional_operand(mean), operand(rstd), optional_operand(sum), operand(x), optional_operand(delta),
       optional_operand(weight), optional_operand(bias), eps, row_total(x), row_length(x),
       launch_on_current_stream(x.device(), std::move(buffers)));
}

void norm_kernel(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                 const Tensor& bias, double eps) {
  launch_norm("norm", y, mean, rstd, Tensor(), x, Tensor(), weight, bias, eps);
}

void add_norm_kernel(const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                     const Tensor& delta, const Tensor& weight, const Tensor& bias, double eps) {
  TESSERA_CHECK(delta.defined() && sum.defined(), "cuda::add_norm: needs delta and sum");
  launch_norm("add_norm", y, mean, rstd, sum, x, delta, weight, bias, eps);
}

// norm_backward, or norm_backward_add where grad_residual is defined.
void launch_norm_backward(const char* op, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                          const Tensor& grad_residual, const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) {
  check_norm_operands(op, x, weight, mean, rstd);
  check_row_operand(op, "grad_y", grad_y, x.dtype(), x.numel());
  if (grad_x.defined()) check_row_operand(op, "grad_x", grad_x, x.dtype(), x.numel());
  if (grad_weight.defined()) check_row_operand(op, "grad_weight", grad_weight, x.dtype(), row_length(x));
  if (grad_bias.defined()) check_row_operand(op, "grad_bias", grad_bias, x.dtype(), row_length(x));
  if (grad_residual.defined()) {
    check_row_operand(op, "grad_residual", grad_residual, x.dtype(), x.numel());
    TESSERA_CHECK(grad_x.defined(), "cuda::{}: grad_residual is added to grad_x, which is undefined", op);
  }
  // The per-block partial sums of the weight and bias gradients (the caching
  // allocator makes this free in steady state; stream order keeps it alive).
  Tensor workspace;
  if (grad_weight.defined() || grad_bias.defined()) {
    workspace = ops::empty({norm_backward_workspace_elements(x.dtype(), row_total(x), row_length(x))},
                           {.dtype = accumulator_dtype(x.dtype()), .device = x.device()});
  }
  std::vector<BufferUse> buffers{buffer_use("grad_y", grad_y, kRead), buffer_use("x", x, kRead),
                                 buffer_use("rstd", rstd, kRead)};
  declare(buffers, "weight", weight, kRead);
  declare(buffers, "mean", mean, kRead);
  declare(buffers, "grad_residual", grad_residual, kRead);
  declare(buffers, "grad_x", grad_x, kWrite);
  declare(buffers, "grad_weight", grad_weight, kWrite);
  declare(buffers, "grad_bias", grad_bias, kWrite);
  declare(buffers, "workspace", workspace, BufferAccess::read_write);
  norm_backward(optional_operand(grad_x), optional_operand(grad_weight), optional_operand(grad_bias),
                optional_operand(workspace), optional_operand(grad_residual), operand(grad_y), operand(x),
                optional_operand(weight), optional_operand(mean), operand(rstd), row_total(x), row_length(x),
                launch_on_current_stream(x.device(), std::move(buffers)));
}

void norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                          const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd) {
  launch_norm_backward("norm_backward", grad_x, grad_weight, grad_bias, Tensor(), grad_y, x, weight, mean, rstd);
}

void norm_backward_add_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                              const Tensor& grad_residual, const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd) {
  TESSERA_CHECK(grad_residual.defined(), "cuda::norm_backward_add: needs grad_residual");
  launch_norm_backward("norm_backward_add", grad_x, grad_weight, grad_bias, grad_residual, grad_y, x, weight, mean,
                       rstd);
}

// logits [rows, columns] contiguous with 0 <= classes <= columns, targets [rows] contiguous, logsumexp [rows]
// in the arithmetic dtype.
void check_cross_entropy_operands(const char* op, const Tensor& logits, const Tensor& logsumexp,
                                  const Tensor& targets, int64_t classes) {
  TESSERA_CHECK(logits.dim() == 2, "cuda::{}: logits must be [rows, classes], got {}", op, logits.sizes());
  TESSERA_CHECK(classes >= 0 && classes <= logits.size(1), "cuda::{}: classes {} outside [0, {}] for logits {}", op,
                classes, logits.size(1), logits.sizes());
  check_row_operand(op, "logits", logits, logits.dtype(), logits.numel());
  check_row_operand(op, "targets", targets, targets.dtype(), logits.size(0));
  check_row_operand(op, "logsumexp", logsumexp, accumulator_dtype(logits.dtype()), logits.size(0));
}

void cross_entropy_kernel(const Tensor& loss, const Tensor& logsumexp, const Tensor& logits, const Tensor& targets,
                          int64_t ignore_index, int64_t classes) {
  check_cross_entropy_operands("cross_entropy", logits, logsumexp, targets, classes);
  const DType accumulator = accumulator_dtype(logits.dtype());
  check_row_operand("cross_entropy", "loss", loss, accumulator, 1);
  const Tensor row_losses = ops::empty({logits.size(0)}, {.dtype = accumulator, .device = logits.device()});
  cross_entropy(operand(loss), operand(logsumexp), operand(row_losses), operand(logits), operand(targets),
                ignore_index, logits.size(0), classes, logits.size(1),
                launch_on_current_stream(logits.device(), {buffer_use("logits", logits, kRead),
                                                           buffer_use("targets", targets, kRead),
                                                           buffer_use("row_losses", row_losses, BufferAccess::read_write),
                                                           buffer_use("logsumexp", logsumexp, kWrite),
                                                           buffer_use("loss", loss, kWrite)}));
}

void cross_entropy_backward_kernel(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                                   const Tensor& logsumexp, const Tensor& targets, int64_t ignore_index,
                                   int64_t classes) {
  check_cross_entropy_operands("cross_entropy_backward", logits, logsumexp, targets, classes);
  check_row_operand("cross_entropy_backward", "grad_logits", grad_logits, logits.dtype(), logits.numel());
  TESSERA_CHECK(grad_loss.numel() == 1, "cuda::cross_entropy_backward: grad_loss must hold one value, got shape {}",
                grad_loss.sizes());
  const DType accumulator = accumulator_dtype(logits.dtype());
  const Tensor grad_value = ops::contiguous(ops::to(grad_loss, accumulator));
  const Tensor scale = ops::empty({1}, {.dtype = accumulator, .device = logits.device()});
  cross_entropy_backward(operand(grad_logits), operand(grad_value), operand(scale), operand(logits),
                         operand(logsumexp), operand(targets), ignore_index, logits.size(0), classes, logits.size(1),
                         launch_on_current_stream(logits.device(), {buffer_use("logits", logits, kRead),
                                                                    buffer_use("logsumexp", logsumexp, kRead),
                                                                    buffer_use("targets", targets, kRead),
                                                                    buffer_use("grad_loss", grad_value, kRead),
                                                                    buffer_use("scale", scale, BufferAccess::read_write),
                                                                    buffer_use("grad_logits", grad_logits, kWrite)}));
}

}  // namespace

bool allow_tf32() { return tf32_allowed.load(); }
void set_allow_tf32(bool allow) { tf32_allowed.store(allow); }

int64_t attention_score_grads_budget() { return score_grads_budget.load(); }

void set_attention_score_grads_budget(int64_t bytes) {
  TESSERA_CHECK(bytes >= 0, "cuda::set_attention_score_grads_budget: bytes must be >= 0, got {}", bytes);
  score_grads_budget.store(bytes);
}

bool attention_hands_over_scores(const AttentionShape& shape) {
  return attention_score_grads_elements(shape) * 2 <= attention_score_grads_budget();
}

void refuse_operands(const char* kernel, const char* what, DType dtype) {
  fail("cuda::{}: {} {}", kernel, what, dtype_name(dtype));
}

const KernelTable& kernel_table() {
  static const KernelTable table{
      .fill = fill_kernel,
      .copy = copy_kernel,
      .copy_segments = copy_segments_kernel,
      .arange = arange_kernel,
      .random = random_kernel,
      .unary = unary_kernel,
      .unary_backward = unary_backward_kernel,
      .binary = binary_kernel,
      .where = where_kernel,
      .reduce = reduce_kernel,
      .max_along = max_along_kernel,
      .index_select = index_select_kernel,
      .index_add = index_add_kernel,
      .matmul = matmul_kernel,
      .matmul_gelu = matmul_gelu_kernel,
      .matmul_gelu_backward = matmul_gelu_backward_kernel,
      .matmul_row_sums = matmul_row_sums_kernel,
      .float8_matmul = float8_matmul_kernel,
      .softmax = softmax_kernel,
      .softmax_backward = softmax_backward_kernel,
      .norm = norm_kernel,
      .norm_backward = norm_backward_kernel,
      .add_norm = add_norm_kernel,
      .norm_backward_add = norm_backward_add_kernel,
      .cross_entropy = cross_entropy_kernel,
      .cross_entropy_backward = cross_entropy_backward_kernel,
      .causal_attention = causal_attention_kernel,
      .causal_attention_backward = causal_attention_backward_kernel,
      .dropout = dropout_kernel,
      .nf4_dequantize = nf4_dequantize_kernel,
      .adamw_step = adamw_step_kernel,
      .sum_of_squares = sum_of_squares_kernel,
      .scale_to_max_norm = scale_to_max_norm_kernel,
      .check_index_range = check_index_range_kernel,
      .computes_bf16 = true,
  };
  return table;
}

}  // namespace tessera::cuda
