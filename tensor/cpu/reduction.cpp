// CPU reduction kernels: sum/max/min over any set of dims, and max along one
// dim with its index. f32 sums accumulate in f64 across 16 independent lanes
// (vectorised without reordering any one sum), and every split of the work
// depends on the shape only, so a result is the same bits at any thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/dtype_dispatch.h"
#include "tensor/cpu/lane_sum.h"
#include "tensor/reduction_ops.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/ops.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kRowBlock = 8192;        // a row is summed as partial sums of this many elements
constexpr int64_t kColumnBlock = 65536;    // elements per partial block of a column reduction
constexpr int64_t kWideColumns = 1024;     // from this many columns, split columns instead of rows
constexpr int64_t kColumnChunk = 256;      // columns per work item when splitting columns

// Reduces n contiguous elements over the fixed lanes of lane_sum.h.
template <typename Op, typename T>
typename Op::Acc reduce_contiguous(const T* x, int64_t n) {
  return lane_reduce(n, Op::identity(), [x](int64_t i) { return Op::load(x[i]); }, Op::combine);
}

// Reduces n elements `stride` elements apart, in order.
template <typename Op, typename T>
typename Op::Acc reduce_strided(const T* x, int64_t n, int64_t stride) {
  if (stride == 1) return reduce_contiguous<Op>(x, n);
  auto acc = Op::identity();
  for (int64_t i = 0; i < n; ++i) acc = Op::combine(acc, Op::load(x[i * stride]));
  return acc;
}

// x's dims (size-1 dims dropped) ordered by x's strides, outermost first, with
// adjacent dims merged where both x and the output allow. Strides in elements;
// a reduced dim has output stride 0.
struct Dim {
  int64_t size;
  int64_t x_stride;
  int64_t out_stride;
  bool reduced;
};

std::vector<Dim> reduction_dims(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  std::vector<Dim> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.size(d) == 1) continue;
    dims.push_back({x.size(d), x.stride(d), reduced[d] ? 0 : out.stride(d), static_cast<bool>(reduced[d])});
  }
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.x_stride > b.x_stride; });
  std::vector<Dim> merged;
  for (const Dim& dim : dims) {
    if (!merged.empty()) {
      Dim& outer = merged.back();
      if (outer.reduced == dim.reduced && outer.x_stride == dim.x_stride * dim.size &&
          outer.out_stride == dim.out_stride * dim.size) {
        outer.size *= dim.size;
        outer.x_stride = dim.x_stride;
        outer.out_stride = dim.out_stride;
        continue;
      }
    }
    merged.push_back(dim);
  }
  return merged;
}

// Offsets of the flat index `index` over `dims` (row-major among them).
std::pair<int64_t, int64_t> offsets_of(const std::vector<Dim>& dims, int64_t index) {
  int64_t x_offset = 0, out_offset = 0;
  for (size_t d = dims.size(); d-- > 0;) {
    const int64_t i = index % dims[d].size;
    index /= dims[d].size;
    x_offset += i * dims[d].x_stride;
    out_offset += i * dims[d].out_stride;
  }
  return {x_offset, out_offset};
}

int64_t numel_of(const std::vector<Dim>& dims) {
  int64_t numel = 1;
  for (const Dim& dim : dims) numel *= dim.size;
  return numel;
}

// Each row (outer kept dims) reduces one contiguous run; long rows are cut
// into kRowBlock pieces so that few rows (a full sum) still use every thread.
template <typename Op, typename T>
void reduce_rows(typename Op::Acc* out, const T* x, const std::vector<Dim>& outer, const Dim& row) {
  using Acc = typename Op::Acc;
  const int64_t rows = numel_of(outer);
  const int64_t blocks = std::max<int64_t>(1, (row.size + kRowBlock - 1) / kRowBlock);
  std::vector<Acc> partial(static_cast<size_t>(rows * blocks));
  const int64_t grain = std::max<int64_t>(1, kRowBlock / std::min(row.size, kRowBlock));
  parallel_for(rows * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t start = (unit % blocks) * kRowBlock;
      const auto [x_offset, out_offset] = offsets_of(outer, unit / blocks);
      partial[unit] = reduce_contiguous<Op>(x + x_offset + start, std::min(kRowBlock, row.size - start));
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    Acc acc = partial[r * blocks];
    for (int64_t b = 1; b < blocks; ++b) acc = Op::combine(acc, partial[r * blocks + b]);
    out[offsets_of(outer, r).second] = acc;
  }
}

// x viewed as [outer..., R, C] with C contiguous: out[outer, c] = reduce over r.
// Narrow C: R is cut into blocks whose partial columns are combined in order;
// wide C: each work item owns a chunk of columns for all of R.
template <typename Op, typename T>
void reduce_columns(typename Op::Acc* out, const T* x, const std::vector<Dim>& outer, const Dim& rows,
                    const Dim& columns) {
  using Acc = typename Op::Acc;
  const int64_t outer_count = numel_of(outer);
  const int64_t R = rows.size, C = columns.size;
  auto accumulate = [&](Acc* acc, const T* base, int64_t r_begin, int64_t r_end, int64_t c_count) {
    for (int64_t c = 0; c < c_count; ++c) acc[c] = Op::identity();
    for (int64_t r = r_begin; r < r_end; ++r) {
      const T* row = base + r * rows.x_stride;
      for (int64_t c = 0; c < c_count; ++c) acc[c] = Op::combine(acc[c], Op::load(row[c]));
    }
  };
  auto store = [&](int64_t out_offset, int64_t c_begin, const Acc* acc, int64_t c_count) {
    for (int64_t c = 0; c < c_count; ++c) out[out_offset + (c_begin + c) * columns.out_stride] = acc[c];
  };

  if (C >= kWideColumns) {
    const int64_t chunks = (C + kColumnChunk - 1) / kColumnChunk;
    parallel_for(outer_count * chunks, 1, [&](int64_t begin, int64_t end) {
      Acc acc[kColumnChunk];
      for (int64_t unit = begin; unit < end; ++unit) {
        const auto [x_offset, out_offset] = offsets_of(outer, unit / chunks);
        const int64_t c_begin = (unit % chunks) * kColumnChunk;
        const int64_t c_count = std::min(kColumnChunk, C - c_begin);
        accumulate(acc, x + x_offset + c_begin, 0, R, c_count);
        store(out_offset, c_begin, acc, c_count);
      }
    });
    return;
  }
  const int64_t rows_per_block = std::max<int64_t>(1, kColumnBlock / C);
  const int64_t blocks = (R + rows_per_block - 1) / rows_per_block;
  std::vector<Acc> partial(static_cast<size_t>(outer_count * blocks * C));
  parallel_for(outer_count * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t r_begin = (unit % blocks) * rows_per_block;
      const int64_t x_offset = offsets_of(outer, unit / blocks).first;
      accumulate(partial.data() + unit * C, x + x_offset, r_begin, std::min(R, r_begin + rows_per_block), C);
    }
  });
  std::vector<Acc> acc(static_cast<size_t>(C));
  for (int64_t o = 0; o < outer_count; ++o) {
    const Acc* first = partial.data() + o * blocks * C;
    std::copy(first, first + C, acc.begin());
    for (int64_t b = 1; b < blocks; ++b) {
      for (int64_t c = 0; c < C; ++c) acc[c] = Op::combine(acc[c], first[b * C + c]);
    }
    store(offsets_of(outer, o).second, 0, acc.data(), C);
  }
}

// Any layout: each output walks its reduced dims, the innermost as a run.
template <typename Op, typename T>
void reduce_general(typename Op::Acc* out, const T* x, const std::vector<Dim>& kept, const std::vector<Dim>& reduced) {
  const int64_t outputs = numel_of(kept);
  const Dim inner = reduced.empty() ? Dim{1, 0, 0, true} : reduced.back();
  const std::vector<Dim> outer_reduced(reduced.begin(), reduced.end() - (reduced.empty() ? 0 : 1));
  const int64_t runs = numel_of(outer_reduced);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, runs * inner.size));
  parallel_for(outputs, grain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const auto [x_offset, out_offset] = offsets_of(kept, o);
      auto acc = Op::identity();
      for (int64_t r = 0; r < runs; ++r) {
        const T* run = x + x_offset + offsets_of(outer_reduced, r).first;
        acc = Op::combine(acc, reduce_strided<Op>(run, inner.size, inner.x_stride));
      }
      out[out_offset] = acc;
    }
  });
}

template <typename Op, typename T>
void reduce_nonempty(typename Op::Acc* acc, const Tensor& acc_tensor, const Tensor& x, const std::vector<bool>& reduced) {
  const T* data = x.data_ptr<T>();
  const std::vector<Dim> dims = reduction_dims(acc_tensor, x, reduced);
  std::vector<Dim> kept, reduced_dims;
  for (const Dim& dim : dims) (dim.reduced ? reduced_dims : kept).push_back(dim);

  const bool single_reduced = reduced_dims.size() == 1;
  if (single_reduced && dims.back().reduced && dims.back().x_stride == 1) {
    reduce_rows<Op>(acc, data, kept, dims.back());
  } else if (single_reduced && dims.size() >= 2 && !dims.back().reduced && dims.back().x_stride == 1 &&
             dims[dims.size() - 2].reduced) {
    const std::vector<Dim> outer(dims.begin(), dims.end() - 2);
    reduce_columns<Op>(acc, data, outer, dims[dims.size() - 2], dims.back());
  } else {
    reduce_general<Op>(acc, data, kept, reduced_dims);
  }
}

template <typename Op, typename T>
void reduce_typed(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  using Acc = typename Op::Acc;
  // Results gather in the accumulator type, then convert into out.
  const Tensor acc_tensor =
      out.dtype() == dtype_of<Acc>::value ? out : ops::empty(out.sizes(), {.dtype = dtype_of<Acc>::value});
  Acc* acc = acc_tensor.data_ptr<Acc>();
  if (x.numel() == 0) {
    std::fill_n(acc, acc_tensor.numel(), Op::identity());
  } else {
    reduce_nonempty<Op, T>(acc, acc_tensor, x, reduced);
  }
  if (!acc_tensor.is_same(out)) copy(out, acc_tensor);
}

template <typename T>
void max_along_typed(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim) {
  const int64_t length = x.dim() == 0 ? 1 : x.size(dim);
  const int64_t step = x.dim() == 0 ? 0 : x.stride(dim) * static_cast<int64_t>(sizeof(T));
  // x at index 0 along dim, shaped like values: the loop walks the outputs.
  const Tensor first = Tensor::make(x.storage(), values.sizes(), x.strides(), x.storage_offset(), x.dtype());
  // The first NaN wins; otherwise the first strict maximum.
  auto better = [](T candidate, T best) {
    if constexpr (std::is_floating_point_v<T>) return candidate > best || (candidate != candidate && best == best);
    return candidate > best;
  };
  StridedLoop<3> loop({&values, &indices, &first});
  loop.parallel_run(std::max<int64_t>(1, 16384 / std::max<int64_t>(1, length)), [&](const auto& p, const auto& s,
                                                                                      int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const char* base = p[2] + i * s[2];
      T best = *reinterpret_cast<const T*>(base);
      int64_t best_index = 0;
      for (int64_t d = 1; d < length; ++d) {
        const T candidate = *reinterpret_cast<const T*>(base + d * step);
        if (better(candidate, best)) {
          best = candidate;
          best_index = d;
        }
      }
      *reinterpret_cast<T*>(p[0] + i * s[0]) = best;
      *reinterpret_cast<int64_t*>(p[1] + i * s[1]) = best_index;
    }
  });
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  TESSERA_CHECK(static_cast<int64_t>(reduced.size()) == x.dim() && out.dim() == x.dim(),
                "cpu::reduce: x of shape {}, out of shape {} and {} reduce flags differ in rank", x.sizes(),
                out.sizes(), reduced.size());
  TESSERA_CHECK(out.is_contiguous(), "cpu::reduce: out must be contiguous, got strides {}", out.strides());
  if (out.numel() == 0) return;
  auto run = [&]<typename T>(T) {
    switch (op) {
      case ReduceOp::sum: return reduce_typed<SumOp<T>, T>(out, x, reduced);
      case ReduceOp::max: return reduce_typed<MaxOp<T>, T>(out, x, reduced);
      case ReduceOp::min: return reduce_typed<MinOp<T>, T>(out, x, reduced);
    }
  };
  switch (x.dtype()) {
    case DType::f32: return run(float{});
    case DType::f64: return run(double{});
    case DType::i32: return run(int32_t{});
    case DType::i64: return run(int64_t{});
    case DType::boolean:
      // bool max/min are any/all: reduce the bytes as integers 0/1.
      return reduce(op, out, ops::to(x, DType::i32), reduced);
    default: break;
  }
  fail("cpu::reduce: computes in f32, f64, i32, i64 or bool, got {}", dtype_name(x.dtype()));
}

void max_along(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim) {
  TESSERA_CHECK(values.dtype() == x.dtype() && indices.dtype() == DType::i64,
                "cpu::max_along: values must be {} and indices i64, got {} and {}", dtype_name(x.dtype()),
                dtype_name(values.dtype()), dtype_name(indices.dtype()));
  if (values.numel() == 0) return;
  visit_compute_dtype(x.dtype(), "max_along", [&]<typename T>(T) { max_along_typed<T>(values, indices, x, dim); });
}

}  // namespace tessera::cpu
