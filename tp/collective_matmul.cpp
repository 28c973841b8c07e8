// The chunked collective matmuls: batch chunks, the collectives issued
// asynchronously in chunk order, the GEMMs between them.
#include "tp/collective_matmul.h"

#include <vector>

#include "autograd/function.h"
#include "dist/dtensor.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tessera::tp {

namespace {

using autograd::TensorList;

// The batch rows of `chunks` chunks (min(chunks, B), ceil-sized).
std::vector<dist::ShardExtent> batch_chunks(int64_t batch, int64_t chunks) {
  const int64_t count = std::max<int64_t>(1, std::min(chunks, batch));
  std::vector<dist::ShardExtent> extents;
  for (int64_t index = 0; index < count; ++index) {
    const dist::ShardExtent extent = dist::shard_extent(batch, count, index);
    if (extent.length > 0) extents.push_back(extent);
  }
  return extents;
}

// A chunk's all-gather along the sequence: [b, T/tp, K] from every rank,
// landing rank by rank in [tp * b, T/tp, K] (issued now; wait, then read with
// sequence_of).
struct PendingGather {
  Tensor landing;
  dist::Work work;
};

PendingGather issue_sequence_gather(const Tensor& chunk, const dist::ProcessGroupPtr& group) {
  const Tensor input = ops::contiguous(chunk);
  Shape shape = input.sizes();
  shape[0] *= group->size();
  Tensor landing = ops::empty(shape, {.dtype = input.dtype(), .device = input.device()});
  dist::Work work = group->all_gather_into(landing, input, /*async_op=*/true);
  return {std::move(landing), std::move(work)};
}

// [tp * b, T/tp, K] rank by rank -> [b, T, K].
Tensor sequence_of(const Tensor& landing, int64_t ranks) {
  const int64_t b = landing.size(0) / ranks, piece = landing.size(1), k = landing.size(2);
  return ops::reshape(ops::contiguous(ops::transpose(ops::view(landing, {ranks, b, piece, k}), 0, 1)),
                      {b, ranks * piece, k});
}

// A chunk's reduce-scatter onto the sequence: [b, T, N] summed over tp into
// this rank's [b, T/tp, N] (issued now).
struct PendingScatter {
  Tensor input, output;
  dist::Work work;
};

PendingScatter issue_sequence_scatter(const Tensor& chunk, const dist::ProcessGroupPtr& group) {
  const int64_t ranks = group->size(), b = chunk.size(0), t = chunk.size(1), n = chunk.size(2);
  // [b, T, N] -> [tp, b, T/tp, N]: rank r's part contiguous at r.
  Tensor input = ops::reshape(ops::contiguous(ops::transpose(ops::view(chunk, {b, ranks, t / ranks, n}), 0, 1)),
                              {ranks * b, t / ranks, n});
  Tensor output = ops::empty({b, t / ranks, n}, {.dtype = chunk.dtype(), .device = chunk.device()});
  dist::Work work = group->reduce_scatter_into(output, input, dist::ReduceOp::sum, /*async_op=*/true);
  return {std::move(input), std::move(output), std::move(work)};
}

void check_sequence_input(const char* what, const Tensor& x, const Tensor& weight) {
  TESSERA_CHECK(x.dim() == 3 && weight.dim() == 2 && x.size(2) == weight.size(1),
                "{}: expected x [B, T, K] and weight [N, K], got {} and {}", what, x.sizes(), weight.sizes());
}

// The gathered input's products (one per weight: attention's wq, wk and wv
// share one gathered input), chunk by chunk as each chunk lands. Inputs:
// x, then each weight and its bias (undefined for none).
class AllGatherLinear final : public autograd::Function {
 public:
  AllGatherLinear(dist::DeviceMesh mesh, int64_t chunks) : mesh_(std::move(mesh)), chunks_(chunks) {}
  std::string name() const override { return "AllGatherLinear"; }

  TensorList forward(autograd::FunctionContext& ctx, const TensorList& inputs) override {
    const Tensor& x = inputs[0];
    const size_t products = (inputs.size() - 1) / 2;
    for (size_t i = 0; i < products; ++i) check_sequence_input("all_gather_linear", x, inputs[1 + 2 * i]);
    const dist::ProcessGroupPtr& group = mesh_.group(0);
    const std::vector<dist::ShardExtent> extents = batch_chunks(x.size(0), chunks_);
    std::vector<PendingGather> pending;
    for (const dist::ShardExtent& extent : extents) {
      pending.push_back(issue_sequence_gather(ops::narrow(x, 0, extent.offset, extent.length), group));
    }
    std::vector<Tensor> gathered;
    std::vector<std::vector<Tensor>> outputs(products);
    for (PendingGather& chunk : pending) {
      chunk.work.wait();
      gathered.push_back(sequence_of(chunk.landing, group->size()));
      for (size_t i = 0; i < products; ++i) {
        outputs[i].push_back(ops::linear(gathered.back(), inputs[1 + 2 * i], inputs[2 + 2 * i]));
      }
    }
    TensorList saved = {gathered.size() == 1 ? gathered[0] : ops::cat(gathered, 0)};
    x_dtype_ = x.dtype();
    TensorList results;
    for (size_t i = 0; i < products; ++i) {
      saved.push_back(inputs[1 + 2 * i]);
      const Tensor& bias = inputs[2 + 2 * i];
      biases_.push_back({bias.defined(), bias.defined() ? bias.dtype() : DType::f32});
      results.push_back(outputs[i].size() == 1 ? outputs[i][0] : ops::cat(outputs[i], 0));
    }
    ctx.save_for_backward(saved);
    return results;
  }

  TensorList backward(autograd::FunctionContext& ctx, const TensorList& grads) override {
    const Tensor& gathered = ctx.saved()[0];
    const size_t products = grads.size();
    const dist::ProcessGroupPtr& group = mesh_.group(0);
    // dx chunk by chunk (every product's share summed), each reduce-scattered
    // while the next one's GEMMs run. A product whose output got no gradient
    // adds nothing.
    std::vector<PendingScatter> pending;
    const int64_t batch = gathered.size(0);
    for (const dist::ShardExtent& extent : batch_chunks(batch, chunks_)) {
      Tensor partial;
      for (size_t i = 0; i < products; ++i) {
        if (!grads[i].defined()) continue;
        const Tensor share = ops::matmul(ops::narrow(grads[i], 0, extent.offset, extent.length), ctx.saved()[1 + i]);
        partial = partial.defined() ? ops::add(partial, share) : share;
      }
      if (!partial.defined()) partial = ops::zeros(Shape{extent.length, gathered.size(1), gathered.size(2)},
                                                  {.dtype = x_dtype_, .device = gathered.device()});
      pending.push_back(issue_sequence_scatter(ops::to(partial, x_dtype_), group));
    }
    // dW and db over every token at once, as the synchronous Linear does.
    TensorList result(1 + 2 * products);
    for (size_t i = 0; i < products; ++i) {
      if (!grads[i].defined()) continue;
      const Tensor& weight = ctx.saved()[1 + i];
      const ops::LinearWeightGrads weight_grads = ops::linear_weight_backward(grads[i], gathered, biases_[i].present);
      result[1 + 2 * i] = ops::to(weight_grads.weight, weight.dtype());
      if (biases_[i].present) result[2 + 2 * i] = ops::to(weight_grads.bias, biases_[i].dtype);
    }
    std::vector<Tensor> dx;
    for (PendingScatter& chunk : pending) {
      chunk.work.wait();
      dx.push_back(chunk.output);
    }
    result[0] = dx.size() == 1 ? dx[0] : ops::cat(dx, 0);
    return result;
  }

 private:
  struct BiasKind {
    bool present = false;
    DType dtype = DType::f32;
  };
  dist::DeviceMesh mesh_;
  int64_t chunks_;
  DType x_dtype_ = DType::f32;
  std::vector<BiasKind> biases_;
};

// The partial product, chunk by chunk, each reduce-scattered while the next
// one's GEMM runs.
class LinearReduceScatter final : public autograd::Function {
 public:
  LinearReduceScatter(dist::DeviceMesh mesh, int64_t chunks) : mesh_(std::move(mesh)), chunks_(chunks) {}
  std::string name() const override { return "LinearReduceScatter"; }

  TensorList forward(autograd::FunctionContext& ctx, const TensorList& inputs) override {
    const Tensor& x = inputs[0];
    const Tensor& weight = inputs[1];
    check_sequence_input("linear_reduce_scatter", x, weight);
    const dist::ProcessGroupPtr& group = mesh_.group(0);
    TESSERA_CHECK(x.size(1) % group->size() == 0,
                  "linear_reduce_scatter: the sequence length {} does not divide by the tp size {}", x.size(1),
                  group->size());
    std::vector<PendingScatter> pending;
    for (const dist::ShardExtent& extent : batch_chunks(x.size(0), chunks_)) {
      const Tensor partial = ops::linear(ops::narrow(x, 0, extent.offset, extent.length), weight, Tensor());
      pending.push_back(issue_sequence_scatter(partial, group));
    }
    std::vector<Tensor> outputs;
    for (PendingScatter& chunk : pending) {
      chunk.work.wait();
      outputs.push_back(chunk.output);
    }
    ctx.save_for_backward({x, weight});
    return {outputs.size() == 1 ? outputs[0] : ops::cat(outputs, 0)};
  }

  TensorList backward(autograd::FunctionContext& ctx, const TensorList& grads) override {
    const Tensor& x = ctx.saved()[0];
    const Tensor& weight = ctx.saved()[1];
    const dist::ProcessGroupPtr& group = mesh_.group(0);
    std::vector<PendingGather> pending;
    for (const dist::ShardExtent& extent : batch_chunks(grads[0].size(0), chunks_)) {
      pending.push_back(issue_sequence_gather(ops::narrow(grads[0], 0, extent.offset, extent.length), group));
    }
    std::vector<Tensor> gathered, dx;
    for (PendingGather& chunk : pending) {
      chunk.work.wait();
      gathered.push_back(sequence_of(chunk.landing, group->size()));
      dx.push_back(ops::to(ops::matmul(gathered.back(), weight), x.dtype()));
    }
    const Tensor g = gathered.size() == 1 ? gathered[0] : ops::cat(gathered, 0);
    const ops::LinearWeightGrads weight_grads = ops::linear_weight_backward(g, x, /*with_bias=*/false);
    return {dx.size() == 1 ? dx[0] : ops::cat(dx, 0), ops::to(weight_grads.weight, weight.dtype())};
  }

 private:
  dist::DeviceMesh mesh_;
  int64_t chunks_;
};

void check_chunks(const char* what, const dist::DeviceMesh& mesh, int64_t chunks) {
  TESSERA_CHECK(mesh.ndim() == 1, "{}: the tp mesh must be 1-D, got {}", what, mesh.to_string());
  TESSERA_CHECK(chunks >= 1, "{}: chunks must be >= 1, got {}", what, chunks);
}

}  // namespace

int64_t collective_chunks(int64_t batch, int64_t chunks) {
  TESSERA_CHECK(batch >= 0 && chunks >= 1, "collective_chunks: batch {} in {} chunks", batch, chunks);
  return static_cast<int64_t>(batch_chunks(batch, chunks).size());
}

Tensor all_gather_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const dist::DeviceMesh& mesh,
                         int64_t chunks) {
  return all_gather_linears(x, {weight}, {bias}, mesh, chunks)[0];
}

std::vector<Tensor> all_gather_linears(const Tensor& x, const std::vector<Tensor>& weights,
                                       const std::vector<Tensor>& biases, const dist::DeviceMesh& mesh,
                                       int64_t chunks) {
  check_chunks("all_gather_linear", mesh, chunks);
  TESSERA_CHECK(!weights.empty() && biases.size() == weights.size(),
                "all_gather_linear: {} weights and {} biases (one bias, or an undefined one, a weight)",
                weights.size(), biases.size());
  TensorList inputs = {x};
  for (size_t i = 0; i < weights.size(); ++i) {
    inputs.push_back(weights[i]);
    inputs.push_back(biases[i]);
  }
  return autograd::Function::apply<AllGatherLinear>(inputs, mesh, chunks);
}

Tensor linear_reduce_scatter(const Tensor& x, const Tensor& weight, const dist::DeviceMesh& mesh, int64_t chunks) {
  check_chunks("linear_reduce_scatter", mesh, chunks);
  return autograd::Function::apply<LinearReduceScatter>({x, weight}, mesh, chunks)[0];
}

}  // namespace tessera::tp
