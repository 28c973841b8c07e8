// What the tests that compare two training runs share (FSDP against one
// process, an accumulated batch against a whole one, a resumed run against an
// uninterrupted one): the pinned thread count that bitwise comparisons need,
// and the tolerances of the other comparisons with the reasons they hold on
// every machine. Used by the fsdp and examples suites.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/parallel.h"

namespace tessera::fsdp::testing {

// Sets this thread's intra-op thread count for a scope and restores it after.
// Eigen's GEMM blocks its inner dimension by the thread count, so two runs
// compared bitwise must use the same count.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int threads) : saved_(num_threads()) { set_num_threads(threads); }
  ~IntraOpThreads() { set_num_threads(saved_); }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int saved_;
};

// How far two runs that sum in different orders may part.
struct Tolerance {
  double loss_rtol;   // per step, relative
  double norm_rtol;   // per step, relative
  double param_atol;  // every element: |actual - expected| <= param_atol + param_rtol * |expected|
  double param_rtol;
};

// f64 with AdamW: rounding noise stays in AdamW's linear range. A gradient's
// rounding error is below (terms summed) * 2^-53 of the magnitudes it sums,
// under 1e-13 here (at most ~300 terms, gradient norms at most 3), five orders
// below AdamW's eps (1e-8): no element's noise is ever divided by itself, so
// every update's error is lr * (gradient error) / (sqrt(v) + eps), linear in
// the rounding. Another machine's GEMM blocking rounds other sums, but each
// sum's error keeps its bound, and typical errors sit sqrt(terms) ~ 17 times
// below it; so the differences measured here hold on any machine within a
// small factor, and each tolerance is ~1000 times them. Measured at most, on
// AVX2 and AVX-512 and with another GEMM blocking (2 intra-op threads against
// 1): parameters 6e-13, losses 7e-14 and gradient norms 1.2e-11 relative.
inline constexpr Tolerance kF64AdamW{.loss_rtol = 1e-10, .norm_rtol = 1e-8, .param_atol = 1e-9, .param_rtol = 1e-9};

// f32 with SGD: an update is lr * (gradient + decay * parameter), so a
// rounding difference in a gradient moves the parameter by lr times that
// difference, never by lr. Over 10 steps, to first order: each run rounds
// each parameter 10 times (2^-24 relative each), so they part by at most
// 1.2e-6 |p|; gradient rounding (at most 300 * 2^-24 relative, gradients at
// most 3) adds at most 10 * lr * 5.4e-5 = 5.4e-6. Losses and gradient norms
// follow the parameters to first order (and round to f32, 6e-8). Measured at
// most, on AVX2 and AVX-512: parameters 1.1e-8 absolute, losses 8e-8 and
// gradient norms 6e-8 relative.
inline constexpr Tolerance kF32Sgd{.loss_rtol = 1e-5, .norm_rtol = 1e-5, .param_atol = 1e-5, .param_rtol = 1e-5};

// Runs that do the same arithmetic still sum their gradient norms in other
// orders (per shard, then across ranks). A sum of n non-negative terms, in any
// order, is within (n - 1) * 2^-53 relative of the exact sum, and so are the
// squares of f64 gradients (2^-53 each; f32 ones square exactly); the square
// root halves relative errors, so two such norms of `elements` gradient
// values part by at most 2 * elements * 2^-53 relative.
inline double reassociated_norm_rtol(int64_t elements) { return 2.0 * static_cast<double>(elements) * std::ldexp(1.0, -53); }

}  // namespace tessera::fsdp::testing
