// Reductions on the device: sum, max and min over any set of dims, and the
// maximum along one dim with its index. Each output is reduced by a group of
// threads (a power of two up to the block, sized to the reduction), each
// thread striding over the reduced elements, then a fixed tree in shared
// memory: no atomics, so a result is the same on every run. Accumulators are
// the cpu's (f64 for float sums, i64 for integer ones).
#include "tensor/cuda/reduction.h"

#include <limits>

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

// The smallest power of two covering `count`, at most a block.
int group_size(int64_t count) {
  int group = 1;
  while (group < kThreads && group < count) group *= 2;
  return group;
}

}  // namespace

void reduce(ReduceOp op, const Operand& out, const Operand& x, const ReduceGeometry& geometry,
            const KernelLaunch& launch) {
  if (geometry.outputs == 0) return;
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
