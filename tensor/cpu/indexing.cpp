// CPU gather (index_select) and scatter-add (index_add) along one dim. Both
// view their contiguous operands as [outer, size, inner] rows, so the common
// case (dim 0: embedding rows) is whole-row memcpy / vectorised adds.
#include <algorithm>
#include <cstring>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/parallel.h"

namespace tessera::cpu {

namespace {

struct Rows {
  int64_t outer = 1;  // product of the dims before `dim`
  int64_t inner = 1;  // product of the dims after `dim`
};

Rows rows_around(const Tensor& tensor, int64_t dim) {
  Rows rows;
  for (int64_t d = 0; d < dim; ++d) rows.outer *= tensor.sizes()[d];
  for (int64_t d = dim + 1; d < tensor.dim(); ++d) rows.inner *= tensor.sizes()[d];
  return rows;
}

void check_contiguous(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* tensor : tensors) {
    TESSERA_CHECK(tensor->is_contiguous(), "cpu::{}: expects contiguous operands, got shape {} strides {}", op,
                  tensor->sizes(), tensor->strides());
  }
}

// Calls fn with the index tensor's values as a typed pointer (i32 or i64).
template <typename Fn>
void with_indices(const Tensor& index, Fn&& fn) {
  if (index.dtype() == DType::i32) {
    fn(index.data_ptr<int32_t>());
  } else {
    fn(index.data_ptr<int64_t>());
  }
}

// out [outer, n, inner] <- x [outer, size, inner] at rows index[j]. Word is an
// unsigned type of the element's size: a gather only moves bits.
template <typename Word>
void gather_rows(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  const Rows rows = rows_around(x, dim);
  const int64_t n = index.numel();
  const int64_t size = x.sizes()[dim];
  const int64_t inner = rows.inner;
  const int64_t row_bytes = inner * static_cast<int64_t>(sizeof(Word));
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(row_bytes, 1));
  auto* to_base = static_cast<Word*>(out.raw_data());
  const auto* from_base = static_cast<const Word*>(x.raw_data());
  with_indices(index, [&](const auto* indices) {
    parallel_for(rows.outer * n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t o = row / n;
        const Word* from = from_base + (o * size + static_cast<int64_t>(indices[row % n])) * inner;
        Word* to = to_base + row * inner;
        if (inner == 1) {
          *to = *from;
        } else {
          std::memcpy(to, from, static_cast<size_t>(row_bytes));
        }
      }
    });
  });
}

// out [outer, size, inner] += source [outer, n, inner] at rows index[i]. Work
// is split over (outer, column block) pairs: each owns disjoint output memory
// and walks all n indices in order, so duplicate indices accumulate without
// races and the result does not depend on the thread count.
template <typename T, typename Index>
void scatter_add_rows(T* out, const T* source, const Index* index, int64_t n, int64_t size, Rows rows) {
  constexpr int64_t kBlock = 128;
  const int64_t inner = rows.inner;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(n * std::min(inner, kBlock), 1));
  parallel_for(rows.outer * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / blocks;
      const int64_t c0 = (item % blocks) * kBlock;
      const int64_t width = std::min(kBlock, inner - c0);
      for (int64_t i = 0; i < n; ++i) {
        T* __restrict to = out + (o * size + static_cast<int64_t>(index[i])) * inner + c0;
        const T* __restrict from = source + (o * n + i) * inner + c0;
        for (int64_t c = 0; c < width; ++c) to[c] += from[c];
      }
    }
  });
}

}  // namespace

void index_select(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  check_contiguous("index_select", {&out, &x, &index});
  switch (x.element_size()) {
    case 1: return gather_rows<uint8_t>(out, x, dim, index);
    case 2: return gather_rows<uint16_t>(out, x, dim, index);
    case 4: return gather_rows<uint32_t>(out, x, dim, index);
    default: return gather_rows<uint64_t>(out, x, dim, index);
  }
}

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& source) {
  check_contiguous("index_add", {&out, &index, &source});
  TESSERA_CHECK(
      out.dtype() == source.dtype() && compute_dtype(out.dtype()) == out.dtype() && out.dtype() != DType::boolean,
      "cpu::index_add: expects f32, f64, i32 or i64 operands of one dtype, got {} and {}", dtype_name(out.dtype()),
      dtype_name(source.dtype()));
  const Rows rows = rows_around(out, dim);
  const int64_t n = index.numel();
  const int64_t size = out.sizes()[dim];
  with_indices(index, [&](const auto* indices) {
    visit_dtype(out.dtype(), [&]<typename T>(T) {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t> ||
                    std::is_same_v<T, int64_t>) {
        scatter_add_rows(out.data_ptr<T>(), source.data_ptr<T>(), indices, n, size, rows);
      }
    });
  });
}

void check_index_range(const Tensor& indices, int64_t count, std::optional<int64_t> also_allowed,
                       const std::function<std::string(int64_t position, int64_t value)>& describe) {
  const std::vector<int64_t> values = indices.to_vector<int64_t>();
  for (size_t position = 0; position < values.size(); ++position) {
    const int64_t value = values[position];
    if ((value >= 0 && value < count) || value == also_allowed) continue;
    fail("{}", describe(static_cast<int64_t>(position), value));
  }
}

}  // namespace tessera::cpu
