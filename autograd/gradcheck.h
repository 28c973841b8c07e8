// Finite-difference gradient checks: the proof that a backward formula is
// right. Compares the analytic gradient of sum(f(inputs) * weights) (weights
// a fixed random projection, so every output element matters) against
// central differences, in f64.
#pragma once

#include <functional>
#include <string>

#include "autograd/node.h"

namespace tessera::autograd {

struct GradcheckOptions {
  double eps = 1e-6;         // finite-difference step
  double atol = 1e-5;
  double rtol = 1e-4;
  uint64_t projection_seed = 1234;
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0.0;
  std::string report;  // the first mismatches: input, element, analytic, numeric
};

// inputs must be f64 leaves with requires_grad set (those without are held
// constant), on cpu or cuda. f returns one tensor.
GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                          GradcheckOptions options = {});

}  // namespace tessera::autograd
