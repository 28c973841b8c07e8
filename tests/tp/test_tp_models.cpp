// Tensor parallelism alone (tp 2, 3 and 4 on thread ranks) against one rank,
// for GPT (fused qkv, tied head, padded vocabulary) and Llama (grouped-query
// attention, SwiGLU, untied head), both with uneven vocabulary shares:
//   - every piece of every parameter is the 1-rank init's, bitwise, whether
//     the model was built on meta and initialised in pieces or built whole
//     and then split;
//   - the loss, every gradient (gathered) and one AdamW step match within f32
//     rounding of the other summation order; the logits-only call gathers
//     the same logits;
//   - sequence-parallel norm gradients are equal on every tp rank, and
//     without their sum over tp (the test-only switch) they are wrong;
//   - clip_grad_norm_ gives the 1-rank norm, each piece counted once;
//   - the refusals: heads or sequence length that tp does not divide, a
//     misspelt plan, a style on the wrong layer, fully_shard before
//     parallelize, decoding with a KV cache (composition with FSDP:
//     test_tp_with_fsdp.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "nn/activation_checkpoint.h"
#include "nn/dropout.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#include "tensor/ops.h"
#include "tp/partial_gradients.h"
#include "tests/tp/composed_models.h"
#include "tp/plans.h"
#include "tp/traffic.h"

using namespace tessera;
using tessera::tp::testing::kComparableAdamW;
using tessera::tp::testing::reference_step;
using tessera::tp::testing::ReferenceStep;
using tessera::tp::testing::thread_rank_options;
namespace ops = tessera::ops;

namespace {

constexpr uint64_t kInitSeed = 1234;
constexpr int64_t kBatch = 2;
constexpr int64_t kSequence = 12;  // divides by 2, 3 and 4

nn::GPTConfig small_gpt() {
  nn::GPTConfig config;
  config.vocab_size = 67;
  config.vocab_padding_multiple = 5;  // 70 rows: 35/35, 24/24/22, 18/18/18/16
  config.block_size = 16;
  config.n_layer = 2;
  config.n_head = 12;
  config.n_embd = 48;
  return config;
}

nn::LlamaConfig small_llama() {
  nn::LlamaConfig config;
  config.vocab_size = 67;  // 34/33, 23/23/21, 17/17/17/16
  config.block_size = 16;
  config.n_layer = 2;
  config.n_head = 24;
  config.n_kv_head = 12;
  config.n_embd = 96;
  config.ffn_hidden = 100;  // 50/50, 34/34/32, 25 each
  return config;
}

using ModelFactory = std::function<std::shared_ptr<nn::CausalLM>(Device)>;

ModelFactory gpt_factory() {
  return [](Device device) { return std::make_shared<nn::GPT>(small_gpt(), device); };
}
ModelFactory gpt_with_dropout_factory() {
  return [](Device device) {
    nn::GPTConfig config = small_gpt();
    config.dropout = 0.2;
    return std::make_shared<nn::GPT>(config, device);
  };
}
ModelFactory llama_factory() {
  return [](Device device) { return std::make_shared<nn::Llama>(small_llama(), device); };
}

// Built on meta, initialised with kInitSeed: the 1-rank reference.
std::shared_ptr<nn::CausalLM> whole_model(const ModelFactory& make) {
  auto model = make(kMeta);
  model->to_empty(kCPU);
  model->reset_parameters(kInitSeed);
  return model;
}

// Built on meta, split over the tp mesh, then each rank initialises its pieces.
std::shared_ptr<nn::CausalLM> parallel_model(const ModelFactory& make, const dist::DeviceMesh& mesh) {
  auto model = make(kMeta);
  tp::parallelize_causal_lm(*model, mesh);
  model->to_empty(kCPU);
  model->reset_parameters(kInitSeed);
  return model;
}

Tensor tokens(int64_t vocab, uint64_t salt) {
  std::vector<int64_t> values;
  for (int64_t i = 0; i < kBatch * kSequence; ++i) {
    values.push_back(static_cast<int64_t>((static_cast<uint64_t>(i) * 2654435761ULL + salt * 97) % 1000003) % vocab);
  }
  return ops::from_vector(values, {kBatch, kSequence});
}

std::vector<double> as_doubles(const Tensor& tensor) {
  return ops::to(tensor.detach(), DType::f64).to_vector<double>();
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && as_doubles(a) == as_doubles(b);
}

// Each element within `relative` of the tensor's largest magnitude, or of
// `floor` if that is larger (1 for losses and parameters: the FSDP
// equivalence tests' 1e-5 * max(1, |x|)).
void check_close(const Tensor& got, const Tensor& want, double relative, const std::string& what,
                 double floor = 1.0) {
  INFO(what);
  REQUIRE(got.sizes() == want.sizes());
  const std::vector<double> mine = as_doubles(got);
  const std::vector<double> wanted = as_doubles(want);
  double scale = floor;
  for (double value : wanted) scale = std::max(scale, std::abs(value));
  double worst = 0.0;
  for (size_t i = 0; i < mine.size(); ++i) worst = std::max(worst, std::abs(mine[i] - wanted[i]));
  CHECK(worst <= relative * scale);
}

// A gradient gathered whole (laid out as its parameter).
Tensor full_gradient(const nn::Parameter& parameter) {
  const auto& spec = parameter.tensor_parallel();
  return spec ? tp::full_tensor(parameter.grad(), *spec) : ops::clone(parameter.grad());
}

dist::DeviceMesh tp_mesh(const dist::ProcessGroupPtr& group) {
  return dist::DeviceMesh(group, kCPU, {group->size()}, {"tp"});
}

// Loss, gradients, one AdamW step and the next loss of the parallel model
// against the reference's.
void check_training_step(const ModelFactory& make, int64_t vocab, int world) {
  auto reference = whole_model(make);
  const Tensor idx = tokens(vocab, 1);
  const Tensor targets = tokens(vocab, 2);
  // Dropout keys come from each rank's default generator: the same state on
  // every rank and in the reference (the trainer seeds by data-parallel rank).
  manual_seed(77);
  const ReferenceStep reference_run = reference_step(*reference, idx, targets);
  const Tensor& reference_loss = reference_run.loss;
  const std::map<std::string, Tensor>& reference_grads = reference_run.gradients;
  const double reference_norm = reference_run.norm;
  const nn::StateDict& reference_after = reference_run.after;
  manual_seed(78);
  const Tensor reference_next = reference->loss(idx, targets);
  reference->eval();
  const Tensor reference_logits = reference->forward(idx).detach();

  dist::run_local(
      world,
      [&](const dist::ProcessGroupPtr& group) {
        INFO(reference->type_name(), " on tp ", world);
        auto model = parallel_model(make, tp_mesh(group));
        manual_seed(77);
        const Tensor loss = model->loss(idx, targets);
        check_close(loss, reference_loss, 1e-5, "loss");
        autograd::backward(loss);
        for (const auto& [name, parameter] : model->named_parameters()) {
          check_close(full_gradient(*parameter), reference_grads.at(name), 1e-4, "gradient of " + name, 1e-6);
        }
        const double norm = optim::clip_grad_norm_(model->parameters(), 1e9);
        CHECK(std::abs(norm - reference_norm) <= 1e-5 * reference_norm);
        optim::AdamW optimizer(model->named_parameters(), kComparableAdamW);
        optimizer.step();
        manual_seed(78);
        check_close(model->loss(idx, targets), reference_next, 1e-5, "loss after a step");
        const nn::StateDict after = tp::full_state_dict(*model);
        for (const auto& [name, tensor] : reference_after) check_close(after.at(name), tensor, 1e-5, name);
        // {idx} gathers the vocabulary shards into whole logits (in eval: no dropout).
        autograd::NoGradGuard no_grad;
        model->eval();
        check_close(model->forward(idx), reference_logits, 1e-5, "logits");
      },
      thread_rank_options());
}

}  // namespace

TEST_CASE("tp init: every rank's pieces are the 1-rank model's bits, built on meta or split when whole") {
  for (const ModelFactory& make : {gpt_factory(), llama_factory()}) {
    const nn::StateDict reference = whole_model(make)->state_dict();
    for (int world : {2, 3, 4}) {
      dist::run_local(
          world,
          [&](const dist::ProcessGroupPtr& group) {
            const dist::DeviceMesh mesh = tp_mesh(group);
            auto from_meta = parallel_model(make, mesh);
            INFO(from_meta->type_name(), " on tp ", world);
            const nn::StateDict gathered = tp::full_state_dict(*from_meta);
            REQUIRE(gathered.size() == reference.size());
            for (const auto& [name, tensor] : reference) {
              CAPTURE(name);
              CHECK(bitwise_equal(gathered.at(name), tensor));
            }
            // A whole model split afterwards holds the same pieces.
            auto split_later = whole_model(make);
            tp::parallelize_causal_lm(*split_later, mesh);
            const nn::StateDict mine = from_meta->state_dict();
            for (const auto& [name, tensor] : split_later->state_dict()) {
              CAPTURE(name);
              CHECK(bitwise_equal(mine.at(name), tensor));
            }
          },
          thread_rank_options());
    }
  }
}

TEST_CASE("tp GPT: loss, gradients, clipped norm and an AdamW step as one rank on tp 2, 3 and 4") {
  for (int world : {2, 3, 4}) check_training_step(gpt_factory(), small_gpt().vocab_size, world);
}

TEST_CASE("tp GPT with dropout: each rank drops its slice of the 1-rank mask, so the step is one rank's") {
  for (int world : {2, 3, 4}) check_training_step(gpt_with_dropout_factory(), small_gpt().vocab_size, world);
}

TEST_CASE("tp: a dropout's sequence slices together draw the whole tensor's mask, bitwise") {
  const Tensor x = ops::add(ops::randn({3, 12, 5}, PhiloxKey{.seed = 9, .stream = 1}), 2.0);
  nn::Dropout whole(0.4);
  manual_seed(5);
  const Tensor reference = whole(x);
  for (int64_t slices : {2, 3, 4}) {
    std::vector<Tensor> pieces;
    for (int64_t index = 0; index < slices; ++index) {
      nn::Dropout slice(0.4);
      slice.set_sequence_slice(1, slices, index);
      manual_seed(5);
      pieces.push_back(slice(ops::contiguous(ops::narrow(x, 1, index * 12 / slices, 12 / slices))));
    }
    CAPTURE(slices);
    CHECK(bitwise_equal(ops::cat(pieces, 1), reference));
  }
  // Something was dropped, and not everything.
  const std::vector<double> values = as_doubles(reference);
  CHECK(std::count(values.begin(), values.end(), 0.0) > 20);
  CHECK(std::count(values.begin(), values.end(), 0.0) < 120);
}

TEST_CASE("tp Llama: loss, gradients, clipped norm and an AdamW step as one rank on tp 2, 3 and 4") {
  for (int world : {2, 3, 4}) check_training_step(llama_factory(), small_llama().vocab_size, world);
}

TEST_CASE("tp: the pieces' shapes, local head counts and the activation collectives of one GPT step") {
  dist::run_local(
      2,
      [](const dist::ProcessGroupPtr& group) {
        const dist::DeviceMesh mesh = tp_mesh(group);
        auto model = parallel_model(gpt_factory(), mesh);
        auto& gpt = static_cast<nn::GPT&>(*model);
        const nn::GPTConfig config = small_gpt();
        CHECK(gpt.wte().weight().sizes() == Shape{35, config.n_embd});
        CHECK(gpt.lm_head().weight().tensor().is_same(gpt.wte().weight().tensor()));  // still tied
        CHECK(gpt.block(0).attn().qkv().weight().sizes() == Shape{3 * config.n_embd / 2, config.n_embd});
        CHECK(gpt.block(0).attn().local_heads() == config.n_head / 2);
        CHECK(gpt.block(0).attn().proj().weight().sizes() == Shape{config.n_embd, config.n_embd / 2});
        CHECK(gpt.block(0).mlp().fc().weight().sizes() == Shape{2 * config.n_embd, config.n_embd});
        CHECK(gpt.wpe().weight().sizes() == Shape{config.block_size, config.n_embd});  // replicated
        CHECK(gpt.block(0).ln1().weight().tensor_parallel()->partial_gradient);
        // Forward: the embedding's reduce-scatter onto the sequence; per block
        // an all-gather into attention and the MLP and a reduce-scatter out of
        // each; the all-gather into the head; the loss's 3 all-reduces.
        const dist::ProcessGroupPtr& tp_group = mesh.group(0);
        tp_group->reset_stats();
        const Tensor loss = model->loss(tokens(config.vocab_size, 1), tokens(config.vocab_size, 2));
        const dist::CommStats forward = tp_group->stats();
        const int64_t L = config.n_layer;
        CHECK(forward[dist::CollectiveKind::all_gather].calls == 2 * L + 1);
        CHECK(forward[dist::CollectiveKind::reduce_scatter].calls == 2 * L + 1);
        CHECK(forward[dist::CollectiveKind::all_reduce].calls == 3);
        // An all-gather of [B, T, C] f32 activations sends (N - 1) / N of them.
        const int64_t activation_bytes = kBatch * kSequence * config.n_embd * 4;
        CHECK(forward[dist::CollectiveKind::all_gather].bytes_sent == (2 * L + 1) * activation_bytes / 2);
        // Backward: the conjugates (plus wpe's gradient all-gathered back to
        // its replicated rows) and one all-reduce per partial gradient: ln1
        // and ln2 weight and bias, proj and mlp.proj bias, ln_f's two.
        tp_group->reset_stats();
        autograd::backward(loss);
        const dist::CommStats backward = tp_group->stats();
        CHECK(backward[dist::CollectiveKind::all_gather].calls == 2 * L + 2);
        CHECK(backward[dist::CollectiveKind::reduce_scatter].calls == 2 * L + 1);
        CHECK(backward[dist::CollectiveKind::all_reduce].calls == 6 * L + 2);
      },
      thread_rank_options());
}

TEST_CASE("tp: sequence-parallel norm gradients are equal on every rank, and wrong without their sum") {
  auto reference = whole_model(gpt_factory());
  const Tensor idx = tokens(small_gpt().vocab_size, 3);
  const Tensor targets = tokens(small_gpt().vocab_size, 4);
  autograd::backward(reference->loss(idx, targets));
  const Tensor reference_grad = ops::clone(static_cast<nn::GPT&>(*reference).block(1).ln2().weight().grad());
  for (bool summed : {true, false}) {
    dist::run_local(
        2,
        [&](const dist::ProcessGroupPtr& group) {
          const dist::DeviceMesh mesh = tp_mesh(group);
          auto model = parallel_model(gpt_factory(), mesh);
          if (!summed) tp::remove_partial_gradient_sums(*model);
          autograd::backward(model->loss(idx, targets));
          const Tensor grad = static_cast<nn::GPT&>(*model).block(1).ln2().weight().grad();
          // Every rank's gradient, stacked: row r is rank r's.
          const Tensor all = dist::DTensor(ops::unsqueeze(ops::contiguous(grad), 0), mesh, {dist::Shard{0}},
                                           {2, grad.size(0)})
                                 .full_tensor();
          const bool equal_on_ranks = bitwise_equal(ops::select(all, 0, 0), ops::select(all, 0, 1));
          const std::vector<double> mine = as_doubles(grad);
          const std::vector<double> wanted = as_doubles(reference_grad);
          double worst = 0.0;
          for (size_t i = 0; i < mine.size(); ++i) worst = std::max(worst, std::abs(mine[i] - wanted[i]));
          if (summed) {
            CHECK(equal_on_ranks);
            CHECK(worst <= 1e-5);
          } else {
            CHECK_FALSE(equal_on_ranks);
            CHECK(worst > 1e-3);
          }
        },
        thread_rank_options());
  }
}

TEST_CASE("tp: refusals name what does not fit") {
  dist::run_local(
      8,
      [](const dist::ProcessGroupPtr& group) {
        auto gpt = std::make_shared<nn::GPT>(small_gpt(), kMeta);
        CHECK_THROWS_WITH_AS(tp::parallelize_gpt(*gpt, tp_mesh(group)),
                             doctest::Contains("n_head = 12, which the tp size 8 does not divide"), Error);
      },
      thread_rank_options());
  dist::run_local(
      4,
      [](const dist::ProcessGroupPtr& group) {
        const dist::DeviceMesh mesh = tp_mesh(group);
        nn::LlamaConfig config = small_llama();
        config.n_kv_head = 6;
        auto llama = std::make_shared<nn::Llama>(config, kMeta);
        CHECK_THROWS_WITH_AS(tp::parallelize_llama(*llama, mesh),
                             doctest::Contains("n_kv_head = 6, which the tp size 4 does not divide"), Error);
        // A sequence of 10 over 4 ranks.
        auto model = parallel_model(gpt_factory(), mesh);
        const Tensor short_idx = ops::narrow(tokens(small_gpt().vocab_size, 1), 1, 0, 10);
        CHECK_THROWS_WITH_AS(model->loss(ops::contiguous(short_idx), ops::contiguous(short_idx)),
                             doctest::Contains("has size 10, which does not divide by the tp size 4"), Error);
        // A misspelt plan, and a style on a layer it does not fit.
        auto other = std::make_shared<nn::GPT>(small_gpt(), kMeta);
        CHECK_THROWS_WITH_AS(tp::parallelize_module(*other, mesh, {{"blocks.*.atn.qkv", tp::colwise_parallel()}}),
                             doctest::Contains("'blocks.*.atn.qkv' (ColwiseParallel(input Replicate(), output "
                                               "Shard(-1))) matches no module"),
                             Error);
        CHECK_THROWS_WITH_AS(tp::parallelize_module(*other, mesh,
                                                    {{"blocks.*.attn.qkv", tp::colwise_parallel()},
                                                     {"wte", tp::rowwise_parallel()}}),
                             doctest::Contains("RowwiseParallel applies to a Linear; wte is a Embedding"), Error);
        // Checked before anything was applied: the model is as it was, and takes a good plan.
        for (const auto& parameter : other->parameters()) CHECK(parameter->tensor_parallel() == nullptr);
        CHECK_FALSE(other->block(0).attn().qkv().has_forward_hooks());
        tp::parallelize_gpt(*other, mesh);
        // A second plan on the same model.
        CHECK_THROWS_WITH_AS(tp::parallelize_gpt(static_cast<nn::GPT&>(*model), mesh),
                             doctest::Contains("this GPT is parallelized already"), Error);
        // Decoding with a KV cache runs on whole models.
        nn::KVCache cache = model->make_kv_cache(1, 8);
        CHECK_THROWS_WITH_AS(model->forward_cached(ops::from_vector(std::vector<int64_t>{1, 2}, {1, 2}), cache),
                             doctest::Contains("is a tensor-parallel piece"), Error);
      },
      thread_rank_options());
  dist::run_local(
      2,
      [](const dist::ProcessGroupPtr& group) {
        auto model = std::make_shared<nn::GPT>(small_gpt(), kMeta);
        const dist::DeviceMesh mesh = tp_mesh(group);
        fsdp::fully_shard(*model, {.mesh = mesh});
        CHECK_THROWS_WITH_AS(tp::parallelize_gpt(*model, mesh),
                             doctest::Contains("already sharded by FSDP; parallelize the model first, then "
                                               "fully_shard"),
                             Error);
      },
      thread_rank_options());
}

TEST_CASE("tp: every step's collectives on the tp group, calls and bytes, are tp::plan_traffic's, exactly") {
  for (const ModelFactory& make : {gpt_factory(), llama_factory()}) {
    // every:2 recomputes the second block: its forward's moves repeat in
    // backward; selective repeats every block's (it keeps products, not moves).
    for (const char* checkpointing : {"off", "every:2", "selective"}) {
      for (int world : {2, 3}) {
        dist::run_local(
            world,
            [&](const dist::ProcessGroupPtr& group) {
              const dist::DeviceMesh mesh = tp_mesh(group);
              auto model = parallel_model(make, mesh);
              INFO(model->type_name(), " on tp ", world, ", activation checkpointing ", checkpointing);
              nn::apply_activation_checkpointing(model->blocks(), nn::ActivationCheckpointPolicy::parse(checkpointing));
              const tp::TensorParallelTraffic planned =
                  tp::plan_traffic(*model, {.batch = kBatch, .seq_len = kSequence, .activation_dtype = DType::f32});
              const int64_t vocab = 67;
              const dist::ProcessGroupPtr& tp_group = mesh.group(0);
              tp_group->reset_stats();
              const Tensor loss = model->loss(tokens(vocab, 1), tokens(vocab, 2));
              const dist::CommStats forward = tp_group->stats();
              tp_group->reset_stats();
              autograd::backward(loss);
              const dist::CommStats backward = tp_group->stats();
              for (const auto kind : {dist::CollectiveKind::all_gather, dist::CollectiveKind::reduce_scatter,
                                      dist::CollectiveKind::all_reduce}) {
                CAPTURE(dist::collective_name(kind));
                CHECK(forward[kind].calls == planned.forward[kind].calls);
                CHECK(forward[kind].bytes_sent == planned.forward[kind].bytes_sent);
                CHECK(forward[kind].bytes_received == planned.forward[kind].bytes_received);
                CHECK(backward[kind].calls == planned.backward[kind].calls);
                CHECK(backward[kind].bytes_sent == planned.backward[kind].bytes_sent);
                CHECK(backward[kind].bytes_received == planned.backward[kind].bytes_received);
              }
              CHECK(planned.forward[dist::CollectiveKind::all_gather].bytes_sent > 0);
            },
            thread_rank_options());
      }
    }
  }
}

TEST_CASE("tp with activation checkpointing: the same loss and gradients, bitwise, dropout replayed on its slice") {
  for (const ModelFactory& make : {gpt_with_dropout_factory(), llama_factory()}) {
    dist::run_local(
        2,
        [&](const dist::ProcessGroupPtr& group) {
          const dist::DeviceMesh mesh = tp_mesh(group);
          const int64_t vocab = small_gpt().vocab_size;
          const auto gradients = [&](const char* checkpointing) {
            auto model = parallel_model(make, mesh);
            nn::apply_activation_checkpointing(model->blocks(), nn::ActivationCheckpointPolicy::parse(checkpointing));
            manual_seed(79);
            const Tensor loss = model->loss(tokens(vocab, 1), tokens(vocab, 2));
            autograd::backward(loss);
            std::map<std::string, std::vector<double>> values{{"loss", as_doubles(loss)}};
            for (const auto& [name, parameter] : model->named_parameters()) {
              values[name] = as_doubles(parameter->grad());
            }
            return values;
          };
          const auto plain = gradients("off");
          for (const char* policy : {"full", "selective"}) {
            const auto checkpointed = gradients(policy);
            for (const auto& [name, values] : plain) {
              CAPTURE(policy);
              CAPTURE(name);
              CHECK(checkpointed.at(name) == values);
            }
          }
        },
        thread_rank_options());
  }
}
