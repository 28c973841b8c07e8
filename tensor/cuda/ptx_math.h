// Single-instruction arithmetic for kernel sources (.cu files only), where
// the CUDA C++ spelling costs several instructions a value. The tensor-core
// attention kernels apply them to every score: there, between two mma.sync,
// the CUDA-core instructions a score costs decide the kernel's speed (a
// 16 x 64 score tile is 64 mma, 256 cycles of one tensor pipe, against about
// 30 issue cycles per score for expf and a software bf16 rounding).
//
//   exp2_approx(x)          ex2.approx.ftz.f32: 2^x on the special-function
//                           unit, within 2 ulp (PTX ISA: maximum relative
//                           error 2^-22); subnormal inputs read as 0 and
//                           subnormal results are 0 (.ftz).
//   pack_bf16x2(low, high)  cvt.rn.bf16x2.f32: both values rounded to bf16,
//                           nearest even, in one 32-bit register, `low` in
//                           the low half (mma's element order); sm_80+.
//
// The simulator computes 2^x in f64 and rounds once, the accurate end of
// what ex2.approx may give, so a kernel's error bound must allow the 2 ulp
// (as it does for expf); the bf16 rounding is exactly the hardware's (a NaN
// stays a quiet NaN; its payload bits may differ).
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/cuda/portability.h"
#include "tensor/float16_bits.h"

namespace tessera::cuda {

#if defined(__CUDACC__)

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));  // first source: the high half
  return packed;
}

#else  // the simulator

inline float flush_subnormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

inline float exp2_approx(float x) {
  return flush_subnormal(static_cast<float>(std::exp2(static_cast<double>(flush_subnormal(x)))));
}

inline uint32_t pack_bf16x2(float low, float high) {
  return static_cast<uint32_t>(float16_bits::bfloat16_from_float(low)) |
         static_cast<uint32_t>(float16_bits::bfloat16_from_float(high)) << 16;
}

#endif

}  // namespace tessera::cuda
