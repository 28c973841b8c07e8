// Async tensor parallelism (tp/collective_matmul.h, PlanOptions::async_chunks):
//   - the collective matmuls alone (and one gather into three products),
//     on tp 2 and 3 and in 1 to 4 batch
//     chunks (uneven ones included): output and every gradient the
//     synchronous move and Linear's (bitwise in one chunk; in several within
//     1e-6 of each tensor's largest: a chunk's GEMM may take another BLAS
//     kernel), a collective call per chunk;
//   - GPT and Llama with async_chunks 2 and 3 on tp 2 (a batch of 3): the
//     loss and every gradient the synchronous plan's, as closely, and the tp
//     group's calls and bytes tp::plan_traffic's with the chunks;
//   - on simulated GPUs with every stream operation jittered, the checker
//     silent and the loss and gradients the synchronous run's, as closely;
//   - the overlap, from the simulator's recorded schedule: a chunk's GEMM
//     waits for its own collective only, never for another chunk's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "tensor/ops.h"
#include "tests/tp/composed_models.h"
#include "tp/collective_matmul.h"
#include "tp/plans.h"
#include "tp/traffic.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/sim/schedule_recorder.h"
#include "tensor/cuda/sim/sim_stream.h"
#endif

using namespace tessera;
using namespace tessera::tp::testing;
namespace ops = tessera::ops;

namespace {

constexpr int64_t kAsyncBatch = 3, kAsyncSequence = 6, kAsyncIn = 5, kAsyncOut = 7;

// Equal within 1e-6 of the larger tensor's largest magnitude (at least 1):
// the chunks' GEMMs may round otherwise than the whole one's.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  const std::vector<double> x = doubles(a.detach()), y = doubles(b.detach());
  double largest = 1.0, worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    largest = std::max({largest, std::abs(x[i]), std::abs(y[i])});
    worst = std::max(worst, std::abs(x[i] - y[i]));
  }
  return worst <= 1e-6 * largest;
}

Tensor leaf(const Tensor& value) {
  Tensor copy = ops::clone(value);
  copy.set_requires_grad(true);
  return copy;
}

// One rank's run of a product and its backward: the output and the gradients
// of the input, the weight and (when there is one) the bias.
struct ProductRun {
  Tensor output, input_grad, weight_grad, bias_grad;
};

template <class Product>
ProductRun run_product(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& upstream,
                       Product product) {
  Tensor x = leaf(input), w = leaf(weight), b = bias.defined() ? leaf(bias) : Tensor();
  const Tensor y = product(x, w, b);
  autograd::backward(tessera::sum(tessera::mul(y, upstream)));
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

// One chunk runs the synchronous GEMMs: bitwise; several, within rounding.
void check_same(const ProductRun& async_run, const ProductRun& sync_run, bool one_chunk) {
  const auto same = [one_chunk](const Tensor& a, const Tensor& b) {
    return one_chunk ? same_bits(a, b) : same_values(a, b);
  };
  CHECK(same(async_run.output, sync_run.output));
  CHECK(same(async_run.input_grad, sync_run.input_grad));
  CHECK(same(async_run.weight_grad, sync_run.weight_grad));
  CHECK(async_run.bias_grad.defined() == sync_run.bias_grad.defined());
  if (sync_run.bias_grad.defined()) CHECK(same(async_run.bias_grad, sync_run.bias_grad));
}

// A GPT or Llama on tp ranks, parallelized with `options`, initialised alike.
std::shared_ptr<nn::CausalLM> model_on(const ComposedFactory& make, const dist::DeviceMesh& mesh, Device device,
                                       const tp::PlanOptions& options) {
  auto model = make(kMeta);
  tp::parallelize_causal_lm(*model, mesh, options);
  model->to_empty(device);
  model->reset_parameters(kComposedSeed);
  return model;
}

// Three sequences: 2 chunks split them unevenly (2 and 1).
Tensor step_tokens(Device device) { return ops::to(ops::narrow(global_tokens(2, 4), 0, 0, 3), device); }

// The loss and every parameter's gradient (on the cpu) of one step.
std::vector<Tensor> step_results(nn::CausalLM& model, Device device) {
  const Tensor idx = step_tokens(device);
  const Tensor loss = model.loss(idx, idx);
  autograd::backward(loss);
  std::vector<Tensor> results = {ops::to(loss.detach(), kCPU)};
  for (const auto& parameter : model.parameters()) results.push_back(ops::to(parameter->grad(), kCPU));
  return results;
}

}  // namespace

TEST_CASE("async tp: chunked all-gather + product and product + reduce-scatter are the synchronous results") {
  for (const int tp : {2, 3}) {
    for (const int64_t chunks : {1, 2, 3, 4}) {
      CAPTURE(tp);
      CAPTURE(chunks);
      dist::run_local(
          tp,
          [&](const dist::ProcessGroupPtr& world) {
            const dist::DeviceMesh mesh(world, kCPU, {tp}, {"tp"});
            const int64_t piece = kAsyncSequence, rank = world->rank();
            const int64_t expected_calls = tp::collective_chunks(kAsyncBatch, chunks);
            // Column-wise: x [B, T/tp, K] sequence-sharded.
            const Tensor x = irregular_tensor({kAsyncBatch, piece, kAsyncIn}, 1 + rank);
            const Tensor w = irregular_tensor({kAsyncOut, kAsyncIn}, 11 + rank);
            const Tensor b = irregular_tensor({kAsyncOut}, 21 + rank);
            const Tensor up = irregular_tensor({kAsyncBatch, piece * tp, kAsyncOut}, 31 + rank);
            mesh.group(0)->reset_stats();
            const auto gather_fused = [&](const Tensor& in, const Tensor& wt, const Tensor& bs) {
              return tp::all_gather_linear(in, wt, bs, mesh, chunks);
            };
            const ProductRun fused = run_product(x, w, b, up, gather_fused);
            const dist::CommStats fused_stats = mesh.group(0)->stats();
            const auto gather_then_multiply = [&](const Tensor& in, const Tensor& wt, const Tensor& bs) {
              return tessera::linear(tp::move_activation(in, mesh, dist::Shard{1}, dist::Replicate{}, dist::Partial{}),
                                     wt, bs);
            };
            const ProductRun moved = run_product(x, w, b, up, gather_then_multiply);
            check_same(fused, moved, expected_calls == 1);
            CHECK(fused_stats[dist::CollectiveKind::all_gather].calls == expected_calls);
            CHECK(fused_stats[dist::CollectiveKind::reduce_scatter].calls == expected_calls);
            // Row-wise: x [B, T, K] -> [B, T/tp, N] summed.
            const Tensor full = irregular_tensor({kAsyncBatch, piece * tp, kAsyncIn}, 41 + rank);
            const Tensor up_piece = irregular_tensor({kAsyncBatch, piece, kAsyncOut}, 51 + rank);
            const ProductRun scattered =
                run_product(full, w, Tensor(), up_piece, [&](const Tensor& in, const Tensor& wt, const Tensor&) {
                  return tp::linear_reduce_scatter(in, wt, mesh, chunks);
                });
            const ProductRun summed =
                run_product(full, w, Tensor(), up_piece, [&](const Tensor& in, const Tensor& wt, const Tensor&) {
                  return tp::move_activation(tessera::linear(in, wt, Tensor()), mesh, dist::Partial{}, dist::Shard{1});
                });
            check_same(scattered, summed, expected_calls == 1);
          },
          thread_rank_options());
    }
  }
}

TEST_CASE("async tp: one chunked gather into several products (Llama's wq, wk, wv) is the moved input's products") {
  for (const int tp : {2, 3}) {
    for (const int64_t chunks : {1, 2, 4}) {
      CAPTURE(tp);
      CAPTURE(chunks);
      dist::run_local(
          tp,
          [&](const dist::ProcessGroupPtr& world) {
            const dist::DeviceMesh mesh(world, kCPU, {tp}, {"tp"});
            const int64_t rank = world->rank(), piece = kAsyncSequence;
            const Tensor x = irregular_tensor({kAsyncBatch, piece, kAsyncIn}, 61 + rank);
            const std::vector<int64_t> outs = {kAsyncOut, 2, kAsyncOut + 3};
            std::vector<Tensor> weights, ups;
            for (size_t i = 0; i < outs.size(); ++i) {
              weights.push_back(irregular_tensor({outs[i], kAsyncIn}, 71 + static_cast<int>(i) + rank));
              ups.push_back(irregular_tensor({kAsyncBatch, piece * tp, outs[i]}, 81 + static_cast<int>(i) + rank));
            }
            const Tensor bias = irregular_tensor({outs[2]}, 91 + rank);  // the last product only
            // Runs `products` on fresh leaves; the second output gets no gradient.
            const auto run = [&](const auto& products) {
              Tensor in = leaf(x), b = leaf(bias);
              std::vector<Tensor> ws;
              for (const Tensor& w : weights) ws.push_back(leaf(w));
              const std::vector<Tensor> ys = products(in, ws, b);
              autograd::backward(tessera::add(tessera::sum(tessera::mul(ys[0], ups[0])),
                                              tessera::sum(tessera::mul(ys[2], ups[2]))));
              std::vector<Tensor> results = {ys[0].detach(), ys[1].detach(), ys[2].detach(), in.grad(),
                                             ws[0].grad(),   ws[2].grad(),   b.grad()};
              // Its weight's gradient: none, or zeros (as the engine hands an unused output).
              CHECK((!ws[1].grad().defined() || ops::amax(ops::abs(ws[1].grad())).item<double>() == 0.0));
              return results;
            };
            mesh.group(0)->reset_stats();
            using Products = std::vector<Tensor>;
            const Products fused = run([&](const Tensor& in, const Products& ws, const Tensor& b) {
              return tp::all_gather_linears(in, ws, {Tensor(), Tensor(), b}, mesh, chunks);
            });
            const dist::CommStats stats = mesh.group(0)->stats();
            const Products moved = run([&](const Tensor& in, const Products& ws, const Tensor& b) {
              const Tensor whole = tp::move_activation(in, mesh, dist::Shard{1}, dist::Replicate{}, dist::Partial{});
              return Products{tessera::linear(whole, ws[0], Tensor()), tessera::linear(whole, ws[1], Tensor()),
                              tessera::linear(whole, ws[2], b)};
            });
            const int64_t calls = tp::collective_chunks(kAsyncBatch, chunks);
            for (size_t index = 0; index < fused.size(); ++index) {
              CAPTURE(index);
              CHECK(same_values(fused[index], moved[index]));
            }
            // One gather a chunk for the three products, one reduce-scatter a chunk for their summed dx.
            CHECK(stats[dist::CollectiveKind::all_gather].calls == calls);
            CHECK(stats[dist::CollectiveKind::reduce_scatter].calls == calls);
          },
          thread_rank_options());
    }
  }
  dist::run_local(
      2,
      [&](const dist::ProcessGroupPtr& world) {
        const dist::DeviceMesh mesh(world, kCPU, {2}, {"tp"});
        const Tensor x = irregular_tensor({kAsyncBatch, kAsyncSequence, kAsyncIn}, 1);
        const Tensor w = irregular_tensor({kAsyncOut, kAsyncIn}, 2);
        const Tensor narrow_w = irregular_tensor({kAsyncOut, kAsyncIn + 1}, 3);
        CHECK_THROWS_WITH_AS(tp::all_gather_linears(x, {w}, {}, mesh, 2),
                             "all_gather_linear: 1 weights and 0 biases (one bias, or an undefined one, a weight)",
                             Error);
        CHECK_THROWS_WITH_AS(tp::all_gather_linears(x, {w, narrow_w}, {Tensor(), Tensor()}, mesh, 2),
                             doctest::Contains("all_gather_linear: expected x [B, T, K] and weight [N, K]"), Error);
      },
      thread_rank_options());
}

TEST_CASE("async tp: GPT and Llama with chunked moves are the synchronous plan's results, and plan_traffic's counts") {
  constexpr int tp = 2;
  for (const auto& [label, make] : composed_models()) {
    {
      for (const int64_t chunks : {2, 3}) {
        CAPTURE(label);
        CAPTURE(chunks);
        dist::run_local(
            tp,
            [&](const dist::ProcessGroupPtr& world) {
              const dist::DeviceMesh mesh(world, kCPU, {tp}, {"tp"});
              auto sync_model = model_on(make, mesh, kCPU, {});
              auto async_model = model_on(make, mesh, kCPU, {.async_chunks = chunks});
              const std::vector<Tensor> sync_results = step_results(*sync_model, kCPU);
              const dist::ProcessGroupPtr& group = mesh.group(0);
              group->reset_stats();
              const Tensor idx = step_tokens(kCPU);
              const Tensor loss = async_model->loss(idx, idx);
              const dist::CommStats forward = group->stats();
              group->reset_stats();
              autograd::backward(loss);
              const dist::CommStats backward = group->stats();
              std::vector<Tensor> async_results = {loss.detach()};
              for (const auto& parameter : async_model->parameters()) async_results.push_back(parameter->grad());
              REQUIRE(async_results.size() == sync_results.size());
              for (size_t index = 0; index < sync_results.size(); ++index) {
                CAPTURE(index);
                CHECK(same_values(async_results[index], sync_results[index]));
              }
              const tp::TensorParallelTraffic planned =
                  tp::plan_traffic(*async_model, {.batch = idx.size(0),
                                                  .seq_len = idx.size(1),
                                                  .activation_dtype = DType::f32,
                                                  .async_chunks = chunks});
              for (const auto kind : {dist::CollectiveKind::all_gather, dist::CollectiveKind::reduce_scatter,
                                      dist::CollectiveKind::all_reduce}) {
                CAPTURE(dist::collective_name(kind));
                CHECK(forward[kind].calls == planned.forward[kind].calls);
                CHECK(forward[kind].bytes_sent == planned.forward[kind].bytes_sent);
                CHECK(backward[kind].calls == planned.backward[kind].calls);
                CHECK(backward[kind].bytes_sent == planned.backward[kind].bytes_sent);
              }
            },
            thread_rank_options());
      }
    }
  }
}

#if TESSERA_HAVE_CUDA_SIM
TEST_CASE("async tp on simulated GPUs, every stream operation jittered: a silent checker and the synchronous results") {
  for (const auto& [label, make] : composed_models()) {
    CAPTURE(label);
    std::vector<std::vector<Tensor>> results(2);
    for (const int64_t chunks : {0, 2}) {
      if (chunks > 0) cuda::sim::set_stream_jitter(7, 200);
      dist::run_local(
          2,
          [&](const dist::ProcessGroupPtr& world) {
            const Device device(DeviceType::cuda, world->rank());
            cuda::set_device(device.index);
            const dist::DeviceMesh mesh(world, device, {2}, {"tp"});
            auto model = model_on(make, mesh, device, {.async_chunks = chunks});
            std::vector<Tensor> mine = step_results(*model, device);
            if (world->rank() == 0) results[chunks > 0 ? 1 : 0] = std::move(mine);
          },
          thread_rank_options());
      cuda::sim::set_stream_jitter(0, 0);
    }
    REQUIRE(results[0].size() == results[1].size());
    for (size_t index = 0; index < results[0].size(); ++index) {
      CAPTURE(index);
      CHECK(same_values(results[1][index], results[0][index]));
    }
  }
}

namespace {

using cuda::sim::ScheduledOp;

// The event recorded on `stream` right after op `after` (a collective's done
// event), or -1.
int64_t event_after(const std::vector<ScheduledOp>& ops, size_t after, int stream) {
  for (size_t index = after + 1; index < ops.size(); ++index) {
    if (ops[index].kind == ScheduledOp::Kind::record && ops[index].stream == stream) return ops[index].event;
  }
  return -1;
}

// Whether `stream` waits for `event` among ops [0, before).
bool waits_for(const std::vector<ScheduledOp>& ops, size_t before, int stream, int64_t event) {
  for (size_t index = 0; index < before; ++index) {
    if (ops[index].kind == ScheduledOp::Kind::wait && ops[index].stream == stream && ops[index].event == event) {
      return true;
    }
  }
  return false;
}

std::vector<size_t> positions(const std::vector<ScheduledOp>& ops, ScheduledOp::Kind kind) {
  std::vector<size_t> found;
  for (size_t index = 0; index < ops.size(); ++index) {
    if (ops[index].kind == kind) found.push_back(index);
  }
  return found;
}

}  // namespace

TEST_CASE("async tp on simulated GPUs: each chunk's GEMM waits for its own collective only (the recorded schedule)") {
  std::vector<ScheduledOp> gather_ops, scatter_ops;
  dist::run_local(
      2,
      [&](const dist::ProcessGroupPtr& world) {
        const Device device(DeviceType::cuda, world->rank());
        cuda::set_device(device.index);
        const dist::DeviceMesh mesh(world, device, {2}, {"tp"});
        const Tensor w = ops::to(irregular_tensor({kAsyncOut, kAsyncIn}, 3), device);
        const Tensor piece = ops::to(irregular_tensor({kAsyncBatch, kAsyncSequence, kAsyncIn}, 4), device);
        const Tensor whole = ops::to(irregular_tensor({kAsyncBatch, 2 * kAsyncSequence, kAsyncIn}, 5), device);
        world->barrier();
        const Tensor narrow_w = ops::to(irregular_tensor({2, kAsyncIn}, 6), device);
        for (const bool gather : {true, false}) {
          std::optional<cuda::sim::ScheduleRecording> recording;
          if (world->rank() == 0) recording.emplace();
          world->barrier();
          // Gathered: into two products (Llama's w1 and w3), chunk by chunk.
          const Tensor y = gather ? tp::all_gather_linears(piece, {w, narrow_w}, {Tensor(), Tensor()}, mesh, 3)[0]
                                  : tp::linear_reduce_scatter(whole, w, mesh, 3);
          current_stream(device)->synchronize();
          world->barrier();
          if (recording) (gather ? gather_ops : scatter_ops) = recording->device(0);
          world->barrier();
        }
      },
      thread_rank_options());
  // All-gathers first, then the GEMMs, two a chunk: chunk j's wait for
  // gather j's event and for no later gather's before they are given.
  {
    const std::vector<size_t> collectives = positions(gather_ops, ScheduledOp::Kind::collective);
    const std::vector<size_t> gemms = positions(gather_ops, ScheduledOp::Kind::gemm);
    REQUIRE(collectives.size() == 3);
    REQUIRE(gemms.size() == 6);
    const int compute = gather_ops[gemms[0]].stream;
    for (size_t j = 0; j < 3; ++j) {
      const int64_t done = event_after(gather_ops, collectives[j], gather_ops[collectives[j]].stream);
      REQUIRE(done >= 0);
      for (const size_t gemm : {gemms[2 * j], gemms[2 * j + 1]}) {
        CHECK(waits_for(gather_ops, gemm, compute, done));  // its own
        if (j + 1 < 3) {
          const int64_t next = event_after(gather_ops, collectives[j + 1], gather_ops[collectives[j + 1]].stream);
          CHECK_FALSE(waits_for(gather_ops, gemm, compute, next));  // not the next chunk's
        }
      }
    }
  }
  // GEMM j, then its reduce-scatter: GEMM j + 1 is given before the compute
  // stream waits for reduce-scatter j.
  {
    const std::vector<size_t> collectives = positions(scatter_ops, ScheduledOp::Kind::collective);
    const std::vector<size_t> gemms = positions(scatter_ops, ScheduledOp::Kind::gemm);
    REQUIRE(collectives.size() == 3);
    REQUIRE(gemms.size() == 3);
    const int compute = scatter_ops[gemms[0]].stream;
    for (size_t j = 0; j + 1 < 3; ++j) {
      CHECK(collectives[j] < gemms[j + 1]);
      const int64_t done = event_after(scatter_ops, collectives[j], scatter_ops[collectives[j]].stream);
      REQUIRE(done >= 0);
      CHECK_FALSE(waits_for(scatter_ops, gemms[j + 1], compute, done));
    }
  }
}
#endif

TEST_CASE("async tp: refusals name the layout or the count that does not fit") {
  CHECK_THROWS_WITH_AS(tp::colwise_parallel({.input_layout = dist::Replicate{}, .async_chunks = 2}),
                       doctest::Contains("async_chunks 2 fuses the sequence's all-gather into the product: the input "
                                         "must be Shard(1)"),
                       Error);
  CHECK_THROWS_WITH_AS(tp::colwise_parallel({.input_layout = dist::Shard{1}, .async_chunks = -1}),
                       doctest::Contains("async_chunks must be >= 0, got -1"), Error);
  CHECK_THROWS_WITH_AS(tp::rowwise_parallel({.output_layout = dist::Replicate{}, .async_chunks = 2}),
                       doctest::Contains("the output must be Shard(1), got Replicate()"), Error);
  CHECK(tp::colwise_parallel({.input_layout = dist::Shard{1}, .async_chunks = 3})->describe() ==
        "ColwiseParallel(input Shard(1), output Shard(-1), async in 3 chunks)");
  dist::run_local(
      2,
      [](const dist::ProcessGroupPtr& world) {
        const dist::DeviceMesh mesh(world, kCPU, {2}, {"tp"});
        // A tied head's product is not a Linear's: it cannot be replaced.
        auto gpt = std::make_shared<nn::GPT>(composed_gpt(), kMeta);
        CHECK_THROWS_WITH_AS(
            tp::parallelize_module(*gpt, mesh,
                                   {{"lm_head", tp::colwise_parallel({.input_layout = dist::Shard{1},
                                                                      .async_chunks = 2})}}),
            doctest::Contains("ColwiseParallel on lm_head: async_chunks needs a Linear"), Error);
        // One gather into several products: the children must be Linears without a fused product, of one width.
        auto llama = std::make_shared<nn::Llama>(composed_llama(), kMeta);
        const auto gather_into = [&](const std::string& module, std::vector<std::string> children) {
          tp::parallelize_module(
              *llama, mesh, {{module, tp::gather_sequence_into({.children = std::move(children), .async_chunks = 2})}});
        };
        CHECK_THROWS_WITH_AS(gather_into("layers.0.attention", {"wq", "rope"}),
                             doctest::Contains("GatherSequenceInto on layers.0.attention: layers.0.attention.rope is a"),
                             Error);
        CHECK_THROWS_WITH_AS(gather_into("layers.0.feed_forward", {"w1", "w2"}),
                             doctest::Contains("layers.0.feed_forward.w2 takes"), Error);
        CHECK_THROWS_WITH_AS(tp::gather_sequence_into({.children = {}, .async_chunks = 2}),
                             doctest::Contains("name the Linears that share the input"), Error);
        CHECK_THROWS_WITH_AS(tp::gather_sequence_into({.children = {"wq"}, .async_chunks = 0}),
                             doctest::Contains("async_chunks must be >= 1, got 0"), Error);
        CHECK(tp::gather_sequence_into({.children = {"w1", "w3"}, .async_chunks = 2})->describe() ==
              "GatherSequenceInto(w1, w3, async in 2 chunks)");
        const Tensor x = irregular_tensor({2, 4, kAsyncIn}, 1), w = irregular_tensor({kAsyncOut, kAsyncIn}, 2);
        CHECK_THROWS_WITH_AS(tp::all_gather_linear(x, w, Tensor(), mesh, 0), doctest::Contains("chunks must be >= 1"),
                             Error);
        CHECK_THROWS_WITH_AS(tp::linear_reduce_scatter(irregular_tensor({2, 3, kAsyncIn}, 3), w, mesh, 2),
                             doctest::Contains("the sequence length 3 does not divide by the tp size 2"), Error);
        CHECK_THROWS_WITH_AS(tp::all_gather_linear(x, irregular_tensor({kAsyncOut, 3}, 4), Tensor(), mesh, 2),
                             doctest::Contains("expected x [B, T, K] and weight [N, K]"), Error);
      },
      thread_rank_options());
  CHECK(tp::collective_chunks(5, 4) == 3);  // ceil-sized chunks of 2: 2, 2, 1
  CHECK(tp::collective_chunks(1, 4) == 1);
  CHECK_THROWS_WITH_AS(tp::collective_chunks(3, 0), doctest::Contains("collective_chunks: batch 3 in 0 chunks"), Error);
}
