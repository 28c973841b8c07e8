// CPU matmul: out[..., M, N] = a[..., M, K] @ b[..., K, N], one cpu::gemm per
// batch matrix (Eigen or a BLAS: gemm_backend.h). Row-major and transposed
// (column-major) operands are passed in place, so x @ W^T never copies W;
// only operands with no unit stride in their last two dims are packed. A
// bias row is added to the product afterwards, one add per element.
#include <algorithm>
#include <optional>
#include <vector>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/dtype_dispatch.h"
#include "tensor/cpu/gemm.h"
#include "tensor/parallel.h"

namespace tessera::cpu {

namespace {

// How a [rows, cols] operand with strides (row_stride, col_stride) lies in memory.
enum class Layout { row_major, col_major, strided };

struct Operand {
  const void* base;  // element 0 of batch 0
  int64_t rows, cols, row_stride, col_stride;
  Layout layout;
  int64_t leading;                // distance between rows (row_major) or columns (col_major)
  std::vector<int64_t> offsets;  // per batch, in elements
};

Layout layout_of(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  // A size-1 dim may carry any stride: it is never stepped over.
  if ((col_stride == 1 || cols == 1) && (row_stride >= cols || rows == 1)) return Layout::row_major;
  if ((row_stride == 1 || rows == 1) && (col_stride >= rows || cols == 1)) return Layout::col_major;
  return Layout::strided;
}

// Offsets of every batch matrix of `t` (leading dims = out's batch dims,
// zero strides for broadcast ones), in row-major batch order.
std::vector<int64_t> batch_offsets(const Tensor& t, int64_t batch_dims) {
  std::vector<int64_t> offsets{0};
  for (int64_t d = 0; d < batch_dims; ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(t.size(d)));
    for (int64_t offset : offsets) {
      for (int64_t i = 0; i < t.size(d); ++i) next.push_back(offset + i * t.stride(d));
    }
    offsets = std::move(next);
  }
  return offsets;
}

Operand make_operand(const Tensor& t, int64_t rows, int64_t row_stride, std::vector<int64_t> offsets) {
  const int64_t cols = t.size(-1), col_stride = t.stride(-1);
  Operand op{t.raw_data(), rows, cols, row_stride, col_stride,
             layout_of(rows, cols, row_stride, col_stride), 0, std::move(offsets)};
  if (op.layout == Layout::row_major) op.leading = rows == 1 ? cols : row_stride;
  if (op.layout == Layout::col_major) op.leading = cols == 1 ? rows : col_stride;
  if (op.layout == Layout::strided) op.leading = cols;  // after packing into a row-major scratch
  return op;
}

// The stride of one row when all dims of `t` but the last merge into one
// (x [B, T, C] -> [B*T, C]); none when they do not.
std::optional<int64_t> merged_row_stride(const Tensor& t) {
  std::optional<int64_t> stride;
  int64_t expected = 0;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
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
  return stride ? stride : t.size(-1);
}

bool batch_broadcast(const Tensor& t, int64_t batch_dims) {
  for (int64_t d = 0; d < batch_dims; ++d) {
    if (t.size(d) != 1 && t.stride(d) != 0) return false;
  }
  return true;
}

// Pointer to batch `batch` of `op`, packed row-major into `scratch` when its strides are irregular.
template <typename T>
const T* operand_data(const Operand& op, int64_t batch, std::vector<T>& scratch) {
  const T* data = static_cast<const T*>(op.base) + op.offsets[static_cast<size_t>(batch)];
  if (op.layout != Layout::strided) return data;
  scratch.resize(static_cast<size_t>(op.rows * op.cols));
  for (int64_t r = 0; r < op.rows; ++r) {
    for (int64_t c = 0; c < op.cols; ++c) scratch[r * op.cols + c] = data[r * op.row_stride + c * op.col_stride];
  }
  return scratch.data();
}

template <typename T>
void gemm_batches(T* out, const Operand& a, const Operand& b, int64_t batches) {
  const int64_t m = a.rows, k = a.cols, n = b.cols;
  const GemmBackend backend = gemm_backend();
  const auto run = [&](int64_t begin, int64_t end) {
    std::vector<T> a_scratch, b_scratch;
    for (int64_t batch = begin; batch < end; ++batch) {
      const GemmMatrix<T> lhs{operand_data<T>(a, batch, a_scratch), a.layout == Layout::col_major, a.leading};
      const GemmMatrix<T> rhs{operand_data<T>(b, batch, b_scratch), b.layout == Layout::col_major, b.leading};
      gemm(backend, m, n, k, lhs, rhs, out + batch * m * n);
    }
  };
  // One big GEMM is split across the OpenMP team by the library itself (which
  // runs serially inside our parallel region); small batched GEMMs are split
  // over batches.
  constexpr int64_t kSmallGemmWork = int64_t{1} << 21;  // multiply-adds, ~128^3
  if (batches > 1 && m * n * k < kSmallGemmWork) {
    parallel_for(batches, 1, run);
  } else {
    run(0, batches);
  }
}

// out [rows, n] += bias [n], row by row.
template <typename T>
void add_bias_rows(T* out, const T* bias, int64_t rows, int64_t n) {
  parallel_for(rows, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, n)), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t col = 0; col < n; ++col) out[row * n + col] += bias[col];
    }
  });
}

template <typename T>
void matmul_typed(const Tensor& out, const Tensor& a_tensor, const Tensor& b_tensor) {
  const int64_t batch_dims = out.dim() - 2;
  const int64_t m = a_tensor.size(-2);
  Operand a = make_operand(a_tensor, m, a_tensor.stride(-2), batch_offsets(a_tensor, batch_dims));
  Operand b = make_operand(b_tensor, b_tensor.size(-2), b_tensor.stride(-2), batch_offsets(b_tensor, batch_dims));
  // A batch of rows times one shared matrix is one taller GEMM.
  if (a.offsets.size() > 1 && batch_broadcast(b_tensor, batch_dims)) {
    const int64_t rows = m * static_cast<int64_t>(a.offsets.size());
    const std::optional<int64_t> row_stride = merged_row_stride(a_tensor);
    if (row_stride && layout_of(rows, a.cols, *row_stride, a.col_stride) != Layout::strided) {
      a = make_operand(a_tensor, rows, *row_stride, {0});
      b.offsets = {0};
    }
  }
  T* dst = out.data_ptr<T>();
  const auto batches = static_cast<int64_t>(a.offsets.size());
  if (a.cols == 0) {  // empty inner dim: the sum over nothing
    std::fill(dst, dst + out.numel(), T{0});
    return;
  }
  gemm_batches<T>(dst, a, b, batches);
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  if (out.numel() == 0) return;
  visit_float_dtype(out.dtype(), "matmul", [&]<typename T>(T) {
    matmul_typed<T>(out, a, b);
    if (bias.defined()) add_bias_rows<T>(out.data_ptr<T>(), bias.data_ptr<T>(), out.numel() / out.size(-1), out.size(-1));
  });
}

}  // namespace tessera::cpu
