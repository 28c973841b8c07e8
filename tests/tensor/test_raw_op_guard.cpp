// The raw-op guard at the tensor layer alone (tensor/raw_op_guard.h): the
// per-thread grad-mode flag, the GradInputsAllowed scope (nesting, exceptions),
// and that a fresh thread starts guarded. Which op refuses what, and the
// messages, are tested with autograd in tests/autograd/test_raw_op_guard.cpp.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <thread>

#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

using namespace tessera;

namespace {

Tensor requiring_grad() {
  Tensor t = ops::from_vector(std::vector<double>{1, -2, 3}, {3}, {.dtype = DType::f64});
  t.set_requires_grad(true);
  return t;
}

// The message of the error that `op` throws, or "" when it throws none.
template <typename Op>
std::string error_of(const Op& op) {
  try {
    op();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

bool refused(const Tensor& x) { return !error_of([&] { ops::relu(x); }).empty(); }

// Restores grad mode when a test leaves it changed, even on a failure.
struct GradModeRestorer {
  bool previous = grad_mode_enabled();
  ~GradModeRestorer() { set_grad_mode_enabled(previous); }
};

}  // namespace

TEST_CASE("raw op guard: grad mode is on by default and gates the refusal") {
  GradModeRestorer restore;
  const Tensor x = requiring_grad();
  CHECK(grad_mode_enabled());
  CHECK(refused(x));
  set_grad_mode_enabled(false);
  CHECK_FALSE(refused(x));
  CHECK(ops::relu(x).to_vector<double>() == std::vector<double>{1, 0, 3});
  set_grad_mode_enabled(true);
  CHECK(refused(x));
  CHECK_FALSE(refused(x.detach()));
}

TEST_CASE("raw op guard: GradInputsAllowed nests and restores, also when an op throws") {
  const Tensor x = requiring_grad();
  {
    const GradInputsAllowed outer;
    CHECK_FALSE(refused(x));
    {
      const GradInputsAllowed inner;
      CHECK_FALSE(refused(x));
    }
    CHECK_FALSE(refused(x));  // the inner scope restored "allowed", not "refused"
  }
  CHECK(refused(x));
  try {
    const GradInputsAllowed scope;
    ops::reshape(x, {4});  // throws: 3 elements
  } catch (const Error&) {
  }
  CHECK(refused(x));
}

TEST_CASE("raw op guard: each thread starts with grad mode on and no scope open") {
  GradModeRestorer restore;
  const Tensor x = requiring_grad();
  set_grad_mode_enabled(false);
  const GradInputsAllowed scope;
  bool other_grad_mode = false;
  bool other_refused = false;
  std::thread other([&] {
    other_grad_mode = grad_mode_enabled();
    other_refused = refused(x);
    set_grad_mode_enabled(false);  // this thread's flag only
  });
  other.join();
  CHECK(other_grad_mode);
  CHECK(other_refused);
  CHECK_FALSE(grad_mode_enabled());
  CHECK_FALSE(refused(x));
}
