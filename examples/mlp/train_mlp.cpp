// Write, train and shard your own model: the smallest complete tessera
// program. A 2-layer MLP classifier trains on synthetic data on one rank, then
// with fully_shard over N local ranks (threads) on the same global batches,
// and the two runs' losses must agree. The install test builds this file
// against the installed tree with pkg-config alone (docs/writing_models.md).
//   train_mlp [ranks]     (default 2; exits 1 unless the loss falls and the runs agree)
#include <tessera/tessera.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

using namespace tessera;

constexpr int64_t kFeatures = 8, kHidden = 32, kClasses = 3, kBatch = 12, kSteps = 150;

// Any nn::Module is a model. The children are built on meta, then
// materialize(device) allocates and initialises the whole tree once.
class Classifier : public nn::Module {
 public:
  explicit Classifier(Device device) : Module("Classifier") {
    mlp_ = register_module("mlp", std::make_shared<nn::MLP>(kFeatures, kHidden, kClasses, std::make_shared<nn::ReLU>(),
                                                            nn::MLPOptions{.device = kMeta}));
    materialize(device);
  }
  Tensor forward(const Tensor& x) override { return (*mlp_)(x); }  // [N, features] -> logits [N, classes]
  nn::MLP& mlp() const { return *mlp_; }

 private:
  std::shared_ptr<nn::MLP> mlp_;
};

// Global batch `step`: Gaussian features, and a class that a small MLP can learn.
std::pair<Tensor, Tensor> global_batch(int64_t step) {
  const Tensor x = ops::randn({kBatch, kFeatures}, PhiloxKey{99, static_cast<uint64_t>(step)});
  const std::vector<float> v = x.to_vector<float>();
  std::vector<int64_t> labels;
  for (int64_t row = 0; row < kBatch; ++row) {
    const float* f = &v[static_cast<size_t>(row * kFeatures)];
    labels.push_back((f[0] + f[1] > 0 ? 1 : 0) + (f[2] * f[3] > 0.25f ? 1 : 0));
  }
  return {x, ops::from_vector(labels, {kBatch})};
}

// The mean loss of each step's global batch; each rank trains on its slice.
std::vector<double> train(int ranks) {
  std::vector<double> losses;
  dist::run_local(ranks, [&](const dist::ProcessGroupPtr& world) {
    Classifier model(kMeta);  // every rank thread builds its own model; on meta, no bytes yet
    if (ranks > 1) {          // blocks first, then the root
      const dist::DeviceMesh mesh = dist::init_device_mesh(kCPU, {ranks}, {"shard"});
      fsdp::fully_shard(model.mlp().fc(), {.mesh = mesh});
      fsdp::fully_shard(model.mlp().proj(), {.mesh = mesh});
      fsdp::fully_shard(model, {.mesh = mesh});
    }
    model.to_empty(kCPU);
    model.reset_parameters(7);  // the unsharded values, each rank filling only its rows
    optim::AdamW optimizer(model.named_parameters(), {.lr = 5e-2});
    const int64_t rows = kBatch / ranks, first = world->rank() * rows;
    for (int64_t step = 0; step < kSteps; ++step) {
      const auto [x, y] = global_batch(step);
      optimizer.zero_grad();
      const Tensor loss = cross_entropy(model(ops::slice(x, 0, first, first + rows)), ops::slice(y, 0, first, first + rows));
      backward(loss);
      optimizer.step();
      Tensor global = ops::clone(loss.detach());
      world->all_reduce(global, dist::ReduceOp::avg);
      if (world->rank() == 0) losses.push_back(global.item());
    }
  });
  return losses;
}

int main(int argc, char** argv) {
  // The one argument, read strictly: a whole integer dividing the batch (so at most the batch).
  int ranks = 2;
  if (argc > 1) {
    const std::string_view text = argv[1];
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), ranks);
    if (argc > 2 || text.empty() || error != std::errc() || end != text.data() + text.size() || ranks < 1 ||
        kBatch % ranks != 0) {
      std::printf("train_mlp: usage: train_mlp [RANKS], RANKS dividing the batch of %lld; got '%s'\n",
                  static_cast<long long>(kBatch), argc > 2 ? "more than one argument" : argv[1]);
      return 2;
    }
  }
  std::vector<double> single, sharded;
  try {
    single = train(1);
    sharded = train(ranks);
  } catch (const Error& error) {
    std::printf("train_mlp: %s\n", error.what());
    return 1;
  }
  double worst = 0.0, last = 0.0;  // last: the mean of the final 10 steps (one batch of 12 is noisy)
  for (size_t step = 0; step < single.size(); ++step) worst = std::max(worst, std::abs(single[step] - sharded[step]));
  for (size_t step = single.size() - 10; step < single.size(); ++step) last += single[step] / 10;
  std::printf("mlp: loss %.4f -> %.4f (mean of the last 10 steps), %d FSDP ranks differ by at most %.2e\n",
              single.front(), last, ranks, worst);
  return last < 0.6 * single.front() && worst <= 1e-5 ? 0 : 1;
}
