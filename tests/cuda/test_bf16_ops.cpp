// bf16 ops on cuda hand bf16 straight to the kernels (KernelTable::
// computes_bf16): each op gives the bits of the widened path (the same op on
// the f32 values, rounded once to bf16), launches no conversion copies, and
// moves the bytes of its bf16 operands, not of f32 ones. Scalars keep their
// f32 meaning: one that is not a bf16 value does not join as bf16.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#if TESSERA_SIM_CHECKS
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

#include "tests/cuda/counted_bytes.h"

using namespace tessera;
using tessera::testing::launched_kernels;
using tessera::testing::counted_bytes;

namespace {

const Device kCuda(DeviceType::cuda);

// bf16 normal values on cuda (scaled, shifted).
Tensor bf16_normal(const Shape& shape, uint64_t stream, double scale = 1.0, double shift = 0.0) {
  const Tensor values = ops::add(ops::mul(ops::randn(shape, PhiloxKey{77, stream}, {.dtype = DType::f32}), scale), shift);
  return ops::to(ops::to(values, DType::bf16), kCuda);
}

Tensor widened(const Tensor& t) { return ops::to(t, DType::f32); }

// The raw bits of `t` on the host: bf16 and bool compare exactly.
std::vector<uint8_t> bits_of(const Tensor& t) {
  const Tensor host = ops::contiguous(ops::to(t, kCPU));
  std::vector<uint8_t> bytes(static_cast<size_t>(host.numel()) * element_size(host.dtype()));
  if (!bytes.empty()) std::memcpy(bytes.data(), host.raw_data(), bytes.size());
  return bytes;
}

void check_same_bits(const std::string& what, const Tensor& got, const Tensor& want) {
  CAPTURE(what);
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.sizes() == want.sizes());
  CHECK(bits_of(got) == bits_of(want));
}

bool launches_a_copy(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (name.find("copy") != std::string::npos) return true;
  }
  return false;
}

// An op on bf16 cuda tensors: `bf16_op` on the inputs as they are, checked
// against the same op on their f32 values rounded to bf16.
struct Case {
  std::string name;
  std::function<Tensor(const std::vector<Tensor>&)> op;
  std::vector<Tensor> inputs;
  double bytes_per_output;  // the ideal bytes per output element (bf16 operands, 2 bytes each)
};

void check_case(const Case& c) {
  CAPTURE(c.name);
  std::vector<Tensor> wide;
  for (const Tensor& input : c.inputs) wide.push_back(widened(input));
  const Tensor want = c.op(wide);
  Tensor got;
  const std::vector<std::string> names = launched_kernels([&] { got = c.op(c.inputs); });
  const DType expected = want.dtype() == DType::f32 ? DType::bf16 : want.dtype();
  check_same_bits(c.name, got, want.dtype() == DType::f32 ? ops::to(want, DType::bf16) : want);
  CHECK(got.dtype() == expected);
  CHECK_FALSE(launches_a_copy(names));
  const auto bytes = counted_bytes([&] { (void)c.op(c.inputs); });
  if (bytes) {
    const double ideal = c.bytes_per_output * static_cast<double>(got.numel());
    MESSAGE(c.name << ": " << bytes->total() << " bytes counted, " << ideal << " ideal");
    CHECK(static_cast<double>(bytes->total()) <= 1.1 * ideal);
  }
}

}  // namespace

TEST_CASE("bf16 elementwise ops on cuda: the widened path's bits, bf16 bytes, no conversion copies") {
  for (const Shape& shape : {Shape{64, 256}, Shape{37, 203}}) {  // packed, and the per-element path
    CAPTURE(shape);
    const int64_t rows = shape[0], cols = shape[1];
    const Tensor a = bf16_normal(shape, 1), b = bf16_normal(shape, 2), positive = bf16_normal(shape, 3, 0.5, 2.0);
    const Tensor bias = bf16_normal({cols}, 4), per_row = bf16_normal({rows, 1}, 5);
    const std::vector<Case> cases = {
        {"add", [](const auto& t) { return ops::add(t[0], t[1]); }, {a, b}, 6},
        {"sub", [](const auto& t) { return ops::sub(t[0], t[1]); }, {a, b}, 6},
        {"mul", [](const auto& t) { return ops::mul(t[0], t[1]); }, {a, b}, 6},
        {"div", [](const auto& t) { return ops::div(t[0], t[1]); }, {a, positive}, 6},
        {"maximum", [](const auto& t) { return ops::maximum(t[0], t[1]); }, {a, b}, 6},
        {"add a bias row", [](const auto& t) { return ops::add(t[0], t[1]); }, {a, bias}, 4.1},
        {"mul a value per row", [](const auto& t) { return ops::mul(t[0], t[1]); }, {a, per_row}, 4.1},
        {"mul 0.5 (a bf16 scalar)", [](const auto& t) { return ops::mul(t[0], 0.5); }, {a}, 4},
        {"gelu (tanh)", [](const auto& t) { return ops::gelu(t[0], GeluApproximation::tanh); }, {a}, 4},
        {"gelu (erf)", [](const auto& t) { return ops::gelu(t[0], GeluApproximation::none); }, {a}, 4},
        {"exp", [](const auto& t) { return ops::exp(t[0]); }, {a}, 4},
        {"log", [](const auto& t) { return ops::log(t[0]); }, {positive}, 4},
        {"tanh", [](const auto& t) { return ops::tanh(t[0]); }, {a}, 4},
        {"silu", [](const auto& t) { return ops::silu(t[0]); }, {a}, 4},
        {"gelu_backward", [](const auto& t) { return ops::gelu_backward(t[0], t[1], GeluApproximation::tanh); },
         {b, a}, 6},
        {"silu_backward", [](const auto& t) { return ops::silu_backward(t[0], t[1]); }, {b, a}, 6},
        {"gt (bool out)", [](const auto& t) { return ops::gt(t[0], t[1]); }, {a, b}, 5},
    };
    for (const Case& c : cases) check_case(c);
  }
}

TEST_CASE("bf16 in-place updates and reductions on cuda: the widened path's bits") {
  const Tensor a = bf16_normal({48, 160}, 6), b = bf16_normal({48, 160}, 7);
  SUBCASE("add_ (gradient accumulation) reads and writes bf16") {
    Tensor out = ops::clone(a), want = widened(a);
    ops::add_(want, widened(b));
    const std::vector<std::string> names = launched_kernels([&] { ops::add_(out, b); });
    check_same_bits("add_", out, ops::to(want, DType::bf16));
    CHECK_FALSE(launches_a_copy(names));
  }
  SUBCASE("add_ with alpha scales b in f32, rounding once") {
    Tensor out = ops::clone(a), want = widened(a);
    ops::add_(want, widened(b), 0.3);
    ops::add_(out, b, 0.3);
    check_same_bits("add_ alpha", out, ops::to(want, DType::bf16));
  }
  SUBCASE("sum over rows (a bias gradient) reads bf16, accumulates in f64") {
    Tensor got;
    const std::vector<std::string> names = launched_kernels([&] { got = ops::sum(a, {0}); });
    check_same_bits("sum", got, ops::to(ops::sum(widened(a), {0}), DType::bf16));
    const auto bytes = counted_bytes([&] { (void)ops::sum(a, {0}); });
    if (bytes) CHECK(static_cast<double>(bytes->read) <= 1.1 * 2.0 * static_cast<double>(a.numel()));
  }
  SUBCASE("amax, amin and mean") {
    check_same_bits("amax", ops::amax(a, {1}), ops::to(ops::amax(widened(a), {1}), DType::bf16));
    check_same_bits("amin", ops::amin(a, {0}), ops::to(ops::amin(widened(a), {0}), DType::bf16));
    check_same_bits("mean", ops::mean(a, {1}), ops::to(ops::mean(widened(a), {1}), DType::bf16));
  }
}

TEST_CASE("bf16 scalars keep their f32 meaning on cuda") {
  const Tensor a = bf16_normal({8, 40}, 8);
  // 0.1 is no bf16 value: a + 0.1 adds 0.1f in f32 and rounds once, as on the cpu.
  check_same_bits("add 0.1 (cuda and cpu)", ops::add(a, 0.1), ops::to(ops::add(ops::to(a, kCPU), 0.1), kCuda));
  check_same_bits("add 0.1 (widened)", ops::add(a, 0.1), ops::to(ops::add(widened(a), 0.1), DType::bf16));
  Tensor scaled = ops::clone(a);
  ops::mul_(scaled, 0.1);
  check_same_bits("mul_ 0.1", scaled, ops::to(ops::mul(widened(a), 0.1), DType::bf16));
  // Exact ops give the cpu's bits too.
  const Tensor b = bf16_normal({8, 40}, 9);
  check_same_bits("mul (cuda and cpu)", ops::mul(a, b), ops::to(ops::mul(ops::to(a, kCPU), ops::to(b, kCPU)), kCuda));
}

TEST_CASE("bf16 row ops and attention on cuda: the widened path's bits, bf16 bytes, no conversion copies") {
  const int64_t rows = 24, cols = 320;
  const Tensor x = bf16_normal({rows, cols}, 10, 2.0, 0.5), w = bf16_normal({cols}, 11), b = bf16_normal({cols}, 12);
  const Tensor gy = bf16_normal({rows, cols}, 13);
  const std::vector<Case> cases = {
      {"softmax", [](const auto& t) { return ops::softmax(t[0], -1); }, {x}, 4},
      {"log_softmax", [](const auto& t) { return ops::log_softmax(t[0], -1); }, {x}, 4},
      {"softmax_backward", [](const auto& t) { return ops::softmax_backward(t[0], t[1], -1); },
       {gy, ops::softmax(x, -1)}, 6},
      {"layer_norm y", [](const auto& t) { return ops::layer_norm(t[0], t[1], t[2], 1e-5).y; }, {x, w, b}, 4.2},
      {"rms_norm y", [](const auto& t) { return ops::rms_norm(t[0], t[1], 1e-5).y; }, {x, w}, 4.2},
  };
  for (const Case& c : cases) check_case(c);

  SUBCASE("layer_norm backward: statistics in f32, gradients in bf16") {
    const ops::NormOutput forward = ops::layer_norm(x, w, b, 1e-5);
    const ops::NormOutput forward_wide = ops::layer_norm(widened(x), widened(w), widened(b), 1e-5);
    check_same_bits("mean", forward.mean, forward_wide.mean);
    check_same_bits("rstd", forward.rstd, forward_wide.rstd);
    ops::NormGrads grads;
    const std::vector<std::string> names = launched_kernels(
        [&] { grads = ops::layer_norm_backward(gy, x, w, forward.mean, forward.rstd, true); });
    const ops::NormGrads wide =
        ops::layer_norm_backward(widened(gy), widened(x), widened(w), forward.mean, forward.rstd, true);
    check_same_bits("grad x", grads.x, ops::to(wide.x, DType::bf16));
    check_same_bits("grad weight", grads.weight, ops::to(wide.weight, DType::bf16));
    check_same_bits("grad bias", grads.bias, ops::to(wide.bias, DType::bf16));
    CHECK_FALSE(launches_a_copy(names));
  }
  SUBCASE("cross-entropy: loss and logsumexp in f32, the gradient in bf16") {
    std::vector<int64_t> classes;
    for (int64_t row = 0; row < rows; ++row) classes.push_back(row * 37 % cols);
    const Tensor targets = ops::to(ops::from_vector(classes, {rows}), kCuda);
    ops::CrossEntropyOutput out;
    std::vector<std::string> names = launched_kernels([&] { out = ops::cross_entropy_with_logsumexp(x, targets); });
    const ops::CrossEntropyOutput wide = ops::cross_entropy_with_logsumexp(widened(x), targets);
    check_same_bits("logsumexp", out.logsumexp, wide.logsumexp);
    check_same_bits("loss", out.loss, ops::to(wide.loss, DType::bf16));
    const Tensor one = ops::ones({}, {.dtype = DType::bf16, .device = kCuda});
    Tensor grad;
    names = launched_kernels([&] { grad = ops::cross_entropy_backward(one, x, targets, -100, out.logsumexp); });
    check_same_bits("grad",
                    grad, ops::to(ops::cross_entropy_backward(widened(one), widened(x), targets, -100, wide.logsumexp),
                                  DType::bf16));
    const auto bytes = counted_bytes([&] { (void)ops::cross_entropy_backward(one, x, targets, -100, out.logsumexp); });
    if (bytes) CHECK(static_cast<double>(bytes->total()) <= 1.1 * 4.0 * static_cast<double>(x.numel()));
  }
  SUBCASE("causal attention forward and backward") {
    const Shape shape{2, 3, 40, 16};
    const Tensor q = bf16_normal(shape, 14), k = bf16_normal(shape, 15), v = bf16_normal(shape, 16);
    const Tensor g = bf16_normal(shape, 17);
    ops::AttentionOutput out;
    std::vector<std::string> names = launched_kernels([&] { out = ops::causal_attention(q, k, v); });
    CHECK_FALSE(launches_a_copy(names));
    const ops::AttentionOutput wide = ops::causal_attention(widened(q), widened(k), widened(v));
    check_same_bits("out", out.out, ops::to(wide.out, DType::bf16));
    check_same_bits("logsumexp", out.logsumexp, wide.logsumexp);
    ops::AttentionGrads grads;
    names = launched_kernels([&] { grads = ops::causal_attention_backward(g, q, k, v, out.out, out.logsumexp); });
    CHECK_FALSE(launches_a_copy(names));
    const ops::AttentionGrads wide_grads = ops::causal_attention_backward(
        widened(g), widened(q), widened(k), widened(v), widened(out.out), out.logsumexp);
    check_same_bits("dq", grads.q, ops::to(wide_grads.q, DType::bf16));
    check_same_bits("dk", grads.k, ops::to(wide_grads.k, DType::bf16));
    check_same_bits("dv", grads.v, ops::to(wide_grads.v, DType::bf16));
  }
}

TEST_CASE("cuda binary kernels refuse operands of two dtypes") {
  const Tensor a = bf16_normal({4, 8}, 18);
  const Tensor b = ops::to(a, DType::f32);
  const Tensor out = ops::empty({4, 8}, {.dtype = DType::bf16, .device = kCuda});
  CHECK_THROWS_WITH_AS(kernels(kCuda).binary(BinaryOp::add, out, a, b),
                       doctest::Contains("cuda::binary: operands differ in dtype; b is f32"), Error);
  CHECK(kernels(kCuda).computes_bf16);
  CHECK_FALSE(kernels(kCPU).computes_bf16);
  CHECK(kernel_dtype(kCuda, DType::bf16) == DType::bf16);
  CHECK(kernel_dtype(kCPU, DType::bf16) == DType::f32);
  CHECK(kernel_dtype(kCuda, DType::f16) == DType::f32);
}
