// CPU elementwise kernels: fill, the generic strided copy (any dtype to any
// dtype), arange, Philox random fills, unary maths and their derivatives,
// binary ops and comparisons, where, dropout. Every kernel walks its operands
// with StridedLoop and has a dense inner loop that the compiler vectorises;
// transcendental maths run through FloatVector so strided and contiguous
// inputs give identical bits.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/dtype_dispatch.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/cpu/vector_math.h"
#include "tensor/element_conversion.h"

namespace tessera::cpu {

namespace {

// Elements per thread chunk: cheap ops (copies, arithmetic) and costly ones
// (transcendentals, Philox) amortise a parallel region at different sizes.
constexpr int64_t kCheapGrain = 32768;
constexpr int64_t kCostlyGrain = 4096;
// Strided runs of transcendental ops are gathered into buffers of this many.
constexpr int64_t kBufferSize = 256;

template <typename T>
T& at(char* base, int64_t stride, int64_t i) {
  return *reinterpret_cast<T*>(base + i * stride);
}

void check_same_dtype(const char* kernel, std::initializer_list<const Tensor*> tensors) {
  const DType dtype = (*tensors.begin())->dtype();
  for (const Tensor* tensor : tensors) {
    TESSERA_CHECK(tensor->dtype() == dtype, "cpu::{}: operands mix {} and {}", kernel, dtype_name(dtype),
                  dtype_name(tensor->dtype()));
  }
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::abs: return "abs";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::relu: return "relu";
    case UnaryOp::gelu_tanh: return "gelu_tanh";
    case UnaryOp::gelu_erf: return "gelu_erf";
    case UnaryOp::silu: return "silu";
    case UnaryOp::logical_not: return "logical_not";
  }
  return "?";
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::pow: return "pow";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
    case BinaryOp::eq: return "eq";
    case BinaryOp::ne: return "ne";
    case BinaryOp::lt: return "lt";
    case BinaryOp::le: return "le";
    case BinaryOp::gt: return "gt";
    case BinaryOp::ge: return "ge";
  }
  return "?";
}

// ---- copy -----------------------------------------------------------------

template <typename To, typename From>
void copy_run(const StridedLoop<2>::Pointers& p, const StridedLoop<2>::Strides& s, int64_t n) {
  if (s[0] == sizeof(To) && s[1] == sizeof(From)) {
    auto* out = reinterpret_cast<To*>(p[0]);
    const auto* in = reinterpret_cast<const From*>(p[1]);
    for (int64_t i = 0; i < n; ++i) out[i] = convert<To>(in[i]);
  } else if (s[1] == 0) {
    const To value = convert<To>(*reinterpret_cast<const From*>(p[1]));
    for (int64_t i = 0; i < n; ++i) at<To>(p[0], s[0], i) = value;
  } else {
    for (int64_t i = 0; i < n; ++i) at<To>(p[0], s[0], i) = convert<To>(at<From>(p[1], s[1], i));
  }
}

// ---- random ---------------------------------------------------------------

template <typename T>
void random_typed(const Tensor& out, RandomDistribution distribution, PhiloxKey key, double a, double b,
                  uint64_t first_index) {
  StridedLoop<1> loop({&out}, /*keep_logical_order=*/true);
  loop.parallel_run_indexed(kCostlyGrain, [&](const auto& p, const auto& s, int64_t n, int64_t position) {
    const uint64_t first = first_index + static_cast<uint64_t>(position);
    if (distribution == RandomDistribution::normal) {
      for (int64_t i = 0; i < n; ++i) at<T>(p[0], s[0], i) = convert<T>(a + b * philox_normal(key, first + i));
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      T value = convert<T>(a + (b - a) * static_cast<double>(philox_uniform(key, first + i)));
      // Rounding to T may reach b; the range is half-open.
      while (a < b && convert<double>(value) >= b) value = step_down(value);
      at<T>(p[0], s[0], i) = value;
    }
  });
}

// ---- unary maths ----------------------------------------------------------

constexpr double kSqrt2OverPi = 0.7978845608028654;   // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;      // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;    // 1 / sqrt(2 pi)

// Formulas over V = FloatVector (f32) or double (f64). At x = -inf an
// activation is its limit, -0, not -inf * 0 = NaN. A derivative is evaluated
// at x clamped to where it has reached its limit in both f32 and f64 (there it
// is exactly 1 or underflows to 0), so that no inf * 0 arises for any x.
template <typename V>
V at_minus_infinity_zero(V x, V value) {
  return vec::select(x == V(-std::numeric_limits<double>::infinity()), V(-0.0), value);
}
// gelu_tanh = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
// the sigmoid form has no cancellation for negative x.
template <typename V>
V gelu_tanh_inner(V x) {
  return V(kSqrt2OverPi) * (x + V(kGeluCubic) * x * x * x);
}
template <typename V>
V gelu_tanh(V x) {
  return at_minus_infinity_zero(x, x * vec::sigmoid(V(2) * gelu_tanh_inner(x)));
}
// d/dx x s(2u) = s + 2 x s (1 - s) u'; constant beyond |x| = 30.
template <typename V>
V gelu_tanh_derivative(V x) {
  x = vec::clamp(x, V(-30), V(30));
  const V s = vec::sigmoid(V(2) * gelu_tanh_inner(x));
  const V du = V(kSqrt2OverPi) * (V(1) + V(3 * kGeluCubic) * x * x);
  return s + V(2) * x * s * (V(1) - s) * du;
}
template <typename V>
V gelu_erf(V x) {
  return at_minus_infinity_zero(x, V(0.5) * x * (V(1) + vec::erf(x * V(kSqrtHalf))));
}
// Constant beyond |x| = 40.
template <typename V>
V gelu_erf_derivative(V x) {
  x = vec::clamp(x, V(-40), V(40));
  return V(0.5) * (V(1) + vec::erf(x * V(kSqrtHalf))) + x * V(kInvSqrt2Pi) * vec::exp(V(-0.5) * x * x);
}
template <typename V>
V silu(V x) {
  return at_minus_infinity_zero(x, x * vec::sigmoid(x));
}
// d/dx x s(x) = s (1 + x (1 - s)); constant beyond |x| = 800.
template <typename V>
V silu_derivative(V x) {
  x = vec::clamp(x, V(-800), V(800));
  const V s = vec::sigmoid(x);
  return s * (V(1) + x * (V(1) - s));
}

// out = fn(x) for floating T: dense runs go straight through map_vectors,
// strided ones through small buffers and the same vector code.
template <typename T, typename Fn>
void map_floating(const Tensor& out, const Tensor& x, const Fn& fn) {
  StridedLoop<2> loop({&out, &x});
  loop.parallel_run(kCostlyGrain, [&](const auto& p, const auto& s, int64_t n) {
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
      map_vectors(reinterpret_cast<T*>(p[0]), reinterpret_cast<const T*>(p[1]), n, fn);
      return;
    }
    T x_buffer[kBufferSize], out_buffer[kBufferSize];
    for (int64_t start = 0; start < n; start += kBufferSize) {
      const int64_t count = std::min(kBufferSize, n - start);
      for (int64_t i = 0; i < count; ++i) x_buffer[i] = at<T>(p[1], s[1], start + i);
      map_vectors(out_buffer, x_buffer, count, fn);
      for (int64_t i = 0; i < count; ++i) at<T>(p[0], s[0], start + i) = out_buffer[i];
    }
  });
}

// out = fn(a, b) for floating T, as map_floating.
template <typename T, typename Fn>
void map_floating(const Tensor& out, const Tensor& a, const Tensor& b, const Fn& fn) {
  StridedLoop<3> loop({&out, &a, &b});
  loop.parallel_run(kCostlyGrain, [&](const auto& p, const auto& s, int64_t n) {
    if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
      map_vectors(reinterpret_cast<T*>(p[0]), reinterpret_cast<const T*>(p[1]), reinterpret_cast<const T*>(p[2]),
                  n, fn);
      return;
    }
    T a_buffer[kBufferSize], b_buffer[kBufferSize], out_buffer[kBufferSize];
    for (int64_t start = 0; start < n; start += kBufferSize) {
      const int64_t count = std::min(kBufferSize, n - start);
      for (int64_t i = 0; i < count; ++i) {
        a_buffer[i] = at<T>(p[1], s[1], start + i);
        b_buffer[i] = at<T>(p[2], s[2], start + i);
      }
      map_vectors(out_buffer, a_buffer, b_buffer, count, fn);
      for (int64_t i = 0; i < count; ++i) at<T>(p[0], s[0], start + i) = out_buffer[i];
    }
  });
}

// out = fn(x) elementwise with a plain loop (integers, bool).
template <typename Out, typename In, typename Fn>
void map_plain(const Tensor& out, const Tensor& x, const Fn& fn) {
  StridedLoop<2> loop({&out, &x});
  loop.parallel_run(kCheapGrain, [&](const auto& p, const auto& s, int64_t n) {
    if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
      auto* o = reinterpret_cast<Out*>(p[0]);
      const auto* in = reinterpret_cast<const In*>(p[1]);
      for (int64_t i = 0; i < n; ++i) o[i] = fn(in[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) at<Out>(p[0], s[0], i) = fn(at<In>(p[1], s[1], i));
    }
  });
}

template <typename T>
void unary_floating(UnaryOp op, const Tensor& out, const Tensor& x) {
  switch (op) {
    case UnaryOp::neg: return map_floating<T>(out, x, [](auto v) { return -v; });
    case UnaryOp::exp: return map_floating<T>(out, x, [](auto v) { return vec::exp(v); });
    case UnaryOp::log: return map_floating<T>(out, x, [](auto v) { return vec::log(v); });
    case UnaryOp::sqrt: return map_floating<T>(out, x, [](auto v) { return vec::sqrt(v); });
    case UnaryOp::rsqrt:
      return map_floating<T>(out, x, [](auto v) { return decltype(v)(1) / vec::sqrt(v); });
    case UnaryOp::abs: return map_floating<T>(out, x, [](auto v) { return vec::abs(v); });
    case UnaryOp::tanh: return map_floating<T>(out, x, [](auto v) { return vec::tanh(v); });
    case UnaryOp::sigmoid: return map_floating<T>(out, x, [](auto v) { return vec::sigmoid(v); });
    case UnaryOp::relu: return map_floating<T>(out, x, [](auto v) { return vec::relu(v); });
    case UnaryOp::gelu_tanh: return map_floating<T>(out, x, [](auto v) { return gelu_tanh(v); });
    case UnaryOp::gelu_erf: return map_floating<T>(out, x, [](auto v) { return gelu_erf(v); });
    case UnaryOp::silu: return map_floating<T>(out, x, [](auto v) { return silu(v); });
    case UnaryOp::logical_not: break;
  }
  fail("cpu::unary: logical_not takes a bool input, got {}", dtype_name(x.dtype()));
}

// Integer neg/abs wrap like two's complement hardware (no signed overflow).
template <typename T>
void unary_integer(UnaryOp op, const Tensor& out, const Tensor& x) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case UnaryOp::neg: return map_plain<T, T>(out, x, [](T v) { return static_cast<T>(U(0) - U(v)); });
    case UnaryOp::abs:
      return map_plain<T, T>(out, x, [](T v) { return v < 0 ? static_cast<T>(U(0) - U(v)) : v; });
    case UnaryOp::relu: return map_plain<T, T>(out, x, [](T v) { return v < 0 ? T(0) : v; });
    default: break;
  }
  fail("cpu::unary: {} needs a floating input, got {}", unary_name(op), dtype_name(x.dtype()));
}

template <typename T>
void unary_backward_floating(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved) {
  const Tensor& g = grad_out;
  switch (op) {
    case UnaryOp::neg: return map_floating<T>(grad_in, g, saved, [](auto dy, auto) { return -dy; });
    case UnaryOp::exp: return map_floating<T>(grad_in, g, saved, [](auto dy, auto x) { return dy * vec::exp(x); });
    case UnaryOp::log: return map_floating<T>(grad_in, g, saved, [](auto dy, auto x) { return dy / x; });
    case UnaryOp::sqrt:
      return map_floating<T>(grad_in, g, saved,
                             [](auto dy, auto x) { return dy / (decltype(x)(2) * vec::sqrt(x)); });
    case UnaryOp::rsqrt:
      // d/dx x^(-1/2) = -1/2 x^(-3/2)
      return map_floating<T>(grad_in, g, saved, [](auto dy, auto x) {
        using V = decltype(x);
        return V(-0.5) * dy / (x * vec::sqrt(x));
      });
    case UnaryOp::abs: return map_floating<T>(grad_in, g, saved, [](auto dy, auto x) { return dy * vec::sign(x); });
    case UnaryOp::tanh:  // saved = y
      return map_floating<T>(grad_in, g, saved, [](auto dy, auto y) { return dy * (decltype(y)(1) - y * y); });
    case UnaryOp::sigmoid:  // saved = y
      return map_floating<T>(grad_in, g, saved, [](auto dy, auto y) { return dy * y * (decltype(y)(1) - y); });
    case UnaryOp::relu: return map_floating<T>(grad_in, g, saved, [](auto dy, auto x) { return dy * vec::step(x); });
    case UnaryOp::gelu_tanh:
      return map_floating<T>(grad_in, g, saved, [](auto dy, auto x) { return dy * gelu_tanh_derivative(x); });
    case UnaryOp::gelu_erf:
      return map_floating<T>(grad_in, g, saved, [](auto dy, auto x) { return dy * gelu_erf_derivative(x); });
    case UnaryOp::silu:
      return map_floating<T>(grad_in, g, saved, [](auto dy, auto x) { return dy * silu_derivative(x); });
    case UnaryOp::logical_not: break;
  }
  fail("cpu::unary_backward: logical_not has no derivative");
}

// ---- binary ops -----------------------------------------------------------

// out = fn(a, b) with dense, scalar-broadcast and strided inner loops.
template <typename Out, typename T, typename Fn>
void map_binary(const Tensor& out, const Tensor& a, const Tensor& b, const Fn& fn) {
  StridedLoop<3> loop({&out, &a, &b});
  loop.parallel_run(kCheapGrain, [&](const auto& p, const auto& s, int64_t n) {
    auto* o = reinterpret_cast<Out*>(p[0]);
    const auto* x = reinterpret_cast<const T*>(p[1]);
    const auto* y = reinterpret_cast<const T*>(p[2]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
      for (int64_t i = 0; i < n; ++i) o[i] = fn(x[i], y[i]);
    } else if (s[0] == sizeof(Out) && s[1] == sizeof(T) && s[2] == 0) {
      const T y0 = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = fn(x[i], y0);
    } else if (s[0] == sizeof(Out) && s[1] == 0 && s[2] == sizeof(T)) {
      const T x0 = *x;
      for (int64_t i = 0; i < n; ++i) o[i] = fn(x0, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) at<Out>(p[0], s[0], i) = fn(at<T>(p[1], s[1], i), at<T>(p[2], s[2], i));
    }
  });
}

// maximum/minimum propagate NaN, like torch.maximum.
template <typename T>
T max_propagating_nan(T a, T b) {
  return (a != a || a > b) ? a : b;
}
template <typename T>
T min_propagating_nan(T a, T b) {
  return (a != a || a < b) ? a : b;
}

template <typename T>
void binary_typed(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::eq: return map_binary<bool, T>(out, a, b, [](T x, T y) { return x == y; });
    case BinaryOp::ne: return map_binary<bool, T>(out, a, b, [](T x, T y) { return x != y; });
    case BinaryOp::lt: return map_binary<bool, T>(out, a, b, [](T x, T y) { return x < y; });
    case BinaryOp::le: return map_binary<bool, T>(out, a, b, [](T x, T y) { return x <= y; });
    case BinaryOp::gt: return map_binary<bool, T>(out, a, b, [](T x, T y) { return x > y; });
    case BinaryOp::ge: return map_binary<bool, T>(out, a, b, [](T x, T y) { return x >= y; });
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case BinaryOp::add: return map_binary<T, T>(out, a, b, [](T x, T y) { return x + y; });
      case BinaryOp::sub: return map_binary<T, T>(out, a, b, [](T x, T y) { return x - y; });
      case BinaryOp::mul: return map_binary<T, T>(out, a, b, [](T x, T y) { return x * y; });
      case BinaryOp::div: return map_binary<T, T>(out, a, b, [](T x, T y) { return x / y; });
      case BinaryOp::pow: return map_binary<T, T>(out, a, b, [](T x, T y) { return std::pow(x, y); });
      case BinaryOp::maximum: return map_binary<T, T>(out, a, b, max_propagating_nan<T>);
      case BinaryOp::minimum: return map_binary<T, T>(out, a, b, min_propagating_nan<T>);
      default: break;
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    // bool arithmetic is logic: + is or, * is and (as in torch).
    switch (op) {
      case BinaryOp::add:
      case BinaryOp::maximum: return map_binary<bool, bool>(out, a, b, [](bool x, bool y) { return x || y; });
      case BinaryOp::mul:
      case BinaryOp::minimum: return map_binary<bool, bool>(out, a, b, [](bool x, bool y) { return x && y; });
      default: break;
    }
  } else {
    using U = std::make_unsigned_t<T>;  // wraps instead of signed overflow
    switch (op) {
      case BinaryOp::add: return map_binary<T, T>(out, a, b, [](T x, T y) { return static_cast<T>(U(x) + U(y)); });
      case BinaryOp::sub: return map_binary<T, T>(out, a, b, [](T x, T y) { return static_cast<T>(U(x) - U(y)); });
      case BinaryOp::mul: return map_binary<T, T>(out, a, b, [](T x, T y) { return static_cast<T>(U(x) * U(y)); });
      case BinaryOp::pow: return map_binary<T, T>(out, a, b, integer_pow<T>);
      case BinaryOp::maximum: return map_binary<T, T>(out, a, b, [](T x, T y) { return x > y ? x : y; });
      case BinaryOp::minimum: return map_binary<T, T>(out, a, b, [](T x, T y) { return x < y ? x : y; });
      default: break;
    }
  }
  fail("cpu::binary: {} is not defined for {} operands", binary_name(op), dtype_name(a.dtype()));
}

// ---- where ----------------------------------------------------------------

// Selection moves bits, so it runs on words of the element size, any dtype.
template <typename Word>
void where_words(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  StridedLoop<4> loop({&out, &condition, &a, &b});
  loop.parallel_run(kCheapGrain, [&](const auto& p, const auto& s, int64_t n) {
    constexpr int64_t w = sizeof(Word);
    if (s[0] == w && s[1] == 1 && s[2] == w && s[3] == w) {
      auto* o = reinterpret_cast<Word*>(p[0]);
      const auto* c = reinterpret_cast<const bool*>(p[1]);
      const auto* x = reinterpret_cast<const Word*>(p[2]);
      const auto* y = reinterpret_cast<const Word*>(p[3]);
      for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : y[i];
    } else {
      for (int64_t i = 0; i < n; ++i) {
        at<Word>(p[0], s[0], i) = at<bool>(p[1], s[1], i) ? at<Word>(p[2], s[2], i) : at<Word>(p[3], s[3], i);
      }
    }
  });
}

template <typename T>
void dropout_typed(const Tensor& y, const Tensor& mask, const Tensor& x, double p, PhiloxKey key,
                   PhiloxNumbering numbering) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  StridedLoop<3> loop({&y, &mask, &x}, /*keep_logical_order=*/true);
  loop.parallel_run_indexed(kCostlyGrain, [&](const auto& ptr, const auto& s, int64_t n, int64_t position) {
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = philox_uniform(key, numbering.index(position + i)) >= p;
      const T m = keep ? scale : T(0);
      at<T>(ptr[1], s[1], i) = m;
      at<T>(ptr[0], s[0], i) = at<T>(ptr[2], s[2], i) * m;
    }
  });
}

}  // namespace

void fill(const Tensor& out, double value) {
  StridedLoop<1> loop({&out});
  visit_dtype(out.dtype(), [&]<typename T>(T) {
    const T converted = convert<T>(value);
    loop.parallel_run(kCheapGrain, [&](const auto& p, const auto& s, int64_t n) {
      if (s[0] == sizeof(T)) {
        std::fill_n(reinterpret_cast<T*>(p[0]), n, converted);
      } else {
        for (int64_t i = 0; i < n; ++i) at<T>(p[0], s[0], i) = converted;
      }
    });
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.sizes() == src.sizes() && dst.is_contiguous() && src.is_contiguous()) {
    auto* out = static_cast<char*>(dst.raw_data());
    const auto* in = static_cast<const char*>(src.raw_data());
    parallel_for(dst.nbytes(), int64_t{1} << 20, [&](int64_t begin, int64_t end) {
      std::memcpy(out + begin, in + begin, static_cast<size_t>(end - begin));
    });
    return;
  }
  StridedLoop<2> loop({&dst, &src});
  visit_dtype(dst.dtype(), [&]<typename To>(To) {
    visit_dtype(src.dtype(), [&]<typename From>(From) { loop.parallel_run(kCheapGrain, copy_run<To, From>); });
  });
}

// Segment by segment through copy and fill: the bits of ops::copy_ and
// ops::fill_, each segment parallel inside.
void copy_segments(const std::vector<CopySegment>& segments) {
  for (const CopySegment& segment : segments) {
    if (segment.src.defined()) {
      copy(segment.dst, segment.src);
    } else {
      fill(segment.dst, segment.value);
    }
  }
}

void arange(const Tensor& out, double start, double step) {
  StridedLoop<1> loop({&out}, /*keep_logical_order=*/true);
  visit_dtype(out.dtype(), [&]<typename T>(T) {
    loop.parallel_run_indexed(kCheapGrain, [&](const auto& p, const auto& s, int64_t n, int64_t position) {
      for (int64_t i = 0; i < n; ++i) {
        at<T>(p[0], s[0], i) = convert<T>(start + static_cast<double>(position + i) * step);
      }
    });
  });
}

void random(const Tensor& out, RandomDistribution distribution, PhiloxKey key, double a, double b,
            uint64_t first_index) {
  TESSERA_CHECK(is_floating(out.dtype()), "cpu::random: needs a floating output, got {}", dtype_name(out.dtype()));
  visit_dtype(out.dtype(), [&]<typename T>(T) {
    if constexpr (std::is_floating_point_v<T> || is_16_bit_float<T>) {
      random_typed<T>(out, distribution, key, a, b, first_index);
    } else {
      fail("cpu::random: no random draws in {}; draw in f32 and cast", dtype_name(out.dtype()));
    }
  });
}

void unary(UnaryOp op, const Tensor& out, const Tensor& x) {
  if (op == UnaryOp::logical_not) {
    TESSERA_CHECK(x.dtype() == DType::boolean && out.dtype() == DType::boolean,
                  "cpu::unary: logical_not maps bool to bool, got {} to {}", dtype_name(x.dtype()),
                  dtype_name(out.dtype()));
    map_plain<bool, bool>(out, x, [](bool v) { return !v; });
    return;
  }
  check_same_dtype("unary", {&out, &x});
  visit_compute_dtype(out.dtype(), "unary", [&]<typename T>(T) {
    if constexpr (std::is_floating_point_v<T>) {
      unary_floating<T>(op, out, x);
    } else if constexpr (std::is_same_v<T, bool>) {
      fail("cpu::unary: {} is not defined for bool", unary_name(op));
    } else {
      unary_integer<T>(op, out, x);
    }
  });
}

void unary_backward(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved) {
  check_same_dtype("unary_backward", {&grad_in, &grad_out, &saved});
  visit_compute_dtype(grad_in.dtype(), "unary_backward", [&]<typename T>(T) {
    if constexpr (std::is_floating_point_v<T>) {
      unary_backward_floating<T>(op, grad_in, grad_out, saved);
    } else {
      fail("cpu::unary_backward: needs floating tensors, got {}", dtype_name(grad_in.dtype()));
    }
  });
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  check_same_dtype("binary", {&a, &b});
  const bool comparison = op == BinaryOp::eq || op == BinaryOp::ne || op == BinaryOp::lt || op == BinaryOp::le ||
                          op == BinaryOp::gt || op == BinaryOp::ge;
  TESSERA_CHECK(out.dtype() == (comparison ? DType::boolean : a.dtype()), "cpu::binary: {} of {} cannot write {}",
                binary_name(op), dtype_name(a.dtype()), dtype_name(out.dtype()));
  visit_compute_dtype(a.dtype(), "binary", [&]<typename T>(T) { binary_typed<T>(op, out, a, b); });
}

void where(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  check_same_dtype("where", {&out, &a, &b});
  TESSERA_CHECK(condition.dtype() == DType::boolean, "cpu::where: condition must be bool, got {}",
                dtype_name(condition.dtype()));
  switch (out.element_size()) {
    case 1: return where_words<uint8_t>(out, condition, a, b);
    case 2: return where_words<uint16_t>(out, condition, a, b);
    case 4: return where_words<uint32_t>(out, condition, a, b);
    default: return where_words<uint64_t>(out, condition, a, b);
  }
}

void dropout(const Tensor& y, const Tensor& mask, const Tensor& x, double p, PhiloxKey key,
             PhiloxNumbering numbering) {
  check_same_dtype("dropout", {&y, &mask, &x});
  if (x.dtype() == DType::f32) return dropout_typed<float>(y, mask, x, p, key, numbering);
  TESSERA_CHECK(x.dtype() == DType::f64, "cpu::dropout: computes in f32 or f64, got {}", dtype_name(x.dtype()));
  dropout_typed<double>(y, mask, x, p, key, numbering);
}

}  // namespace tessera::cpu
