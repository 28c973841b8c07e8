// Picks the C++ type a CPU kernel computes in. Kernels run on f32/f64 (and
// integers or bool where that makes sense); the ops convert bf16/f16 to f32
// before calling them, so a 16-bit dtype reaching here is a bug in an op.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/error.h"

namespace tessera::cpu {

// Calls fn(T{}) with T = float or double.
template <typename Fn>
void visit_float_dtype(DType dtype, const char* kernel, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    default: break;
  }
  fail("cpu::{}: no kernel for dtype {} (the op computes bf16/f16 in f32)", kernel, dtype_name(dtype));
}

// Calls fn(T{}) for every dtype elementwise kernels compute in.
template <typename Fn>
void visit_compute_dtype(DType dtype, const char* kernel, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::boolean: return fn(bool{});
    case DType::bf16:
    case DType::f16:
    case DType::f8e4m3:
    case DType::f8e5m2:
    case DType::u8: break;
  }
  TESSERA_CHECK(dtype != DType::u8, "cpu::{}: u8 is a dtype of raw bytes (packed formats), not computed on; cast it "
                "with ops::to first", kernel);
  fail("cpu::{}: computes in f32, f64, i32, i64 or bool, got {} (the op converts 16- and 8-bit floats)", kernel,
       dtype_name(dtype));
}

}  // namespace tessera::cpu
