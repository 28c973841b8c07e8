// nn::Llama against an independent PyTorch implementation (golden data from
// tests/oracle/llama_oracle.py: f32 weights, a batch, and f64 logits, loss and
// gradients), the RoPE tables on meta and after to_empty, grouped-query
// attention against multi-head attention with repeated kv heads, gradient
// checks of the new layers, presets and counts, and a tiny model overfitting.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "checkpoint/safetensors.h"
#include "nn/grouped_query_attention.h"
#include "nn/models/llama.h"
#include "nn/optim/adamw.h"
#include "nn/rotary_embedding.h"
#include "nn/swiglu.h"
#include "tensor/ops.h"
#include "tests/nn/tensor_differences.h"

using namespace tessera;
using testing::max_abs_difference;
using testing::max_scaled_difference;

namespace {

std::string golden_path() { return std::string(TESSERA_NN_GOLDEN_DIR) + "/llama_golden.safetensors"; }

Tensor golden(const std::string& name) { return checkpoint::read_safetensors_tensor(golden_path(), name); }

// The golden model's shape, from the file's metadata.
nn::LlamaConfig golden_config(DType dtype) {
  const auto metadata = checkpoint::read_safetensors_header(golden_path()).metadata;
  auto integer = [&](const char* key) { return std::stoll(metadata.at(key)); };
  nn::LlamaConfig config;
  config.vocab_size = integer("vocab_size");
  config.block_size = integer("block_size");
  config.n_layer = integer("n_layer");
  config.n_head = integer("n_head");
  config.n_kv_head = integer("n_kv_head");
  config.n_embd = integer("n_embd");
  config.ffn_hidden = integer("ffn_hidden");
  config.rope_theta = std::stod(metadata.at("rope_theta"));
  config.norm_eps = std::stod(metadata.at("norm_eps"));
  config.dtype = dtype;
  return config;
}

struct GoldenComparison {
  double logits = 0, loss = 0, grads = 0;  // max_scaled_difference
  double logits_abs = 0, grads_abs = 0;      // max_abs_difference, for the record
};

// Loads the golden weights into a Llama of `dtype`, runs forward and backward
// on the golden batch, and returns the worst differences from PyTorch's f64.
GoldenComparison compare_with_golden(DType dtype) {
  nn::Llama model(golden_config(dtype), kMeta);
  model.to_empty(kCPU);
  nn::StateDict weights;
  for (const auto& [name, parameter] : model.named_parameters()) weights.emplace(name, golden("param." + name));
  model.load_state_dict(weights);  // strict: every parameter, and nothing else (the RoPE tables are not state)

  const Tensor idx = golden("batch.idx"), targets = golden("batch.targets");
  GoldenComparison worst;
  const Tensor logits = model(idx);
  worst.logits = max_scaled_difference(logits, golden("logits"));
  worst.logits_abs = max_abs_difference(logits, golden("logits"));
  const Tensor loss = model.loss(idx, targets);
  worst.loss = max_scaled_difference(loss, golden("loss"));
  autograd::backward(loss);
  for (const auto& [name, parameter] : model.named_parameters()) {
    CAPTURE(name);
    REQUIRE(parameter->grad().defined());
    const Tensor expected = golden("grad." + name);
    worst.grads = std::max(worst.grads, max_scaled_difference(parameter->grad(), expected));
    worst.grads_abs = std::max(worst.grads_abs, max_abs_difference(parameter->grad(), expected));
  }
  return worst;
}

// A fixed batch of byte tokens: idx [B, T] and targets shifted by one.
std::pair<Tensor, Tensor> llama_batch(int64_t B, int64_t T, int64_t vocab) {
  std::vector<int64_t> idx, targets;
  for (int64_t i = 0; i < B * T; ++i) {
    idx.push_back((i * 37 + (i / 5) * 11) % vocab);
    targets.push_back(((i + 1) * 37 + ((i + 1) / 5) * 11) % vocab);
  }
  return {ops::from_vector(idx, {B, T}), ops::from_vector(targets, {B, T})};
}

}  // namespace

// Tolerances in max |a - e| / max(1, max |e|) per tensor. The golden weights
// (std 0.3) amplify f32 rounding: PyTorch's own f32 run of this model is
// 3.6e-6 (logits, which reach 4) and 6.6e-6 (grads, up to 1.8) off its f64.
// f64 is the proof of the formulas; f32 shows the f32 path rounds no worse.
TEST_CASE("Llama matches the PyTorch golden: f32 within 1e-5, f64 within 1e-10") {
  const GoldenComparison f32 = compare_with_golden(DType::f32);
  MESSAGE("f32 vs torch f64: logits " << f32.logits << " (abs " << f32.logits_abs << "), loss " << f32.loss
                                      << ", grads " << f32.grads << " (abs " << f32.grads_abs << ")");
  CHECK(f32.logits < 1e-5);
  CHECK(f32.loss < 1e-5);
  CHECK(f32.grads < 1e-5);
  const GoldenComparison f64 = compare_with_golden(DType::f64);
  MESSAGE("f64 vs torch f64: logits " << f64.logits << ", loss " << f64.loss << ", grads " << f64.grads);
  CHECK(f64.logits < 1e-10);
  CHECK(f64.loss < 1e-10);
  CHECK(f64.grads < 1e-10);
}

TEST_CASE("Llama: the RoPE tables are meta on meta, built by to_empty, and not state") {
  nn::LlamaConfig config = nn::LlamaConfig::preset("llama-nano");
  nn::Llama on_meta(config, kMeta);
  const nn::GroupedQueryAttention& attention = on_meta.layer(0).attention();
  REQUIRE(attention.rope() != nullptr);
  CHECK(attention.rope()->buffer("cos").device().is_meta());
  CHECK(attention.rope()->buffer("cos").sizes() == Shape{config.block_size, config.n_embd / config.n_head / 2});
  for (const auto& [name, tensor] : on_meta.state_dict()) CHECK(name.find("rope") == std::string::npos);
  CHECK(on_meta.named_buffers().size() == 2 * static_cast<size_t>(config.n_layer));

  on_meta.to_empty(kCPU);  // no reset_parameters: the tables must already be right
  const int64_t D = config.n_embd / config.n_head;
  const std::vector<double> cos = attention.rope()->buffer("cos").to_vector<double>();
  const std::vector<double> sin = attention.rope()->buffer("sin").to_vector<double>();
  double worst = 0;
  for (int64_t t = 0; t < config.block_size; ++t) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const double angle = static_cast<double>(t) * std::pow(config.rope_theta, -2.0 * static_cast<double>(i) / D);
      worst = std::max(worst, std::abs(cos[static_cast<size_t>(t * D / 2 + i)] - std::cos(angle)));
      worst = std::max(worst, std::abs(sin[static_cast<size_t>(t * D / 2 + i)] - std::sin(angle)));
    }
  }
  CHECK(worst < 1e-7);  // f32 tables: one rounding of the f64 angle's cos/sin

  manual_seed(3);
  nn::Llama on_cpu(config);
  CHECK(on_cpu.layer(0).attention().rope()->buffer("cos").to_vector<float>() ==
        attention.rope()->buffer("cos").to_vector<float>());
}

TEST_CASE("RotaryEmbedding rotates interleaved pairs by t * theta^(-2i/D)") {
  nn::RotaryEmbedding rope(4, 8, {.theta = 100.0, .dtype = DType::f64});
  const int64_t B = 1, T = 3, H = 2, D = 4;
  const Tensor x = ops::randn({B, T, H, D}, PhiloxKey{5, 1}, {.dtype = DType::f64});
  const std::vector<double> in = x.to_vector<double>(), out = rope(x).to_vector<double>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < D / 2; ++i) {
        const double angle = static_cast<double>(t) * std::pow(100.0, -2.0 * static_cast<double>(i) / D);
        const size_t even = static_cast<size_t>((t * H + h) * D + 2 * i), odd = even + 1;
        CHECK(out[even] == doctest::Approx(in[even] * std::cos(angle) - in[odd] * std::sin(angle)).epsilon(1e-12));
        CHECK(out[odd] == doctest::Approx(in[even] * std::sin(angle) + in[odd] * std::cos(angle)).epsilon(1e-12));
      }
    }
  }
  CHECK_THROWS_WITH_AS(rope(ops::zeros({1, 9, 2, 4}, {.dtype = DType::f64})),
                       doctest::Contains("expected input [B, T <= 8, H, 4]"), Error);
  CHECK_THROWS_WITH_AS(nn::RotaryEmbedding(3, 8), doctest::Contains("head_dim must be positive and even"), Error);

  Tensor leaf = ops::randn({2, 3, 2, 4}, PhiloxKey{6, 1}, {.dtype = DType::f64});
  leaf.set_requires_grad(true);
  const auto check = autograd::gradcheck([&](const nn::TensorList& in) { return rope(in[0]); }, {leaf});
  CHECK_MESSAGE(check.ok, check.report);
}

TEST_CASE("GroupedQueryAttention equals multi-head attention with each kv head repeated") {
  manual_seed(21);
  const int64_t C = 8, H = 4, Hkv = 2, D = C / H;
  nn::GroupedQueryAttention grouped(C, H, {.num_kv_heads = Hkv, .rope = {{.max_seq_len = 6}}, .dtype = DType::f64});
  nn::GroupedQueryAttention full(C, H, {.rope = {{.max_seq_len = 6}}, .dtype = DType::f64});
  CHECK(grouped.wk().weight().sizes() == Shape{Hkv * D, C});
  CHECK(full.wk().weight().sizes() == Shape{H * D, C});
  {
    autograd::NoGradGuard no_grad;
    for (const char* name : {"wq", "wo"}) {
      Tensor target = full.child(name)->parameter("weight")->tensor();
      ops::copy_(target, grouped.child(name)->parameter("weight")->tensor());
    }
    // Query head j reads kv head j / (H / Hkv): rows [h*D, (h+1)*D) of the
    // full projection are rows [(h / 2)*D, ...) of the grouped one.
    for (const char* name : {"wk", "wv"}) {
      const Tensor source = grouped.child(name)->parameter("weight")->tensor();
      Tensor target = full.child(name)->parameter("weight")->tensor();
      for (int64_t h = 0; h < H; ++h) {
        Tensor rows = ops::narrow(target, 0, h * D, D);
        ops::copy_(rows, ops::narrow(source, 0, (h / (H / Hkv)) * D, D));
      }
    }
  }
  const Tensor x = ops::randn({2, 5, C}, PhiloxKey{7, 1}, {.dtype = DType::f64});
  CHECK(max_abs_difference(grouped(x), full(x)) < 1e-14);

  CHECK_THROWS_WITH_AS(nn::GroupedQueryAttention(8, 4, {.num_kv_heads = 3}),
                       doctest::Contains("num_kv_heads (3) must divide num_heads (4)"), Error);
  CHECK_THROWS_WITH_AS(nn::GroupedQueryAttention(8, 3), doctest::Contains("positive multiple of num_heads"), Error);
  CHECK_THROWS_WITH_AS(grouped(ops::zeros({2, 5, 7}, {.dtype = DType::f64})),
                       doctest::Contains("expected input [B, T, 8]"), Error);

  Tensor leaf = ops::randn({1, 4, C}, PhiloxKey{8, 1}, {.dtype = DType::f64});
  leaf.set_requires_grad(true);
  const auto check = autograd::gradcheck([&](const nn::TensorList& in) { return grouped(in[0]); }, {leaf});
  CHECK_MESSAGE(check.ok, check.report);
}

TEST_CASE("SwiGLU computes w2(silu(w1 x) * w3 x) and passes a gradient check") {
  manual_seed(22);
  nn::SwiGLU swiglu(3, 5, {.dtype = DType::f64});
  CHECK(swiglu.w1().weight().sizes() == Shape{5, 3});
  CHECK(swiglu.w2().weight().sizes() == Shape{3, 5});
  CHECK_FALSE(swiglu.w1().has_bias());
  Tensor x = ops::randn({2, 3}, PhiloxKey{9, 1}, {.dtype = DType::f64});
  const auto w = [](const nn::Linear& linear) { return linear.weight().tensor().to_vector<double>(); };
  const std::vector<double> w1 = w(swiglu.w1()), w2 = w(swiglu.w2()), w3 = w(swiglu.w3()), in = x.to_vector<double>();
  const std::vector<double> out = swiglu(x).to_vector<double>();
  for (int64_t row = 0; row < 2; ++row) {
    std::vector<double> gated(5);
    for (int64_t f = 0; f < 5; ++f) {
      double gate = 0, up = 0;
      for (int64_t c = 0; c < 3; ++c) {
        gate += w1[f * 3 + c] * in[row * 3 + c];
        up += w3[f * 3 + c] * in[row * 3 + c];
      }
      gated[f] = gate / (1.0 + std::exp(-gate)) * up;
    }
    for (int64_t c = 0; c < 3; ++c) {
      double expected = 0;
      for (int64_t f = 0; f < 5; ++f) expected += w2[c * 5 + f] * gated[f];
      CHECK(out[row * 3 + c] == doctest::Approx(expected).epsilon(1e-12));
    }
  }
  x.set_requires_grad(true);
  const auto check = autograd::gradcheck([&](const nn::TensorList& in) { return swiglu(in[0]); }, {x});
  CHECK_MESSAGE(check.ok, check.report);
}

TEST_CASE("LlamaConfig: presets, validation and counts") {
  const nn::LlamaConfig llama2 = nn::LlamaConfig::preset("llama2-7b");
  CHECK(llama2.num_parameters() == 6'738'415'616);  // Meta's published count
  const nn::LlamaConfig llama3 = nn::LlamaConfig::preset("llama3-8b");
  CHECK(llama3.num_parameters() == 8'030'261'248);  // Meta's published count
  CHECK(llama3.rope_theta == 500000.0);
  CHECK(nn::LlamaConfig::preset("llama3-70b").num_parameters() == 70'553'706'496);  // Meta's published count
  for (const std::string& name : nn::LlamaConfig::preset_names()) {
    CAPTURE(name);
    const nn::LlamaConfig config = nn::LlamaConfig::preset(name);
    CHECK_NOTHROW(config.validate());
    if (config.num_parameters() < 200'000'000) {
      nn::Llama model(config, kMeta);  // meta: the count without allocating
      CHECK(model.num_parameters() == config.num_parameters());
    }
  }
  CHECK_THROWS_WITH_AS(nn::LlamaConfig::preset("llama-huge"), doctest::Contains("llama-tiny"), Error);
  nn::LlamaConfig bad;
  bad.n_kv_head = 3;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("n_kv_head (3) must divide n_head (4)"), Error);
  bad = {};
  bad.n_embd = 12;  // head_dim 3: RoPE needs pairs
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("even head_dim"), Error);
  const nn::LlamaConfig tiny = nn::LlamaConfig::preset("llama-tiny");
  CHECK(tiny.flops_per_token(64) ==
        6.0 * static_cast<double>(tiny.num_parameters() - 256 * 64) + 12.0 * 2 * 64 * 64);
}

TEST_CASE("Llama: names, untied head, input errors") {
  manual_seed(23);
  nn::Llama model(nn::LlamaConfig::preset("llama-nano"));
  std::vector<std::string> names;
  for (const auto& [name, parameter] : model.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{
                     "tok_embeddings.weight", "layers.0.attention_norm.weight", "layers.0.attention.wq.weight",
                     "layers.0.attention.wk.weight", "layers.0.attention.wv.weight", "layers.0.attention.wo.weight",
                     "layers.0.ffn_norm.weight", "layers.0.feed_forward.w1.weight", "layers.0.feed_forward.w2.weight",
                     "layers.0.feed_forward.w3.weight", "norm.weight", "output.weight"});
  CHECK_FALSE(model.output().weight().tensor().is_same(model.tok_embeddings().weight().tensor()));
  CHECK(model.blocks().size() == 1);
  const auto [idx, targets] = llama_batch(2, 8, 256);
  CHECK(model(idx).sizes() == Shape{2, 8, 256});
  CHECK_THROWS_WITH_AS(model(ops::zeros({2, 33}, {.dtype = DType::i64})),
                       doctest::Contains("Llama: sequence length 33 is outside [1, block_size 32]"), Error);
  CHECK_THROWS_WITH_AS(model.loss(idx, ops::zeros({2, 7}, {.dtype = DType::i64})),
                       doctest::Contains("Llama: targets must be [2, 8]"), Error);
}

TEST_CASE("Llama: a few AdamW steps overfit a fixed batch") {
  manual_seed(24);
  nn::Llama model(nn::LlamaConfig::preset("llama-tiny"));
  optim::AdamW adamw(model.named_parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  const auto [idx, targets] = llama_batch(4, 32, 256);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    const Tensor loss = model.loss(idx, targets);
    if (step == 0) first = loss.item();
    last = loss.item();
    adamw.zero_grad();
    autograd::backward(loss);
    adamw.step();
  }
  MESSAGE("tiny Llama overfit: loss " << first << " -> " << last);
  CHECK(last < 0.3 * first);
}
