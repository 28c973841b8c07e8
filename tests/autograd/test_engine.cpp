// The backward engine and its hooks: dependency counting, accumulation into
// .grad, freed graphs and retain_graph, grad mode, execution order, custom
// functions, every hook kind, final callbacks, errors, and autograd::grad.
#include <doctest/doctest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"

using namespace tessera;
using namespace tessera::autograd;

namespace {

Tensor leaf(const std::vector<double>& values, const Shape& shape) {
  Tensor t = ops::from_vector(values, shape, {.dtype = DType::f64});
  t.set_requires_grad(true);
  return t;
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

struct Square : Function {
  TensorList forward(FunctionContext& ctx, const TensorList& in) override {
    ctx.save_for_backward({in[0]});
    return {ops::mul(in[0], in[0])};
  }
  TensorList backward(FunctionContext& ctx, const TensorList& grad) override {
    return {ops::mul(grad[0], ops::mul(ctx.saved()[0], 2.0))};
  }
  std::string name() const override { return "SquareBackward"; }
};

// Returns (x * y, x + y) and saves its first output, which must not keep
// the graph alive through a cycle.
struct ProductAndSum : Function {
  TensorList forward(FunctionContext& ctx, const TensorList& in) override {
    Tensor product = ops::mul(in[0], in[1]);
    ctx.save_for_backward({in[0], in[1], product});
    return {product, ops::add(in[0], in[1])};
  }
  TensorList backward(FunctionContext& ctx, const TensorList& grad) override {
    const TensorList& saved = ctx.saved();
    return {ops::add(ops::mul(grad[0], saved[1]), grad[1]), ops::add(ops::mul(grad[0], saved[0]), grad[1])};
  }
};

struct WrongCount : Function {
  TensorList forward(FunctionContext&, const TensorList& in) override { return {ops::mul(in[0], 2.0)}; }
  TensorList backward(FunctionContext&, const TensorList& grad) override { return {grad[0], grad[0]}; }
};

struct WrongShape : Function {
  TensorList forward(FunctionContext&, const TensorList& in) override { return {ops::sum(in[0])}; }
  TensorList backward(FunctionContext&, const TensorList& grad) override { return {grad[0]}; }
};

// Hands its inputs back unchanged and counts its backward calls: the way FSDP
// learns that a module's backward is done.
struct CountingIdentity : Function {
  explicit CountingIdentity(int* calls) : calls_(calls) {}
  TensorList forward(FunctionContext&, const TensorList& in) override { return in; }
  TensorList backward(FunctionContext&, const TensorList& grad) override {
    ++*calls_;
    return grad;
  }
  int* calls_;
};

struct HookFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

TEST_CASE("a diamond runs the shared node once with the summed gradient") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor a = mul(x, 2.0);  // shared by both branches
  Tensor left = mul(a, 3.0);
  Tensor right = mul(a, a);
  Tensor y = sum(add(left, right));  // y = 6x + 4x^2

  int calls = 0;
  std::vector<double> seen;
  register_pre_hook(a.grad_fn(), [&](const TensorList& grads) {
    ++calls;
    seen = values(grads[0]);
    return TensorList{};
  });
  backward(y);
  CHECK(calls == 1);
  // dy/da = 3 + 2a = 3 + 4x
  CHECK(seen == std::vector<double>{7, 11, 15});
  CHECK(values(x.grad()) == std::vector<double>{14, 22, 30});  // 6 + 8x
}

TEST_CASE("one leaf used several times has one AccumulateGrad") {
  Tensor x = leaf({1, 2}, {2});
  Tensor a = mul(x, 2.0);
  Tensor b = mul(x, 5.0);
  CHECK(a.grad_fn()->next_edges()[0].node == b.grad_fn()->next_edges()[0].node);
  CHECK(a.grad_fn()->next_edges()[0].node->name() == "AccumulateGrad");
  int accumulated = 0;
  register_post_accumulate_grad_hook(x, [&](Tensor&) { ++accumulated; });
  backward(sum(add(a, b)));
  CHECK(accumulated == 1);
  CHECK(values(x.grad()) == std::vector<double>{7, 7});
}

TEST_CASE(".grad accumulates across backward calls and does not alias the incoming gradient") {
  Tensor x = leaf({1, 2, 3}, {3});
  backward(sum(mul(x, x)));
  CHECK(values(x.grad()) == std::vector<double>{2, 4, 6});
  const Tensor first = x.grad();
  backward(sum(mul(x, 3.0)));
  CHECK(values(x.grad()) == std::vector<double>{5, 7, 9});
  CHECK(x.grad().is_same(first));  // accumulated in place

  // A gradient the caller still holds is copied, not stolen.
  Tensor z = leaf({1, 1}, {2});
  Tensor g = ops::from_vector(std::vector<double>{4, 5}, {2}, {.dtype = DType::f64});
  backward(mul(z, 1.0), g);
  ops::fill_(g, 0.0);
  CHECK(values(z.grad()) == std::vector<double>{4, 5});
  CHECK(!z.grad().requires_grad());
  CHECK(z.grad().grad_fn() == nullptr);
}

TEST_CASE("backward frees the graph; retain_graph keeps it") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(mul(x, x));
  backward(y, {}, {.retain_graph = true});
  CHECK(!y.grad_fn()->is_released());
  backward(y, {}, {.retain_graph = true});
  CHECK(values(x.grad()) == std::vector<double>{4, 8});
  backward(y);  // frees
  CHECK(y.grad_fn()->is_released());
  CHECK(y.grad_fn()->next_edges().empty());
  CHECK(values(x.grad()) == std::vector<double>{6, 12});
  CHECK_THROWS_WITH_AS(backward(y), doctest::Contains("retain_graph"), Error);
  CHECK_THROWS_WITH_AS(grad({y}, {x}), doctest::Contains("retain_graph"), Error);
  CHECK(values(x.grad()) == std::vector<double>{6, 12});
}

TEST_CASE("backward releases the saved tensors as it goes") {
  Tensor x = leaf({1, 2, 3}, {3});
  std::weak_ptr<TensorImpl> intermediate;
  Tensor y;
  {
    Tensor a = mul(x, 2.0);
    intermediate = a.impl_ptr();
    y = sum(mul(a, a));  // MulBackward saves a
  }
  CHECK(!intermediate.expired());
  backward(y);
  CHECK(intermediate.expired());
  CHECK(values(x.grad()) == std::vector<double>{8, 16, 24});
}

TEST_CASE("NoGradGuard stops recording and restores the mode") {
  Tensor x = leaf({1, 2}, {2});
  CHECK(GradMode::is_enabled());
  {
    NoGradGuard guard;
    CHECK(!GradMode::is_enabled());
    Tensor y = mul(x, 2.0);
    CHECK(!y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    {
      NoGradGuard inner;
      CHECK(!GradMode::is_enabled());
    }
    CHECK(!GradMode::is_enabled());
  }
  CHECK(GradMode::is_enabled());
  Tensor y = mul(x, 2.0);
  CHECK(y.requires_grad());
  CHECK(y.grad_fn()->name() == "MulBackward");
  // Ops on tensors that need no grad record nothing either.
  Tensor c = ops::ones({2}, {.dtype = DType::f64});
  CHECK(mul(c, c).grad_fn() == nullptr);
}

TEST_CASE("ready nodes run latest-recorded first") {
  Tensor x = leaf({1, 2}, {2});
  std::vector<std::string> order;
  // Three "layers", recorded in order; backward must visit them in reverse.
  Tensor h = x;
  std::vector<std::shared_ptr<Node>> layers;
  for (int layer = 0; layer < 3; ++layer) {
    h = tanh(mul(h, 0.5));
    layers.push_back(h.grad_fn());
  }
  // Two independent branches off the last layer: the later one runs first.
  Tensor early = exp(h);
  Tensor late = sigmoid(h);
  for (size_t i = 0; i < layers.size(); ++i) {
    register_pre_hook(layers[i], [&order, i](const TensorList&) {
      order.push_back("layer" + std::to_string(i));
      return TensorList{};
    });
  }
  register_pre_hook(early.grad_fn(), [&](const TensorList&) {
    order.push_back("early");
    return TensorList{};
  });
  register_pre_hook(late.grad_fn(), [&](const TensorList&) {
    order.push_back("late");
    return TensorList{};
  });
  CHECK(late.grad_fn()->sequence_nr() > early.grad_fn()->sequence_nr());
  backward(sum(add(early, late)));
  CHECK(order == std::vector<std::string>{"late", "early", "layer2", "layer1", "layer0"});
}

TEST_CASE("custom functions record one node and check what backward returns") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = Function::apply<Square>({x})[0];
  CHECK(y.grad_fn()->name() == "SquareBackward");
  CHECK(values(y) == std::vector<double>{1, 4, 9});
  backward(sum(y));
  CHECK(values(x.grad()) == std::vector<double>{2, 4, 6});

  // No input requires grad: nothing is recorded.
  Tensor c = ops::ones({2}, {.dtype = DType::f64});
  CHECK(Function::apply<Square>({c})[0].grad_fn() == nullptr);

  // Two outputs, one unused: its gradient arrives as zeros.
  Tensor a = leaf({2, 3}, {2});
  Tensor b = leaf({5, 7}, {2});
  std::weak_ptr<TensorImpl> product_impl;
  {
    TensorList out = Function::apply<ProductAndSum>({a, b});
    product_impl = out[0].impl_ptr();
    backward(sum(out[0]));
  }
  CHECK(values(a.grad()) == std::vector<double>{5, 7});
  CHECK(values(b.grad()) == std::vector<double>{2, 3});
  CHECK(product_impl.expired());  // the saved output made no cycle

  // A function that returns its inputs: the outputs get their own handles,
  // the inputs stay leaves.
  int calls = 0;
  Tensor c1 = leaf({1, 2}, {2});
  TensorList same = Function::apply<CountingIdentity>({c1, x}, &calls);
  CHECK(c1.is_leaf());
  CHECK(!same[0].is_same(c1));
  CHECK(same[0].grad_fn() == same[1].grad_fn());
  backward(sum(mul(same[0], same[0])));
  CHECK(calls == 1);
  CHECK(values(c1.grad()) == std::vector<double>{2, 4});

  Tensor z = leaf({1, 2}, {2});
  CHECK_THROWS_WITH_AS(backward(sum(Function::apply<WrongCount>({z})[0])),
                       doctest::Contains("returned 2 gradients for 1 inputs"), Error);
  CHECK_THROWS_WITH_AS(backward(Function::apply<WrongShape>({z})[0]), doctest::Contains("shape"), Error);
}

TEST_CASE("tensor hooks see and replace gradients; handles remove them") {
  Tensor x = leaf({1, 2}, {2});
  std::vector<double> seen;
  HookHandle scale = register_hook(x, [&](const Tensor& g) {
    seen = values(g);
    return ops::mul(g, 10.0);
  });
  backward(sum(mul(x, 3.0)));
  CHECK(seen == std::vector<double>{3, 3});
  CHECK(values(x.grad()) == std::vector<double>{30, 30});
  scale.remove();
  scale.remove();  // a second remove does nothing
  x.set_grad({});
  backward(sum(mul(x, 3.0)));
  CHECK(values(x.grad()) == std::vector<double>{3, 3});

  // A non-leaf hook runs once on the complete gradient (both consumers summed),
  // and what it returns flows on.
  Tensor w = leaf({1, 2}, {2});
  Tensor h = mul(w, 2.0);
  int calls = 0;
  register_hook(h, [&](const Tensor& g) {
    ++calls;
    seen = values(g);
    return ops::mul(g, 0.5);
  });
  HookHandle observer = register_hook(h, [&](const Tensor& g) {
    CHECK(values(g) == std::vector<double>{2.5, 2.5});  // sees the first hook's result
    return Tensor();
  });
  backward(sum(add(mul(h, 2.0), mul(h, 3.0))));
  CHECK(calls == 1);
  CHECK(seen == std::vector<double>{5, 5});
  CHECK(values(w.grad()) == std::vector<double>{5, 5});
  observer.remove();
  CHECK(h.grad_fn()->output_hooks().size() == 1);

  Tensor constant = ops::ones({2});
  CHECK_THROWS_WITH_AS(register_hook(constant, [](const Tensor& g) { return g; }),
                       doctest::Contains("does not require grad"), Error);
  CHECK_THROWS_AS(register_post_accumulate_grad_hook(h, [](Tensor&) {}), Error);
}

TEST_CASE("post-accumulate hooks see the final .grad") {
  Tensor x = leaf({1, 2}, {2});
  x.set_grad(ops::from_vector(std::vector<double>{100, 100}, {2}, {.dtype = DType::f64}));
  std::vector<double> seen;
  HookHandle handle = register_post_accumulate_grad_hook(x, [&](Tensor& t) { seen = values(t.grad()); });
  backward(sum(add(mul(x, 2.0), mul(x, x))));  // 2 + 2x
  CHECK(seen == std::vector<double>{104, 106});
  handle.remove();
  seen.clear();
  backward(sum(mul(x, 2.0)));
  CHECK(seen.empty());
}

TEST_CASE("node pre-hooks may replace the gradients a node receives") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, x);
  HookHandle handle = register_pre_hook(y.grad_fn(), [](const TensorList& grads) {
    return TensorList{ops::mul(grads[0], 0.0)};
  });
  backward(sum(y), {}, {.retain_graph = true});
  CHECK(values(x.grad()) == std::vector<double>{0, 0});
  handle.remove();
  backward(sum(y));
  CHECK(values(x.grad()) == std::vector<double>{2, 4});
}

TEST_CASE("retain_grad keeps a non-leaf's gradient") {
  Tensor x = leaf({1, 2}, {2});
  Tensor h = mul(x, 3.0);
  retain_grad(h);
  backward(sum(mul(h, h)));
  CHECK(values(h.grad()) == std::vector<double>{6, 12});
  CHECK(values(x.grad()) == std::vector<double>{18, 36});
}

TEST_CASE("final callbacks run once, after every node, and may queue more") {
  Tensor w1 = leaf({1, 2}, {2});
  Tensor w2 = leaf({3, 4}, {2});
  std::vector<std::string> events;
  int ready_params = 0;
  CHECK(!in_backward());
  CHECK_THROWS_WITH_AS(queue_callback([] {}), doctest::Contains("no backward pass"), Error);

  // FSDP's pattern: each leaf reports when its grad is in; the group queues
  // its work once all are, and the root's callback runs at the very end.
  auto on_accumulated = [&](Tensor&) {
    CHECK(in_backward());
    if (++ready_params == 2) {
      queue_callback([&] {
        events.push_back("group");
        queue_callback([&] { events.push_back("nested"); });
      });
    }
  };
  register_post_accumulate_grad_hook(w1, on_accumulated);
  register_post_accumulate_grad_hook(w2, on_accumulated);
  Tensor h = mul(w1, w2);
  register_hook(h, [&](const Tensor&) {
    queue_callback([&] {
      events.push_back("root");
      CHECK(values(w1.grad()) == std::vector<double>{3, 4});
      CHECK(values(w2.grad()) == std::vector<double>{1, 2});
    });
    return Tensor();
  });
  backward(sum(h));
  CHECK(events == std::vector<std::string>{"root", "group", "nested"});
  CHECK(!in_backward());

  events.clear();
  ready_params = 0;
  backward(sum(mul(w1, w2)));  // callbacks from the last pass do not run again
  CHECK(events == std::vector<std::string>{"group", "nested"});
}

TEST_CASE("an exception in a hook propagates as itself and leaves the engine usable") {
  Tensor x = leaf({1, 2}, {2});
  bool callback_ran = false;
  HookHandle bad = register_hook(x, [&](const Tensor&) -> Tensor {
    queue_callback([&] { callback_ran = true; });
    throw HookFailure("hook failed");
  });
  CHECK_THROWS_WITH_AS(backward(sum(mul(x, 2.0))), "hook failed", HookFailure);
  CHECK(!callback_ran);
  CHECK(!in_backward());
  CHECK(GradMode::is_enabled());
  CHECK(!x.grad().defined());
  bad.remove();

  Tensor y = mul(x, 2.0);
  register_hook(y, [&](const Tensor&) -> Tensor { throw HookFailure("non-leaf hook failed"); });
  CHECK_THROWS_AS(backward(sum(y)), HookFailure);

  backward(sum(mul(x, 2.0)));
  CHECK(values(x.grad()) == std::vector<double>{2, 2});
}

TEST_CASE("hooks and callbacks run with grad mode off") {
  Tensor x = leaf({1, 2}, {2});
  bool hook_mode = true;
  bool callback_mode = true;
  register_hook(x, [&](const Tensor&) {
    hook_mode = GradMode::is_enabled();
    queue_callback([&] { callback_mode = GradMode::is_enabled(); });
    return Tensor();
  });
  backward(sum(mul(x, 2.0)));
  CHECK(!hook_mode);
  CHECK(!callback_mode);
  CHECK(GradMode::is_enabled());
}

TEST_CASE("autograd::grad computes gradients without touching .grad") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor w = leaf({2, 2, 2}, {3});
  Tensor unused = leaf({1}, {1});
  Tensor h = mul(x, w);
  Tensor y = sum(mul(h, h));  // y = sum (x w)^2
  TensorList grads = grad({y}, {x, h, unused}, {}, {.retain_graph = true});
  CHECK(values(grads[0]) == std::vector<double>{8, 16, 24});  // 2 x w^2
  CHECK(values(grads[1]) == std::vector<double>{4, 8, 12});   // 2h
  CHECK(!grads[2].defined());
  CHECK(!x.grad().defined());
  CHECK(!w.grad().defined());

  // With an explicit output gradient.
  TensorList scaled = grad({h}, {w}, {ops::full({3}, 2.0, {.dtype = DType::f64})});
  CHECK(values(scaled[0]) == std::vector<double>{2, 4, 6});
  CHECK_THROWS_WITH_AS(grad({y}, {ops::ones({1})}), doctest::Contains("does not require grad"), Error);
}

TEST_CASE("backward reports bad roots clearly") {
  Tensor x = leaf({1, 2}, {2});
  Tensor c = ops::ones({2});
  CHECK_THROWS_WITH_AS(backward(c), doctest::Contains("does not require grad"), Error);
  CHECK_THROWS_WITH_AS(backward(mul(x, 2.0)), doctest::Contains("one-element"), Error);
  CHECK_THROWS_WITH_AS(backward(mul(x, 2.0), ops::ones({3}, {.dtype = DType::f64})),
                       doctest::Contains("has shape [3] but output 0 has shape [2]"), Error);
  CHECK_THROWS_AS(backward(TensorList{}), Error);
  // A leaf may be its own root.
  backward(x, ops::full({2}, 3.0, {.dtype = DType::f64}));
  CHECK(values(x.grad()) == std::vector<double>{3, 3});
}

TEST_CASE("gradients keep the dtype of what they flow into") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = to(mul(to(x, DType::f32), 3.0), DType::f64);
  CHECK(y.grad_fn()->name() == "ToDTypeBackward");
  backward(sum(y));
  CHECK(x.grad().dtype() == DType::f64);
  CHECK(values(x.grad()) == std::vector<double>{3, 3});
  CHECK(to(x, DType::f64).is_same(x));  // no change, no node
}

TEST_CASE("hooks that return a gradient of the wrong shape are reported") {
  Tensor x = leaf({1, 2}, {2});
  Tensor h = mul(x, 2.0);
  register_hook(h, [](const Tensor&) { return ops::ones({3}, {.dtype = DType::f64}); });
  CHECK_THROWS_WITH_AS(backward(sum(h)), doctest::Contains("returned shape [3] for a gradient of shape [2]"), Error);

  Tensor z = leaf({1, 2}, {2});
  register_hook(z, [](const Tensor&) { return ops::ones({1}, {.dtype = DType::f64}); });
  CHECK_THROWS_WITH_AS(backward(sum(mul(z, 2.0))), doctest::Contains("AccumulateGrad"), Error);
}

TEST_CASE("backward on meta tensors infers the gradients' shapes") {
  Tensor w = ops::empty({3, 4}, {.dtype = DType::f32, .device = kMeta});
  w.set_requires_grad(true);
  Tensor x = ops::empty({2, 4}, {.dtype = DType::f32, .device = kMeta});
  backward(sum(linear(x, w, Tensor())));
  CHECK(w.grad().is_meta());
  CHECK(w.grad().sizes() == Shape{3, 4});
  CHECK(w.grad().dtype() == DType::f32);
}

TEST_CASE("a backward run from inside a hook is its own pass") {
  Tensor x = leaf({1, 2}, {2});
  Tensor inner = leaf({3}, {1});
  std::vector<std::string> events;
  register_hook(x, [&](const Tensor& g) {
    queue_callback([&] { events.push_back("outer"); });
    Tensor recomputed;
    {
      GradModeGuard record(true);
      recomputed = sum(mul(inner, 2.0));
    }
    backward(recomputed);
    queue_callback([&] { events.push_back("outer again"); });
    return g;
  });
  register_post_accumulate_grad_hook(inner, [&](Tensor&) {
    queue_callback([&] { events.push_back("inner"); });
  });
  backward(sum(mul(x, 3.0)));
  CHECK(events == std::vector<std::string>{"inner", "outer", "outer again"});
  CHECK(values(inner.grad()) == std::vector<double>{2});
  CHECK(values(x.grad()) == std::vector<double>{3, 3});
}
