// Softmax and log_softmax on the device, forward and backward: a row per
// group of threads (row_group.h), read once into registers where it fits
// (up to 8192 columns), the maximum and the sums by fixed trees. The
// formulas are the cpu's (tensor/cpu/normalization.cpp):
//   softmax      y = exp(x - max) / sum,    dx = y (g - <g, y>)
//   log_softmax  y = (x - max) - log(sum),  dx = g - exp(y) sum(g)
// Sums accumulate in f32 for f32 and bf16 rows, in f64 for f64 ones. Longer
// rows take the online maximum and sum in one read, then a second read to
// write.
#include "tensor/cuda/softmax.h"

#include "tensor/cuda/portability.h"
#include "tensor/cuda/row_group.h"

namespace tessera::cuda {

namespace {

struct Max {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return a > b ? a : b;
  }
};

template <typename T, int kGroupThreads, int kPerThread>
__global__ void __launch_bounds__(RowGroup<kGroupThreads>::kBlockThreads)
    softmax_kernel(T* out, const T* x, int64_t rows, int64_t cols, bool log) {
  using Group = RowGroup<kGroupThreads>;
  using A = Accumulator<T>;
  for (int64_t row = Group::first(); row < rows; row += Group::stride()) {
    const RowSlice<T, kGroupThreads, kPerThread> slice(x + row * cols, cols, Group::lane());
    T* y = out + row * cols;
    A max, sum;
    if constexpr (kPerThread > 0) {
      max = -std::numeric_limits<A>::infinity();
      slice.for_each([&](int, int64_t, A value) { max = value > max ? value : max; });
      max = Group::all_reduce(max, Max{});
      sum = 0;
      slice.for_each([&](int, int64_t, A value) { sum += std::exp(value - max); });
      sum = Group::all_reduce(sum, Plus{});
    } else {
      MaxSum<A> state = MaxSum<A>::none();
      slice.for_each([&](int, int64_t, A value) { state.add(value); });
      state = Group::all_reduce(state, Combine{});
      max = state.max;
      sum = state.sum;
    }
    if (log) {
      const A log_sum = std::log(sum);
      slice.for_each([&](int, int64_t col, A value) { y[col] = convert<T>((value - max) - log_sum); });
    } else {
      const A inverse = A(1) / sum;
      slice.for_each([&](int, int64_t col, A value) { y[col] = convert<T>(std::exp(value - max) * inverse); });
    }
  }
}

template <typename T, int kGroupThreads, int kPerThread>
__global__ void __launch_bounds__(RowGroup<kGroupThreads>::kBlockThreads)
    softmax_backward_kernel(T* grad_in, const T* grad_out, const T* y, int64_t rows, int64_t cols, bool log) {
  using Group = RowGroup<kGroupThreads>;
  using A = Accumulator<T>;
  for (int64_t row = Group::first(); row < rows; row += Group::stride()) {
    const RowSlice<T, kGroupThreads, kPerThread> g(grad_out + row * cols, cols, Group::lane());
    const RowSlice<T, kGroupThreads, kPerThread> p(y + row * cols, cols, Group::lane());
    T* dx = grad_in + row * cols;
    A total = 0;  // sum(g) for log_softmax, <g, y> for softmax
    if (log) {
      g.for_each([&](int, int64_t, A value) { total += value; });
    } else {
      g.for_each([&](int i, int64_t col, A value) { total += value * p.at(i, col); });
    }
    total = Group::all_reduce(total, Plus{});
    if (log) {
      g.for_each([&](int i, int64_t col, A value) { dx[col] = convert<T>(value - std::exp(p.at(i, col)) * total); });
    } else {
      g.for_each([&](int i, int64_t col, A value) { dx[col] = convert<T>(p.at(i, col) * (value - total)); });
    }
  }
}

}  // namespace

void softmax(const Operand& out, const Operand& x, int64_t rows, int64_t cols, bool log, const KernelLaunch& launch) {
  if (rows == 0 || cols == 0) return;
  visit_row_dtype(x.dtype, "softmax", [&]<typename T>(T) {
    visit_row_shape(cols, [&]<int kGroupThreads, int kPerThread>() {
      TESSERA_LAUNCH((softmax_kernel<T, kGroupThreads, kPerThread>), row_config<kGroupThreads>(rows, launch),
                     static_cast<T*>(out.data), static_cast<const T*>(x.data), rows, cols, log);
    });
  });
}

void softmax_backward(const Operand& grad_in, const Operand& grad_out, const Operand& y, int64_t rows, int64_t cols,
                      bool log, const KernelLaunch& launch) {
  if (rows == 0 || cols == 0) return;
  visit_row_dtype(y.dtype, "softmax_backward", [&]<typename T>(T) {
    visit_row_shape(cols, [&]<int kGroupThreads, int kPerThread>() {
      TESSERA_LAUNCH((softmax_backward_kernel<T, kGroupThreads, kPerThread>), row_config<kGroupThreads>(rows, launch),
                     static_cast<T*>(grad_in.data), static_cast<const T*>(grad_out.data),
                     static_cast<const T*>(y.data), rows, cols, log);
    });
  });
}

}  // namespace tessera::cuda
