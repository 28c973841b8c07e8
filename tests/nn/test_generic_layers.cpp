// The generic layers a model author builds with: Sequential, MLP with any
// activation, the options of attention and the block (no model config
// inside), and non-persistent buffers.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/rotary_embedding.h"
#include "nn/sequential.h"
#include "nn/transformer_block.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

std::vector<std::string> parameter_names(const nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& [name, parameter] : module.named_parameters()) names.push_back(name);
  return names;
}

}  // namespace

TEST_CASE("Sequential feeds each child's output to the next, children named by index") {
  manual_seed(31);
  auto first = std::make_shared<nn::Linear>(3, 4);
  auto second = std::make_shared<nn::Linear>(4, 2);
  nn::Sequential net({first, std::make_shared<nn::ReLU>(), second});
  CHECK(net.type_name() == "Sequential");
  CHECK(net.size() == 3);
  CHECK(parameter_names(net) == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  const Tensor x = ops::randn({5, 3}, PhiloxKey{1, 2});
  CHECK(net(x).to_vector<float>() == (*second)(tessera::relu((*first)(x))).to_vector<float>());
  nn::Sequential empty;
  CHECK(empty(x).is_same(x));
  CHECK_THROWS_WITH_AS(nn::Sequential({first, nullptr}), doctest::Contains("the module is null"), Error);
  CHECK_THROWS_WITH_AS(net(ops::zeros({5, 4})), doctest::Contains("Linear: expected input [..., 3]"), Error);
}

TEST_CASE("MLP takes any activation module, and the options set its init and bias") {
  manual_seed(32);
  nn::MLP relu_mlp(3, 6, 2, std::make_shared<nn::ReLU>());
  CHECK(relu_mlp.fc().weight().sizes() == Shape{6, 3});
  CHECK(relu_mlp.proj().weight().sizes() == Shape{2, 6});
  CHECK(relu_mlp.activation().type_name() == "ReLU");
  const Tensor x = ops::randn({4, 3}, PhiloxKey{3, 4});
  const Tensor expected = relu_mlp.proj()(tessera::relu(relu_mlp.fc()(x)));
  CHECK(relu_mlp(x).to_vector<float>() == expected.to_vector<float>());

  nn::MLP no_bias(3, 6, 2, std::make_shared<nn::Tanh>(), {.bias = false, .init_std = 0.0, .proj_init_std = 1.0});
  CHECK(parameter_names(no_bias) == std::vector<std::string>{"fc.weight", "proj.weight"});
  for (float value : no_bias.fc().weight().tensor().to_vector<float>()) CHECK(value == 0.0f);  // N(0, 0)
  double squares = 0;
  for (float value : no_bias.proj().weight().tensor().to_vector<float>()) squares += value * value;
  CHECK(squares > 0.5);  // N(0, 1): 12 draws
  CHECK_THROWS_WITH_AS(nn::MLP(3, 6, 2, nullptr), doctest::Contains("MLP: the activation module is null"), Error);
}

TEST_CASE("CausalSelfAttention and TransformerBlock take their own options") {
  nn::CausalSelfAttention attention(6, 3, {.bias = false, .device = kMeta, .dtype = DType::f64});
  CHECK(attention.qkv().weight().sizes() == Shape{18, 6});
  CHECK_FALSE(attention.qkv().has_bias());
  CHECK(attention.qkv().weight().tensor().device().is_meta());
  CHECK(attention.qkv().weight().tensor().dtype() == DType::f64);
  CHECK_THROWS_WITH_AS(nn::CausalSelfAttention(6, 4), doctest::Contains("embed_dim (6) must be a positive multiple of num_heads (4)"), Error);

  nn::TransformerBlock block(8, 2, {.mlp_hidden = 12, .bias = false, .device = kMeta});
  CHECK(block.mlp().fc().weight().sizes() == Shape{12, 8});
  CHECK(block.num_parameters() == 8 + 24 * 8 + 8 * 8 + 8 + 12 * 8 + 8 * 12);
  CHECK_THROWS_WITH_AS(nn::TransformerBlock(8, 2, {.mlp_hidden = -1}), doctest::Contains("mlp_hidden must be positive"), Error);
}

TEST_CASE("Module: a non-persistent buffer is computed by to_empty and left out of state_dict") {
  nn::RotaryEmbedding rope(4, 3, {.device = kMeta});
  CHECK_FALSE(rope.is_persistent_buffer("cos"));
  CHECK(rope.named_buffers().size() == 2);
  CHECK(rope.state_dict().empty());
  CHECK(rope.load_state_dict({}).missing_keys.empty());  // strict, and nothing is expected
  CHECK_THROWS_WITH_AS(rope.is_persistent_buffer("tan"), doctest::Contains("no buffer 'tan'"), Error);
  rope.to_empty(kCPU);
  const std::vector<float> cos = rope.buffer("cos").to_vector<float>();
  CHECK(cos[0] == 1.0f);                               // position 0: no rotation
  CHECK(cos[2] == doctest::Approx(std::cos(1.0)));     // position 1, pair 0: angle 1
  CHECK(cos[3] == doctest::Approx(std::cos(0.01)));    // position 1, pair 1: angle 10000^(-1/2)

  nn::Linear linear(2, 2);
  linear.register_buffer("steps", ops::zeros({1}));
  CHECK(linear.is_persistent_buffer("steps"));
  CHECK(linear.state_dict().count("steps") == 1);
}
