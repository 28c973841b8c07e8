// Gather (index_select) and deterministic scatter-add (index_add) along one
// dim, on contiguous operands viewed as [outer, size, inner].
#include "tensor/cuda/indexing.h"

#include "tensor/cuda/kernel_loop.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

namespace {

// A block per output row: one thread reads the row's index into shared
// memory, every thread copies columns of the row (each index read once).
template <typename Word, typename Index>
__global__ void __launch_bounds__(kThreads) index_select_kernel(Word* out, const Word* x, const Index* index,
                                                               IndexGeometry geometry) {
  __shared__ int64_t source_row;
  const int64_t rows = geometry.outer * geometry.count;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t outer = row / geometry.count, j = row % geometry.count;
    if (threadIdx.x == 0) source_row = outer * geometry.size + static_cast<int64_t>(index[j]);
    __syncthreads();
    const Word* from = x + source_row * geometry.inner;
    Word* to = out + row * geometry.inner;
    for (int64_t column = threadIdx.x; column < geometry.inner; column += blockDim.x) to[column] = from[column];
    __syncthreads();  // source_row is rewritten next round
  }
}

// Each thread owns one (outer, inner) column and walks the indices in order;
// a block stages the indices through shared memory, kThreads at a time, so
// each is read from device memory once per block.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) index_add_kernel(T* out, const T* source, const Index* index,
                                                           IndexGeometry geometry) {
  __shared__ int64_t staged[kThreads];
  const int64_t columns = geometry.outer * geometry.inner;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x; base < columns;
       base += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t item = base + threadIdx.x;
    const bool active = item < columns;
    const int64_t outer = active ? item / geometry.inner : 0, column = active ? item % geometry.inner : 0;
    for (int64_t tile = 0; tile < geometry.count; tile += kThreads) {
      const int64_t in_tile = geometry.count - tile < kThreads ? geometry.count - tile : kThreads;
      if (threadIdx.x < in_tile) staged[threadIdx.x] = static_cast<int64_t>(index[tile + threadIdx.x]);
      __syncthreads();
      for (int64_t k = 0; active && k < in_tile; ++k) {
        const int64_t i = tile + k;
        T& target = out[(outer * geometry.size + staged[k]) * geometry.inner + column];
        const T addend = source[(outer * geometry.count + i) * geometry.inner + column];
        if constexpr (std::is_floating_point_v<T>) {
          target = target + addend;
        } else {
          using U = std::make_unsigned_t<T>;  // wraps, as two's complement hardware does
          target = static_cast<T>(static_cast<U>(target) + static_cast<U>(addend));
        }
      }
      __syncthreads();  // the next tile overwrites staged
    }
  }
}

// Calls fn(Index{}) for the index dtype (i32 or i64).
template <typename Fn>
void visit_index(DType dtype, const char* kernel, Fn&& fn) {
  if (dtype == DType::i32) return fn(int32_t{});
  if (dtype == DType::i64) return fn(int64_t{});
  refuse_operands(kernel, "takes i32 or i64 indices, got", dtype);
}

}  // namespace

void index_select(const Operand& out, const Operand& x, const Operand& index, const IndexGeometry& geometry,
                  const KernelLaunch& launch) {
  const int64_t rows = geometry.outer * geometry.count;
  if (rows == 0 || geometry.inner == 0) return;
  visit_index(index.dtype, "index_select", [&]<typename Index>(Index) {
    visit_word(x.dtype, [&]<typename Word>(Word) {
      TESSERA_LAUNCH((index_select_kernel<Word, Index>), config_for(rows * kThreads, launch), static_cast<Word*>(out.data),
                     static_cast<const Word*>(x.data), static_cast<const Index*>(index.data), geometry);
    });
  });
}

void index_add(const Operand& out, const Operand& index, const Operand& source, const IndexGeometry& geometry,
               const KernelLaunch& launch) {
  const int64_t columns = geometry.outer * geometry.inner;
  if (columns == 0 || geometry.count == 0) return;
  visit_index(index.dtype, "index_add", [&]<typename Index>(Index) {
    visit_numeric(out.dtype, "index_add", "adds f32, f64, i32 or i64, got", [&]<typename T>(T) {
      TESSERA_LAUNCH((index_add_kernel<T, Index>), config_for(columns, launch), static_cast<T*>(out.data),
                     static_cast<const T*>(source.data), static_cast<const Index*>(index.data), geometry);
    });
  });
}

}  // namespace tessera::cuda
