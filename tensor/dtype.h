// Element types. CPU kernels compute in f32 (f64 for gradient checks); bf16
// and f16 are storage and communication types, converted with round-to-
// nearest-even so that a value survives a round trip through the wire format
// exactly as on GPUs. f8e4m3 and f8e5m2 are FP8 training's 8-bit floats
// (tensor/float8_bits.h): computed in f32 like the 16-bit ones, rounded to
// nearest even and saturated as the hardware's conversion does. u8 is raw bytes: packed formats (NF4's codes, an
// all-gather's mixed payloads) are u8 tensors that are created, copied,
// viewed, gathered and cast, never computed on; a byte never passes through
// a float type on its way (a NaN-canonicalising copy would change it).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "tensor/float16_bits.h"
#include "tensor/float8_bits.h"

namespace tessera {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, boolean, u8, f8e4m3, f8e5m2 };

constexpr int kNumDTypes = 10;

size_t element_size(DType dtype);
std::string_view dtype_name(DType dtype);
DType dtype_from_name(std::string_view name);  // throws on an unknown name
bool is_floating(DType dtype);
// The type elementwise kernels compute in: f64 for f64, f32 for the other
// floats, the type itself for integers and bool.
DType compute_dtype(DType dtype);
// The result type of a binary op between a and b (float beats int, wider beats
// narrower, f32 beats bf16/f16 mixes).
DType promote_types(DType a, DType b);

// 16-bit brain float: the top half of an IEEE f32.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value) : bits(float16_bits::bfloat16_from_float(value)) {}
  explicit operator float() const { return float16_bits::float_from_bfloat16(bits); }
};

// IEEE 754 binary16.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float value) : bits(float16_bits::half_from_float(value)) {}
  explicit operator float() const { return float16_bits::float_from_half(bits); }
};

// The 8-bit floats (tensor/float8_bits.h).
struct Float8E4M3 {
  uint8_t bits = 0;
  Float8E4M3() = default;
  explicit Float8E4M3(float value) : bits(float8_bits::code_from_float(value, float8_bits::e4m3())) {}
  explicit operator float() const { return float8_bits::float_from_code(bits, float8_bits::e4m3()); }
};

struct Float8E5M2 {
  uint8_t bits = 0;
  Float8E5M2() = default;
  explicit Float8E5M2(float value) : bits(float8_bits::code_from_float(value, float8_bits::e5m2())) {}
  explicit operator float() const { return float8_bits::float_from_code(bits, float8_bits::e5m2()); }
};

// Maps a C++ element type to its DType.
template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<Float8E4M3> { static constexpr DType value = DType::f8e4m3; };
template <> struct dtype_of<Float8E5M2> { static constexpr DType value = DType::f8e5m2; };

// Calls fn with a value of the C++ type of `dtype` (its value is unused;
// only its type matters): visit_dtype(t.dtype(), [&]<typename T>(T) { ... }).
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(BFloat16{});
    case DType::f16: return fn(Half{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::boolean: return fn(bool{});
    case DType::u8: return fn(uint8_t{});
    case DType::f8e4m3: return fn(Float8E4M3{});
    case DType::f8e5m2: return fn(Float8E5M2{});
  }
  return fn(float{});
}

}  // namespace tessera
