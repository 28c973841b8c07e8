// nn::GPT: parameter counts and names, meta builds that allocate nothing,
// GPT-2 init, meta -> cpu materialisation bitwise equal to a cpu build, the
// tied head's gradient, an f64 model, a tiny model overfitting a fixed
// batch, and training with the fused residual add and LayerNorm equal to the
// unfused training.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "nn/models/gpt.h"
#include "nn/optim/adamw.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

double std_of(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  double mean = 0, var = 0;
  for (double x : v) mean += x / static_cast<double>(v.size());
  for (double x : v) var += (x - mean) * (x - mean) / static_cast<double>(v.size());
  return std::sqrt(var);
}

// The sample std of n normal draws has a relative standard error of
// 1/sqrt(2n); a correct init is within 5 of them but once in 1.7 million
// (and the seeds are fixed, so a pass holds for good).
void check_init_std(const Tensor& weight, double expected) {
  CAPTURE(weight.sizes());
  CHECK(std::abs(std_of(weight) / expected - 1.0) <= 5.0 / std::sqrt(2.0 * static_cast<double>(weight.numel())));
}

// A fixed batch of byte tokens: idx [B, T] and targets shifted by one.
std::pair<Tensor, Tensor> fixed_batch(int64_t B, int64_t T, int64_t vocab) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < B * (T + 1); ++i) tokens.push_back((i * 37 + (i / 5) * 11) % vocab);
  std::vector<int64_t> idx, targets;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      idx.push_back(tokens[b * (T + 1) + t]);
      targets.push_back(tokens[b * (T + 1) + t + 1]);
    }
  }
  return {ops::from_vector(idx, {B, T}), ops::from_vector(targets, {B, T})};
}

}  // namespace

TEST_CASE("GPTConfig: presets, validation and counts") {
  const nn::GPTConfig gpt2 = nn::GPTConfig::preset("gpt2-124m");
  CHECK(gpt2.n_layer == 12);
  CHECK(gpt2.n_head == 12);
  CHECK(gpt2.n_embd == 768);
  CHECK(gpt2.vocab_size == 50257);
  CHECK(gpt2.padded_vocab_size() == 50304);  // llm.c's Vp
  CHECK(gpt2.block_size == 1024);
  CHECK(gpt2.num_parameters() == 124439808 + 47 * 768);  // llm.c's 124,475,904
  // 6 N + 12 L T C with N excluding wpe and the padding rows.
  CHECK(gpt2.flops_per_token(1024) == 6.0 * (124439808 - 1024 * 768) + 12.0 * 12 * 1024 * 768);  // integers: exact

  const nn::GPTConfig tiny = nn::GPTConfig::preset("tiny");
  CHECK(tiny.n_layer == 2);
  CHECK(tiny.n_embd == 64);
  CHECK(tiny.vocab_size == 256);
  CHECK(tiny.padded_vocab_size() == 256);
  CHECK(nn::GPTConfig::preset("gpt2-350m").num_parameters() == 354823168 + 47 * 1024);
  CHECK(nn::GPTConfig::preset_names().size() == 6);
  CHECK_THROWS_WITH_AS(nn::GPTConfig::preset("gpt5"),
                       doctest::Contains("GPTConfig: unknown preset 'gpt5' (known: [\"nano\", \"tiny\""), Error);

  nn::GPTConfig bad = tiny;
  bad.n_head = 3;
  CHECK_THROWS_WITH_AS(bad.validate(), "GPTConfig: n_embd (64) must be a positive multiple of n_head (3)", Error);
  bad = tiny;
  bad.dropout = 1.0;
  CHECK_THROWS_AS(nn::GPT(bad, kMeta), Error);
  bad = tiny;
  bad.dtype = DType::bf16;
  CHECK_THROWS_WITH_AS(bad.validate(), "GPTConfig: dtype must be f32 or f64, got bf16", Error);
  bad = tiny;
  bad.vocab_padding_multiple = 0;
  CHECK_THROWS_WITH_AS(bad.validate(), "GPTConfig: vocab_padding_multiple must be in [1, 1024], got 0", Error);
  bad.vocab_padding_multiple = 1025;
  CHECK_THROWS_AS(bad.validate(), Error);
}

TEST_CASE("GPT: gpt2-124m on meta has the right parameters and allocates nothing") {
  const int64_t live = memory_stats(kCPU).live_bytes;
  nn::GPT model(nn::GPTConfig::preset("gpt2-124m"), kMeta);
  CHECK(memory_stats(kCPU).live_bytes - live < (1 << 20));  // the model would be ~500 MB
  CHECK(model.num_parameters() == nn::GPTConfig::preset("gpt2-124m").num_parameters());
  CHECK(model.wte().weight().sizes() == Shape{50304, 768});

  const auto named = model.named_parameters();
  CHECK(named.size() == 2 + 12 * 12 + 2);
  CHECK(named.front().first == "wte.weight");
  CHECK(named[1].first == "wpe.weight");
  CHECK(named[2].first == "blocks.0.ln1.weight");
  CHECK(named[4].first == "blocks.0.attn.qkv.weight");
  CHECK(named.back().first == "ln_f.bias");
  for (const auto& [name, parameter] : named) {
    CAPTURE(name);
    CHECK(parameter->tensor().is_meta());
    CHECK(parameter->requires_grad());
  }
  CHECK(model.block(3).attn().qkv().weight().sizes() == Shape{2304, 768});
  CHECK(model.block(11).mlp().proj().weight().sizes() == Shape{768, 3072});

  // Forward on meta is shape inference.
  const Tensor idx = ops::zeros({2, 1024}, {.dtype = DType::i64, .device = kMeta});
  const Tensor logits = model(idx);
  CHECK(logits.sizes() == Shape{2, 1024, 50257});
  CHECK(logits.is_meta());
  CHECK(memory_stats(kCPU).live_bytes - live < (1 << 20));

  nn::GPTConfig no_bias = nn::GPTConfig::preset("tiny");
  no_bias.bias = false;
  CHECK(nn::GPT(no_bias, kMeta).num_parameters() == no_bias.num_parameters());
  CHECK(nn::GPT(nn::GPTConfig::preset("nano"), kMeta).num_parameters() ==
        nn::GPTConfig::preset("nano").num_parameters());
}

TEST_CASE("GPT: GPT-2 init") {
  nn::GPTConfig config = nn::GPTConfig::preset("tiny");
  config.n_layer = 4;
  nn::GPT model(config);
  check_init_std(model.wte().weight().tensor(), 0.02);
  check_init_std(model.wpe().weight().tensor(), 0.02);
  check_init_std(model.block(0).attn().qkv().weight().tensor(), 0.02);
  check_init_std(model.block(0).mlp().fc().weight().tensor(), 0.02);
  const double residual = 0.02 / std::sqrt(8.0);
  check_init_std(model.block(1).attn().proj().weight().tensor(), residual);
  check_init_std(model.block(2).mlp().proj().weight().tensor(), residual);
  for (const auto& [name, parameter] : model.named_parameters()) {
    CAPTURE(name);
    const std::vector<float> v = parameter->tensor().to_vector<float>();
    if (name.ends_with(".bias")) CHECK(v == std::vector<float>(v.size(), 0.0f));
    if (name.find("ln") != std::string::npos && name.ends_with(".weight")) {
      CHECK(v == std::vector<float>(v.size(), 1.0f));
    }
  }
}

TEST_CASE("GPT: meta -> to_empty -> reset_parameters equals a cpu build with the same seed (bitwise)") {
  const nn::GPTConfig config = nn::GPTConfig::preset("tiny");
  manual_seed(2024);
  nn::GPT cpu_model(config);

  nn::GPT meta_model(config, kMeta);
  meta_model.to_empty(kCPU);
  manual_seed(2024);
  meta_model.reset_parameters(nn::init::next_seed());

  const auto expected = cpu_model.state_dict();
  const auto actual = meta_model.state_dict();
  REQUIRE(actual.size() == expected.size());
  for (const auto& [name, tensor] : expected) {
    CAPTURE(name);
    CHECK(actual.at(name).to_vector<float>() == tensor.to_vector<float>());
  }

  // An explicit seed gives the same bits whatever the model was built with.
  cpu_model.reset_parameters(7);
  meta_model.reset_parameters(7);
  CHECK(cpu_model.block(1).attn().qkv().weight().tensor().to_vector<float>() ==
        meta_model.block(1).attn().qkv().weight().tensor().to_vector<float>());
}

TEST_CASE("GPT: tiny forward shapes and an initial loss of about ln(vocab)") {
  manual_seed(1);
  nn::GPT model(nn::GPTConfig::preset("tiny"));
  const auto [idx, targets] = fixed_batch(2, 16, 256);
  const Tensor logits = model(idx);
  CHECK(logits.sizes() == Shape{2, 16, 256});
  const Tensor loss = model.loss(idx, targets);
  CHECK(loss.dim() == 0);
  // Untrained logits are ~N(0, 0.16^2) (init std 0.02 over 64 normalised
  // features): ln 256 + 0.16^2 / 2, give or take their noise over 32 tokens
  // (0.03); 2% of ln 256 is 0.11 (measured: ln 256 + 0.0003).
  CHECK(loss.item() == doctest::Approx(std::log(256.0)).epsilon(0.02));

  // Hooks on the model and on a block run at every call (FSDP's unshard and reshard).
  int block_calls = 0;
  auto pre = model.block(0).register_forward_pre_hook([&](nn::Module&, const nn::TensorList& inputs) {
    ++block_calls;
    CHECK(inputs[0].sizes() == Shape{2, 16, 64});
    return std::optional<nn::TensorList>();
  });
  auto post = model.register_forward_hook([](nn::Module&, const nn::TensorList& inputs, const Tensor& output) {
    return inputs.size() == 2 ? std::optional<Tensor>(tessera::mul(output, 2.0)) : std::nullopt;
  });
  CHECK(model.loss(idx, targets).item() == 2.0 * loss.item());  // the same forward, doubled exactly
  CHECK(block_calls == 1);
  pre.remove();
  post.remove();

  CHECK_THROWS_WITH_AS(model(ops::zeros({1, 65}, {.dtype = DType::i64})),
                       "GPT: sequence length 65 is outside [1, block_size 64]", Error);
  CHECK_THROWS_AS(model(ops::zeros({1, 4})), Error);  // f32 indices
  CHECK_THROWS_AS(model(nn::TensorList{idx, ops::zeros({2, 15}, {.dtype = DType::i64})}), Error);
}

TEST_CASE("GPT: dropout is active in training and off in eval") {
  nn::GPTConfig config = nn::GPTConfig::preset("nano");
  config.dropout = 0.2;
  manual_seed(8);
  nn::GPT model(config);
  const auto [idx, targets] = fixed_batch(2, 8, 256);
  const std::vector<float> first = model(idx).to_vector<float>();
  CHECK(model(idx).to_vector<float>() != first);
  model.eval();
  const std::vector<float> eval = model(idx).to_vector<float>();
  CHECK(model(idx).to_vector<float>() == eval);
  CHECK(eval != first);
}

TEST_CASE("GPT: the tied wte receives gradients from the embedding and from the head") {
  const nn::GPTConfig config = nn::GPTConfig::preset("nano");
  manual_seed(4);
  nn::GPT model(config);
  const auto [idx, targets] = fixed_batch(2, 8, 256);
  autograd::backward(model.loss(idx, targets));
  const std::vector<double> total = model.wte().weight().grad().to_vector<double>();
  REQUIRE(total.size() == 256 * 16);

  // The same forward by hand on a copy of the model, with wte's two uses
  // separable: `embed` feeds the lookup, `head` the output projection.
  auto share = [&](bool through_embedding) {
    nn::GPT copy(config, kMeta);
    copy.to_empty(kCPU);
    copy.load_state_dict(model.state_dict());
    const Tensor trainable = copy.wte().weight().tensor();
    const Tensor frozen = ops::clone(trainable.detach());  // a copy that needs no grad
    const Tensor& embed = through_embedding ? trainable : frozen;
    const Tensor& head = through_embedding ? frozen : trainable;
    Tensor x = tessera::add(tessera::embedding(embed, idx), copy.wpe()(ops::arange(0, 8, 1, {.dtype = DType::i64})));
    for (const auto& block : copy.blocks()) x = (*block)(x);
    const Tensor logits = tessera::linear(copy.ln_f()(x), head, Tensor());
    autograd::backward(tessera::cross_entropy(tessera::view(logits, {16, 256}), tessera::reshape(targets, {16})));
    return copy.wte().weight().grad().to_vector<double>();
  };
  const std::vector<double> embedding_share = share(true);
  const std::vector<double> head_share = share(false);

  std::vector<bool> used(256, false);
  for (int64_t token : idx.to_vector<int64_t>()) used[static_cast<size_t>(token)] = true;
  int64_t head_rows = 0;
  for (int64_t row = 0; row < 256; ++row) {
    double head_norm = 0;
    for (int64_t c = 0; c < 16; ++c) {
      const size_t i = static_cast<size_t>(row * 16 + c);
      // Each share is bitwise its part of the full backward; the engine adds the two in f32.
      CHECK(total[i] == static_cast<double>(static_cast<float>(embedding_share[i]) + static_cast<float>(head_share[i])));
      if (!used[static_cast<size_t>(row)]) CHECK(embedding_share[i] == 0.0);
      head_norm += std::abs(head_share[i]);
    }
    head_rows += head_norm > 0.0;
  }
  CHECK(head_rows == 256);  // the softmax reaches every vocabulary row
  double embedding_norm = 0;
  for (double g : embedding_share) embedding_norm += std::abs(g);
  CHECK(embedding_norm > 0.0);
}

TEST_CASE("GPT: an f64 model computes in f64 throughout (a directional derivative to 1e-6)") {
  nn::GPTConfig config = nn::GPTConfig::preset("nano");
  config.dtype = DType::f64;
  manual_seed(6);
  nn::GPT model(config);
  const auto parameters = model.named_parameters();
  for (const auto& [name, parameter] : parameters) {
    CAPTURE(name);
    CHECK(parameter->tensor().dtype() == DType::f64);
  }
  const auto [idx, targets] = fixed_batch(2, 8, 256);
  const Tensor loss = model.loss(idx, targets);
  CHECK(loss.dtype() == DType::f64);
  autograd::backward(loss);
  double gradient_norm = 0.0;
  for (const auto& [name, parameter] : parameters) {
    for (double g : parameter->grad().to_vector<double>()) gradient_norm += g * g;
  }
  gradient_norm = std::sqrt(gradient_norm);

  // The loss along the unit gradient direction at +-h: its central difference
  // is the slope |g| up to h^2 times the third derivative / 6 plus the loss's
  // rounding over 2h: 1e-16 * 5 / 1e-5 = 5e-11 in f64, where a single f32
  // rounding on the way would make it 6e-8 * 5 / 1e-5 = 3e-2. Measured: 6e-9.
  const double h = 1e-5;
  autograd::NoGradGuard no_grad;
  auto loss_at = [&](double step) {
    for (const auto& [name, parameter] : parameters) {
      ops::add_(parameter->tensor(), parameter->grad(), step / gradient_norm);
    }
    const double value = model.loss(idx, targets).item();
    for (const auto& [name, parameter] : parameters) {
      ops::add_(parameter->tensor(), parameter->grad(), -step / gradient_norm);
    }
    return value;
  };
  const double slope = (loss_at(h) - loss_at(-h)) / (2.0 * h);
  INFO("central difference " << slope << ", gradient norm " << gradient_norm);
  CHECK(std::abs(slope - gradient_norm) <= 1e-6 * gradient_norm);
}

TEST_CASE("GPT: a few AdamW steps overfit a fixed batch") {
  manual_seed(0);
  nn::GPT model(nn::GPTConfig::preset("tiny"));
  const auto [idx, targets] = fixed_batch(4, 32, 256);
  optim::AdamW optimizer(model.named_parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 15; ++step) {
    optimizer.zero_grad();
    const Tensor loss = model.loss(idx, targets);
    if (step == 0) first = loss.item();
    last = loss.item();
    autograd::backward(loss);
    optimizer.step();
  }
  MESSAGE("tiny GPT overfit: loss " << first << " -> " << last);  // measured 5.56 -> 1.20
  CHECK(first == doctest::Approx(std::log(256.0)).epsilon(0.02));
  CHECK(last < 0.5 * first);
}

// Each block runs h = x + attn(...) and ln2(h) as one add_layer_norm unless
// ln2 has a forward hook: a no-op hook on every ln2 gives the unfused
// model, which must train to the same bits (dropout on: the keys are drawn
// in the same order by both).
TEST_CASE("GPT: training with the blocks' fused residual add and ln2 is the unfused training, bit for bit") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    nn::GPTConfig config = nn::GPTConfig::preset("tiny");
    config.dtype = dtype;
    config.dropout = 0.1;
    const std::pair<Tensor, Tensor> batch = fixed_batch(2, 16, 256);
    const auto train = [&](bool hooked, int& hook_calls) {
      manual_seed(5);
      auto model = std::make_unique<nn::GPT>(config);
      for (int64_t i = 0; hooked && i < config.n_layer; ++i) {
        model->block(i).ln2().register_forward_hook([&hook_calls](nn::Module&, const nn::TensorList&, const Tensor&) {
          ++hook_calls;
          return std::optional<Tensor>();
        });
      }
      optim::AdamW optimizer(model->named_parameters(), {.lr = 1e-2, .weight_decay = 0.1});
      std::vector<double> losses;
      for (int step = 0; step < 3; ++step) {
        optimizer.zero_grad();
        const Tensor loss = model->loss(batch.first, batch.second);
        losses.push_back(loss.item());
        autograd::backward(loss);
        optimizer.step();
      }
      return std::pair{std::move(model), losses};
    };
    int fused_calls = 0, unfused_calls = 0;
    const auto [fused, fused_losses] = train(false, fused_calls);
    const auto [unfused, unfused_losses] = train(true, unfused_calls);
    CHECK(unfused_calls == 3 * config.n_layer);
    CHECK(fused_losses == unfused_losses);
    const auto fused_parameters = fused->named_parameters(), unfused_parameters = unfused->named_parameters();
    REQUIRE(fused_parameters.size() == unfused_parameters.size());
    for (size_t i = 0; i < fused_parameters.size(); ++i) {
      CAPTURE(fused_parameters[i].first);
      const auto values = [](const Tensor& t) { return ops::to(t.detach(), DType::f64).to_vector<double>(); };
      CHECK(values(fused_parameters[i].second->tensor()) == values(unfused_parameters[i].second->tensor()));
    }
  }
}

// The padded vocabulary: the same model as the unpadded one, with zero rows
// that only align the head's GEMMs. Row i's init depends only on (key, i), so
// a padded and an unpadded model of one seed share their first V rows.
TEST_CASE("GPT: a padded vocabulary trains exactly like the unpadded one and its padding stays zero") {
  nn::GPTConfig plain = nn::GPTConfig::preset("tiny");
  plain.vocab_size = 250;  // pads to 256 with a multiple of 128
  nn::GPTConfig padded = plain;
  padded.vocab_padding_multiple = 128;
  REQUIRE(padded.padded_vocab_size() == 256);
  manual_seed(3);
  nn::GPT reference(plain);
  manual_seed(3);
  nn::GPT model(padded);
  CHECK(model.num_parameters() == padded.num_parameters());
  CHECK(model.num_parameters() - reference.num_parameters() == 6 * 64);
  const auto rows = [](const Tensor& t, int64_t begin, int64_t count) {
    return ops::narrow(t.detach(), 0, begin, count).to_vector<float>();
  };
  const Tensor table = model.wte().weight().tensor();
  REQUIRE(table.sizes() == Shape{256, 64});
  CHECK(rows(table, 0, 250) == reference.wte().weight().tensor().to_vector<float>());
  CHECK(rows(table, 250, 6) == std::vector<float>(6 * 64, 0.0f));

  const auto [idx, targets] = fixed_batch(2, 16, 250);
  CHECK(model(idx).sizes() == Shape{2, 16, 250});  // {idx}: the real columns only
  optim::AdamW reference_optimizer(reference.named_parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  optim::AdamW optimizer(model.named_parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    reference_optimizer.zero_grad();
    optimizer.zero_grad();
    const Tensor reference_loss = reference.loss(idx, targets);
    const Tensor loss = model.loss(idx, targets);
    // The padded head's GEMM has more columns, which may change how the
    // library blocks it but not what each column sums: equal to f32 rounding.
    CHECK(loss.item() == doctest::Approx(reference_loss.item()).epsilon(1e-6));
    autograd::backward(reference_loss);
    autograd::backward(loss);
    const Tensor grad = model.wte().weight().grad();
    CHECK(rows(grad, 250, 6) == std::vector<float>(6 * 64, 0.0f));
    reference_optimizer.step();
    optimizer.step();
  }
  CHECK(rows(model.wte().weight().tensor(), 250, 6) == std::vector<float>(6 * 64, 0.0f));
  const std::vector<float> trained = rows(model.wte().weight().tensor(), 0, 250);
  const std::vector<float> expected = reference.wte().weight().tensor().to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) worst = std::max(worst, std::abs(double{trained[i]} - expected[i]));
  CHECK(worst < 1e-5);  // three steps of lr 1e-2 from equal weights: the rounding of the loss's sums only

  // A token in the padding is refused like any out-of-range one.
  CHECK_THROWS_WITH_AS(model(ops::from_vector(std::vector<int64_t>{3, 252}, {1, 2})),
                       doctest::Contains("252"), Error);
  CHECK_THROWS_WITH_AS(model.loss(ops::from_vector(std::vector<int64_t>{3, 4}, {1, 2}),
                                  ops::from_vector(std::vector<int64_t>{5, 251}, {1, 2})),
                       doctest::Contains("target 251 out of range for 250 classes"), Error);
}
