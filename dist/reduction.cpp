// The reduction kernel behind every backend's SUM/AVG/MAX/MIN. Elements go in
// blocks; each sweep over a block folds up to four inputs, in order, into
// accumulators of the wide type (plain loops the compiler vectorises), and the
// last sweep divides (AVG) and rounds into `dtype` once, so 16-bit sums round once.
#include "dist/reduction.h"

#include <algorithm>
#include <bit>
#include <type_traits>

#include "tensor/error.h"

namespace tessera::dist {

namespace {

// Elements per block: the accumulators (at most 8 KiB) stay in L1.
constexpr int64_t kBlock = 1024;

// How elements of T are accumulated: f32 for f32/bf16/f16, f64 for f64, i64
// for integers; load widens one element, store rounds one accumulator back.
template <typename T>
struct Accumulation {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_integral_v<T>, int64_t, float>>;
  static Acc load(T value) { return static_cast<Acc>(value); }
  static T store(Acc value) { return static_cast<T>(value); }
};

// bf16 is the top half of an f32: widening is a shift, written out so that
// the loops stay vectorisable.
template <>
struct Accumulation<BFloat16> {
  using Acc = float;
  static float load(BFloat16 value) { return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16); }
  static BFloat16 store(float value) {
    BFloat16 result;
    result.bits = float16_bits::bfloat16_from_float(value);
    return result;
  }
};

template <>
struct Accumulation<Half> {
  using Acc = float;
  static float load(Half value) { return static_cast<float>(value); }
  static Half store(float value) { return Half(value); }
};

// One step of each op on accumulators. Integer sums wrap (two's complement)
// instead of overflowing; MAX and MIN propagate NaN.
template <ReduceOp kOp, typename Acc>
Acc combine(Acc acc, Acc value) {
  if constexpr (kOp == ReduceOp::sum || kOp == ReduceOp::avg) {
    if constexpr (std::is_integral_v<Acc>) {
      return static_cast<Acc>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(value));
    } else {
      return acc + value;
    }
  } else if constexpr (kOp == ReduceOp::max) {
    return (value > acc || value != value) ? value : acc;
  } else {
    return (value < acc || value != value) ? value : acc;
  }
}

// Inputs read together in one sweep over a block: enough to keep several
// memory streams busy at once (one input at a time leaves the hardware
// prefetchers idle between bursts: half the bandwidth), few enough for registers.
constexpr int kInputsPerSweep = 4;

// One sweep over the block [begin, begin + n): value_i = op(acc[i], in_0[i],
// ..., in_{m-1}[i]) folded left in input order (kStart: from in_0, no acc).
// The values go back to acc, or (kFinish) are divided for AVG and rounded
// into out, so with few inputs a block is read and written exactly once.
// Out of line: inlined into the loop over sweeps, GCC 12 unrolls and jams
// that loop and turns the loads into gathers (3x slower).
template <ReduceOp kOp, int kInputs, bool kStart, bool kFinish, typename T, typename Acc>
[[gnu::noinline]] void sweep(T* out, Acc* __restrict acc, std::span<const void* const> inputs, int64_t begin,
                             int64_t n, int divisor) {
  using A = Accumulation<T>;
  const T* in[kInputs];
  for (int k = 0; k < kInputs; ++k) in[k] = static_cast<const T*>(inputs[k]) + begin;
  const Acc d = static_cast<Acc>(divisor);
  for (int64_t i = 0; i < n; ++i) {
    Acc value = kStart ? A::load(in[0][i]) : combine<kOp>(acc[i], A::load(in[0][i]));
    for (int k = 1; k < kInputs; ++k) value = combine<kOp>(value, A::load(in[k][i]));
    if constexpr (!kFinish) {
      acc[i] = value;
    } else if constexpr (kOp == ReduceOp::avg) {
      out[begin + i] = A::store(value / d);
    } else {
      out[begin + i] = A::store(value);  // after reading every input at i: `out` may alias one
    }
  }
}

template <ReduceOp kOp, bool kStart, bool kFinish, typename T, typename Acc>
void sweep_inputs(T* out, Acc* acc, std::span<const void* const> inputs, int64_t begin, int64_t n, int divisor) {
  static_assert(kInputsPerSweep == 4);
  switch (inputs.size()) {
    case 1: return sweep<kOp, 1, kStart, kFinish>(out, acc, inputs, begin, n, divisor);
    case 2: return sweep<kOp, 2, kStart, kFinish>(out, acc, inputs, begin, n, divisor);
    case 3: return sweep<kOp, 3, kStart, kFinish>(out, acc, inputs, begin, n, divisor);
    default: return sweep<kOp, 4, kStart, kFinish>(out, acc, inputs, begin, n, divisor);
  }
}

// out[i] = op(inputs[0][i], ..., inputs[n-1][i]) (divided by `divisor` for
// AVG), one block at a time, kInputsPerSweep inputs per sweep.
template <typename T, ReduceOp kOp>
void reduce_blocks(T* out, std::span<const void* const> inputs, int64_t count, int divisor) {
  using Acc = typename Accumulation<T>::Acc;
  Acc acc[kBlock];
  const size_t m = inputs.size();
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(count - begin, kBlock);
    if (m <= kInputsPerSweep) {
      sweep_inputs<kOp, true, true>(out, acc, inputs, begin, n, divisor);
      continue;
    }
    sweep_inputs<kOp, true, false>(out, acc, inputs.first(kInputsPerSweep), begin, n, divisor);
    size_t k = kInputsPerSweep;
    for (; m - k > kInputsPerSweep; k += kInputsPerSweep) {
      sweep_inputs<kOp, false, false>(out, acc, inputs.subspan(k, kInputsPerSweep), begin, n, divisor);
    }
    sweep_inputs<kOp, false, true>(out, acc, inputs.subspan(k), begin, n, divisor);
  }
}

// Calls fn(T{}) for the element types a collective can reduce.
template <typename Fn>
void visit_reducible_dtype(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(BFloat16{});
    case DType::f16: return fn(Half{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::boolean:
    case DType::u8:
    case DType::f8e4m3:
    case DType::f8e5m2: break;
  }
  fail("{}: cannot reduce dtype {} (f32, f64, bf16, f16, i32 and i64 can be reduced)", what, dtype_name(dtype));
}

template <typename T>
void reduce_typed(T* out, std::span<const void* const> inputs, int64_t count, ReduceOp op, int divisor) {
  switch (op) {
    case ReduceOp::sum: return reduce_blocks<T, ReduceOp::sum>(out, inputs, count, 0);
    case ReduceOp::avg: return reduce_blocks<T, ReduceOp::avg>(out, inputs, count, divisor);
    case ReduceOp::max: return reduce_blocks<T, ReduceOp::max>(out, inputs, count, 0);
    case ReduceOp::min: return reduce_blocks<T, ReduceOp::min>(out, inputs, count, 0);
  }
}

}  // namespace

void reduce_in_order(void* out, std::span<const void* const> inputs, int64_t count, DType dtype, ReduceOp op,
                     int group_size) {
  TESSERA_CHECK(!inputs.empty(), "reduce_in_order: needs at least one input, got none");
  TESSERA_CHECK(count >= 0, "reduce_in_order: count must be non-negative, got {}", count);
  TESSERA_CHECK(op != ReduceOp::avg || group_size >= 1, "reduce_in_order: AVG needs a group size >= 1, got {}",
                group_size);
  visit_reducible_dtype(dtype, "reduce_in_order", [&]<typename T>(T) {
    reduce_typed(static_cast<T*>(out), inputs, count, op, group_size);
  });
}

void combine_into(void* inout, const void* in, int64_t count, DType dtype, ReduceOp op) {
  TESSERA_CHECK(count >= 0, "combine_into: count must be non-negative, got {}", count);
  const void* inputs[2] = {inout, in};
  // AVG combines as SUM; the one division comes later, in finish_average.
  const ReduceOp step = op == ReduceOp::avg ? ReduceOp::sum : op;
  visit_reducible_dtype(dtype, "combine_into", [&]<typename T>(T) {
    reduce_typed(static_cast<T*>(inout), inputs, count, step, 0);
  });
}

void finish_average(void* data, int64_t count, DType dtype, int group_size) {
  TESSERA_CHECK(count >= 0, "finish_average: count must be non-negative, got {}", count);
  TESSERA_CHECK(group_size >= 1, "finish_average: group size must be >= 1, got {}", group_size);
  const void* inputs[1] = {data};
  visit_reducible_dtype(dtype, "finish_average", [&]<typename T>(T) {
    reduce_typed(static_cast<T*>(data), inputs, count, ReduceOp::avg, group_size);
  });
}

}  // namespace tessera::dist
