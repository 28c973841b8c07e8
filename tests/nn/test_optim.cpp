// optim: SGD and AdamW steps against hand-computed values, parameter groups
// and weight decay, named state, the warmup + cosine schedule, clip_grad_norm_.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#include "nn/optim/schedule.h"
#include "nn/optim/sgd.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

std::shared_ptr<nn::Parameter> make_parameter(const std::vector<double>& values, DType dtype = DType::f32) {
  return std::make_shared<nn::Parameter>(
      ops::from_vector(values, {static_cast<int64_t>(values.size())}, {.dtype = dtype}));
}

void set_grad(const std::shared_ptr<nn::Parameter>& parameter, const std::vector<double>& values) {
  parameter->tensor().set_grad(ops::from_vector(values, {static_cast<int64_t>(values.size())},
                                                {.dtype = parameter->tensor().dtype()}));
}

// |actual - expected| <= rtol * |expected| for every element (zeros exactly).
// The optimizers' few operations per step round by a few units of the
// dtype's precision: rtol 1e-12 for f64 (2^-53 = 1.1e-16), 1e-6 for f32
// (2^-24 = 6e-8, and the f32 inputs are the f64 values rounded).
void check_relative_close(const std::vector<double>& actual, const std::vector<double>& expected, double rtol) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("element " << i << ": " << actual[i] << " vs " << expected[i]);
    CHECK(std::abs(actual[i] - expected[i]) <= rtol * std::abs(expected[i]));
  }
}

std::vector<double> parameter_values(const std::shared_ptr<nn::Parameter>& parameter) {
  return parameter->tensor().to_vector<double>();
}

}  // namespace

TEST_CASE("SGD: plain, weight decay, momentum and Nesterov steps") {
  auto p = make_parameter({1.0, 2.0}, DType::f64);
  optim::SGD plain({{"p", p}}, {.lr = 0.1});
  set_grad(p, {0.5, -1.0});
  plain.step();
  check_relative_close(parameter_values(p), {1.0 - 0.05, 2.0 + 0.1}, 1e-12);

  auto q = make_parameter({1.0, 2.0}, DType::f64);
  optim::SGD decayed({{"q", q}}, {.lr = 0.1, .weight_decay = 0.5});
  set_grad(q, {0.5, -1.0});
  decayed.step();  // g + wd p = [1.0, 0.0]
  check_relative_close(parameter_values(q), {0.9, 2.0}, 1e-12);

  // Momentum 0.9: buf1 = g1, buf2 = 0.9 buf1 + g2.
  for (bool nesterov : {false, true}) {
    CAPTURE(nesterov);
    auto r = make_parameter({1.0}, DType::f64);
    optim::SGD momentum({{"r", r}}, {.lr = 0.1, .momentum = 0.9, .nesterov = nesterov});
    set_grad(r, {1.0});
    momentum.step();
    const double buf1 = 1.0;
    double expected = 1.0 - 0.1 * (nesterov ? 1.0 + 0.9 * buf1 : buf1);
    check_relative_close(parameter_values(r), {expected}, 1e-12);
    set_grad(r, {2.0});
    momentum.step();
    const double buf2 = 0.9 * buf1 + 2.0;
    expected -= 0.1 * (nesterov ? 2.0 + 0.9 * buf2 : buf2);
    check_relative_close(parameter_values(r), {expected}, 1e-12);
    check_relative_close({momentum.state("r").at("momentum_buffer").item()}, {buf2}, 1e-12);
    CHECK(momentum.state("r").at("step").item() == 2);
  }
  CHECK_THROWS_AS(optim::SGD({{"p", p}}, {.nesterov = true}), Error);
}

TEST_CASE("AdamW: two steps match the hand-computed update (f32 and f64)") {
  const double lr = 0.01, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const std::vector<double> start = {1.0, -2.0, 3.0, 0.0};
  const std::vector<std::vector<double>> grads = {{0.1, -0.2, 0.3, 0.0}, {-0.3, 0.1, 0.2, 0.05}};

  std::vector<double> p = start, m(4, 0.0), v(4, 0.0);
  for (int t = 1; t <= 2; ++t) {
    for (size_t i = 0; i < 4; ++i) {
      const double g = grads[t - 1][i];
      p[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }

  for (DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    auto parameter = make_parameter(start, dtype);
    optim::AdamW adamw({{"w", parameter}}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
    CHECK(adamw.state("w").empty());
    for (const auto& g : grads) {
      set_grad(parameter, g);
      adamw.step();
    }
    const double tolerance = dtype == DType::f32 ? 1e-6 : 1e-12;
    check_relative_close(parameter_values(parameter), p, tolerance);
    const optim::ParamState& state = adamw.state("w");
    CHECK(state.at("step").item() == 2);
    check_relative_close(state.at("exp_avg").to_vector<double>(), m, tolerance);
    check_relative_close(state.at("exp_avg_sq").to_vector<double>(), v, tolerance);
    CHECK(adamw.step_count() == 2);
  }
}

TEST_CASE("AdamW: a big parameter takes the threaded path and matches a small one element for element") {
  const int64_t n = 300000;
  std::vector<double> start(static_cast<size_t>(n)), grad(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    start[i] = std::sin(0.001 * static_cast<double>(i));
    grad[i] = std::cos(0.003 * static_cast<double>(i));
  }
  auto big = make_parameter(start);
  optim::AdamW adamw({{"big", big}}, {.lr = 0.1});
  set_grad(big, grad);
  adamw.step();
  const std::vector<double> after = parameter_values(big);
  for (int64_t i : {int64_t{0}, int64_t{12345}, n - 1}) {
    auto one = make_parameter({start[i]});
    optim::AdamW single({{"one", one}}, {.lr = 0.1});
    set_grad(one, {grad[i]});
    single.step();
    CHECK(after[i] == parameter_values(one)[0]);
  }
}

TEST_CASE("optimizer: step_in_parts makes step()'s update part by part, in order, the unlisted ones last") {
  const auto build = [] {
    std::vector<nn::NamedParameter> named;
    for (int index = 0; index < 4; ++index) {
      auto parameter = make_parameter({1.0 + index, -2.0, 0.5 * index});
      set_grad(parameter, {0.25, -1.0 + index, 3.0});
      named.emplace_back("p" + std::to_string(index), parameter);
    }
    return named;
  };
  const std::vector<nn::NamedParameter> whole = build(), in_parts = build();
  optim::AdamW whole_adamw(whole, {.lr = 0.1, .weight_decay = 0.1});
  optim::AdamW parts_adamw(in_parts, {.lr = 0.1, .weight_decay = 0.1});
  whole_adamw.step();
  // Part 0 is p2, part 1 is p0; p1 and p3 are in none.
  std::vector<size_t> calls;
  parts_adamw.step_in_parts({{in_parts[2].second.get()}, {in_parts[0].second.get()}}, [&](size_t part) {
    calls.push_back(part);
    // A part is updated before its call; the unlisted ones after the last.
    CHECK(parameter_values(in_parts[part == 0 ? 2 : 0].second) == parameter_values(whole[part == 0 ? 2 : 0].second));
    CHECK(parameter_values(in_parts[1].second) == std::vector<double>{2.0, -2.0, 0.5});
  });
  CHECK(calls == std::vector<size_t>{0, 1});
  for (size_t index = 0; index < whole.size(); ++index) {
    CAPTURE(index);
    CHECK(parameter_values(in_parts[index].second) == parameter_values(whole[index].second));
  }
  CHECK(parts_adamw.step_count() == 1);
}

TEST_CASE("optimizer: weight-decay groups skip biases and norms") {
  struct Model : nn::Module {
    Model() : Module("Model") {
      register_module("fc", std::make_shared<nn::Linear>(3, 2));
      register_module("norm", std::make_shared<nn::LayerNorm>(2));
    }
  };
  Model model;
  const auto groups = optim::weight_decay_groups(model.named_parameters(), 0.1);
  REQUIRE(groups.size() == 2);
  REQUIRE(groups[0].params.size() == 1);
  CHECK(groups[0].params[0].first == "fc.weight");
  CHECK(*groups[0].weight_decay == 0.1);
  CHECK(groups[1].params.size() == 3);
  CHECK(*groups[1].weight_decay == 0.0);

  optim::AdamW adamw(groups, {.lr = 0.5});
  CHECK(*adamw.param_groups()[0].lr == 0.5);  // defaults filled in
  const auto before = model.state_dict();
  std::vector<std::vector<float>> before_values;
  for (const auto& [name, parameter] : model.named_parameters()) {
    before_values.push_back(parameter->tensor().to_vector<float>());
    parameter->tensor().set_grad(ops::zeros_like(parameter->tensor()));  // only decay can move anything
  }
  adamw.step();
  const auto named = model.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    CAPTURE(named[i].first);
    const std::vector<float> now = named[i].second->tensor().to_vector<float>();
    for (size_t j = 0; j < now.size(); ++j) {
      const float expected = named[i].first == "fc.weight" ? before_values[i][j] * static_cast<float>(1.0 - 0.5 * 0.1)
                                                           : before_values[i][j];
      CHECK(now[j] == expected);  // p * decay - lr * 0 / (0 + eps): the same f32 product
    }
  }

  adamw.set_lr(0.25);
  for (const auto& group : adamw.param_groups()) CHECK(*group.lr == 0.25);
  adamw.zero_grad();
  for (const auto& [name, parameter] : model.named_parameters()) CHECK_FALSE(parameter->grad().defined());
}

TEST_CASE("optimizer: named state, skipped parameters, init_state and errors") {
  auto a = make_parameter({1.0, 2.0});
  auto b = make_parameter({3.0});
  optim::AdamW adamw({{"a", a}, {"b", b}});
  CHECK(adamw.param_names() == std::vector<std::string>{"a", "b"});
  set_grad(a, {1.0, 1.0});
  adamw.step();
  CHECK(adamw.state("a").size() == 3);
  CHECK(adamw.state("b").empty());  // no gradient, no step, no state
  CHECK(parameter_values(b) == std::vector<double>{3.0});
  CHECK_THROWS_WITH_AS(adamw.state("c"), "AdamW: no parameter named 'c'", Error);

  adamw.init_state();
  CHECK(adamw.state("b").at("step").item() == 0);
  CHECK(adamw.state("b").at("exp_avg").to_vector<float>() == std::vector<float>{0.0f});
  CHECK(adamw.state("a").at("step").item() == 1);  // existing state is kept

  CHECK_THROWS_WITH_AS(optim::AdamW({{"a", a}, {"again", a}}), "AdamW: parameter 'again' appears more than once",
                       Error);
  CHECK_THROWS_WITH_AS(optim::AdamW({{"a", a}, {"a", b}}), "AdamW: two parameters are named 'a'", Error);
  CHECK_THROWS_AS(optim::AdamW({{"a", a}}, {.beta1 = 1.0}), Error);
  CHECK_THROWS_AS(optim::AdamW({{"a", a}}, {.lr = -1.0}), Error);

  auto mixed = std::make_shared<nn::Parameter>(ops::zeros({2}));
  mixed->tensor().set_grad(ops::zeros({2}, {.dtype = DType::f64}));
  optim::SGD sgd({{"x", mixed}});
  CHECK_THROWS_WITH_AS(sgd.step(), "SGD: gradient of 'x' is [2] f64, the parameter [2] f32", Error);
}

TEST_CASE("WarmupCosineSchedule: warmup, cosine decay and the floor") {
  // Closed forms in f64, each a few roundings from the value: within 1e-12.
  const optim::WarmupCosineSchedule schedule(1.0, 0.1, 10, 110);
  check_relative_close({schedule.lr(0), schedule.lr(4), schedule.lr(9), schedule.lr(10), schedule.lr(60), schedule.lr(110),
               schedule(5000)},
              {0.1, 0.5, 1.0, 1.0, 0.55, 0.1, 0.1}, 1e-12);
  check_relative_close({schedule.lr(35)}, {0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25))}, 1e-12);
  CHECK(schedule.lr(109) > 0.1);
  for (int64_t step = 10; step < 110; ++step) CHECK(schedule.lr(step + 1) <= schedule.lr(step));

  const optim::WarmupCosineSchedule no_warmup(3e-4, 0.0, 0, 100);
  check_relative_close({no_warmup.lr(0), no_warmup.lr(50)}, {3e-4, 1.5e-4}, 1e-12);
  CHECK_THROWS_AS(optim::WarmupCosineSchedule(1.0, 2.0, 0, 10), Error);
  CHECK_THROWS_AS(optim::WarmupCosineSchedule(1.0, 0.0, 20, 10), Error);
  CHECK_THROWS_AS(schedule.lr(-1), Error);
}

TEST_CASE("clip_grad_norm_: returns the true norm and scales only when above max_norm") {
  auto a = make_parameter({0.0, 0.0});
  auto b = make_parameter({0.0});
  auto no_grad = make_parameter({5.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});
  const std::vector<std::shared_ptr<nn::Parameter>> params = {a, b, no_grad};

  CHECK(optim::clip_grad_norm_(params, 100.0) == 13.0);  // sqrt(9 + 16 + 144): exact
  CHECK(a->grad().to_vector<double>() == std::vector<double>{3.0, 4.0});

  CHECK(optim::clip_grad_norm_(params, 6.5) == 13.0);
  // The f32 gradients are scaled and rounded once (6e-8 relative).
  const double scale = 6.5 / (13.0 + 1e-6);
  check_relative_close(a->grad().to_vector<double>(), {3.0 * scale, 4.0 * scale}, 1e-6);
  check_relative_close(b->grad().to_vector<double>(), {12.0 * scale}, 1e-6);
  check_relative_close({optim::clip_grad_norm_(params, 100.0)}, {6.5}, 1e-6);

  // A million f32 ones: an f32 running sum would drift; f64 is exact.
  auto big = std::make_shared<nn::Parameter>(ops::zeros({1000003}));
  big->tensor().set_grad(ops::ones({1000003}));
  CHECK(optim::clip_grad_norm_({big}, 1e9) == std::sqrt(1000003.0));
  CHECK_THROWS_AS(optim::clip_grad_norm_({big}, -1.0), Error);
}
