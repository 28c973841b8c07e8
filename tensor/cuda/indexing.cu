// Gather (index_select) and deterministic scatter-add (index_add) along one
// dim, on contiguous operands viewed as [outer, size, inner].
#include "tensor/cuda/indexing.h"

#include "tensor/cuda/kernel_loop.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

namespace {

template <typename Word, typename Index>
__global__ void __launch_bounds__(kThreads) index_select_kernel(Word* out, const Word* x, const Index* index,
                                                               IndexGeometry geometry) {
  const int64_t total = geometry.outer * geometry.count * geometry.inner;
  for (int64_t e = first_index(); e < total; e += index_stride()) {
    const int64_t row = e / geometry.inner, column = e % geometry.inner;
    const int64_t outer = row / geometry.count, j = row % geometry.count;
    out[e] = x[(outer * geometry.size + static_cast<int64_t>(index[j])) * geometry.inner + column];
  }
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) index_add_kernel(T* out, const T* source, const Index* index,
                                                           IndexGeometry geometry) {
  const int64_t columns = geometry.outer * geometry.inner;
  for (int64_t item = first_index(); item < columns; item += index_stride()) {
    const int64_t outer = item / geometry.inner, column = item % geometry.inner;
    for (int64_t i = 0; i < geometry.count; ++i) {
      T& target = out[(outer * geometry.size + static_cast<int64_t>(index[i])) * geometry.inner + column];
      const T addend = source[(outer * geometry.count + i) * geometry.inner + column];
      if constexpr (std::is_floating_point_v<T>) {
        target = target + addend;
      } else {
        using U = std::make_unsigned_t<T>;  // wraps, as two's complement hardware does
        target = static_cast<T>(static_cast<U>(target) + static_cast<U>(addend));
      }
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
  const int64_t total = geometry.outer * geometry.count * geometry.inner;
  if (total == 0) return;
  visit_index(index.dtype, "index_select", [&]<typename Index>(Index) {
    const auto run = [&]<typename Word>(Word) {
      TESSERA_LAUNCH((index_select_kernel<Word, Index>), config_for(total, launch), static_cast<Word*>(out.data),
                     static_cast<const Word*>(x.data), static_cast<const Index*>(index.data), geometry);
    };
    switch (element_size(x.dtype)) {
      case 1: return run(uint8_t{});
      case 2: return run(uint16_t{});
      case 4: return run(uint32_t{});
      default: return run(uint64_t{});
    }
  });
}

void index_add(const Operand& out, const Operand& index, const Operand& source, const IndexGeometry& geometry,
               const KernelLaunch& launch) {
  const int64_t columns = geometry.outer * geometry.inner;
  if (columns == 0 || geometry.count == 0) return;
  visit_index(index.dtype, "index_add", [&]<typename Index>(Index) {
    const auto run = [&]<typename T>(T) {
      TESSERA_LAUNCH((index_add_kernel<T, Index>), config_for(columns, launch), static_cast<T*>(out.data),
                     static_cast<const T*>(source.data), static_cast<const Index*>(index.data), geometry);
    };
    switch (out.dtype) {
      case DType::f32: return run(float{});
      case DType::f64: return run(double{});
      case DType::i32: return run(int32_t{});
      case DType::i64: return run(int64_t{});
      default: refuse_operands("index_add", "adds f32, f64, i32 or i64, got", out.dtype);
    }
  });
}

}  // namespace tessera::cuda
