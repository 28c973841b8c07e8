// FloatVector: one SIMD register of f32 (Eigen's packet type for this machine)
// with arithmetic operators and vectorised exp, log, tanh, erf and sigmoid, so
// a kernel writes its formula once, as a template over FloatVector (f32) and
// double (f64, through std::), and runs it with map_vectors. Every element,
// the tail of a span included, takes the same vector path, so results do not
// depend on alignment or on where a span starts.
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
#include <unsupported/Eigen/SpecialFunctions>

namespace tessera::cpu {

struct FloatVector {
  using Packet = Eigen::internal::packet_traits<float>::type;
  static constexpr int64_t kWidth = Eigen::internal::unpacket_traits<Packet>::size;

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

inline FloatVector operator+(FloatVector a, FloatVector b) { return FloatVector::of(Eigen::internal::padd(a.packet, b.packet)); }
inline FloatVector operator-(FloatVector a, FloatVector b) { return FloatVector::of(Eigen::internal::psub(a.packet, b.packet)); }
inline FloatVector operator*(FloatVector a, FloatVector b) { return FloatVector::of(Eigen::internal::pmul(a.packet, b.packet)); }
inline FloatVector operator/(FloatVector a, FloatVector b) { return FloatVector::of(Eigen::internal::pdiv(a.packet, b.packet)); }
inline FloatVector operator-(FloatVector a) { return FloatVector::of(Eigen::internal::pnegate(a.packet)); }

// The math both element types share; the double overloads are the std::
// functions, so one formula template serves f32 and f64.
namespace vec {

inline FloatVector exp(FloatVector x) { return FloatVector::of(Eigen::internal::pexp(x.packet)); }
inline FloatVector log(FloatVector x) { return FloatVector::of(Eigen::internal::plog(x.packet)); }
inline FloatVector sqrt(FloatVector x) { return FloatVector::of(Eigen::internal::psqrt(x.packet)); }
inline FloatVector abs(FloatVector x) { return FloatVector::of(Eigen::internal::pabs(x.packet)); }
inline FloatVector tanh(FloatVector x) {
  return FloatVector::of(Eigen::internal::generic_fast_tanh_float(x.packet));
}
inline FloatVector erf(FloatVector x) {
  return FloatVector::of(Eigen::internal::generic_fast_erf_float(x.packet));
}
// 1 / (1 + e^-x): a few ulp everywhere, tails included (Eigen's logistic
// approximates e^x below -9, off by 1e-4 relative).
inline FloatVector sigmoid(FloatVector x) { return FloatVector(1.0f) / (FloatVector(1.0f) + exp(-x)); }
// max(x, 0), keeping NaN.
inline FloatVector relu(FloatVector x) {
  using Packet = FloatVector::Packet;
  const Packet zero = Eigen::internal::pzero(x.packet);
  return FloatVector::of(Eigen::internal::pselect(Eigen::internal::pcmp_lt(x.packet, zero), zero, x.packet));
}
// 1 where x > 0, else 0 (the derivative of relu).
inline FloatVector step(FloatVector x) {
  using Packet = FloatVector::Packet;
  const Packet zero = Eigen::internal::pzero(x.packet);
  const Packet one = Eigen::internal::pset1<Packet>(1.0f);
  return FloatVector::of(Eigen::internal::pand(Eigen::internal::pcmp_lt(zero, x.packet), one));
}
// -1, 0 or 1 by the sign of x (the derivative of abs).
inline FloatVector sign(FloatVector x) {
  const FloatVector negative = step(-x);
  return step(x) - negative;
}

inline double exp(double x) { return std::exp(x); }
inline double log(double x) { return std::log(x); }
inline double sqrt(double x) { return std::sqrt(x); }
inline double abs(double x) { return std::abs(x); }
inline double tanh(double x) { return std::tanh(x); }
inline double erf(double x) { return std::erf(x); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double relu(double x) { return x < 0.0 ? 0.0 : x; }
inline double step(double x) { return x > 0.0 ? 1.0 : 0.0; }
inline double sign(double x) { return step(x) - step(-x); }

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
