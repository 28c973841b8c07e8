// nn::Module: registry and fully qualified names, hooks, tree walks,
// state_dict round trips and every load error, to_empty, train/eval.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/module_list.h"
#include "nn/normalization.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

// Multiplies by a learned per-feature scale and counts its calls in a buffer.
struct Scale : nn::Module {
  explicit Scale(int64_t dim) : Module("Scale") {
    register_parameter("weight", ops::ones({dim}));
    register_buffer("calls", ops::zeros({1}));
  }
  Tensor forward(const Tensor& x) override { return tessera::mul(x, parameter("weight")->tensor()); }
  void reset_own_parameters(const nn::InitContext&) override {
    nn::init::ones_(*parameter("weight"));
    Tensor calls = buffer("calls");
    nn::init::zeros_(calls);
  }
};

struct Block : nn::Module {
  Block() : Module("Block") {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 4));
    scale = register_module("scale", std::make_shared<Scale>(4));
  }
  Tensor forward(const Tensor& x) override { return (*scale)((*fc)(x)); }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<Scale> scale;
};

// encoder -> blocks.0 -> blocks.1 -> norm
struct Net : nn::Module {
  Net() : Module("Net") {
    encoder = register_module("encoder", std::make_shared<nn::Linear>(3, 4));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    blocks->push_back(std::make_shared<Block>());
    blocks->push_back(std::make_shared<Block>());
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(4));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*encoder)(x);
    for (const auto& block : *blocks) h = (*block)(h);
    return (*norm)(h);
  }
  std::shared_ptr<nn::Linear> encoder;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
};

std::vector<std::string> names_of(const std::vector<nn::NamedParameter>& named) {
  std::vector<std::string> names;
  for (const auto& [name, parameter] : named) names.push_back(name);
  return names;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("module: fully qualified parameter, buffer and module names") {
  Net net;
  CHECK(names_of(net.named_parameters()) ==
        std::vector<std::string>{"encoder.weight", "encoder.bias", "blocks.0.fc.weight", "blocks.0.fc.bias",
                                 "blocks.0.scale.weight", "blocks.1.fc.weight", "blocks.1.fc.bias",
                                 "blocks.1.scale.weight", "norm.weight", "norm.bias"});
  const auto buffers = net.named_buffers();
  REQUIRE(buffers.size() == 2);
  CHECK(buffers[0].first == "blocks.0.scale.calls");
  CHECK(buffers[1].first == "blocks.1.scale.calls");

  std::vector<std::string> module_names;
  for (const auto& [name, module] : net.named_modules()) module_names.push_back(name + ":" + module->type_name());
  CHECK(module_names == std::vector<std::string>{":Net", "encoder:Linear", "blocks:ModuleList", "blocks.0:Block",
                                                 "blocks.0.fc:Linear", "blocks.0.scale:Scale", "blocks.1:Block",
                                                 "blocks.1.fc:Linear", "blocks.1.scale:Scale", "norm:LayerNorm"});
  CHECK(net.modules().size() == 10);
  CHECK(net.children().size() == 3);
  CHECK(net.named_children()[1].first == "blocks");
  CHECK(names_of(net.blocks->named_parameters()).front() == "0.fc.weight");
  CHECK(net.named_parameters(false).empty());
  CHECK(net.num_parameters() == (3 * 4 + 4) + 2 * (16 + 4 + 4) + 8);
  CHECK(&net.blocks->operator[](1) == net.blocks->items()[1].get());
  CHECK_THROWS_AS(net.blocks->operator[](2), Error);
}

TEST_CASE("module: registry rejects bad names and reports unknown ones") {
  Scale scale(2);
  CHECK_THROWS_WITH_AS(scale.register_parameter("weight", ops::ones({2})), "Scale: the name 'weight' is already registered",
                       Error);
  CHECK_THROWS_AS(scale.register_buffer("weight", ops::ones({2})), Error);
  CHECK_THROWS_AS(scale.register_parameter("a.b", ops::ones({2})), Error);
  CHECK_THROWS_AS(scale.register_parameter("", ops::ones({2})), Error);
  CHECK_THROWS_WITH_AS(scale.parameter("bias"), "Scale: no parameter 'bias' (has [\"weight\"])", Error);
  CHECK_THROWS_AS(scale.buffer("nope"), Error);
  CHECK_THROWS_AS(scale.child("nope"), Error);
  CHECK_THROWS_AS(scale.set_parameter("weight", std::make_shared<nn::Parameter>(ops::ones({3}))), Error);
  CHECK(scale.has_parameter("weight"));
  CHECK_FALSE(scale.has_parameter("bias"));
  CHECK(scale.parameter("weight")->requires_grad());
  CHECK(scale.parameter("weight")->tensor().requires_grad());
}

TEST_CASE("module: a parameter swapped behind the slot is what forward reads") {
  Scale scale(2);
  const Tensor x = ops::from_vector(std::vector<float>{1, 2}, {2});
  CHECK(scale(x).to_vector<float>() == std::vector<float>{1, 2});
  // What FSDP does: replace the tensor inside the Parameter; the layer notices nothing.
  scale.parameter("weight")->set_tensor(ops::full({2}, 3.0));
  CHECK(scale.parameter("weight")->tensor().requires_grad());
  CHECK(scale(x).to_vector<float>() == std::vector<float>{3, 6});
  // Or replace the Parameter in the slot.
  scale.set_parameter("weight", std::make_shared<nn::Parameter>(ops::full({2}, -1.0)));
  CHECK(scale(x).to_vector<float>() == std::vector<float>{-1, -2});
}

TEST_CASE("module: forward-pre hooks replace inputs, forward hooks replace outputs, handles remove them") {
  Scale scale(2);
  const Tensor x = ops::from_vector(std::vector<float>{1, 2}, {2});
  std::vector<std::string> calls;
  std::vector<std::vector<float>> seen;
  auto pre = scale.register_forward_pre_hook([&](nn::Module& module, const nn::TensorList& inputs) {
    calls.push_back("pre:" + module.type_name());
    return std::optional<nn::TensorList>(nn::TensorList{ops::mul(inputs[0], 10.0)});
  });
  auto post = scale.register_forward_hook(
      [&](nn::Module&, const nn::TensorList& inputs, const Tensor& output) -> std::optional<Tensor> {
        calls.push_back("post");
        seen.push_back(inputs[0].to_vector<float>());
        return tessera::add(output, 1.0);
      });
  auto observer = scale.register_forward_hook(
      [&](nn::Module&, const nn::TensorList&, const Tensor& output) -> std::optional<Tensor> {
        calls.push_back("observe");
        seen.push_back(output.to_vector<float>());
        return std::nullopt;
      });
  CHECK(scale(x).to_vector<float>() == std::vector<float>{11, 21});
  CHECK(calls == std::vector<std::string>{"pre:Scale", "post", "observe"});
  // The forward hook sees the replaced inputs; later hooks see earlier replacements.
  CHECK(seen == std::vector<std::vector<float>>{{10, 20}, {11, 21}});

  pre.remove();
  CHECK(scale(x).to_vector<float>() == std::vector<float>{2, 3});
  post.remove();
  post.remove();  // a second remove is harmless
  observer.remove();
  calls.clear();
  CHECK(scale(x).to_vector<float>() == std::vector<float>{1, 2});
  CHECK(calls.empty());
}

TEST_CASE("module: a hook may remove itself while running, and outlive its module") {
  nn::HookHandle handle;
  int runs = 0;
  {
    Scale scale(1);
    handle = scale.register_forward_pre_hook([&](nn::Module&, const nn::TensorList&) {
      ++runs;
      handle.remove();
      return std::optional<nn::TensorList>();
    });
    scale(ops::ones({1}));
    scale(ops::ones({1}));
    CHECK(runs == 1);
    scale.register_forward_hook([](nn::Module&, const nn::TensorList&, const Tensor&) { return std::optional<Tensor>(); });
  }
  handle.remove();
}

TEST_CASE("module: input count is checked") {
  Scale scale(2);
  CHECK_THROWS_WITH_AS(scale(nn::TensorList{ops::ones({2}), ops::ones({2})}), "Scale: forward takes 1 input, got 2",
                       Error);
}

TEST_CASE("module: shared parameters are listed once and receive both gradients") {
  // The same Parameter in two modules (a tied embedding / output head).
  struct Tied : nn::Module {
    Tied() : Module("Tied") {
      first = register_module("first", std::make_shared<Scale>(2));
      second = register_module("second", std::make_shared<Scale>(2));
      second->set_parameter("weight", first->parameter("weight"));
    }
    Tensor forward(const Tensor& x) override { return tessera::add((*first)(x), (*second)(tessera::mul(x, x))); }
    std::shared_ptr<Scale> first, second;
  };
  Tied tied;
  CHECK(names_of(tied.named_parameters()) == std::vector<std::string>{"first.weight"});
  CHECK(tied.num_parameters() == 2);
  const auto state = tied.state_dict();
  CHECK(state.contains("first.weight"));
  CHECK(state.contains("second.weight"));  // like torch: every name, one tensor

  const Tensor x = ops::from_vector(std::vector<float>{2, 3}, {2});
  autograd::backward(tessera::sum(tied(x)));
  // d/dw sum(w x + w x^2) = x + x^2
  CHECK(tied.first->parameter("weight")->grad().to_vector<float>() == std::vector<float>{6, 12});
}

TEST_CASE("module: apply, train and eval reach every module") {
  Net net;
  int count = 0;
  std::vector<std::string> order;
  net.apply([&](nn::Module& module) {
    ++count;
    order.push_back(module.type_name());
  });
  CHECK(count == 10);
  CHECK(order.back() == "Net");  // children before parents
  CHECK(order.front() == "Linear");
  CHECK(net.is_training());
  net.eval();
  for (nn::Module* module : net.modules()) CHECK_FALSE(module->is_training());
  net.blocks->train();
  CHECK(net.blocks->operator[](0).is_training());
  CHECK_FALSE(net.is_training());
}

TEST_CASE("module: state_dict round trip copies values, not aliases") {
  Net a;
  Net b;
  a.reset_parameters(1);
  b.reset_parameters(2);
  a.blocks->items()[0]->child("scale")->set_buffer("calls", ops::full({1}, 7.0));
  const nn::StateDict state = a.state_dict();
  CHECK(state.size() == 12);  // 10 parameters + 2 buffers
  CHECK_FALSE(state.at("encoder.weight").requires_grad());
  CHECK(state.at("encoder.weight").shares_storage_with(a.encoder->weight().tensor()));
  CHECK(a.encoder->weight().tensor().to_vector<float>() != b.encoder->weight().tensor().to_vector<float>());

  const nn::LoadResult result = b.load_state_dict(state);
  CHECK(result.missing_keys.empty());
  CHECK(result.unexpected_keys.empty());
  const nn::StateDict loaded = b.state_dict();
  for (const auto& [name, tensor] : state) {
    CAPTURE(name);
    CHECK(loaded.at(name).to_vector<float>() == tensor.to_vector<float>());
    CHECK_FALSE(loaded.at(name).shares_storage_with(tensor));
  }
  CHECK(b.blocks->items()[0]->child("scale")->buffer("calls").item() == 7.0);
  CHECK(b.encoder->weight().tensor().requires_grad());  // still a trainable leaf
}

TEST_CASE("module: load_state_dict names every missing, unexpected and mis-shaped key in one message") {
  Net net;
  nn::StateDict state = net.state_dict();
  state.erase("encoder.bias");
  state.erase("norm.weight");
  state["decoder.weight"] = ops::zeros({2, 2});
  state["blocks.1.fc.weight"] = ops::zeros({4, 5});

  const std::string message = error_of([&] { net.load_state_dict(state); });
  CAPTURE(message);
  CHECK(contains(message, "Net: load_state_dict"));
  CHECK(contains(message, "missing keys: encoder.bias, norm.weight"));
  CHECK(contains(message, "unexpected keys: decoder.weight"));
  CHECK(contains(message, "blocks.1.fc.weight: expected shape [4, 4], got [4, 5]"));

  // Non-strict: missing and unexpected keys are returned, a shape mismatch still throws.
  const std::string non_strict = error_of([&] { net.load_state_dict(state, false); });
  CHECK(contains(non_strict, "blocks.1.fc.weight: expected shape [4, 4], got [4, 5]"));
  CHECK_FALSE(contains(non_strict, "missing"));

  state.erase("blocks.1.fc.weight");
  state["encoder.weight"] = ops::full({4, 3}, 0.5);
  const nn::LoadResult result = net.load_state_dict(state, false);
  CHECK(result.missing_keys == std::vector<std::string>{"blocks.1.fc.weight", "encoder.bias", "norm.weight"});
  CHECK(result.unexpected_keys == std::vector<std::string>{"decoder.weight"});
  CHECK(net.encoder->weight().tensor().to_vector<float>() == std::vector<float>(12, 0.5f));
}

TEST_CASE("module: a failed load copies nothing") {
  Net net;
  nn::StateDict state;
  for (const auto& [name, tensor] : net.state_dict()) state[name] = ops::zeros_like(tensor);
  state["norm.bias"] = ops::zeros({5});
  const std::vector<float> before = net.encoder->weight().tensor().to_vector<float>();
  CHECK_THROWS_AS(net.load_state_dict(state), Error);
  CHECK(net.encoder->weight().tensor().to_vector<float>() == before);
}

TEST_CASE("module: to_empty from meta, then reset_parameters, matches a model built on cpu (bitwise)") {
  Net cpu_net;
  cpu_net.reset_parameters(123);

  Net meta_net;
  meta_net.to_empty(kMeta);
  for (const auto& [name, parameter] : meta_net.named_parameters()) CHECK(parameter->tensor().is_meta());
  meta_net.to_empty(kCPU);
  meta_net.reset_parameters(123);

  const auto expected = cpu_net.state_dict();
  for (const auto& [name, tensor] : meta_net.state_dict()) {
    CAPTURE(name);
    CHECK(tensor.device() == kCPU);
    CHECK(tensor.to_vector<float>() == expected.at(name).to_vector<float>());
  }
  // Different seeds, different values; each parameter its own stream.
  Net other;
  other.reset_parameters(124);
  CHECK(other.encoder->weight().tensor().to_vector<float>() != cpu_net.encoder->weight().tensor().to_vector<float>());
  const auto first = cpu_net.blocks->items()[0]->state_dict().at("fc.weight").to_vector<float>();
  const auto second = cpu_net.blocks->items()[1]->state_dict().at("fc.weight").to_vector<float>();
  CHECK(first != second);
}

TEST_CASE("module: modules built on a real device draw their init seed from the default generator") {
  manual_seed(9);
  nn::Linear a(5, 3);
  nn::Linear b(5, 3);
  CHECK(a.weight().tensor().to_vector<float>() != b.weight().tensor().to_vector<float>());
  manual_seed(9);
  nn::Linear again(5, 3);
  CHECK(again.weight().tensor().to_vector<float>() == a.weight().tensor().to_vector<float>());

  nn::Linear meta(5, 3, {.device = kMeta});
  CHECK(meta.weight().tensor().is_meta());
  meta.to_empty(kCPU);
  manual_seed(9);
  meta.reset_parameters(nn::init::next_seed());
  CHECK(meta.weight().tensor().to_vector<float>() == a.weight().tensor().to_vector<float>());
  CHECK(meta.bias().tensor().to_vector<float>() == a.bias().tensor().to_vector<float>());
}
