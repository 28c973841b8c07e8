// The training kernels on cuda against the cpu: the multi-tensor AdamW step
// (bit for bit: the same IEEE operations in the same order), clip_grad_norm_
// (norm within f64 summation error, grads within one rounding), dropout and
// the sorted embedding backward (bit for bit), their launch and byte counts
// on the simulator, and their errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

using namespace tessera;

namespace {

const Device kCuda(DeviceType::cuda);

std::vector<uint8_t> bytes_of(const Tensor& tensor) {
  autograd::NoGradGuard no_grad;  // parameters are compared as values
  const Tensor dense = ops::contiguous(ops::to(tensor, kCPU));
  std::vector<uint8_t> bytes(static_cast<size_t>(dense.nbytes()));
  if (!bytes.empty()) std::memcpy(bytes.data(), dense.raw_data(), bytes.size());
  return bytes;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) { return a.sizes() == b.sizes() && bytes_of(a) == bytes_of(b); }

Tensor random_values(const Shape& shape, uint64_t stream, DType dtype = DType::f32) {
  return ops::randn(shape, PhiloxKey{2024, stream}, {.dtype = dtype});
}

struct Launches {
  int64_t launches = 0, read = 0, written = 0;
};

// What the simulator counted for the kernels whose name contains `kernel`
// while `run` ran; nullopt where nothing counts (a GPU).
template <typename Run>
std::optional<Launches> counted(const std::string& kernel, Run run) {
#if TESSERA_SIM_CHECKS
  current_stream(kCuda)->synchronize();
  cuda::sim::reset_kernel_counters();
  run();
  current_stream(kCuda)->synchronize();
  Launches total;
  for (const auto& [name, counter] : cuda::sim::kernel_counters()) {
    if (name.find(kernel) == std::string::npos) continue;
    total.launches += counter.launches;
    total.read += counter.device_bytes_read;
    total.written += counter.device_bytes_written;
  }
  return total;
#else
  (void)kernel;
  run();
  return std::nullopt;
#endif
}

using Params = std::vector<std::shared_ptr<nn::Parameter>>;

// The same parameters and gradients on cpu and on cuda, of `sizes`.
std::pair<Params, Params> twin_parameters(const std::vector<int64_t>& sizes, DType dtype, uint64_t seed) {
  Params cpu, cuda;
  for (size_t i = 0; i < sizes.size(); ++i) {
    autograd::NoGradGuard no_grad;
    const Tensor value = random_values({sizes[i]}, seed + 2 * i, dtype);
    cuda.push_back(std::make_shared<nn::Parameter>(ops::to(value, kCuda)));
    cpu.push_back(std::make_shared<nn::Parameter>(value));
  }
  return {cpu, cuda};
}

void set_twin_grads(const Params& cpu, const Params& cuda, uint64_t seed, double scale = 1.0) {
  for (size_t i = 0; i < cpu.size(); ++i) {
    const Tensor grad = ops::mul(random_values(cpu[i]->tensor().sizes(), seed + 2 * i + 1, cpu[i]->tensor().dtype()),
                                 scale);
    cpu[i]->tensor().set_grad(grad);
    cuda[i]->tensor().set_grad(ops::to(grad, kCuda));
  }
}

// Appends rather than `"p" + std::to_string(i)`, on which GCC 12 warns a
// false -Wrestrict (its bug 105329) at every use.
std::string parameter_name(size_t index) {
  std::string name = "p";
  name += std::to_string(index);
  return name;
}

std::vector<nn::NamedParameter> named(const Params& params) {
  std::vector<nn::NamedParameter> result;
  for (size_t i = 0; i < params.size(); ++i) result.emplace_back(parameter_name(i), params[i]);
  return result;
}

// Odd sizes: empty, one element, chunk (2048) and warp tails, several chunks.
const std::vector<int64_t> kOddSizes = {0, 1, 31, 2047, 2048, 2049, 5000, 1, 33, 4099, 0, 7};

}  // namespace

TEST_CASE("AdamW on cuda: every tensor bit for bit with the cpu over several steps, with the bf16 working copy") {
  autograd::NoGradGuard no_grad;  // the parameters are read as values
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    auto [cpu, cuda] = twin_parameters(kOddSizes, dtype, 10);
    // Two groups (decay and none) with different lrs: per-tensor scalars.
    const auto groups_of = [](const Params& params) {
      std::vector<optim::ParamGroup> groups(2);
      groups[0].weight_decay = 0.1;
      groups[1].lr = 3e-3;
      groups[1].weight_decay = 0.0;
      const auto all = named(params);
      for (size_t i = 0; i < all.size(); ++i) groups[i % 2].params.push_back(all[i]);
      return groups;
    };
    optim::AdamW cpu_optimizer(groups_of(cpu), {.lr = 1e-2, .weight_decay = 0.05});
    optim::AdamW cuda_optimizer(groups_of(cuda), {.lr = 1e-2, .weight_decay = 0.05});
    std::vector<Tensor> cpu_copies, cuda_copies;
    for (size_t i = 0; i < cpu.size(); i += 3) {  // a working copy on every third parameter
      cpu_copies.push_back(ops::empty(cpu[i]->tensor().sizes(), {.dtype = DType::bf16}));
      cuda_copies.push_back(ops::empty(cpu[i]->tensor().sizes(), {.dtype = DType::bf16, .device = kCuda}));
      cpu_optimizer.set_working_copy(parameter_name(i), cpu_copies.back());
      cuda_optimizer.set_working_copy(parameter_name(i), cuda_copies.back());
    }
    for (int step = 0; step < 4; ++step) {
      CAPTURE(step);
      set_twin_grads(cpu, cuda, 100 + 50 * step, step == 2 ? 1e-3 : 1.0);
      if (step == 3) {  // a parameter without a gradient is skipped on both
        cpu[4]->tensor().set_grad(Tensor());
        cuda[4]->tensor().set_grad(Tensor());
      }
      cpu_optimizer.step();
      cuda_optimizer.step();
      for (size_t i = 0; i < cpu.size(); ++i) {
        CAPTURE(i);
        CHECK(bitwise_equal(cpu[i]->tensor(), cuda[i]->tensor()));
        const std::string name = parameter_name(i);
        CHECK(bitwise_equal(cpu_optimizer.state(name).at("exp_avg"), cuda_optimizer.state(name).at("exp_avg")));
        CHECK(bitwise_equal(cpu_optimizer.state(name).at("exp_avg_sq"), cuda_optimizer.state(name).at("exp_avg_sq")));
        CHECK(cuda_optimizer.state(name).at("step").device().is_cpu());
      }
      for (size_t k = 0; k < cuda_copies.size(); ++k) {
        CHECK(bitwise_equal(cpu_copies[k], cuda_copies[k]));
        CHECK(bitwise_equal(cuda_copies[k], ops::to(cuda[3 * k]->tensor(), DType::bf16)));
      }
    }
  }
}

TEST_CASE("AdamW on cuda: one launch per step per 40 tensors, and the ideal bytes") {
  auto [cpu, cuda] = twin_parameters(kOddSizes, DType::f32, 20);
  optim::AdamW optimizer(named(cuda), {.lr = 1e-3});
  std::vector<Tensor> copies;
  for (size_t i = 0; i < cuda.size(); ++i) {
    copies.push_back(ops::empty(cuda[i]->tensor().sizes(), {.dtype = DType::bf16, .device = kCuda}));
    optimizer.set_working_copy(parameter_name(i), copies.back());
  }
  set_twin_grads(cpu, cuda, 30);
  int64_t elements = 0;
  for (const int64_t size : kOddSizes) elements += size;
  for (int step = 0; step < 2; ++step) {
    const std::optional<Launches> launches = counted("adamw_kernel", [&] { optimizer.step(); });
    if (!launches) continue;
    CHECK(launches->launches == 1);
    // Read p, g, m, v; write p, m, v and the bf16 copy.
    const int64_t ideal = elements * (4 * 4 + 3 * 4 + 2);
    INFO("read " << launches->read << " written " << launches->written << " ideal " << ideal);
    CHECK(launches->read + launches->written >= ideal);
    CHECK(static_cast<double>(launches->read + launches->written) <= 1.1 * static_cast<double>(ideal));
  }

  // 45 small tensors take two launches (40 fit one kernel argument).
  auto [cpu_many, cuda_many] = twin_parameters(std::vector<int64_t>(45, 3), DType::f32, 40);
  optim::AdamW many(named(cuda_many));
  set_twin_grads(cpu_many, cuda_many, 41);
  const std::optional<Launches> launches = counted("adamw_kernel", [&] { many.step(); });
  if (launches) CHECK(launches->launches == 2);
}

TEST_CASE("clip_grad_norm_ on cuda: the cpu's norm and scaled gradients, non-finite norms as on the cpu") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    auto [cpu, cuda] = twin_parameters(kOddSizes, dtype, 50);
    set_twin_grads(cpu, cuda, 60);
    // Below max_norm: the same norm, gradients untouched.
    const double cpu_norm = optim::clip_grad_norm_(cpu, 1e6);
    const double cuda_norm = optim::clip_grad_norm_(cuda, 1e6);
    // Both sum ~15k non-negative terms in f64 in different fixed orders:
    // each is within n 2^-53 relative of the exact sum (n = 15k: 2e-12).
    CHECK(std::abs(cpu_norm - cuda_norm) <= 2e-12 * cpu_norm);
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (cpu[i]->tensor().numel() > 0) CHECK(bitwise_equal(cpu[i]->grad(), cuda[i]->grad()));
    }
    // Above it: both scale by max_norm / (norm + 1e-6), rounded to the dtype;
    // the factors differ by at most a few f64 ulps, so the products by at most
    // one rounding of the dtype.
    CHECK(std::abs(optim::clip_grad_norm_(cpu, 1.5) - optim::clip_grad_norm_(cuda, 1.5)) <= 2e-12 * cpu_norm);
    const double ulp = dtype == DType::f32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -52);
    for (size_t i = 0; i < cpu.size(); ++i) {
      const std::vector<double> expected = cpu[i]->grad().to_vector<double>();
      const std::vector<double> actual = ops::to(cuda[i]->grad(), kCPU).to_vector<double>();
      REQUIRE(expected.size() == actual.size());
      for (size_t k = 0; k < expected.size(); ++k) CHECK(std::abs(actual[k] - expected[k]) <= ulp * std::abs(expected[k]));
    }
  }

  // Non-finite norms are returned and nothing is scaled, as on the cpu.
  for (const double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    auto [cpu, cuda] = twin_parameters({5, 3000}, DType::f32, 70);
    set_twin_grads(cpu, cuda, 80);
    Tensor grad = ops::to(cuda[1]->grad(), kCPU);
    grad.data_ptr<float>()[17] = static_cast<float>(bad);
    cuda[1]->tensor().set_grad(ops::to(grad, kCuda));
    const Tensor before = ops::to(cuda[0]->grad(), kCPU);
    const double norm = optim::clip_grad_norm_(cuda, 1.0);
    CHECK(!std::isfinite(norm));
    CHECK(std::isnan(norm) == std::isnan(bad));
    CHECK(bitwise_equal(before, cuda[0]->grad()));
  }
  CHECK_THROWS_WITH_AS(optim::clip_grad_norm_({std::make_shared<nn::Parameter>(ops::zeros({2}))}, -1.0),
                       doctest::Contains("max_norm must be >= 0"), Error);
}

TEST_CASE("the device sum of squares: the cpu's total, its ideal bytes in two launches, and its errors") {
  const std::vector<Tensor> tensors = {ops::to(random_values({3001}, 1), kCuda), ops::to(random_values({9000}, 2), kCuda),
                                       ops::to(random_values({1}, 3), kCuda)};
  const Tensor total = ops::empty({}, {.dtype = DType::f64, .device = kCuda});
  const std::optional<Launches> squares =
      counted("_kernel", [&] { kernels(kCuda).sum_of_squares(total, tensors); });
  if (squares) {
    const int64_t ideal = (3001 + 9000 + 1) * 4 + 8;
    INFO("read " << squares->read << " written " << squares->written);
    CHECK(squares->read + squares->written >= ideal);
    CHECK(static_cast<double>(squares->read + squares->written) <= 1.1 * static_cast<double>(ideal));
    CHECK(squares->launches == 2);  // one multi-tensor pass, one fixed-order total
  }
  double expected = 0.0;
  for (const Tensor& tensor : tensors) {
    const Tensor host = ops::to(tensor, kCPU);
    const Tensor cpu_total = ops::empty({}, {.dtype = DType::f64});
    kernels(kCPU).sum_of_squares(cpu_total, {host});
    expected += cpu_total.item();
  }
  CHECK(std::abs(ops::to(total, kCPU).item() - expected) <= 1e-12 * expected);

  CHECK_THROWS_WITH_AS(kernels(kCuda).sum_of_squares(total, {ops::zeros({3}, {.dtype = DType::i32, .device = kCuda})}),
                       doctest::Contains("cuda::sum_of_squares: computes in f32 or f64, got i32"), Error);
  CHECK_THROWS_WITH_AS(kernels(kCuda).sum_of_squares(ops::empty({}, {.device = kCuda}), tensors),
                       doctest::Contains("the total must be one contiguous f64 value"), Error);
}

TEST_CASE("adamw_step on cuda refuses mismatched operands") {
  const Tensor param = ops::zeros({4}, {.device = kCuda});
  AdamWTensor bad{.param = param,
                  .grad = ops::zeros({4}, {.dtype = DType::f64, .device = kCuda}),
                  .exp_avg = ops::zeros({4}, {.device = kCuda}),
                  .exp_avg_sq = ops::zeros({4}, {.device = kCuda}),
                  .working_copy = Tensor()};
  CHECK_THROWS_WITH_AS(kernels(kCuda).adamw_step({bad}, {}), doctest::Contains("cuda::adamw_step: grad must be"),
                       Error);
  bad.grad = ops::zeros({4}, {.device = kCuda});
  bad.working_copy = ops::zeros({4}, {.device = kCuda});
  CHECK_THROWS_WITH_AS(kernels(kCuda).adamw_step({bad}, {}),
                       doctest::Contains("working_copy must be a contiguous bf16 tensor"), Error);
  bad.working_copy = Tensor();
  bad.exp_avg = ops::zeros({4});
  CHECK_THROWS_WITH_AS(kernels(kCuda).adamw_step({bad}, {}), doctest::Contains("exp_avg must be"), Error);

  auto param_on_cuda = std::make_shared<nn::Parameter>(ops::zeros({3}, {.device = kCuda}));
  optim::AdamW optimizer(std::vector<nn::NamedParameter>{{"w", param_on_cuda}});
  CHECK_THROWS_WITH_AS(optimizer.set_working_copy("w", ops::zeros({3}, {.device = kCuda})),
                       doctest::Contains("must be a contiguous bf16 tensor"), Error);
  optimizer.set_working_copy("w", ops::zeros({4}, {.dtype = DType::bf16, .device = kCuda}));
  param_on_cuda->tensor().set_grad(ops::zeros({3}, {.device = kCuda}));
  CHECK_THROWS_WITH_AS(optimizer.step(), doctest::Contains("the working copy of 'w' is [4]"), Error);
}

TEST_CASE("dropout on cuda: the cpu's mask and output bit for bit") {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (const Shape& shape : {Shape{7}, Shape{33, 65}, Shape{3, 5, 129}}) {
      for (const double p : {0.1, 0.5, 0.9}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(p);
        const Tensor x = random_values(shape, 5, dtype);
        const PhiloxKey key{99, 3};
        const auto [cpu_y, cpu_mask] = ops::dropout(x, p, key);
        const auto [cuda_y, cuda_mask] = ops::dropout(ops::to(x, kCuda), p, key);
        CHECK(bitwise_equal(cpu_y, cuda_y));
        CHECK(bitwise_equal(cpu_mask, cuda_mask));
      }
    }
  }
  // A strided input (a transpose) reads its logical order.
  const Tensor x = random_values({40, 70}, 6);
  const auto [cpu_y, cpu_mask] = ops::dropout(ops::transpose(x, 0, 1), 0.3, {1, 1});
  const auto [cuda_y, cuda_mask] = ops::dropout(ops::transpose(ops::to(x, kCuda), 0, 1), 0.3, {1, 1});
  CHECK(bitwise_equal(cpu_y, cuda_y));
  CHECK(bitwise_equal(cpu_mask, cuda_mask));
  // A sequence slice's numbering (slice 1 of 3 of [3, 12, 5] along dim 1):
  // the cpu's draws, which are the whole tensor's there.
  const PhiloxNumbering slice_numbering{.first = 20, .run = 20, .stride = 60};
  const Tensor slice = random_values({3, 4, 5}, 8);
  const auto [cpu_slice_y, cpu_slice_mask] = ops::dropout(slice, 0.5, {2, 2}, slice_numbering);
  const auto [cuda_slice_y, cuda_slice_mask] = ops::dropout(ops::to(slice, kCuda), 0.5, {2, 2}, slice_numbering);
  CHECK(bitwise_equal(cpu_slice_y, cuda_slice_y));
  CHECK(bitwise_equal(cpu_slice_mask, cuda_slice_mask));
  const Tensor whole_mask = ops::dropout(ops::ones({3, 12, 5}), 0.5, {2, 2}).second;
  CHECK(bitwise_equal(cpu_slice_mask, ops::contiguous(ops::narrow(whole_mask, 1, 4, 4))));
  // p = 0 copies with a mask of ones; p = 1 is refused; empty is empty.
  const Tensor small = ops::to(random_values({9}, 7), kCuda);
  const auto [same, ones] = ops::dropout(small, 0.0, {1, 1});
  CHECK(bitwise_equal(same, small));
  CHECK(bitwise_equal(ones, ops::ones({9})));
  CHECK_THROWS_WITH_AS(ops::dropout(small, 1.0, {1, 1}), doctest::Contains("dropout: p must be in [0, 1)"), Error);
  CHECK(ops::dropout(ops::zeros({0, 3}, {.device = kCuda}), 0.5, {1, 1}).first.numel() == 0);
  CHECK_THROWS_WITH_AS(kernels(kCuda).dropout(ops::empty({9}, {.device = kCuda}), ops::empty({9}, {.device = kCuda}),
                                              ops::zeros({9}, {.dtype = DType::f64, .device = kCuda}), 0.5, {1, 1}, {}),
                       doctest::Contains("cuda::dropout: y and mask must be contiguous"), Error);
}

TEST_CASE("embedding backward on cuda: the cpu's bits with heavy duplicates, parallel over tokens") {
  struct Case {
    int64_t vocab, tokens, columns;
    int64_t distinct;  // indices drawn from the first `distinct` rows
  };
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const Case& c : {Case{37, 1500, 70, 5}, Case{300, 700, 33, 300}, Case{11, 600, 257, 1}, Case{50, 1, 3, 50},
                          Case{64, 513, 1, 7}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(c.tokens);
      const Tensor grad_out = random_values({c.tokens, c.columns}, 8, dtype);
      Tensor indices = ops::empty({c.tokens}, {.dtype = DType::i64});
      for (int64_t i = 0; i < c.tokens; ++i) indices.data_ptr<int64_t>()[i] = (i * 7919 + i / 3) % c.distinct;
      const Tensor cpu = ops::embedding_backward(grad_out, indices, c.vocab);
      const Tensor cuda = ops::embedding_backward(ops::to(grad_out, kCuda), ops::to(indices, kCuda), c.vocab);
      CHECK(bitwise_equal(cpu, cuda));
      // i32 indices and a [B, T] shape take the same path.
      const Tensor cuda_i32 = ops::embedding_backward(ops::reshape(ops::to(grad_out, kCuda), {1, c.tokens, c.columns}),
                                                      ops::to(ops::to(ops::reshape(indices, {1, c.tokens}), DType::i32), kCuda),
                                                      c.vocab);
      CHECK(bitwise_equal(cpu, cuda_i32));
    }
  }
  // Counted: sorting 2048 keys and summing 2048 rows of 96 over 500 rows.
  const int64_t tokens = 2048, columns = 96, vocab = 500;
  Tensor indices = ops::empty({tokens}, {.dtype = DType::i64});
  for (int64_t i = 0; i < tokens; ++i) indices.data_ptr<int64_t>()[i] = (i * 104729) % vocab;
  const Tensor device_indices = ops::to(indices, kCuda);
  const Tensor grad_out = ops::to(random_values({tokens, columns}, 9), kCuda);
  Tensor out = ops::zeros({vocab, columns}, {.device = kCuda});
  const std::optional<Launches> runs =
      counted("add_runs_kernel", [&] { ops::index_add_(out, 0, device_indices, grad_out); });
  const std::optional<Launches> sort = counted("sort", [&] { ops::index_add_(out, 0, device_indices, grad_out); });
  if (runs && sort) {
    // The sum: each source row read once, each touched output row read and
    // written once, each key read about once (plus the run-end searches).
    const int64_t ideal = tokens * columns * 4 + 2 * vocab * columns * 4 + tokens * 8;
    INFO("runs read " << runs->read << " written " << runs->written << " ideal " << ideal << "; sort "
                      << sort->read + sort->written << " bytes in " << sort->launches << " launches");
    CHECK(static_cast<double>(runs->read + runs->written) <= 1.1 * static_cast<double>(ideal));
    // A tile pass sorts tiles of 512; k = 1024: one global step and a tile
    // pass; k = 2048: two global steps and a tile pass.
    CHECK(sort->launches == 6);
  }
}

TEST_CASE("gradcheck of embedding and dropout on cuda, in f64") {
  Tensor weight = ops::to(random_values({6, 5}, 11, DType::f64), kCuda);
  weight.set_requires_grad(true);
  const Tensor indices = ops::to(ops::from_vector(std::vector<double>{1.0, 4.0, 1.0, 0.0, 1.0, 5.0}, Shape{2, 3}, {.dtype = DType::i64}), kCuda);
  const auto embedding = [&](const std::vector<Tensor>& inputs) { return tessera::embedding(inputs[0], indices); };
  const autograd::GradcheckResult embedding_result = autograd::gradcheck(embedding, {weight});
  CHECK_MESSAGE(embedding_result.ok, embedding_result.report);

  Tensor x = ops::to(random_values({4, 9}, 12, DType::f64), kCuda);
  x.set_requires_grad(true);
  const auto dropout = [](const std::vector<Tensor>& inputs) { return tessera::dropout(inputs[0], 0.4, true, {5, 5}); };
  const autograd::GradcheckResult dropout_result = autograd::gradcheck(dropout, {x});
  CHECK_MESSAGE(dropout_result.ok, dropout_result.report);
}
