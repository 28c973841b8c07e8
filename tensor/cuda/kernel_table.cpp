// The cuda kernel table: each entry declares the bytes its launch reads and
// writes (for the simulator's memcheck and stream-ordering checker) and runs
// on the current stream of the tensors' device. Entries whose kernels are
// not written yet refuse with an error naming the op.
#include <atomic>
#include <optional>

#include "tensor/cuda/blas_lt.h"
#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/indexing.h"
#include "tensor/cuda/operands.h"
#include "tensor/cuda/random.h"
#include "tensor/cuda/reduction.h"
#include "tensor/cuda/transfer.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

namespace tessera::cuda {

namespace {

constexpr BufferAccess kRead = BufferAccess::read;
constexpr BufferAccess kWrite = BufferAccess::write;

[[noreturn]] void not_on_cuda_yet(const char* op) {
  fail("{} has no cuda kernel yet (the cuda device is being built: elementwise, random, reduction and indexing "
       "ops run on it today); compute it on cpu",
       op);
}

void fill_kernel(const Tensor& out, double value) {
  fill(operand(out), value, launch_on_current_stream(out.device(), {buffer_use("out", out, kWrite)}));
}

void copy_kernel(const Tensor& dst, const Tensor& src) {
  if (src.device().is_cpu()) return copy_host_to_device(dst, src);
  if (dst.device().is_cpu()) return copy_device_to_host(dst, src);
  TESSERA_CHECK(src.device() == dst.device(), "copy: between {} and {}; copy through the host", src.device().str(),
                dst.device().str());
  copy(operand(dst), operand(src),
       launch_on_current_stream(dst.device(), {buffer_use("in", src, kRead), buffer_use("out", dst, kWrite)}));
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
  reduce(op, operand(out), operand(x), geometry,
         launch_on_current_stream(out.device(), {buffer_use("x", x, kRead), buffer_use("out", out, kWrite)}));
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
  index_add(operand(out), operand(index), operand(source), rows_around(out, dim, index.numel()),
            launch_on_current_stream(out.device(), {buffer_use("source", source, kRead),
                                                    buffer_use("index", index, kRead),
                                                    buffer_use("out", out, BufferAccess::read_write)}));
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

// out [..., M, N] (contiguous) = a [..., M, K] @ b [..., K, N] (+ bias [N])
// as one cublasLtMatmul: a strided batch, or one taller GEMM when b is shared
// by every batch and a's batch rows follow each other (x [B, T, C] @ W^T).
void matmul_kernel(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  TESSERA_CHECK(out.is_contiguous() && a.dtype() == out.dtype() && b.dtype() == out.dtype() &&
                    (!bias.defined() || (bias.dtype() == out.dtype() && bias.is_contiguous())),
                "cuda::matmul: out {} {} (contiguous), a {} and b {} of its dtype, bias (contiguous) {}",
                dtype_name(out.dtype()), out.sizes(), dtype_name(a.dtype()), dtype_name(b.dtype()),
                bias.defined() ? dtype_name(bias.dtype()) : "none");
  if (out.numel() == 0) return;
  const int64_t batch_dims = out.dim() - 2, m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (k == 0) {  // the sum over nothing, which cuBLASLt's layouts cannot describe
    fill_kernel(out, 0.0);
    if (bias.defined()) binary_kernel(BinaryOp::add, out, out, ops::expand(bias, out.sizes()));
    return;
  }
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
  if (bias.defined()) {
    if (descriptor.compute == GemmCompute::f64) {  // no f64 epilogues (blas_lt.h): the bias is a second launch
      cuda::gemm(descriptor, current_stream(out.device()));
      return binary_kernel(BinaryOp::add, out, out, ops::expand(bias, out.sizes()));
    }
    descriptor.epilogue = GemmEpilogue::bias;
    descriptor.bias = bias.cuda_data();
  }
  cuda::gemm(descriptor, current_stream(out.device()));
}

}  // namespace

bool allow_tf32() { return tf32_allowed.load(); }
void set_allow_tf32(bool allow) { tf32_allowed.store(allow); }

void refuse_operands(const char* kernel, const char* what, DType dtype) {
  fail("cuda::{}: {} {}", kernel, what, dtype_name(dtype));
}

const KernelTable& kernel_table() {
  static const KernelTable table{
      .fill = fill_kernel,
      .copy = copy_kernel,
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
      .softmax = [](const Tensor&, const Tensor&, bool) { not_on_cuda_yet("softmax"); },
      .softmax_backward = [](const Tensor&, const Tensor&, const Tensor&, bool) { not_on_cuda_yet("softmax"); },
      .norm = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 double) { not_on_cuda_yet("layer_norm/rms_norm"); },
      .norm_backward = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&) { not_on_cuda_yet("layer_norm/rms_norm"); },
      .cross_entropy = [](const Tensor&, const Tensor&, const Tensor&, int64_t) { not_on_cuda_yet("cross_entropy"); },
      .cross_entropy_backward = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   int64_t) { not_on_cuda_yet("cross_entropy"); },
      .causal_attention = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&) { not_on_cuda_yet("causal_attention"); },
      .causal_attention_backward = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&) { not_on_cuda_yet("causal_attention"); },
      .dropout = [](const Tensor&, const Tensor&, const Tensor&, double, PhiloxKey) { not_on_cuda_yet("dropout"); },
  };
  return table;
}

}  // namespace tessera::cuda
