// One op namespace for model code (issue 15): a raw op (tensor/ops.h) refuses
// an input that requires grad while grad mode is on, naming the op, the input
// and the differentiable function to call instead. Every raw op with a tensor
// input is called here three ways: with an input that requires grad (refused,
// with the right message), the same under NoGradGuard, and with a detached
// input (both accepted, which also shows the call itself is valid). The twin
// a refusal names is held to the two headers' declarations. Then the exempt
// ops, differentiable functions and backward, and a hand-written model that
// used ops::relu by mistake.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "tensor/raw_op_guard.h"

using namespace tessera;
using namespace tessera::autograd;

namespace {

// Distinct values in [0.5, 1.5): positive for log, sqrt and pow.
Tensor data(const Shape& shape) {
  const double n = static_cast<double>(shape_numel(shape));
  return ops::reshape(ops::add(ops::div(ops::arange(0, n, 1, {.dtype = DType::f64}), n), 0.5), shape);
}

Tensor requiring_grad(const Shape& shape) {
  Tensor t = data(shape);
  t.set_requires_grad(true);
  return t;
}

Tensor index_tensor(const std::vector<int64_t>& values) {
  return ops::from_vector(values, {static_cast<int64_t>(values.size())});
}

std::string error_of(const std::function<void()>& op) {
  try {
    op();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Every name followed by "(" outside comments in `header` (a path from the
// source root): each function it declares, however the declaration is laid
// out, read independently of the build's own reading (tensor/raw_op_twins.py).
std::set<std::string> called_or_declared(const std::string& header) {
  std::ifstream file(std::string(TESSERA_SOURCE_ROOT) + "/" + header);
  REQUIRE(file.good());
  static const std::regex name_and_parenthesis(R"(\b([A-Za-z_]\w*)\s*\()");
  std::set<std::string> names;
  for (std::string line; std::getline(file, line);) {
    const std::string code = line.substr(0, line.find("//"));
    for (std::sregex_iterator it(code.begin(), code.end(), name_and_parenthesis), end; it != end; ++it) {
      names.insert((*it)[1]);
    }
  }
  return names;
}

void check_close(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.sizes() == expected.sizes());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(e[i]));
}

// One raw call: `tensor` goes into the op's input `input` (its name in
// tensor/ops.h); every other argument needs no grad.
struct RawCall {
  const char* op;
  const char* input;
  const char* twin;  // the differentiable function the error names, or nullptr when there is none
  Shape shape;
  std::function<void(const Tensor& tensor)> call;
};

std::vector<RawCall> raw_calls() {
  const Shape s{2, 3};
  const Tensor other = data(s);
  const Tensor mask = ops::gt(data(s), 1.0);
  const Tensor row = index_tensor({1});
  const PhiloxKey key{7, 0};
  auto attention = [](const Tensor& q, const Tensor& k, const Tensor& v) { return ops::causal_attention(q, k, v); };
  const Shape qkv{1, 1, 2, 3};
  const ops::AttentionOutput forward = attention(data(qkv), data(qkv), data(qkv));
  const ops::NormOutput norm = ops::layer_norm(data(s), data({3}), data({3}), 1e-5);
  return {
      // views
      {"view", "tensor", "tessera::view", s, [](const Tensor& t) { ops::view(t, {3, 2}); }},
      {"reshape", "tensor", "tessera::reshape", s, [](const Tensor& t) { ops::reshape(t, {6}); }},
      {"flatten", "tensor", "tessera::flatten", s, [](const Tensor& t) { ops::flatten(t); }},
      {"permute", "tensor", "tessera::permute", s, [](const Tensor& t) { ops::permute(t, {1, 0}); }},
      {"transpose", "tensor", "tessera::transpose", s, [](const Tensor& t) { ops::transpose(t, 0, 1); }},
      {"narrow", "tensor", "tessera::narrow", s, [](const Tensor& t) { ops::narrow(t, 0, 0, 1); }},
      {"slice", "tensor", "tessera::slice", s, [](const Tensor& t) { ops::slice(t, 1, 0, 3, 2); }},
      {"select", "tensor", "tessera::select", s, [](const Tensor& t) { ops::select(t, 0, 1); }},
      {"squeeze", "tensor", "tessera::squeeze", {1, 3}, [](const Tensor& t) { ops::squeeze(t); }},
      {"squeeze", "tensor", "tessera::squeeze", {1, 3}, [](const Tensor& t) { ops::squeeze(t, 0); }},
      {"unsqueeze", "tensor", "tessera::unsqueeze", s, [](const Tensor& t) { ops::unsqueeze(t, 0); }},
      {"expand", "tensor", "tessera::expand", s, [](const Tensor& t) { ops::expand(t, {2, 2, 3}); }},
      {"as_strided", "tensor", nullptr, s, [](const Tensor& t) { ops::as_strided(t, {2}, {1}, 0); }},
      // copies and conversions
      {"clone", "tensor", "tessera::clone", s, [](const Tensor& t) { ops::clone(t); }},
      {"contiguous", "tensor", "tessera::contiguous", s, [](const Tensor& t) { ops::contiguous(t); }},
      {"to", "tensor", "tessera::to", s, [](const Tensor& t) { ops::to(t, DType::f32); }},
      {"to", "tensor", "tessera::to", s, [](const Tensor& t) { ops::to(t, kMeta); }},
      {"copy_", "src", nullptr, s, [](const Tensor& t) {
         Tensor dst = ops::zeros({2, 3});
         ops::copy_(dst, t);
       }},
      // joining and splitting
      {"cat", "tensors[1]", "tessera::cat", s, [other](const Tensor& t) { ops::cat({other, t}, 0); }},
      {"stack", "tensors[1]", "tessera::stack", s, [other](const Tensor& t) { ops::stack({other, t}, 0); }},
      {"split", "tensor", "tessera::split", s, [](const Tensor& t) { ops::split(t, 1, 0); }},
      {"split_with_sizes", "tensor", nullptr, s, [](const Tensor& t) { ops::split_with_sizes(t, {1, 2}, 1); }},
      {"chunk", "tensor", "tessera::chunk", s, [](const Tensor& t) { ops::chunk(t, 2, 0); }},
      {"index_select", "tensor", "tessera::index_select", s, [row](const Tensor& t) { ops::index_select(t, 0, row); }},
      {"index_add_", "source", nullptr, {1, 3}, [row](const Tensor& t) {
         Tensor out = ops::zeros({2, 3}, {.dtype = DType::f64});
         ops::index_add_(out, 0, row, t);
       }},
      // elementwise
      {"add", "a", "tessera::add", s, [other](const Tensor& t) { ops::add(t, other); }},
      {"add", "b", "tessera::add", s, [other](const Tensor& t) { ops::add(other, t); }},
      {"sub", "b", "tessera::sub", s, [other](const Tensor& t) { ops::sub(other, t); }},
      {"mul", "a", "tessera::mul", s, [other](const Tensor& t) { ops::mul(t, other); }},
      {"div", "b", "tessera::div", s, [other](const Tensor& t) { ops::div(other, t); }},
      {"pow", "a", "tessera::pow", s, [other](const Tensor& t) { ops::pow(t, other); }},
      {"maximum", "a", nullptr, s, [other](const Tensor& t) { ops::maximum(t, other); }},
      {"minimum", "b", nullptr, s, [other](const Tensor& t) { ops::minimum(other, t); }},
      {"add", "a", "tessera::add", s, [](const Tensor& t) { ops::add(t, 1.0); }},
      {"sub", "a", "tessera::sub", s, [](const Tensor& t) { ops::sub(t, 1.0); }},
      {"mul", "a", "tessera::mul", s, [](const Tensor& t) { ops::mul(t, 3.0); }},
      {"div", "a", "tessera::div", s, [](const Tensor& t) { ops::div(t, 3.0); }},
      {"pow", "a", "tessera::pow", s, [](const Tensor& t) { ops::pow(t, 2.0); }},  // computed as mul(a, a)
      {"pow", "a", "tessera::pow", s, [](const Tensor& t) { ops::pow(t, 0.5); }},
      {"add_", "b", nullptr, s, [](const Tensor& t) {
         Tensor out = ops::zeros({2, 3});
         ops::add_(out, t, 2.0);
       }},
      {"mul_", "b", nullptr, s, [](const Tensor& t) {
         Tensor out = ops::ones({2, 3}, {.dtype = DType::f64});
         ops::mul_(out, t);
       }},
      {"neg", "x", "tessera::neg", s, [](const Tensor& t) { ops::neg(t); }},
      {"exp", "x", "tessera::exp", s, [](const Tensor& t) { ops::exp(t); }},
      {"log", "x", "tessera::log", s, [](const Tensor& t) { ops::log(t); }},
      {"sqrt", "x", "tessera::sqrt", s, [](const Tensor& t) { ops::sqrt(t); }},
      {"rsqrt", "x", "tessera::rsqrt", s, [](const Tensor& t) { ops::rsqrt(t); }},
      {"abs", "x", nullptr, s, [](const Tensor& t) { ops::abs(t); }},
      {"tanh", "x", "tessera::tanh", s, [](const Tensor& t) { ops::tanh(t); }},
      {"sigmoid", "x", "tessera::sigmoid", s, [](const Tensor& t) { ops::sigmoid(t); }},
      {"relu", "x", "tessera::relu", s, [](const Tensor& t) { ops::relu(t); }},
      {"gelu", "x", "tessera::gelu", s, [](const Tensor& t) { ops::gelu(t, GeluApproximation::none); }},
      {"silu", "x", "tessera::silu", s, [](const Tensor& t) { ops::silu(t); }},
      {"tanh_backward", "grad_out", nullptr, s, [other](const Tensor& t) { ops::tanh_backward(t, other); }},
      {"tanh_backward", "y", nullptr, s, [other](const Tensor& t) { ops::tanh_backward(other, t); }},
      {"relu_backward", "x", nullptr, s, [other](const Tensor& t) { ops::relu_backward(other, t); }},
      {"gelu_backward", "x", nullptr, s,
       [other](const Tensor& t) { ops::gelu_backward(other, t, GeluApproximation::tanh); }},
      {"silu_backward", "grad_out", nullptr, s, [other](const Tensor& t) { ops::silu_backward(t, other); }},
      {"sigmoid_backward", "y", nullptr, s, [other](const Tensor& t) { ops::sigmoid_backward(other, t); }},
      {"where", "a", "tessera::where", s, [mask, other](const Tensor& t) { ops::where(mask, t, other); }},
      {"where", "b", "tessera::where", s, [mask, other](const Tensor& t) { ops::where(mask, other, t); }},
      {"masked_fill", "x", "tessera::masked_fill", s, [mask](const Tensor& t) { ops::masked_fill(t, mask, 0.0); }},
      {"dropout", "x", "tessera::dropout", s, [key](const Tensor& t) { ops::dropout(t, 0.5, key); }},
      // reductions
      {"sum", "x", "tessera::sum", s, [](const Tensor& t) { ops::sum(t, {1}); }},
      {"mean", "x", "tessera::mean", s, [](const Tensor& t) { ops::mean(t); }},
      {"amax", "x", "tessera::amax", s, [](const Tensor& t) { ops::amax(t, {0}); }},
      {"amin", "x", nullptr, s, [](const Tensor& t) { ops::amin(t); }},
      {"max", "x", "tessera::max", s, [](const Tensor& t) { ops::max(t, 1); }},
      {"sum_to_shape", "grad", nullptr, s, [](const Tensor& t) { ops::sum_to_shape(t, {1, 3}); }},
      // linear algebra
      {"matmul", "a", "tessera::matmul", s, [](const Tensor& t) { ops::matmul(t, data({3, 2})); }},
      {"matmul", "b", "tessera::matmul", {3, 2}, [](const Tensor& t) { ops::matmul(data({2, 3}), t); }},
      {"linear", "x", "tessera::linear", s, [](const Tensor& t) { ops::linear(t, data({4, 3}), data({4})); }},
      {"linear", "weight", "tessera::linear", {4, 3}, [](const Tensor& t) { ops::linear(data({2, 3}), t, Tensor()); }},
      {"linear", "bias", "tessera::linear", {4}, [](const Tensor& t) { ops::linear(data({2, 3}), data({4, 3}), t); }},
      {"linear_gelu", "x", nullptr, s, [](const Tensor& t) { ops::linear_gelu(t, data({4, 3}), data({4})); }},
      {"linear_gelu", "weight", nullptr, {4, 3}, [](const Tensor& t) { ops::linear_gelu(data({2, 3}), t, Tensor()); }},
      {"linear_gelu", "bias", nullptr, {4}, [](const Tensor& t) { ops::linear_gelu(data({2, 3}), data({4, 3}), t); }},
      {"matmul_gelu_backward", "a", nullptr, s,
       [](const Tensor& t) { ops::matmul_gelu_backward(t, data({3, 4}), data({2, 4})); }},
      {"matmul_gelu_backward", "b", nullptr, {3, 4},
       [](const Tensor& t) { ops::matmul_gelu_backward(data({2, 3}), t, data({2, 4})); }},
      {"matmul_gelu_backward", "pre", nullptr, {2, 4},
       [](const Tensor& t) { ops::matmul_gelu_backward(data({2, 3}), data({3, 4}), t); }},
      {"linear_weight_backward", "grad_y", nullptr, s,
       [](const Tensor& t) { ops::linear_weight_backward(t, data({2, 5}), true); }},
      {"linear_weight_backward", "x", nullptr, {2, 5},
       [](const Tensor& t) { ops::linear_weight_backward(data({2, 3}), t, true); }},
      // neural-network functions
      {"softmax", "x", "tessera::softmax", s, [](const Tensor& t) { ops::softmax(t, 1); }},
      {"log_softmax", "x", "tessera::log_softmax", s, [](const Tensor& t) { ops::log_softmax(t, 0); }},
      {"softmax_backward", "y", nullptr, s, [other](const Tensor& t) { ops::softmax_backward(other, t, 1); }},
      {"log_softmax_backward", "grad_out", nullptr, s,
       [other](const Tensor& t) { ops::log_softmax_backward(t, other, 1); }},
      {"layer_norm", "x", "tessera::layer_norm", s, [](const Tensor& t) { ops::layer_norm(t, data({3}), Tensor(), 1e-5); }},
      {"layer_norm", "bias", "tessera::layer_norm", {3},
       [](const Tensor& t) { ops::layer_norm(data({2, 3}), data({3}), t, 1e-5); }},
      {"rms_norm", "weight", "tessera::rms_norm", {3}, [](const Tensor& t) { ops::rms_norm(data({2, 3}), t, 1e-6); }},
      {"layer_norm_backward", "grad_y", nullptr, s,
       [norm](const Tensor& t) { ops::layer_norm_backward(t, data({2, 3}), data({3}), norm.mean, norm.rstd, true); }},
      {"rms_norm_backward", "x", nullptr, s,
       [norm](const Tensor& t) { ops::rms_norm_backward(data({2, 3}), t, Tensor(), norm.rstd); }},
      {"embedding", "weight", "tessera::embedding", {4, 3},
       [](const Tensor& t) { ops::embedding(t, index_tensor({3, 0})); }},
      {"embedding_backward", "grad_out", nullptr, s,
       [](const Tensor& t) { ops::embedding_backward(t, index_tensor({3, 0}), 4); }},
      {"cross_entropy", "logits", "tessera::cross_entropy", s,
       [](const Tensor& t) { ops::cross_entropy(t, index_tensor({2, 0})); }},
      {"cross_entropy_backward", "grad_loss", nullptr, {},
       [](const Tensor& t) { ops::cross_entropy_backward(t, data({2, 3}), index_tensor({2, 0})); }},
      {"causal_attention", "v", "tessera::scaled_dot_product_attention", qkv,
       [attention, qkv](const Tensor& t) { attention(data(qkv), data(qkv), t); }},
      {"causal_attention_backward", "out", nullptr, qkv,
       [forward, qkv](const Tensor& t) {
         ops::causal_attention_backward(data(qkv), data(qkv), data(qkv), data(qkv), t, forward.logsumexp);
       }},
  };
}

}  // namespace

TEST_CASE("raw op guard: ops::relu on an input that requires grad names the op, the input and tessera::relu") {
  const Tensor x = requiring_grad({2, 3});
  const std::string message = error_of([&] { ops::relu(x); });
  CHECK(message ==
        "ops::relu: input x requires grad while grad mode is on, so its gradient would be lost: call tessera::relu "
        "(autograd/functions.h), or compute under autograd::NoGradGuard");
  // A non-leaf requires grad through its history.
  const Tensor h = mul(x, 2.0);
  CHECK(contains(error_of([&] { ops::relu(h); }), "ops::relu: input x requires grad"));
}

TEST_CASE("raw op guard: every raw op with a tensor input refuses one that requires grad, naming what to call") {
  for (const RawCall& raw : raw_calls()) {
    CAPTURE(raw.op);
    CAPTURE(raw.input);
    const Tensor tensor = requiring_grad(raw.shape);
    const std::string message = error_of([&] { raw.call(tensor); });
    CHECK(contains(message, fmt::format("ops::{}: input {} requires grad while grad mode is on", raw.op, raw.input)));
    if (raw.twin != nullptr) {
      CHECK(contains(message, fmt::format("call {} (autograd/functions.h)", raw.twin)));
    } else {
      CHECK(contains(message, fmt::format("ops::{} has no differentiable version", raw.op)));
      CHECK(contains(message, "autograd::NoGradGuard"));
    }
  }
}

TEST_CASE("raw op guard: a refusal names the same-named function of autograd/functions.h, and only one it declares") {
  const std::set<std::string> raw = called_or_declared("tensor/ops.h");
  const std::set<std::string> differentiable = called_or_declared("autograd/functions.h");
  REQUIRE(raw.contains("relu"));
  REQUIRE(differentiable.contains("relu"));
  for (const std::string& op : raw) {
    CAPTURE(op);
    const std::string twin = differentiable_twin(op);
    if (op == "causal_attention") {
      CHECK(twin == "tessera::scaled_dot_product_attention");
      CHECK(differentiable.contains("scaled_dot_product_attention"));
    } else if (differentiable.contains(op)) {
      CHECK(twin == "tessera::" + op);  // a same-named twin the refusal must name
    } else {
      CHECK(twin == "");  // claims a twin autograd/functions.h lacks
    }
  }
}

TEST_CASE("raw op guard: the same calls pass under NoGradGuard and on inputs that need no grad") {
  for (const RawCall& raw : raw_calls()) {
    CAPTURE(raw.op);
    CAPTURE(raw.input);
    const Tensor tensor = requiring_grad(raw.shape);
    {
      NoGradGuard no_grad;
      CHECK(error_of([&] { raw.call(tensor); }) == "");
    }
    CHECK(error_of([&] { raw.call(tensor.detach()); }) == "");
    CHECK(error_of([&] { raw.call(data(raw.shape)); }) == "");
  }
}

TEST_CASE("raw op guard: ops whose results carry no gradient, and in-place destinations, are not refused") {
  Tensor x = requiring_grad({2, 3});  // values 0.5 + i/6
  const Tensor other = data({2, 3});
  REQUIRE(GradMode::is_enabled());
  // Creation from a tensor's shape, dtype and device.
  CHECK(ops::empty_like(x).sizes() == Shape{2, 3});
  CHECK(ops::zeros_like(x).to_vector<double>() == std::vector<double>(6, 0.0));
  CHECK(ops::full_like(x, 2.0).to_vector<double>() == std::vector<double>(6, 2.0));
  CHECK(ops::to_empty(x, kMeta).is_meta());
  // Bool and index results, printing and reading values out.
  CHECK(ops::gt(x, 1.0).to_vector<bool>() == std::vector<bool>{false, false, false, false, true, true});
  CHECK(ops::eq(x, other).to_vector<bool>() == std::vector<bool>(6, true));
  CHECK(ops::le(other, x).to_vector<bool>() == std::vector<bool>(6, true));
  CHECK(ops::logical_not(ops::gt(x, 1.0)).to_vector<bool>() ==
        std::vector<bool>{true, true, true, true, false, false});
  CHECK(ops::argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{2, 2});
  CHECK(contains(ops::to_string(x), "requires_grad=true"));
  std::ostringstream printed;
  printed << x;
  CHECK(contains(printed.str(), "shape=[2, 3]"));
  CHECK(requiring_grad({}).item() == 0.5);
  CHECK(requiring_grad({1}).item<float>() == 0.5f);
  CHECK(x.to_vector<double>() == other.to_vector<double>());
  CHECK(x.to_vector<float>().size() == 6);
  // In place: the destination may require grad (the optimizer's and FSDP's
  // pattern, normally under NoGradGuard); only sources are checked.
  Tensor weight = requiring_grad({2, 3});
  ops::copy_(weight, other);
  ops::add_(weight, other, -1.0);
  CHECK(weight.to_vector<double>() == std::vector<double>(6, 0.0));
  ops::fill_(weight, 2.0);
  ops::mul_(weight, 1.5);
  ops::mul_(weight, other);
  CHECK(weight.to_vector<double>()[0] == doctest::Approx(1.5));
  ops::zero_(weight);
  ops::index_add_(weight, 0, index_tensor({1}), data({1, 3}));
  CHECK(weight.to_vector<double>() == std::vector<double>{0, 0, 0, 0.5, 0.5 + 1.0 / 3.0, 0.5 + 2.0 / 3.0});
  ops::normal_(weight, PhiloxKey{1, 0}, 0.0, 1.0);
  ops::uniform_(weight, PhiloxKey{1, 0}, 0.0, 1.0);
  // A destination in another dtype goes through a converted copy of itself.
  Tensor f32_weight = ops::zeros({2, 3});
  f32_weight.set_requires_grad(true);
  ops::add_(f32_weight, other);
  ops::mul_(f32_weight, 2.0);
  ops::index_add_(f32_weight, 0, index_tensor({0}), ops::ones({1, 3}));
  CHECK(f32_weight.to_vector<double>()[0] == doctest::Approx(2.0));
  CHECK(weight.requires_grad());
}

TEST_CASE("raw op guard: differentiable functions read inputs that require grad and record as before") {
  const Tensor x = requiring_grad({2, 3});
  const Tensor w = requiring_grad({3, 2});
  const Tensor y = sum(relu(matmul(sub(x, 1.0), w)));
  backward(y);
  // d/dx sum(relu((x - 1) w)) = 1[(x - 1) w > 0] w^T and d/dw = (x - 1)^T 1[...]: the first row of x - 1
  // is negative and the second is not, so the mask cuts half. The formula, with raw ops under NoGradGuard:
  NoGradGuard no_grad;
  const Tensor active = ops::to(ops::gt(ops::matmul(ops::sub(x, 1.0), w), 0.0), DType::f64);
  check_close(x.grad(), ops::matmul(active, ops::transpose(w, 0, 1)));
  check_close(w.grad(), ops::matmul(ops::transpose(ops::sub(x, 1.0), 0, 1), active));
  CHECK(ops::sum(active).item() == 2.0);
}

TEST_CASE("raw op guard: a differentiable function's scope ends with it, on return and on error") {
  const Tensor x = requiring_grad({2, 3});
  relu(x);
  CHECK(contains(error_of([&] { ops::relu(x); }), "ops::relu"));
  CHECK(contains(error_of([&] { matmul(x, x); }), "matmul: inner dims differ"));
  CHECK(contains(error_of([&] { ops::relu(x); }), "ops::relu"));
}

TEST_CASE("raw op guard: backward formulas, custom functions and hooks run raw ops on tensors that require grad") {
  // A custom function's forward runs under NoGradGuard and its backward in the
  // engine (grad mode off): both read the input, which requires grad.
  struct Cube : Function {
    TensorList forward(FunctionContext& ctx, const TensorList& in) override {
      ctx.save_for_backward({in[0]});
      return {ops::mul(ops::mul(in[0], in[0]), in[0])};
    }
    TensorList backward(FunctionContext& ctx, const TensorList& grad) override {
      const Tensor& x = ctx.saved()[0];
      return {ops::mul(grad[0], ops::mul(ops::mul(x, x), 3.0))};
    }
  };
  Tensor x = requiring_grad({3});
  const Tensor y = Function::apply<Cube>({x})[0];
  bool hook_ran = false;
  std::string hook_error_with_grad_mode;
  const HookHandle hook = register_hook(x, [&](const Tensor& grad) {
    hook_ran = true;
    ops::mul(x, 1.0);  // grad mode is off in hooks
    GradModeGuard recording(true);
    hook_error_with_grad_mode = error_of([&] { ops::mul(x, 1.0); });
    return grad;
  });
  backward(sum(y));
  CHECK(hook_ran);
  CHECK(contains(hook_error_with_grad_mode, "ops::mul: input a requires grad"));
  const std::vector<double> values = x.detach().to_vector<double>();
  const std::vector<double> grads = x.grad().to_vector<double>();
  for (size_t i = 0; i < values.size(); ++i) CHECK(grads[i] == doctest::Approx(3 * values[i] * values[i]));
  // tessera has no create_graph (no double backward): a backward records
  // nothing, so a gradient never requires grad, and a given root gradient
  // that does is taken as data.
  CHECK_FALSE(x.grad().requires_grad());
  Tensor z = requiring_grad({3});
  const Tensor given = requiring_grad({3});
  backward(mul(z, 2.0), given);
  check_close(z.grad(), ops::mul(given.detach(), 2.0));
  CHECK_FALSE(z.grad().requires_grad());
}

namespace {

// A two-layer model written by hand: x [N, 2] -> [N, 3] -> relu -> [N, 1].
// `raw_relu` is the mistake issue 15 is about: ops::relu where tessera::relu
// was meant. Before the guard it ran, and w1 silently never got a gradient.
struct TinyModel {
  Tensor w1 = requiring_grad({2, 3});
  Tensor w2 = requiring_grad({3, 1});
  bool raw_relu = false;

  Tensor forward(const Tensor& x) const {
    const Tensor hidden = matmul(x, w1);
    const Tensor activated = raw_relu ? ops::relu(hidden) : relu(hidden);
    return matmul(activated, w2);
  }
};

}  // namespace

TEST_CASE("raw op guard: a model that calls ops::relu in its forward fails there instead of silently not training") {
  const Tensor x = data({4, 2});
  TinyModel wrong;
  wrong.raw_relu = true;
  const std::string message = error_of([&] { backward(sum(wrong.forward(x))); });
  CHECK(contains(message, "ops::relu: input x requires grad"));
  CHECK(contains(message, "call tessera::relu"));
  CHECK_FALSE(wrong.w1.grad().defined());

  // Written with tessera::relu, both layers get their gradients and a few
  // plain SGD steps lower the loss.
  TinyModel right;
  const Tensor target = ops::zeros({4, 1}, {.dtype = DType::f64});
  auto loss_of = [&] { return mean(pow(sub(right.forward(x), target), 2.0)); };
  const double first = loss_of().item();
  for (int step = 0; step < 5; ++step) {
    Tensor loss = loss_of();
    right.w1.set_grad(Tensor());
    right.w2.set_grad(Tensor());
    backward(loss);
    REQUIRE(right.w1.grad().defined());
    REQUIRE(right.w2.grad().defined());
    NoGradGuard no_grad;
    ops::add_(right.w1, right.w1.grad(), -0.1);
    ops::add_(right.w2, right.w2.grad(), -0.1);
  }
  CHECK(ops::amax(ops::abs(right.w1.grad())).item() > 0.0);
  CHECK(loss_of().item() < first);
}
