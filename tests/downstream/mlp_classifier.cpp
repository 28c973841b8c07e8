// A downstream project: built against an installed tessera with pkg-config
// only (tests/downstream/build_and_run.sh), so it includes <tessera/...> and
// nothing else of the source tree. It trains a 2-layer MLP classifier on one
// rank and sharded over 2 local ranks, on the same global batches, and exits
// non-zero unless the loss falls and the two runs' losses agree.
#include <tessera/tessera.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

using namespace tessera;

namespace {

constexpr int64_t kFeatures = 8, kHidden = 32, kClasses = 3, kBatch = 12, kSteps = 150;

class Classifier : public nn::Module {
 public:
  explicit Classifier(Device device) : Module("Classifier") {
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(kFeatures, kHidden, nn::LinearOptions{.device = device}));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(kHidden, kClasses, nn::LinearOptions{.device = device}));
  }
  Tensor forward(const Tensor& x) override { return (*fc2_)(tessera::relu((*fc1_)(x))); }
  nn::Linear& fc1() { return *fc1_; }
  nn::Linear& fc2() { return *fc2_; }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// Batch `step`: Gaussian features, and a class that a small MLP can learn.
void batch(int64_t step, Tensor& x, Tensor& y) {
  x = ops::randn({kBatch, kFeatures}, PhiloxKey{99, static_cast<uint64_t>(step)});
  const std::vector<float> values = x.to_vector<float>();
  std::vector<int64_t> labels(kBatch);
  for (int64_t row = 0; row < kBatch; ++row) {
    const float* v = &values[static_cast<size_t>(row * kFeatures)];
    labels[static_cast<size_t>(row)] = (v[0] + v[1] > 0 ? 1 : 0) + (v[2] * v[3] > 0.25f ? 1 : 0);
  }
  y = ops::from_vector(labels, {kBatch});
}

// The mean loss over each step's global batch, with `ranks` ranks each
// taking an equal slice of it.
std::vector<double> train(int ranks) {
  std::vector<double> losses;
  dist::run_local(ranks, [&](const dist::ProcessGroupPtr& world) {
    Classifier model(kMeta);  // every rank builds its own model, on meta: no bytes yet
    if (ranks > 1) {
      const dist::DeviceMesh mesh = dist::init_device_mesh(kCPU, {ranks}, {"shard"});
      fsdp::fully_shard(model.fc1(), {.mesh = mesh});
      fsdp::fully_shard(model.fc2(), {.mesh = mesh});
      fsdp::fully_shard(model, {.mesh = mesh});
    }
    model.to_empty(kCPU);
    model.reset_parameters(7);  // the same values as unsharded, each rank filling its rows
    optim::AdamW optimizer(model.named_parameters(), {.lr = 5e-2});
    const int64_t rows = kBatch / ranks, first = world->rank() * rows;
    for (int64_t step = 0; step < kSteps; ++step) {
      Tensor x, y;
      batch(step, x, y);
      x = ops::slice(x, 0, first, first + rows);
      y = ops::slice(y, 0, first, first + rows);
      optimizer.zero_grad();
      const Tensor loss = tessera::cross_entropy(model(x), y);
      backward(loss);  // tessera::backward, from the umbrella header
      optimizer.step();
      Tensor global = ops::clone(loss.detach());
      world->all_reduce(global, dist::ReduceOp::avg);
      if (world->rank() == 0) losses.push_back(global.item());
    }
  });
  return losses;
}

}  // namespace

int main() {
  const std::vector<double> single = train(1), sharded = train(2);
  double worst = 0.0;
  for (size_t step = 0; step < single.size(); ++step) worst = std::max(worst, std::abs(single[step] - sharded[step]));
  std::printf("downstream MLP: loss %.4f -> %.4f on 1 rank, %.4f -> %.4f on 2 FSDP ranks, worst difference %.2e\n",
              single.front(), single.back(), sharded.front(), sharded.back(), worst);
  double last = 0.0;  // the mean of the last 10 steps: one batch of 12 is noisy
  for (size_t step = single.size() - 10; step < single.size(); ++step) last += single[step] / 10;
  const bool falls = last < 0.6 * single.front();
  const bool agrees = worst <= 1e-5;
  std::printf("downstream MLP: mean loss of the last 10 steps %.4f\n", last);
  if (!falls) std::printf("downstream MLP: the loss did not fall below 0.6 of its start\n");
  if (!agrees) std::printf("downstream MLP: the sharded losses differ from the unsharded ones by more than 1e-5\n");
  return falls && agrees ? 0 : 1;
}
