// Deterministic tensor parallelism, bitwise: a sequence-parallel MLP
// (column-wise fc, GELU, row-wise proj with its output reduce-scattered onto
// the sequence), as the GPT plan lays out every block's MLP, on tp 2, 3 and
// 4 with ProcessGroupOptions::deterministic, against a 1-rank reference that
// computes each rank's chunk of the GEMMs on its own and sums the row-wise
// products in rank order (summed the other way round, some bits differ). The forward output and the gradients of every
// piece, of the partial-gradient bias and of the input are the reference's
// bits: what tensor parallelism sums across ranks it sums in the order a
// single rank would, and nothing else changes a bit.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "nn/activation.h"
#include "nn/mlp.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"
#include "tests/tp/composed_models.h"
#include "tp/parallelize.h"

using namespace tessera;
using namespace tessera::tp::testing;
namespace ops = tessera::ops;

namespace {

constexpr int64_t kMlpBatch = 2, kMlpSequence = 12, kMlpWidth = 10, kMlpHidden = 24;

struct MlpWeights {
  Tensor fc_weight = irregular_tensor({kMlpHidden, kMlpWidth}, 1), fc_bias = irregular_tensor({kMlpHidden}, 2);
  Tensor proj_weight = irregular_tensor({kMlpWidth, kMlpHidden}, 3), proj_bias = irregular_tensor({kMlpWidth}, 4);
  Tensor input = irregular_tensor({kMlpBatch, kMlpSequence, kMlpWidth}, 5);
  Tensor upstream = irregular_tensor({kMlpBatch, kMlpSequence, kMlpWidth}, 6);  // d loss / d output
};

// Rows [first, first + count) of dim `dim`, as a contiguous leaf of its own.
Tensor leaf_slice(const Tensor& whole, int64_t dim, int64_t first, int64_t count) {
  Tensor slice = ops::contiguous(ops::narrow(whole, dim, first, count));
  slice.set_requires_grad(true);
  return slice;
}

struct Reference {
  std::vector<Tensor> outputs;  // per rank: its sequence chunk of the output
  std::vector<Tensor> fc_weight, fc_bias, proj_weight;  // per rank: the gradient of its piece
  Tensor proj_bias, input;                              // summed in rank order
  bool order_shows = false;  // summing the row-wise products the other way round changes some bit
};

// One rank computes every tp rank's part as that rank would, and adds across
// ranks in rank order: the row-wise products, then the bias's and the
// input's gradient contributions.
Reference chunked_reference(const MlpWeights& w, int64_t tp) {
  const int64_t hidden = kMlpHidden / tp, sequence = kMlpSequence / tp;
  std::vector<Tensor> inputs, fc_weights, fc_biases, proj_weights, biases;
  Tensor sum;
  std::vector<Tensor> products;
  for (int64_t rank = 0; rank < tp; ++rank) {
    inputs.push_back(leaf_slice(w.input, 0, 0, kMlpBatch));  // each rank's copy of the gathered input
    fc_weights.push_back(leaf_slice(w.fc_weight, 0, rank * hidden, hidden));
    fc_biases.push_back(leaf_slice(w.fc_bias, 0, rank * hidden, hidden));
    proj_weights.push_back(leaf_slice(w.proj_weight, 1, rank * hidden, hidden));
    const Tensor activation =
        tessera::gelu(tessera::linear(inputs.back(), fc_weights.back(), fc_biases.back()), GeluApproximation::none);
    products.push_back(tessera::linear(activation, proj_weights.back(), Tensor()));
    sum = rank == 0 ? products.back() : tessera::add(sum, products.back());
  }
  Reference reference;
  Tensor reversed = products.back().detach();
  for (int64_t rank = tp - 2; rank >= 0; --rank) reversed = ops::add(reversed, products[rank].detach());
  reference.order_shows = sum.detach().to_vector<float>() != reversed.to_vector<float>();
  Tensor loss;
  for (int64_t rank = 0; rank < tp; ++rank) {
    biases.push_back(leaf_slice(w.proj_bias, 0, 0, kMlpWidth));  // each rank's copy of the replicated bias
    const Tensor output = tessera::add(tessera::narrow(sum, 1, rank * sequence, sequence), biases.back());
    reference.outputs.push_back(output.detach());
    const Tensor term = tessera::sum(tessera::mul(output, ops::narrow(w.upstream, 1, rank * sequence, sequence)));
    loss = rank == 0 ? term : tessera::add(loss, term);
  }
  autograd::backward(loss);
  for (int64_t rank = 0; rank < tp; ++rank) {
    reference.fc_weight.push_back(fc_weights[rank].grad());
    reference.fc_bias.push_back(fc_biases[rank].grad());
    reference.proj_weight.push_back(proj_weights[rank].grad());
    reference.proj_bias = rank == 0 ? biases[0].grad() : ops::add(reference.proj_bias, biases[rank].grad());
    reference.input = rank == 0 ? inputs[0].grad() : ops::add(reference.input, inputs[rank].grad());
  }
  return reference;
}

}  // namespace

TEST_CASE("deterministic tp: a sequence-parallel MLP on tp 2, 3, 4 is bitwise the 1-rank chunked reference") {
  const MlpWeights weights;
  for (const int64_t tp : {2, 3, 4}) {
    CAPTURE(tp);
    const int saved_threads = num_threads();
    set_num_threads(1);  // as each thread rank
    const Reference reference = chunked_reference(weights, tp);
    set_num_threads(saved_threads);
    // With 3 or more terms the order of the sum shows in the bits: the
    // comparison below tells rank order from any other.
    if (tp >= 3) CHECK(reference.order_shows);
    const int64_t hidden = kMlpHidden / tp, sequence = kMlpSequence / tp;
    dist::LocalOptions options = thread_rank_options();
    options.group.deterministic = true;
    options.threads_per_rank = 1;
    dist::run_local(
        static_cast<int>(tp),
        [&](const dist::ProcessGroupPtr& world) {
          const int64_t rank = world->rank();
          const dist::DeviceMesh mesh(world, kCPU, {tp}, {"tp"});
          nn::MLP mlp(kMlpWidth, kMlpHidden, kMlpWidth, std::make_shared<nn::GELU>(), {.device = kMeta});
          tp::parallelize_module(mlp, mesh,
                                 {{"fc", tp::colwise_parallel({.input_layout = dist::Shard{1}})},
                                  {"proj", tp::rowwise_parallel({.output_layout = dist::Shard{1}})}});
          mlp.to_empty(kCPU);
          // This rank's pieces of the reference's weights.
          ops::copy_(mlp.fc().weight().tensor(), ops::narrow(weights.fc_weight, 0, rank * hidden, hidden));
          ops::copy_(mlp.fc().bias().tensor(), ops::narrow(weights.fc_bias, 0, rank * hidden, hidden));
          ops::copy_(mlp.proj().weight().tensor(), ops::narrow(weights.proj_weight, 1, rank * hidden, hidden));
          ops::copy_(mlp.proj().bias().tensor(), weights.proj_bias);
          Tensor input = ops::contiguous(ops::narrow(weights.input, 1, rank * sequence, sequence));
          input.set_requires_grad(true);
          const Tensor output = mlp.forward(input);
          CHECK(same_bits(output, reference.outputs[rank]));
          const Tensor upstream = ops::narrow(weights.upstream, 1, rank * sequence, sequence);
          autograd::backward(tessera::sum(tessera::mul(output, upstream)));
          CHECK(same_bits(mlp.fc().weight().grad(), reference.fc_weight[rank]));
          CHECK(same_bits(mlp.fc().bias().grad(), reference.fc_bias[rank]));
          CHECK(same_bits(mlp.proj().weight().grad(), reference.proj_weight[rank]));
          CHECK(same_bits(mlp.proj().bias().grad(), reference.proj_bias));  // partial, summed over tp
          CHECK(same_bits(input.grad(), ops::narrow(reference.input, 1, rank * sequence, sequence)));
        },
        options);
  }
}
