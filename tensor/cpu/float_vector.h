// FloatVector: one SIMD register of f32 (Eigen's packet type for this machine)
// with the operations IEEE 754 defines exactly (add, sub, mul, div, sqrt,
// fused multiply-add, compare, select, sign and exponent bits), so a kernel
// writes its formula once, as a template over FloatVector (f32) and double
// (f64, through std::), and runs it with map_vectors. Built only from those
// operations, a formula gives the same bits on every instruction set with
// FMA (AVX2 and AVX-512 alike). Every element, the tail of a span included,
// takes the same vector path, so results do not depend on alignment or on
// where a span starts. The transcendental functions are in vector_math.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

// Eigen's packet code trips GCC's flow warnings (it reads "undefined" registers
// on purpose) and packet types carry alignment attributes that template
// arguments drop; neither is a defect here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wignored-attributes"
#include <Eigen/Core>

namespace tessera::cpu {

struct FloatVector {
  using Packet = Eigen::internal::packet_traits<float>::type;
  using IntPacket = Eigen::internal::unpacket_traits<Packet>::integer_packet;  // int32 lanes
  static constexpr int64_t kWidth = Eigen::internal::unpacket_traits<Packet>::size;
  // What this build's vectors (and Eigen's GEMM) were compiled for (-march).
#if defined(__AVX512F__)
  static constexpr const char* kInstructionSet = "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__)
  static constexpr const char* kInstructionSet = "AVX2+FMA";
#elif defined(__AVX__)
  static constexpr const char* kInstructionSet = "AVX";
#elif defined(__SSE2__)
  static constexpr const char* kInstructionSet = "SSE2";
#else
  static constexpr const char* kInstructionSet = "scalar";
#endif

  Packet packet;

  FloatVector(float value) : packet(Eigen::internal::pset1<Packet>(value)) {}  // broadcast
  static FloatVector of(Packet packet) {
    FloatVector vector(0.0f);
    vector.packet = packet;
    return vector;
  }
  static FloatVector load(const float* data) { return of(Eigen::internal::ploadu<Packet>(data)); }
  void store(float* data) const { Eigen::internal::pstoreu(data, packet); }
};

// A lane-wise condition: all bits set where true (what Eigen's compares give).
struct FloatMask {
  FloatVector::Packet bits;
};

inline FloatVector operator+(FloatVector a, FloatVector b) { return FloatVector::of(Eigen::internal::padd(a.packet, b.packet)); }
inline FloatVector operator-(FloatVector a, FloatVector b) { return FloatVector::of(Eigen::internal::psub(a.packet, b.packet)); }
inline FloatVector operator*(FloatVector a, FloatVector b) { return FloatVector::of(Eigen::internal::pmul(a.packet, b.packet)); }
inline FloatVector operator/(FloatVector a, FloatVector b) { return FloatVector::of(Eigen::internal::pdiv(a.packet, b.packet)); }
// IEEE negation flips the sign bit (-0 for 0, NaN's sign too); Eigen's
// pnegate computes 0 - a on SSE/AVX/AVX-512, which gives +0.
inline FloatVector operator-(FloatVector a) {
  return FloatVector::of(Eigen::internal::pxor(a.packet, Eigen::internal::pset1<FloatVector::Packet>(-0.0f)));
}

// Compares are false where either side is NaN, as IEEE says.
inline FloatMask operator<(FloatVector a, FloatVector b) { return {Eigen::internal::pcmp_lt(a.packet, b.packet)}; }
inline FloatMask operator==(FloatVector a, FloatVector b) { return {Eigen::internal::pcmp_eq(a.packet, b.packet)}; }

namespace vec {

// a * b + c rounded once where the target has FMA (x86-64-v3 and up), as
// mul then add elsewhere.
inline FloatVector fma(FloatVector a, FloatVector b, FloatVector c) {
  return FloatVector::of(Eigen::internal::pmadd(a.packet, b.packet, c.packet));
}
inline FloatVector select(FloatMask mask, FloatVector if_true, FloatVector if_false) {
  return FloatVector::of(Eigen::internal::pselect(mask.bits, if_true.packet, if_false.packet));
}
inline FloatMask is_nan(FloatVector x) {
  const FloatVector::Packet equal = Eigen::internal::pcmp_eq(x.packet, x.packet);
  return {Eigen::internal::pandnot(Eigen::internal::ptrue(equal), equal)};
}
// |magnitude| with the sign bit of `sign` (NaN and -0 included).
inline FloatVector copysign(FloatVector magnitude, FloatVector sign) {
  const FloatVector::Packet sign_bit = Eigen::internal::pset1<FloatVector::Packet>(-0.0f);
  return FloatVector::of(Eigen::internal::por(Eigen::internal::pandnot(magnitude.packet, sign_bit),
                                              Eigen::internal::pand(sign.packet, sign_bit)));
}

// 2^k for int32 lanes k in [-126, 127], built from its exponent bits.
inline FloatVector exp2_integer(FloatVector::IntPacket k) {
  using namespace Eigen::internal;
  const FloatVector::IntPacket biased = padd(k, pset1<FloatVector::IntPacket>(127));
  return FloatVector::of(preinterpret<FloatVector::Packet>(plogical_shift_left<23>(biased)));
}
// x * 2^n for integer-valued n in [-252, 254], as (x * 2^ceil(n/2)) *
// 2^floor(n/2): for x in [0.5, 2] and n >= -200 the first product is exact,
// so the result rounds once, also where it underflows into the subnormals.
inline FloatVector scale_by_power_of_two(FloatVector x, FloatVector n) {
  using namespace Eigen::internal;
  const FloatVector::IntPacket whole = pcast<FloatVector::Packet, FloatVector::IntPacket>(n.packet);
  const FloatVector::IntPacket half = parithmetic_shift_right<1>(whole);  // floor(n / 2)
  return x * exp2_integer(psub(whole, half)) * exp2_integer(half);
}
// For positive normal x = m * 2^e with m in [1, 2): e (as a float) and m.
inline FloatVector exponent_of(FloatVector x) {
  using namespace Eigen::internal;
  using IntPacket = FloatVector::IntPacket;
  const IntPacket biased = plogical_shift_right<23>(preinterpret<IntPacket>(x.packet));
  return FloatVector::of(pcast<IntPacket, FloatVector::Packet>(psub(biased, pset1<IntPacket>(127))));
}
inline FloatVector significand_of(FloatVector x) {
  using namespace Eigen::internal;
  using IntPacket = FloatVector::IntPacket;
  const IntPacket fraction = pand(preinterpret<IntPacket>(x.packet), pset1<IntPacket>(0x007fffff));
  return FloatVector::of(preinterpret<FloatVector::Packet>(por(fraction, pset1<IntPacket>(0x3f800000))));
}

// The cheap maths both element types share; the double overloads are plain
// C++, so one formula template serves f32 and f64.
inline FloatVector sqrt(FloatVector x) { return FloatVector::of(Eigen::internal::psqrt(x.packet)); }
inline FloatVector abs(FloatVector x) { return FloatVector::of(Eigen::internal::pabs(x.packet)); }
// max(x, 0), keeping NaN.
inline FloatVector relu(FloatVector x) { return select(x < FloatVector(0.0f), FloatVector(0.0f), x); }
// 1 where x > 0, else 0 (the derivative of relu).
inline FloatVector step(FloatVector x) { return select(FloatVector(0.0f) < x, FloatVector(1.0f), FloatVector(0.0f)); }
// -1, 0 or 1 by the sign of x (the derivative of abs).
inline FloatVector sign(FloatVector x) { return step(x) - step(-x); }

inline double select(bool condition, double if_true, double if_false) { return condition ? if_true : if_false; }
inline double sqrt(double x) { return std::sqrt(x); }
inline double abs(double x) { return std::abs(x); }
inline double relu(double x) { return x < 0.0 ? 0.0 : x; }
inline double step(double x) { return x > 0.0 ? 1.0 : 0.0; }
inline double sign(double x) { return step(x) - step(-x); }

// x limited to [low, high]; NaN stays NaN (compares with NaN are false).
template <typename V>
V clamp(V x, V low, V high) {
  return select(x < low, low, select(high < x, high, x));
}

}  // namespace vec

// out[i] = fn(x[i]) over n contiguous floats, the tail through a padded vector.
template <typename Fn>
void map_vectors(float* out, const float* x, int64_t n, const Fn& fn) {
  constexpr int64_t W = FloatVector::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) fn(FloatVector::load(x + i)).store(out + i);
  if (i == n) return;
  float x_tail[W] = {}, out_tail[W];
  std::copy(x + i, x + n, x_tail);
  fn(FloatVector::load(x_tail)).store(out_tail);
  std::copy(out_tail, out_tail + (n - i), out + i);
}

// out[i] = fn(a[i], b[i]) over n contiguous floats.
template <typename Fn>
void map_vectors(float* out, const float* a, const float* b, int64_t n, const Fn& fn) {
  constexpr int64_t W = FloatVector::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) fn(FloatVector::load(a + i), FloatVector::load(b + i)).store(out + i);
  if (i == n) return;
  float a_tail[W] = {}, b_tail[W] = {}, out_tail[W];
  std::copy(a + i, a + n, a_tail);
  std::copy(b + i, b + n, b_tail);
  fn(FloatVector::load(a_tail), FloatVector::load(b_tail)).store(out_tail);
  std::copy(out_tail, out_tail + (n - i), out + i);
}

// The f64 versions: plain loops over the double overloads.
template <typename Fn>
void map_vectors(double* out, const double* x, int64_t n, const Fn& fn) {
  for (int64_t i = 0; i < n; ++i) out[i] = fn(x[i]);
}
template <typename Fn>
void map_vectors(double* out, const double* a, const double* b, int64_t n, const Fn& fn) {
  for (int64_t i = 0; i < n; ++i) out[i] = fn(a[i], b[i]);
}

}  // namespace tessera::cpu

#pragma GCC diagnostic pop
