// Tensor parallelism's stream protocol on simulated GPUs, proven the other
// way round from the jitter soak (tests/train/test_train_cuda.cpp): with
// either of the device protocol's orderings dropped on the tp group
// (ProcessGroup::drop_device_ordering_for_testing), a (tp 2) step of GPT and
// of Llama is stopped by the stream-order checker, which names the tp
// collective and the compute kernel on either side of it; with both kept the
// same step runs clean and gives the cpu's loss.
#include <doctest/doctest.h>

#if TESSERA_HAVE_CUDA_SIM

#include <cmath>
#include <string>

#include "autograd/engine.h"
#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tests/dist/error_message.h"
#include "tests/tp/composed_models.h"
#include "tp/plans.h"

using namespace tessera;
using namespace tessera::tp::testing;
namespace ops = tessera::ops;

namespace {

// One forward and backward of `make`'s model over (tp 2) on simulated
// cuda:0 and cuda:1 (or on cpu ranks), the tp group without `dropped`;
// returns rank 0's loss.
double tensor_parallel_step(const ComposedFactory& make, DeviceType type,
                            std::optional<dist::ProcessGroup::DeviceOrdering> dropped) {
  double loss_value = 0.0;
  dist::run_local(
      2,
      [&](const dist::ProcessGroupPtr& world) {
        const Device device = type == DeviceType::cuda ? Device(DeviceType::cuda, world->rank()) : kCPU;
        if (device.is_cuda()) cuda::set_device(device.index);
        const dist::DeviceMesh mesh(world, device, {2}, {"tp"});
        if (dropped) mesh.group(0)->drop_device_ordering_for_testing(*dropped);
        auto model = make(kMeta);
        tp::parallelize_causal_lm(*model, mesh);
        model->to_empty(device);
        model->reset_parameters(kComposedSeed);
        const Tensor idx = ops::to(rows_of_dp_rank(global_tokens(1, 5), 0), device);
        const Tensor loss = model->loss(idx, idx);
        autograd::backward(loss);
        const double value = ops::to(loss.detach(), kCPU).to_vector<float>().front();
        if (world->rank() == 0) loss_value = value;
      },
      thread_rank_options());
  return loss_value;
}

}  // namespace

TEST_CASE("tp streams: a step on simulated GPUs runs clean with both orderings, and as on cpu ranks") {
  for (const auto& [label, make] : composed_models()) {
    CAPTURE(label);
    const double on_gpus = tensor_parallel_step(make, DeviceType::cuda, std::nullopt);
    const double on_cpus = tensor_parallel_step(make, DeviceType::cpu, std::nullopt);
    CHECK(std::abs(on_gpus - on_cpus) <= 1e-5 * std::max(1.0, std::abs(on_cpus)));
  }
}

TEST_CASE("tp streams: a collective that does not wait for its input is caught, naming both operations") {
  for (const auto& [label, make] : composed_models()) {
    CAPTURE(label);
    const std::string message = test::message_of([&] {
      tensor_parallel_step(make, DeviceType::cuda, dist::ProcessGroup::DeviceOrdering::input_written);
    });
    CAPTURE(message);
    // The first tp collective (the embedding's reduce-scatter onto the
    // sequence) reads its input before the kernel writing it is ordered.
    CHECK(message.starts_with("stream-order checker: `#0 reduce_scatter_into("));
    CHECK(message.find("on group 'tp'` on cuda:") != std::string::npos);
    CHECK(message.find("reads `in`") != std::string::npos);
    CHECK(message.find("which `(copy_kernel<To, From>)` on cuda:") != std::string::npos);
    CHECK(message.find("with no event or synchronize between them") != std::string::npos);
  }
}

TEST_CASE("tp streams: compute that does not wait for a collective's output is caught, naming both operations") {
  for (const auto& [label, make] : composed_models()) {
    CAPTURE(label);
    const std::string message = test::message_of([&] {
      tensor_parallel_step(make, DeviceType::cuda, dist::ProcessGroup::DeviceOrdering::output_written);
    });
    CAPTURE(message);
    // The kernel after the embedding's reduce-scatter reads its output
    // before the collective is ordered before it.
    CHECK(message.starts_with("stream-order checker: `(copy_kernel<To, From>)` on cuda:"));
    CHECK(message.find("which `#0 reduce_scatter_into(") != std::string::npos);
    CHECK(message.find("on group 'tp'` on cuda:") != std::string::npos);
    CHECK(message.find("with no event or synchronize between them") != std::string::npos);
  }
}

#endif  // TESSERA_HAVE_CUDA_SIM
