// Reductions on the device: sum, max and min over any set of dims, and the
// maximum along one dim with its index. Two shapes of work, both fixed
// orders with no atomics, so a result is the same on every run:
// - rows: each output is reduced by a group of threads (a power of two up to
//   the block, sized to the reduction), each thread striding over the
//   reduced elements, then a fixed tree in shared memory. For reduced
//   elements that are adjacent in memory (a row's sum).
// - columns: the reduced elements are one strided dim whose stride is wider
//   than a warp, the outputs lie closer together (a bias gradient: the sum
//   of [rows, cols] over rows). Adjacent lanes take adjacent outputs, so a
//   warp's loads are coalesced; the rows are split among the block's warps
//   and among blocks (grid.y chunks) to fill the GPU, and a second pass adds
//   each output's chunk partials in chunk order.
// Accumulators are the cpu's (f64 for float sums, i64 for integer ones).
#include "tensor/cuda/reduction.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "tensor/cuda/kernel_loop.h"
#include "tensor/element_conversion.h"
#include "tensor/reduction_ops.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

namespace {

// Groups of `group` threads (a power of two dividing kThreads) each reduce
// one output per round.
template <typename Op, typename T, typename Out>
__global__ void __launch_bounds__(kThreads) reduce_kernel(Out* out, const T* x, ReduceGeometry geometry, int group) {
  using Acc = typename Op::Acc;
  __shared__ Acc partial[kThreads];
  const int lane = static_cast<int>(threadIdx.x) % group;
  const int64_t per_block = kThreads / group;
  for (int64_t base = blockIdx.x * per_block; base < geometry.outputs; base += gridDim.x * per_block) {
    const int64_t output = base + threadIdx.x / group;
    Acc acc = Op::identity();
    if (output < geometry.outputs) {
      const int64_t origin = geometry.kept.offset(output);
      for (int64_t r = lane; r < geometry.reduced_count; r += group) {
        acc = Op::combine(acc, Op::load(x[origin + geometry.reduced.offset(r)]));
      }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = group / 2; stride > 0; stride /= 2) {
      if (lane < stride) partial[threadIdx.x] = Op::combine(partial[threadIdx.x], partial[threadIdx.x + stride]);
      __syncthreads();
    }
    if (lane == 0 && output < geometry.outputs) out[output] = convert<Out>(partial[threadIdx.x]);
    __syncthreads();  // the next round reuses partial
  }
}

// The column shape: a block is kColumnLanes adjacent outputs by kColumnWarps
// warps; each chunk of rows at least kMinChunkRows (so the partials add at
// most ~3% to a bf16 input's bytes), as many chunks as bring the grid to
// about kColumnTargetBlocks (8 blocks of 256 threads on each of an H100's 132
// SMs, 2048 threads each).
constexpr int kColumnLanes = 32;
constexpr int kColumnWarps = kThreads / kColumnLanes;
constexpr int64_t kMinChunkRows = 256;
constexpr int64_t kColumnTargetBlocks = 1024;

// x: [rows, outputs], row r of output o at r * row_stride + kept.offset(o).
// Block (bx, c): outputs bx * 32 + lane; warp w adds rows c * rows_per_chunk
// + w, + w + 8, ... of the chunk in row order, the 8 warps' sums are added
// by a fixed tree, and the block writes its chunk's partial (partials[c *
// outputs + o]), or the result itself when there is one chunk.
template <typename Op, typename T, typename Out>
__global__ void __launch_bounds__(kThreads) reduce_columns_kernel(Out* out, typename Op::Acc* partials, const T* x,
                                                                  Layout kept, int64_t outputs, int64_t rows,
                                                                  int64_t row_stride, int64_t rows_per_chunk) {
  using Acc = typename Op::Acc;
  __shared__ Acc warp_sums[kColumnWarps][kColumnLanes];
  const int lane = static_cast<int>(threadIdx.x) % kColumnLanes;
  const int warp = static_cast<int>(threadIdx.x) / kColumnLanes;
  const int64_t output = static_cast<int64_t>(blockIdx.x) * kColumnLanes + lane;
  const int64_t chunk_end = std::min(rows, (static_cast<int64_t>(blockIdx.y) + 1) * rows_per_chunk);
  Acc acc = Op::identity();
  if (output < outputs) {
    const T* column = x + kept.offset(output);
    int64_t r = static_cast<int64_t>(blockIdx.y) * rows_per_chunk + warp;
    // Four rows' loads in flight before they are added, in row order.
    for (; r + 3 * kColumnWarps < chunk_end; r += 4 * kColumnWarps) {
      T values[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) values[k] = column[(r + k * kColumnWarps) * row_stride];
#pragma unroll
      for (int k = 0; k < 4; ++k) acc = Op::combine(acc, Op::load(values[k]));
    }
    for (; r < chunk_end; r += kColumnWarps) acc = Op::combine(acc, Op::load(column[r * row_stride]));
  }
  warp_sums[warp][lane] = acc;
  __syncthreads();
  for (int stride = kColumnWarps / 2; stride > 0; stride /= 2) {
    if (warp < stride) warp_sums[warp][lane] = Op::combine(warp_sums[warp][lane], warp_sums[warp + stride][lane]);
    __syncthreads();
  }
  if (warp != 0 || output >= outputs) return;
  if (gridDim.y == 1) {
    out[output] = convert<Out>(warp_sums[0][lane]);
  } else {
    partials[static_cast<int64_t>(blockIdx.y) * outputs + output] = warp_sums[0][lane];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) max_along_kernel(T* values, int64_t* indices, const T* x, Layout first,
                                                           int64_t count, int64_t length, int64_t step) {
  for (int64_t o = first_index(); o < count; o += index_stride()) {
    const T* element = x + first.offset(o);
    T best = *element;
    int64_t best_index = 0;
#pragma unroll 1
    for (int64_t d = 1; d < length; ++d) {
      element += step;
      const T candidate = *element;
      bool better = candidate > best;
      if constexpr (std::is_floating_point_v<T>) better = better || (candidate != candidate && best == best);
      if (better) {
        best = candidate;
        best_index = d;
      }
    }
    values[o] = best;
    indices[o] = best_index;
  }
}

// Calls fn(T{}) for the dtypes reduce reads: f32, f64, i32, i64 and bf16
// (bool goes through i32).
template <typename Fn>
void visit_reduced(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) return fn(BFloat16{});
  visit_numeric(dtype, "reduce", "reads f32, f64, i32, i64 or bf16 (bool goes through i32), got", fn);
}

// A column reduction's split: x as [rows, outputs] with rows row_stride
// apart, the rows in `chunks` chunks of rows_per_chunk.
struct ColumnPlan {
  int64_t rows = 0, row_stride = 0, rows_per_chunk = 0, chunks = 0, column_blocks = 0;
};

// The column plan for `geometry`, if it takes the column shape: the reduced
// dims merge into one whose stride is at least a warp wide (narrower rows
// share sectors, which the rows shape reads well) and wider than the
// innermost kept dim's.
std::optional<ColumnPlan> column_plan(const ReduceGeometry& geometry) {
  if (geometry.reduced_count == 0 || geometry.kept.dims == 0) return std::nullopt;
  ColumnPlan plan;
  plan.rows = geometry.reduced_count;
  int64_t reach = 0;  // the reduced dims, innermost first, must nest into one stride
  for (int32_t dim = geometry.reduced.dims - 1; dim >= 0; --dim) {
    const int64_t size = geometry.reduced.sizes[dim], stride = geometry.reduced.strides[dim];
    if (size == 1) continue;
    if (plan.row_stride == 0) {
      plan.row_stride = stride;
    } else if (stride != reach) {
      return std::nullopt;
    }
    reach = stride * size;
  }
  int64_t kept_stride = 0;
  for (int32_t dim = geometry.kept.dims - 1; dim >= 0 && kept_stride == 0; --dim) {
    if (geometry.kept.sizes[dim] > 1) kept_stride = geometry.kept.strides[dim];
  }
  if (plan.row_stride < kColumnLanes || kept_stride <= 0 || kept_stride >= plan.row_stride) return std::nullopt;
  plan.column_blocks = (geometry.outputs + kColumnLanes - 1) / kColumnLanes;
  const int64_t wanted_chunks = std::max<int64_t>(1, kColumnTargetBlocks / plan.column_blocks);
  plan.rows_per_chunk = std::max(kMinChunkRows, (plan.rows + wanted_chunks - 1) / wanted_chunks);
  plan.chunks = (plan.rows + plan.rows_per_chunk - 1) / plan.rows_per_chunk;
  return plan;
}

// The column shape, two passes: chunk partials, then their sum per output
// (the same kernel on the [chunks, outputs] partials, in Acc).
template <template <typename> class OpOf, typename T, typename Out>
void reduce_columns(const ColumnPlan& plan, const Operand& out, const Operand& workspace, const Operand& x,
                    const ReduceGeometry& geometry, const KernelLaunch& launch) {
  using Acc = typename OpOf<T>::Acc;
  LaunchConfig config = config_for(1, launch);
  config.grid = dim3(static_cast<unsigned>(plan.column_blocks), static_cast<unsigned>(plan.chunks));
  Acc* partials = static_cast<Acc*>(workspace.data);
  TESSERA_LAUNCH((reduce_columns_kernel<OpOf<T>, T, Out>), config, static_cast<Out*>(out.data), partials,
                 static_cast<const T*>(x.data), geometry.kept, geometry.outputs, plan.rows, plan.row_stride,
                 plan.rows_per_chunk);
  if (plan.chunks == 1) return;
  Layout dense;
  dense.dims = 1;
  dense.sizes[0] = geometry.outputs;
  dense.strides[0] = 1;
  config.grid = dim3(static_cast<unsigned>(plan.column_blocks), 1);
  TESSERA_LAUNCH((reduce_columns_kernel<OpOf<Acc>, Acc, Out>), config, static_cast<Out*>(out.data),
                 static_cast<Acc*>(nullptr), static_cast<const Acc*>(partials), dense, geometry.outputs, plan.chunks,
                 geometry.outputs, plan.chunks);
}

// The smallest power of two covering `count`, at most a block.
int group_size(int64_t count) {
  int group = 1;
  while (group < kThreads && group < count) group *= 2;
  return group;
}

}  // namespace

int64_t reduce_workspace_elements(const ReduceGeometry& geometry) {
  const std::optional<ColumnPlan> plan = column_plan(geometry);
  return plan && plan->chunks > 1 ? plan->chunks * geometry.outputs : 0;
}

void reduce(ReduceOp op, const Operand& out, const Operand& workspace, const Operand& x,
            const ReduceGeometry& geometry, const KernelLaunch& launch) {
  if (geometry.outputs == 0) return;
  if (const std::optional<ColumnPlan> plan = column_plan(geometry)) {
    return visit_reduced(x.dtype, [&]<typename T>(T) {
      visit_dtype(out.dtype, [&]<typename Out>(Out) {
        switch (op) {
          case ReduceOp::sum: return reduce_columns<SumOp, T, Out>(*plan, out, workspace, x, geometry, launch);
          case ReduceOp::max: return reduce_columns<MaxOp, T, Out>(*plan, out, workspace, x, geometry, launch);
          case ReduceOp::min: return reduce_columns<MinOp, T, Out>(*plan, out, workspace, x, geometry, launch);
        }
      });
    });
  }
  const int group = group_size(geometry.reduced_count);
  const int64_t blocks_needed = (geometry.outputs * group + kThreads - 1) / kThreads;
  visit_reduced(x.dtype, [&]<typename T>(T) {
    visit_dtype(out.dtype, [&]<typename Out>(Out) {
      LaunchConfig config = config_for(blocks_needed * kThreads, launch);
      const T* data = static_cast<const T*>(x.data);
      Out* result = static_cast<Out*>(out.data);
      switch (op) {
        case ReduceOp::sum: return TESSERA_LAUNCH((reduce_kernel<SumOp<T>, T, Out>), config, result, data, geometry, group);
        case ReduceOp::max: return TESSERA_LAUNCH((reduce_kernel<MaxOp<T>, T, Out>), config, result, data, geometry, group);
        case ReduceOp::min: return TESSERA_LAUNCH((reduce_kernel<MinOp<T>, T, Out>), config, result, data, geometry, group);
      }
    });
  });
}

void max_along(const Operand& values, const Operand& indices, const Operand& first, int64_t length, int64_t step,
               const KernelLaunch& launch) {
  visit_numeric(values.dtype, "max_along", "computes in f32, f64, i32 or i64, got", [&]<typename T>(T) {
    TESSERA_LAUNCH(max_along_kernel<T>, config_for(values.count, launch), static_cast<T*>(values.data),
                   static_cast<int64_t*>(indices.data), static_cast<const T*>(first.data), first.layout, values.count,
                   length, step);
  });
}

}  // namespace tessera::cuda
