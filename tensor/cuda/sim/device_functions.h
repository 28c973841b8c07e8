// CUDA's device function library as the simulator compiles it (included by
// tensor/cuda/portability.h, not by kernels): the atomics, integer and bit
// intrinsics, reinterpreting casts, cache-hinted loads and stores, fences,
// clock64 and __nanosleep, and the math functions whose hardware rounding
// differs from the host's. Each one accepts exactly the overloads nvcc
// accepts, so a kernel that compiles here compiles there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "tensor/cuda/sim/intrinsics.h"

namespace tessera::cuda::sim {

template <typename T, typename... Allowed>
concept OneOf = (std::same_as<T, Allowed> || ...);

// An atomic read-modify-write of a T by `Update`, a stateless functor over
// (old, operands[2]).
template <typename T, typename Update>
T atomic(T* address, T first, T second, std::source_location site) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8);
  const T operands[2] = {first, second};
  T old;
  atomic_update(
      address, sizeof(T), operands,
      [](const void* old_bits, const void* operand_bits, void* new_bits) {
        T value, given[2];
        std::memcpy(&value, old_bits, sizeof(T));
        std::memcpy(given, operand_bits, sizeof(given));
        const T updated = Update{}(value, given[0], given[1]);
        std::memcpy(new_bits, &updated, sizeof(T));
      },
      &old, site);
  return old;
}

struct AtomicAdd {
  template <typename T>
  T operator()(T old, T value, T) const {
    if constexpr (std::is_integral_v<T>) {
      using Unsigned = std::make_unsigned_t<T>;  // wraps, as the hardware does
      return static_cast<T>(static_cast<Unsigned>(old) + static_cast<Unsigned>(value));
    } else {
      return old + value;  // rounded once to T, as red.add is
    }
  }
};
struct AtomicSub {
  template <typename T>
  T operator()(T old, T value, T) const {
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(old) - static_cast<std::make_unsigned_t<T>>(value));
  }
};
struct AtomicMax {
  template <typename T>
  T operator()(T old, T value, T) const { return old < value ? value : old; }
};
struct AtomicMin {
  template <typename T>
  T operator()(T old, T value, T) const { return value < old ? value : old; }
};
struct AtomicExchange {
  template <typename T>
  T operator()(T, T value, T) const { return value; }
};
struct AtomicCompareAndSwap {
  template <typename T>
  T operator()(T old, T expected, T desired) const {
    return std::memcmp(&old, &expected, sizeof(T)) == 0 ? desired : old;
  }
};
struct AtomicAnd {
  template <typename T>
  T operator()(T old, T value, T) const { return old & value; }
};
struct AtomicOr {
  template <typename T>
  T operator()(T old, T value, T) const { return old | value; }
};
struct AtomicXor {
  template <typename T>
  T operator()(T old, T value, T) const { return old ^ value; }
};
// ((old >= limit) ? 0 : old + 1) and (((old == 0) || (old > limit)) ? limit : old - 1).
struct AtomicIncrement {
  unsigned operator()(unsigned old, unsigned limit, unsigned) const { return old >= limit ? 0u : old + 1u; }
};
struct AtomicDecrement {
  unsigned operator()(unsigned old, unsigned limit, unsigned) const {
    return old == 0u || old > limit ? limit : old - 1u;
  }
};

}  // namespace tessera::cuda::sim

#define TESSERA_SITE std::source_location site = std::source_location::current()

template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned, unsigned long long, float, double, __half, __half2,
                                       __nv_bfloat16, __nv_bfloat162>
T atomicAdd(T* address, std::type_identity_t<T> value, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicAdd>(address, value, value, site);
}
template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned>
T atomicSub(T* address, std::type_identity_t<T> value, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicSub>(address, value, value, site);
}
template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned, long long, unsigned long long>
T atomicMax(T* address, std::type_identity_t<T> value, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicMax>(address, value, value, site);
}
template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned, long long, unsigned long long>
T atomicMin(T* address, std::type_identity_t<T> value, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicMin>(address, value, value, site);
}
template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned, unsigned long long, float>
T atomicExch(T* address, std::type_identity_t<T> value, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicExchange>(address, value, value, site);
}
template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned, unsigned long long, unsigned short>
T atomicCAS(T* address, std::type_identity_t<T> expected, std::type_identity_t<T> desired, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicCompareAndSwap>(address, expected, desired,
                                                                                       site);
}
template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned, unsigned long long>
T atomicAnd(T* address, std::type_identity_t<T> value, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicAnd>(address, value, value, site);
}
template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned, unsigned long long>
T atomicOr(T* address, std::type_identity_t<T> value, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicOr>(address, value, value, site);
}
template <typename T>
  requires ::tessera::cuda::sim::OneOf<T, int, unsigned, unsigned long long>
T atomicXor(T* address, std::type_identity_t<T> value, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<T, ::tessera::cuda::sim::AtomicXor>(address, value, value, site);
}
inline unsigned atomicInc(unsigned* address, unsigned limit, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<unsigned, ::tessera::cuda::sim::AtomicIncrement>(address, limit, limit, site);
}
inline unsigned atomicDec(unsigned* address, unsigned limit, TESSERA_SITE) {
  return ::tessera::cuda::sim::atomic<unsigned, ::tessera::cuda::sim::AtomicDecrement>(address, limit, limit, site);
}

// Loads and stores with cache hints (read-only, streaming, last use, ...):
// plain, checked accesses here.
template <typename T>
T __ldg(const T* address) { return *address; }
template <typename T>
T __ldcg(const T* address) { return *address; }
template <typename T>
T __ldca(const T* address) { return *address; }
template <typename T>
T __ldcs(const T* address) { return *address; }
template <typename T>
T __ldlu(const T* address) { return *address; }
template <typename T>
T __ldcv(const T* address) { return *address; }
template <typename T>
void __stwb(T* address, T value) { *address = value; }
template <typename T>
void __stcg(T* address, T value) { *address = value; }
template <typename T>
void __stcs(T* address, T value) { *address = value; }
template <typename T>
void __stwt(T* address, T value) { *address = value; }

// Fences order this thread's accesses; blocks run one at a time here, so
// they only keep the compiler from moving accesses across them.
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// clock64 is the simulated clock (intrinsics.h): it advances, it is not
// time. clock() is not provided: it would clash with the C library's.
inline long long clock64() { return ::tessera::cuda::sim::clock_ticks(); }
inline void __nanosleep(unsigned, TESSERA_SITE) { ::tessera::cuda::sim::nano_sleep(site); }

// Integer and bit intrinsics.
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
inline unsigned __brev(unsigned x) {
  unsigned reversed = 0;
  for (int bit = 0; bit < 32; ++bit) reversed |= ((x >> bit) & 1u) << (31 - bit);
  return reversed;
}
inline int __mul24(int a, int b) { return (a << 8 >> 8) * (b << 8 >> 8); }
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}

// Reinterpreting casts.
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

// CUDA's integer min and max (the floating ones are fminf/fmaxf, and
// min/max on floats, which CUDA also overloads).
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a < b ? b : a; }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned umax(unsigned a, unsigned b) { return a < b ? b : a; }

// rsqrtf is MUFU.RSQ on the GPU, within 2 ulp of 1/sqrt(x) (CUDA
// programming guide, table of single-precision maximum ulp errors); here it
// is 1/sqrt(x) computed in double and rounded to float, so results may
// differ from the GPU's in the last 2 bits. rsqrt (double) is within 1 ulp
// there and here (a rounded sqrt, then a rounded division).
inline float rsqrtf(float x) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(x))); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

#undef TESSERA_SITE
