// Elementwise cuda kernels: fill, copy (any strides, dtype conversion,
// broadcast views), arange, unary and its backward, binary, where. One
// source for nvcc and the simulator. Each kernel walks its elements with a
// grid-stride loop; dense operands take a path without index arithmetic,
// and same-width dense operands (unary, its backward, binary) move 16 bytes
// per load and store. Binary ops with a broadcast operand (a bias row, a
// per-row value, a scalar) take a tiled path that reads it about once
// instead of once per element.
// bf16 operands are read and written as bf16 and computed in f32, each
// result rounded once: the bits of widening to f32, computing and narrowing,
// without the two extra passes over memory that costs.
// The formulas are the cpu kernels' (tensor/cpu/elementwise.cpp): IEEE-exact
// operations give the same bits; exp, log, tanh, erf, pow and what is built
// on them use the device's math library, within a few ulp of the cpu's.
#include "tensor/cuda/elementwise.h"

#include <cmath>
#include <optional>

#include "tensor/cuda/kernel_loop.h"
#include "tensor/element_conversion.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

namespace {

// ---- maths (the cpu's formulas, on the device's math library) -------------

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <typename C>
__device__ C clamp(C x, C low, C high) {
  return x < low ? low : (high < x ? high : x);
}
template <typename C>
__device__ C step(C x) {
  return C(0) < x ? C(1) : C(0);
}
template <typename C>
__device__ C sigmoid(C x) {
  const C e = std::exp(-std::fabs(x));
  return x < C(0) ? e / (C(1) + e) : C(1) / (C(1) + e);
}
template <typename C>
__device__ C at_minus_infinity_zero(C x, C value) {
  return x == -std::numeric_limits<C>::infinity() ? C(-0.0) : value;
}
template <typename C>
__device__ C gelu_tanh_inner(C x) {
  return C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
}
template <typename C>
__device__ C gelu_tanh_derivative(C x) {
  x = clamp(x, C(-30), C(30));
  const C s = sigmoid(C(2) * gelu_tanh_inner(x));
  const C du = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
  return s + C(2) * x * s * (C(1) - s) * du;
}
template <typename C>
__device__ C gelu_erf_derivative(C x) {
  x = clamp(x, C(-40), C(40));
  return C(0.5) * (C(1) + std::erf(x * C(kSqrtHalf))) + x * C(kInvSqrt2Pi) * std::exp(C(-0.5) * x * x);
}
template <typename C>
__device__ C silu_derivative(C x) {
  x = clamp(x, C(-800), C(800));
  const C s = sigmoid(x);
  return s * (C(1) + x * (C(1) - s));
}

template <typename C>
__device__ C apply_unary(UnaryOp op, C x) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case UnaryOp::neg: return -x;
      case UnaryOp::exp: return std::exp(x);
      case UnaryOp::log: return std::log(x);
      case UnaryOp::sqrt: return std::sqrt(x);
      case UnaryOp::rsqrt: return C(1) / std::sqrt(x);
      case UnaryOp::abs: return std::fabs(x);
      case UnaryOp::tanh: return std::tanh(x);
      case UnaryOp::sigmoid: return sigmoid(x);
      case UnaryOp::relu: return x < C(0) ? C(0) : x;
      case UnaryOp::gelu_tanh: return at_minus_infinity_zero(x, x * sigmoid(C(2) * gelu_tanh_inner(x)));
      case UnaryOp::gelu_erf: return at_minus_infinity_zero(x, C(0.5) * x * (C(1) + std::erf(x * C(kSqrtHalf))));
      case UnaryOp::silu: return at_minus_infinity_zero(x, x * sigmoid(x));
      case UnaryOp::logical_not: break;
    }
    return x;
  } else if constexpr (std::is_same_v<C, bool>) {
    return !x;  // logical_not; the table refuses other ops on bool
  } else {
    using U = std::make_unsigned_t<C>;  // two's complement wrap, no signed overflow
    switch (op) {
      case UnaryOp::neg: return static_cast<C>(U(0) - U(x));
      case UnaryOp::abs: return x < 0 ? static_cast<C>(U(0) - U(x)) : x;
      default: return x < 0 ? C(0) : x;  // relu
    }
  }
}

template <typename C>
__device__ C apply_unary_backward(UnaryOp op, C dy, C s) {  // s: y for tanh/sigmoid, x otherwise
  switch (op) {
    case UnaryOp::neg: return -dy;
    case UnaryOp::exp: return dy * std::exp(s);
    case UnaryOp::log: return dy / s;
    case UnaryOp::sqrt: return dy / (C(2) * std::sqrt(s));
    case UnaryOp::rsqrt: return C(-0.5) * dy / (s * std::sqrt(s));
    case UnaryOp::abs: return dy * (step(s) - step(-s));
    case UnaryOp::tanh: return dy * (C(1) - s * s);
    case UnaryOp::sigmoid: return dy * s * (C(1) - s);
    case UnaryOp::relu: return dy * step(s);
    case UnaryOp::gelu_tanh: return dy * gelu_tanh_derivative(s);
    case UnaryOp::gelu_erf: return dy * gelu_erf_derivative(s);
    case UnaryOp::silu: return dy * silu_derivative(s);
    case UnaryOp::logical_not: break;
  }
  return dy;
}

// a op b for arithmetic ops (comparisons are compare()).
template <typename C>
__device__ C apply_binary(BinaryOp op, C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case BinaryOp::add: return a + b;
      case BinaryOp::sub: return a - b;
      case BinaryOp::mul: return a * b;
      case BinaryOp::div: return a / b;
      case BinaryOp::pow: return std::pow(a, b);
      case BinaryOp::maximum: return (a != a || a > b) ? a : b;  // NaN propagates
      case BinaryOp::minimum: return (a != a || a < b) ? a : b;
      default: return a;
    }
  } else if constexpr (std::is_same_v<C, bool>) {
    return (op == BinaryOp::add || op == BinaryOp::maximum) ? (a || b) : (a && b);  // logic, as in torch
  } else {
    using U = std::make_unsigned_t<C>;
    switch (op) {
      case BinaryOp::add: return static_cast<C>(U(a) + U(b));
      case BinaryOp::sub: return static_cast<C>(U(a) - U(b));
      case BinaryOp::mul: return static_cast<C>(U(a) * U(b));
      case BinaryOp::pow: return integer_pow(a, b);
      case BinaryOp::maximum: return a > b ? a : b;
      case BinaryOp::minimum: return a < b ? a : b;
      default: return a;
    }
  }
}

template <typename C>
__device__ bool compare(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::eq: return a == b;
    case BinaryOp::ne: return a != b;
    case BinaryOp::lt: return a < b;
    case BinaryOp::le: return a <= b;
    case BinaryOp::gt: return a > b;
    default: return a >= b;
  }
}

bool is_comparison(BinaryOp op) { return op >= BinaryOp::eq; }

// ---- kernels ---------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads) fill_packed_kernel(Pack<T>* out, int64_t packs, T value) {
  Pack<T> pack;
  for (int lane = 0; lane < Pack<T>::kCount; ++lane) pack.values[lane] = value;
  for (int64_t i = first_index(); i < packs; i += index_stride()) out[i] = pack;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) fill_kernel(T* out, int64_t count, T value) {
  for (int64_t i = first_index(); i < count; i += index_stride()) out[i] = value;
}

template <typename To, typename From>
__global__ void __launch_bounds__(kThreads) copy_kernel(To* out, Layout out_layout, bool out_dense, const From* in, Layout in_layout,
                            bool in_dense, int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const From value = in[in_dense ? i : in_layout.offset(i)];
    out[out_dense ? i : out_layout.offset(i)] = convert<To>(value);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) copy_packed_kernel(Pack<T>* out, const Pack<T>* in, int64_t packs) {
  for (int64_t i = first_index(); i < packs; i += index_stride()) out[i] = in[i];
}

template <typename T>
__global__ void __launch_bounds__(kThreads) arange_kernel(T* out, Layout layout, bool dense, int64_t count, double start, double step) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    out[dense ? i : layout.offset(i)] = convert<T>(start + static_cast<double>(i) * step);
  }
}

// The type a stored element S computes in: f32 for bf16, else S itself.
template <typename S>
using ComputeOf = std::conditional_t<std::is_same_v<S, BFloat16>, float, S>;

template <typename C, typename S, int N>
__device__ Pack<C, N> widen(const Pack<S, N>& stored) {
  Pack<C, N> values;
  for (int lane = 0; lane < N; ++lane) values.values[lane] = convert<C>(stored.values[lane]);
  return values;
}

template <typename S>
__global__ void __launch_bounds__(kThreads) unary_kernel(UnaryOp op, S* out, Layout out_layout, bool out_dense, const S* x,
                                                         Layout x_layout, bool x_dense, int64_t count) {
  using C = ComputeOf<S>;
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const C value = convert<C>(x[x_dense ? i : x_layout.offset(i)]);
    out[out_dense ? i : out_layout.offset(i)] = convert<S>(apply_unary(op, value));
  }
}

template <typename S>
__global__ void __launch_bounds__(kThreads) unary_packed_kernel(UnaryOp op, Pack<S>* out, const Pack<S>* x, int64_t packs) {
  using C = ComputeOf<S>;
  for (int64_t i = first_index(); i < packs; i += index_stride()) {
    Pack<S> values = x[i];
    for (int lane = 0; lane < Pack<S>::kCount; ++lane) {
      values.values[lane] = convert<S>(apply_unary(op, convert<C>(values.values[lane])));
    }
    out[i] = values;
  }
}

template <typename S>
__global__ void __launch_bounds__(kThreads) unary_backward_kernel(UnaryOp op, S* grad_in, Layout in_layout, const S* grad_out,
                                      Layout out_layout, const S* saved, Layout saved_layout, bool dense,
                                      int64_t count) {
  using C = ComputeOf<S>;
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const C dy = convert<C>(grad_out[dense ? i : out_layout.offset(i)]);
    const C s = convert<C>(saved[dense ? i : saved_layout.offset(i)]);
    grad_in[dense ? i : in_layout.offset(i)] = convert<S>(apply_unary_backward(op, dy, s));
  }
}

// The dense path of unary_backward: 16 bytes of each operand per load or
// store, as unary_packed_kernel (2-byte bf16 loads leave too few bytes in
// flight to keep the memory system busy).
template <typename S>
__global__ void __launch_bounds__(kThreads) unary_backward_packed_kernel(UnaryOp op, Pack<S>* grad_in,
                                                                         const Pack<S>* grad_out,
                                                                         const Pack<S>* saved, int64_t packs) {
  using C = ComputeOf<S>;
  for (int64_t i = first_index(); i < packs; i += index_stride()) {
    const Pack<S> dy = grad_out[i], s = saved[i];
    Pack<S> result;
    for (int lane = 0; lane < Pack<S>::kCount; ++lane) {
      result.values[lane] = convert<S>(apply_unary_backward(op, convert<C>(dy.values[lane]), convert<C>(s.values[lane])));
    }
    grad_in[i] = result;
  }
}

// out = a op b, or the comparison a op b into bool when Out is bool.
template <typename Out, typename C>
__device__ Out binary_result(BinaryOp op, bool comparison, C x, C y) {
  if constexpr (std::is_same_v<Out, bool>) {
    return comparison ? compare(op, x, y) : static_cast<bool>(apply_binary(op, x, y));
  } else {
    return convert<Out>(apply_binary(op, x, y));
  }
}

template <typename Out, typename S>
__global__ void __launch_bounds__(kThreads) binary_kernel(BinaryOp op, bool comparison, Out* out, Layout out_layout, const S* a, Layout a_layout,
                              const S* b, Layout b_layout, bool dense, int64_t count) {
  using C = ComputeOf<S>;
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const C x = convert<C>(a[dense ? i : a_layout.offset(i)]);
    const C y = convert<C>(b[dense ? i : b_layout.offset(i)]);
    out[dense ? i : out_layout.offset(i)] = binary_result<Out>(op, comparison, x, y);
  }
}

template <typename S>
__global__ void __launch_bounds__(kThreads) binary_packed_kernel(BinaryOp op, Pack<S>* out, const Pack<S>* a, const Pack<S>* b, int64_t packs) {
  using C = ComputeOf<S>;
  for (int64_t i = first_index(); i < packs; i += index_stride()) {
    const Pack<S> x = a[i], y = b[i];
    Pack<S> result;
    for (int lane = 0; lane < Pack<S>::kCount; ++lane) {
      result.values[lane] = convert<S>(apply_binary(op, convert<C>(x.values[lane]), convert<C>(y.values[lane])));
    }
    out[i] = result;
  }
}

// How a binary operand spreads over an output viewed as [rows, columns]:
// dense; one row, the same for every row (a bias); or one value per row,
// the same across the columns (a row's mean, or a scalar when rows is 1).
enum class Spread : uint8_t { dense, one_row, one_per_row };

template <typename S>
struct SpreadOperand {
  const S* data;
  Spread spread;
};

template <typename C, typename S, int N>
__device__ Pack<C, N> spread_lanes(const SpreadOperand<S>& operand, const Pack<C, N>& row_values,
                                   const S* staged_per_row, int64_t at, int64_t tile_row) {
  if (operand.spread == Spread::dense) return widen<C>(reinterpret_cast<const Pack<S, N>*>(operand.data)[at]);
  if (operand.spread == Spread::one_row) return row_values;
  Pack<C, N> lanes;
  for (int lane = 0; lane < N; ++lane) lanes.values[lane] = convert<C>(staged_per_row[tile_row]);
  return lanes;
}

// out = a op b where an operand is broadcast, reading each input byte about
// once: a thread keeps its column of a one_row operand in registers across
// a tile of rows (so that operand is read once per block row, at most 1/32
// of the output), and a block stages a tile's per-row values in shared
// memory (read once per block column). Columns are in packs of N elements;
// dynamic shared memory holds 2 * tile_rows values of S.
template <typename Out, typename S, int N>
__global__ void __launch_bounds__(kThreads) binary_spread_kernel(BinaryOp op, bool comparison, Pack<Out, N>* out,
                                                                 SpreadOperand<S> a, SpreadOperand<S> b,
                                                                 int64_t rows, int64_t columns, int64_t tile_rows) {
  using C = ComputeOf<S>;
  S* staged = dynamic_shared_memory<S>();  // a's per-row values, then b's
  const bool stages = a.spread == Spread::one_per_row || b.spread == Spread::one_per_row;
  const int threads = static_cast<int>(blockDim.x * blockDim.y);
  const int thread = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
  for (int64_t first_column = static_cast<int64_t>(blockIdx.x) * blockDim.x; first_column < columns;
       first_column += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t column = first_column + threadIdx.x;
    const bool active = column < columns;
    Pack<C, N> a_row{}, b_row{};
    if (active && a.spread == Spread::one_row) a_row = widen<C>(reinterpret_cast<const Pack<S, N>*>(a.data)[column]);
    if (active && b.spread == Spread::one_row) b_row = widen<C>(reinterpret_cast<const Pack<S, N>*>(b.data)[column]);
    for (int64_t first_row = static_cast<int64_t>(blockIdx.y) * tile_rows; first_row < rows;
         first_row += static_cast<int64_t>(gridDim.y) * tile_rows) {
      const int64_t tile = rows - first_row < tile_rows ? rows - first_row : tile_rows;
      if (stages) {
        __syncthreads();  // every thread is done with the previous tile's values
        for (int64_t row = thread; row < tile; row += threads) {
          if (a.spread == Spread::one_per_row) staged[row] = a.data[first_row + row];
          if (b.spread == Spread::one_per_row) staged[tile_rows + row] = b.data[first_row + row];
        }
        __syncthreads();
      }
      if (!active) continue;
      for (int64_t row = threadIdx.y; row < tile; row += blockDim.y) {
        const int64_t at = (first_row + row) * columns + column;
        const Pack<C, N> x = spread_lanes(a, a_row, staged, at, row);
        const Pack<C, N> y = spread_lanes(b, b_row, staged + tile_rows, at, row);
        Pack<Out, N> result;
        for (int lane = 0; lane < N; ++lane) {
          result.values[lane] = binary_result<Out>(op, comparison, x.values[lane], y.values[lane]);
        }
        out[at] = result;
      }
    }
  }
}

// Selection moves bits: words of the element size, any dtype.
template <typename Word>
__global__ void __launch_bounds__(kThreads) where_kernel(Word* out, Layout out_layout, const bool* condition, Layout condition_layout,
                             const Word* a, Layout a_layout, const Word* b, Layout b_layout, bool dense,
                             int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const bool take_a = condition[dense ? i : condition_layout.offset(i)];
    out[dense ? i : out_layout.offset(i)] = take_a ? a[dense ? i : a_layout.offset(i)] : b[dense ? i : b_layout.offset(i)];
  }
}

// Calls fn(S{}) for the dtypes the compute kernels store: the numeric ones,
// bool and bf16 (computed in f32).
template <typename Fn>
void visit_stored(DType dtype, const char* kernel, Fn&& fn) {
  if (dtype == DType::boolean) return fn(bool{});
  if (dtype == DType::bf16) return fn(BFloat16{});
  visit_numeric(dtype, kernel, "computes in f32, f64, i32, i64, bool or bf16 (the op converts f16), got", fn);
}


}  // namespace

void fill(const Operand& out, double value, const KernelLaunch& launch) {
  if (!out.contiguous) refuse_operands("fill", "needs a contiguous output, got one of dtype", out.dtype);
  visit_dtype(out.dtype, [&]<typename T>(T) {
    const T element = convert<T>(value);
    T* data = static_cast<T*>(out.data);
    const int64_t packs = packable<T>(out) ? out.count / Pack<T>::kCount : 0;
    if (packs > 0) {
      TESSERA_LAUNCH(fill_packed_kernel<T>, config_for(packs, launch), reinterpret_cast<Pack<T>*>(data), packs, element);
    }
    const int64_t tail = out.count - packs * Pack<T>::kCount;
    if (tail > 0) {
      TESSERA_LAUNCH(fill_kernel<T>, config_for(tail, launch), data + packs * Pack<T>::kCount, tail, element);
    }
  });
}

void copy(const Operand& out, const Operand& in, const KernelLaunch& launch) {
  visit_dtype(out.dtype, [&]<typename To>(To) {
    visit_dtype(in.dtype, [&]<typename From>(From) {
      if constexpr (std::is_same_v<To, From>) {
        if (packable<To>(out) && packable<From>(in) && out.count % Pack<To>::kCount == 0) {
          const int64_t packs = out.count / Pack<To>::kCount;
          TESSERA_LAUNCH(copy_packed_kernel<To>, config_for(packs, launch), static_cast<Pack<To>*>(out.data),
                         static_cast<const Pack<From>*>(in.data), packs);
          return;
        }
      }
      TESSERA_LAUNCH((copy_kernel<To, From>), config_for(out.count, launch), static_cast<To*>(out.data), out.layout,
                     out.contiguous, static_cast<const From*>(in.data), in.layout, in.contiguous, out.count);
    });
  });
}

void arange(const Operand& out, double start, double step, const KernelLaunch& launch) {
  visit_dtype(out.dtype, [&]<typename T>(T) {
    TESSERA_LAUNCH(arange_kernel<T>, config_for(out.count, launch), static_cast<T*>(out.data), out.layout,
                   out.contiguous, out.count, start, step);
  });
}

void unary(UnaryOp op, const Operand& out, const Operand& x, const KernelLaunch& launch) {
  visit_stored(x.dtype, "unary", [&]<typename S>(S) {
    using C = ComputeOf<S>;
    const bool defined = std::is_same_v<C, bool>    ? op == UnaryOp::logical_not
                         : std::is_integral_v<C> ? (op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::relu)
                                                 : op != UnaryOp::logical_not;
    if (!defined) refuse_operands("unary", "this op is not defined for an input of dtype", x.dtype);
    if (out.dtype != x.dtype) refuse_operands("unary", "the output's dtype differs from the input's,", out.dtype);
    if (packable<S>(out) && packable<S>(x) && out.count % Pack<S>::kCount == 0) {
      const int64_t packs = out.count / Pack<S>::kCount;
      TESSERA_LAUNCH(unary_packed_kernel<S>, config_for(packs, launch), op, static_cast<Pack<S>*>(out.data),
                     static_cast<const Pack<S>*>(x.data), packs);
      return;
    }
    TESSERA_LAUNCH(unary_kernel<S>, config_for(out.count, launch), op, static_cast<S*>(out.data), out.layout,
                   out.contiguous, static_cast<const S*>(x.data), x.layout, x.contiguous, out.count);
  });
}

void unary_backward(UnaryOp op, const Operand& grad_in, const Operand& grad_out, const Operand& saved,
                    const KernelLaunch& launch) {
  if (op == UnaryOp::logical_not) refuse_operands("unary_backward", "logical_not has no derivative; input", grad_in.dtype);
  const bool dense = grad_in.contiguous && grad_out.contiguous && saved.contiguous;
  visit_stored(grad_in.dtype, "unary_backward", [&]<typename S>(S) {
    if constexpr (std::is_floating_point_v<ComputeOf<S>>) {
      if (packable<S>(grad_in) && packable<S>(grad_out) && packable<S>(saved) &&
          grad_in.count % Pack<S>::kCount == 0) {
        const int64_t packs = grad_in.count / Pack<S>::kCount;
        TESSERA_LAUNCH(unary_backward_packed_kernel<S>, config_for(packs, launch), op,
                       static_cast<Pack<S>*>(grad_in.data), static_cast<const Pack<S>*>(grad_out.data),
                       static_cast<const Pack<S>*>(saved.data), packs);
        return;
      }
      TESSERA_LAUNCH(unary_backward_kernel<S>, config_for(grad_in.count, launch), op, static_cast<S*>(grad_in.data),
                     grad_in.layout, static_cast<const S*>(grad_out.data), grad_out.layout,
                     static_cast<const S*>(saved.data), saved.layout, dense, grad_in.count);
    } else {
      refuse_operands("unary_backward", "needs floating operands, got", grad_in.dtype);
    }
  });
}

namespace {

// Whether dims [begin, end) of `layout` are row-major dense among themselves
// (size-1 dims have any stride).
bool dense_over(const Layout& layout, int32_t begin, int32_t end) {
  int64_t expected = 1;
  for (int32_t dim = end - 1; dim >= begin; --dim) {
    if (layout.sizes[dim] != 1 && layout.strides[dim] != expected) return false;
    expected *= layout.sizes[dim];
  }
  return true;
}

bool broadcast_over(const Layout& layout, int32_t begin, int32_t end) {
  for (int32_t dim = begin; dim < end; ++dim) {
    if (layout.sizes[dim] != 1 && layout.strides[dim] != 0) return false;
  }
  return true;
}

// How `operand` (a view of the output's shape) spreads when the output is
// split into rows (dims before `split`) and columns (the rest), if it does.
std::optional<Spread> spread_at(const Operand& operand, int32_t split) {
  const Layout& layout = operand.layout;
  if (dense_over(layout, 0, layout.dims)) return Spread::dense;
  if (broadcast_over(layout, 0, split) && dense_over(layout, split, layout.dims)) return Spread::one_row;
  if (dense_over(layout, 0, split) && broadcast_over(layout, split, layout.dims)) return Spread::one_per_row;
  return std::nullopt;
}

bool aligned(const void* data, int64_t bytes) { return reinterpret_cast<uintptr_t>(data) % bytes == 0; }

// Launches binary_spread_kernel when the output is contiguous and both
// operands spread at one split of its dims (the first, which gives the
// longest rows); false when they do not.
template <typename Out, typename S>
bool binary_spread(BinaryOp op, bool comparison, const Operand& out, const Operand& a, const Operand& b,
                   const KernelLaunch& launch) {
  if (!out.contiguous) return false;
  const int32_t dims = out.layout.dims;
  int32_t split = 0;
  std::optional<Spread> a_spread, b_spread;
  for (; split <= dims; ++split) {
    a_spread = spread_at(a, split);
    b_spread = spread_at(b, split);
    if (a_spread && b_spread) break;
  }
  if (split > dims) return false;
  int64_t rows = 1;
  for (int32_t dim = 0; dim < split; ++dim) rows *= out.layout.sizes[dim];
  const int64_t columns = out.count / rows;

  // Up to four lanes (16 bytes of f32/i32, 4 of bool), and f64 one at a time:
  // 16 bool lanes, or two f64 lanes live across the call to pow, make ptxas
  // spill with the operands a thread keeps across its rows.
  constexpr int kWide = std::is_same_v<S, double> ? 1 : std::min(Pack<S>::kCount, 4);
  const auto packs = [&](const Operand& operand, Spread spread) {
    return spread == Spread::one_per_row || aligned(operand.data, sizeof(S) * kWide);
  };
  const bool wide = columns % kWide == 0 && aligned(out.data, sizeof(Out) * kWide) && packs(a, *a_spread) &&
                    packs(b, *b_spread);
  const int64_t width = wide ? kWide : 1;
  const int64_t column_packs = columns / width;

  LaunchConfig config;
  const int64_t block_x = std::min<int64_t>(kThreads, column_packs);
  const int64_t block_y = kThreads / block_x;
  // At least 32 rows per tile: the one_row operand costs at most 1/32 of a dense one.
  const int64_t tile_rows = block_y * ((32 + block_y - 1) / block_y);
  const int64_t grid_x = std::min(kMaxBlocks, (column_packs + block_x - 1) / block_x);
  const int64_t grid_y = std::min(std::max<int64_t>(1, kMaxBlocks / grid_x), (rows + tile_rows - 1) / tile_rows);
  config.grid = dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  config.block = dim3(static_cast<unsigned>(block_x), static_cast<unsigned>(block_y));
  const bool stages = *a_spread == Spread::one_per_row || *b_spread == Spread::one_per_row;
  config.dynamic_shared_bytes = stages ? 2 * tile_rows * static_cast<int64_t>(sizeof(S)) : 0;
  config.buffers = launch.buffers;
  config.stream = launch.stream;
  const SpreadOperand<S> a_operand{static_cast<const S*>(a.data), *a_spread};
  const SpreadOperand<S> b_operand{static_cast<const S*>(b.data), *b_spread};
  if (wide) {
    TESSERA_LAUNCH((binary_spread_kernel<Out, S, kWide>), config, op, comparison,
                   static_cast<Pack<Out, kWide>*>(out.data), a_operand, b_operand, rows, column_packs, tile_rows);
  } else {
    TESSERA_LAUNCH((binary_spread_kernel<Out, S, 1>), config, op, comparison, static_cast<Pack<Out, 1>*>(out.data),
                   a_operand, b_operand, rows, column_packs, tile_rows);
  }
  return true;
}

}  // namespace

void binary(BinaryOp op, const Operand& out, const Operand& a, const Operand& b, const KernelLaunch& launch) {
  const bool dense = out.contiguous && a.contiguous && b.contiguous;
  visit_stored(a.dtype, "binary", [&]<typename S>(S) {
    using C = ComputeOf<S>;
    const bool comparison = is_comparison(op);
    if (!comparison) {
      const bool defined = std::is_floating_point_v<C> ||
                           (std::is_same_v<C, bool> ? (op == BinaryOp::add || op == BinaryOp::maximum ||
                                                       op == BinaryOp::mul || op == BinaryOp::minimum)
                                                    : op != BinaryOp::div);
      if (!defined) refuse_operands("binary", "this op is not defined for operands of dtype", a.dtype);
    }
    if (b.dtype != a.dtype) refuse_operands("binary", "operands differ in dtype; b is", b.dtype);
    if (comparison || std::is_same_v<C, bool>) {
      if (!dense && binary_spread<bool, S>(op, comparison, out, a, b, launch)) return;
      TESSERA_LAUNCH((binary_kernel<bool, S>), config_for(out.count, launch), op, comparison,
                     static_cast<bool*>(out.data), out.layout, static_cast<const S*>(a.data), a.layout,
                     static_cast<const S*>(b.data), b.layout, dense, out.count);
      return;
    }
    if (out.dtype != a.dtype) refuse_operands("binary", "the output's dtype differs from the operands',", out.dtype);
    if (packable<S>(out) && packable<S>(a) && packable<S>(b) && out.count % Pack<S>::kCount == 0) {
      const int64_t packs = out.count / Pack<S>::kCount;
      TESSERA_LAUNCH(binary_packed_kernel<S>, config_for(packs, launch), op, static_cast<Pack<S>*>(out.data),
                     static_cast<const Pack<S>*>(a.data), static_cast<const Pack<S>*>(b.data), packs);
      return;
    }
    if (!dense && binary_spread<S, S>(op, false, out, a, b, launch)) return;
    TESSERA_LAUNCH((binary_kernel<S, S>), config_for(out.count, launch), op, false, static_cast<S*>(out.data),
                   out.layout, static_cast<const S*>(a.data), a.layout, static_cast<const S*>(b.data), b.layout,
                   dense, out.count);
  });
}

void where(const Operand& out, const Operand& condition, const Operand& a, const Operand& b,
           const KernelLaunch& launch) {
  const bool dense = out.contiguous && condition.contiguous && a.contiguous && b.contiguous;
  visit_word(out.dtype, [&]<typename Word>(Word) {
    TESSERA_LAUNCH(where_kernel<Word>, config_for(out.count, launch), static_cast<Word*>(out.data), out.layout,
                   static_cast<const bool*>(condition.data), condition.layout, static_cast<const Word*>(a.data),
                   a.layout, static_cast<const Word*>(b.data), b.layout, dense, out.count);
  });
}

}  // namespace tessera::cuda
