// The KV cache on the cuda device (the simulator here, a GPU in an nvidia
// build): a GPT's and a Llama's (GQA) cached logits, a left-padded batch
// included, are forward's on cuda and the cpu cache's, within the f32 bound
// of tests/nn/test_kv_cache.cpp; generation on cuda gives the cpu's tokens
// with and without the cache.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "tensor/ops.h"
#include "tests/nn/tensor_differences.h"
#include "tests/train/cuda_device.h"
#include "train/byte_text.h"
#include "train/generation.h"

using tessera::Tensor;
using tessera::testing::max_scaled_difference;

using tessera::testing::kCuda;

namespace {

// The f32 bound of tests/nn/test_kv_cache.cpp (why it holds is written
// there): the cuda kernels sum in their own orders, cached or not. The
// largest difference seen here is 1.9e-7.
constexpr double kF32Bound = 2e-6;

// Built on the cpu, then moved: the same weights on either device.
std::unique_ptr<tessera::nn::CausalLM> small_gpt(tessera::Device device) {
  tessera::nn::GPTConfig config = tessera::nn::GPTConfig::preset("nano");
  config.block_size = 16;
  auto model = std::make_unique<tessera::nn::GPT>(config, tessera::kMeta);
  model->to_empty(tessera::kCPU);
  model->reset_parameters(31);
  model->to(device);
  model->eval();
  return model;
}

std::unique_ptr<tessera::nn::CausalLM> small_llama(tessera::Device device) {
  tessera::nn::LlamaConfig config = tessera::nn::LlamaConfig::preset("llama-nano");  // 2 heads, 1 kv head
  config.block_size = 16;
  auto model = std::make_unique<tessera::nn::Llama>(config, tessera::kMeta);
  model->to_empty(tessera::kCPU);
  model->reset_parameters(32);
  model->to(device);
  model->eval();
  return model;
}

// Two sequences of lengths 7 and 3, left-padded, prefilled and then decoded
// 5 steps: the logits of every slot [2, 12, V] (on the cpu).
Tensor padded_batch_logits(tessera::nn::CausalLM& model, tessera::Device device) {
  const std::vector<int64_t> prefill = {72, 101, 108, 108, 111, 44, 32, 0, 0, 0, 0, 97, 98, 99};
  tessera::nn::KVCache cache = model.make_kv_cache(2, 12, {0, 4});
  std::vector<Tensor> pieces{model.forward_cached(tessera::ops::to(tessera::ops::from_vector(prefill, {2, 7}), device),
                                                  cache)};
  for (int64_t step = 0; step < 5; ++step) {
    const Tensor next = tessera::ops::from_vector(std::vector<int64_t>{100 + step, 50 + step}, {2, 1});
    pieces.push_back(model.forward_cached(tessera::ops::to(next, device), cache));
  }
  return tessera::ops::to(tessera::ops::cat(pieces, 1), tessera::kCPU);
}

}  // namespace

TEST_CASE("forward_cached on cuda: forward's logits there, and the cpu cache's (GPT and Llama)") {
  tessera::autograd::NoGradGuard no_grad;
  for (auto* make : {&small_gpt, &small_llama}) {
    auto on_cuda = make(kCuda);
    auto on_cpu = make(tessera::kCPU);
    CAPTURE(on_cuda->type_name());
    const std::vector<int64_t> tokens = {84, 104, 101, 32, 113, 117, 105, 99, 107, 32};
    const Tensor idx = tessera::ops::to(tessera::ops::from_vector(tokens, {1, 10}), kCuda);
    const Tensor expected = tessera::ops::to((*on_cuda)(idx), tessera::kCPU);  // [1, 10, V]
    tessera::nn::KVCache cache = on_cuda->make_kv_cache(1, 10);
    CHECK(cache.device() == kCuda);
    std::vector<Tensor> pieces{on_cuda->forward_cached(tessera::ops::narrow(idx, 1, 0, 4), cache)};
    for (int64_t t = 4; t < 10; ++t) {
      pieces.push_back(on_cuda->forward_cached(tessera::ops::narrow(idx, 1, t, 1), cache));
    }
    const Tensor cached = tessera::ops::to(tessera::ops::cat(pieces, 1), tessera::kCPU);
    // The causal prefill runs forward's kernels: its bits.
    CHECK(tessera::ops::narrow(cached, 1, 0, 4).to_vector<float>() ==
          tessera::ops::narrow(expected, 1, 0, 4).to_vector<float>());
    CHECK(max_scaled_difference(cached, expected) <= kF32Bound);
    CHECK(max_scaled_difference(padded_batch_logits(*on_cuda, kCuda), padded_batch_logits(*on_cpu, tessera::kCPU)) <=
          kF32Bound);
  }
}

TEST_CASE("generate on cuda: the cpu's tokens, with and without the KV cache") {
  for (auto* make : {&small_gpt, &small_llama}) {
    auto on_cuda = make(kCuda);
    auto on_cpu = make(tessera::kCPU);
    CAPTURE(on_cuda->type_name());
    const std::vector<std::vector<uint32_t>> prompts = {tessera::train::text_to_byte_tokens("Hello"),
                                                        tessera::train::text_to_byte_tokens("a")};
    tessera::train::GenerationOptions options{.max_new_tokens = 14,  // "Hello" + 14 passes block_size 16: a refill
                                   .sampling = {.temperature = 0.0, .top_k = 0}};
    const auto reference = tessera::train::generate(*on_cpu, prompts, options);
    const auto cached = tessera::train::generate(*on_cuda, prompts, options);
    options.kv_cache = false;
    const auto uncached = tessera::train::generate(*on_cuda, prompts, options);
    for (size_t b = 0; b < prompts.size(); ++b) {
      CAPTURE(b);
      CHECK(cached[b].tokens == reference[b].tokens);
      CHECK(uncached[b].tokens == reference[b].tokens);
    }
  }
}
