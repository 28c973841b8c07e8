// A model author's program, built against the installed tree alone (the
// install suite builds it with CMake's find_package(tessera)): a
// differentiable function of its own, held to finite differences; a module
// that uses it, trained with fully_shard on 3 local ranks (an odd world, so
// the shards are uneven); a sharded checkpoint of it, loaded back on 2 ranks,
// whose parameters must give the loss the 3 ranks ended with.
//   model_author DIR     (a fresh directory for the checkpoint; exits 1 on any mismatch)
#include <tessera/autograd/function.h>
#include <tessera/autograd/gradcheck.h>
#include <tessera/tessera.h>

#include <cmath>
#include <cstdio>
#include <string>

using namespace tessera;
using autograd::TensorList;

constexpr int64_t kFeatures = 6, kHidden = 10, kBatch = 12, kSteps = 40;

// softplus(x) = log(1 + e^x), written as the model author's own function:
// forward on raw ops, backward by hand (d/dx = sigmoid(x)).
struct Softplus : autograd::Function {
  TensorList forward(autograd::FunctionContext& ctx, const TensorList& in) override {
    ctx.save_for_backward({in[0]});
    return {ops::log(ops::add(ops::exp(in[0]), 1.0))};
  }
  TensorList backward(autograd::FunctionContext& ctx, const TensorList& grad) override {
    return {ops::mul(grad[0], ops::sigmoid(ctx.saved()[0]))};
  }
  std::string name() const override { return "Softplus"; }
};

Tensor softplus(const Tensor& x) { return autograd::Function::apply<Softplus>({x})[0]; }

// [N, features] -> [N, 1]: fc, the author's softplus, head.
class Regressor : public nn::Module {
 public:
  Regressor() : Module("Regressor") {
    fc_ = register_module("fc", std::make_shared<nn::Linear>(kFeatures, kHidden, nn::LinearOptions{.device = kMeta}));
    head_ = register_module("head", std::make_shared<nn::Linear>(kHidden, 1, nn::LinearOptions{.device = kMeta}));
  }
  Tensor forward(const Tensor& x) override { return (*head_)(softplus((*fc_)(x))); }
  nn::Linear& fc() const { return *fc_; }

 private:
  std::shared_ptr<nn::Linear> fc_, head_;
};

Tensor inputs() { return ops::randn({kBatch, kFeatures}, PhiloxKey{5, 0}); }
Tensor targets() { return ops::sum(ops::mul(inputs(), inputs()), {1}, /*keepdim=*/true); }

// A model sharded over the world's ranks, parameters from seed 11.
std::shared_ptr<Regressor> sharded_model(int ranks) {
  auto model = std::make_shared<Regressor>();
  const dist::DeviceMesh mesh = dist::init_device_mesh(kCPU, {ranks}, {"shard"});
  fsdp::fully_shard(model->fc(), {.mesh = mesh});
  fsdp::fully_shard(*model, {.mesh = mesh});
  model->to_empty(kCPU);
  model->reset_parameters(11);
  return model;
}

// The global batch's mean squared error, every rank computing all of it
// (a collective: the forward all-gathers each group's shards).
double global_loss(Regressor& model) {
  autograd::NoGradGuard no_grad;
  const Tensor error = ops::sub(model(inputs()), targets());
  return ops::mean(ops::mul(error, error)).item();
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::printf("model_author: usage: model_author DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  try {
    Tensor x = ops::randn({4, 3}, PhiloxKey{1, 0}, {.dtype = DType::f64});
    x.set_requires_grad(true);
    const autograd::GradcheckResult check = autograd::gradcheck([](const TensorList& in) { return softplus(in[0]); }, {x});
    std::printf("model_author: softplus gradcheck %s, max error %.2e\n", check.ok ? "passed" : "FAILED",
                check.max_abs_error);
    if (!check.ok) return 1;

    double first = 0.0, trained = 0.0, loaded = 0.0;
    dist::run_local(3, [&](const dist::ProcessGroupPtr& world) {
      std::shared_ptr<Regressor> model = sharded_model(3);
      optim::AdamW optimizer(model->named_parameters(), {.lr = 3e-2});
      const int64_t rows = kBatch / 3, begin = world->rank() * rows;
      const double initial = global_loss(*model);  // every rank: the forward all-gathers its shards
      if (world->rank() == 0) first = initial;
      for (int64_t step = 0; step < kSteps; ++step) {
        optimizer.zero_grad();
        const Tensor error = sub((*model)(ops::slice(inputs(), 0, begin, begin + rows)),
                                 ops::slice(targets(), 0, begin, begin + rows));
        backward(mean(mul(error, error)));
        optimizer.step();
      }
      const double loss = global_loss(*model);
      if (world->rank() == 0) trained = loss;
      checkpoint::save(dir, checkpoint::model_state(*model));
    });
    dist::run_local(2, [&](const dist::ProcessGroupPtr& world) {
      std::shared_ptr<Regressor> model = sharded_model(2);  // other values until the load
      checkpoint::load(dir, checkpoint::model_state(*model));
      const double loss = global_loss(*model);
      if (world->rank() == 0) loaded = loss;
    });
    std::printf("model_author: loss %.4f -> %.4f on 3 ranks; the checkpoint on 2 ranks gives %.4f\n", first,
                trained, loaded);
    return trained < 0.5 * first && std::abs(loaded - trained) <= 1e-6 * std::abs(trained) ? 0 : 1;
  } catch (const Error& error) {
    std::printf("model_author: %s\n", error.what());
    return 1;
  }
}
