// FSDP's copies on the cuda device (the simulator): a parameter group is
// moved by one multi-tensor launch per copy step (copy-in, copy-out, gradient
// copy-in, gradient casts) however many parameters it has, and what it moves
// is exact: the unsharded parameters are the bf16 bits of the f32 shards, the
// sharded gradients the f32 bits of the bf16 gradients (one rank: the
// average over one rank divides by 1).
#include <doctest/doctest.h>

#if TESSERA_HAVE_CUDA_SIM

#include <map>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "fsdp/param_group.h"
#include "fsdp/state.h"
#include "tensor/ops.h"
#include "tests/cuda/counted_bytes.h"
#include "tests/fsdp/layer_stack.h"
#include "tests/tensor/copy_segment_cases.h"

using namespace tessera;
using namespace tessera::fsdp;
using namespace tessera::fsdp::testing;
using tessera::testing::bytes_of;
using tessera::testing::launch_counts;

namespace {

const Device kCuda(DeviceType::cuda);

int64_t total_launches(const std::map<std::string, int64_t>& counts) {
  int64_t total = 0;
  for (const auto& [name, launches] : counts) total += launches;
  return total;
}

std::string listed(const std::map<std::string, int64_t>& counts) {
  std::string text;
  for (const auto& [name, launches] : counts) text += name + " x" + std::to_string(launches) + "; ";
  return text;
}

struct GroupLaunches {
  std::map<std::string, int64_t> unshard, reduce;  // kernel -> launches
};

// `layers` Linear layers of odd widths in one FSDP group on cuda (param
// dtype bf16), after a first forward and backward: the launches of an
// unshard, and of a gradient reduce-scatter and its accumulation into the
// shards, checking the bits each moves.
GroupLaunches group_launches(int layers) {
  GroupLaunches result;
  dist::run_local(1, [&](const dist::ProcessGroupPtr& group) {
    std::vector<int64_t> widths{24};
    for (int layer = 0; layer < layers; ++layer) widths.push_back(layer % 2 == 0 ? 17 : 24);
    LayerStack model(widths);
    const dist::DeviceMesh mesh(group, kCuda, {1});
    FSDPModule root = fully_shard(model, {.mesh = mesh, .mp_policy = {.param_dtype = DType::bf16}});
    model.to_empty(kCuda);
    model.reset_parameters(5);
    autograd::backward(model(ops::to(ops::randn({4, 24}, PhiloxKey{9, 1}), kCuda)));
    FSDPParamGroup& fsdp_group = *model.extension<FSDPState>()->group();
    REQUIRE(fsdp_group.params().size() == static_cast<size_t>(2 * layers));
    REQUIRE(fsdp_group.state() == ShardState::sharded);

    result.unshard = launch_counts([&] { fsdp_group.unshard(/*async_op=*/false); });
    autograd::NoGradGuard no_grad;
    std::vector<Tensor> grads;
    for (const auto& param : fsdp_group.params()) {
      CHECK(bytes_of(param->unsharded()) == bytes_of(ops::to(param->sharded(), DType::bf16)));
      Tensor unsharded = param->unsharded();
      grads.push_back(ops::to(ops::randn(unsharded.sizes(), PhiloxKey{9, grads.size() + 2}), kCuda));
      unsharded.set_grad(ops::to(grads.back(), DType::bf16));
      Tensor sharded = param->sharded();
      sharded.set_grad(Tensor());  // the first backward's: the reduced gradient is cast into a new one
    }
    result.reduce = launch_counts([&] {
      fsdp_group.post_backward();
      fsdp_group.finish_backward(/*wait_for_reduce_scatter=*/true);  // compute then waits for the gradients
    });
    for (size_t index = 0; index < grads.size(); ++index) {
      const Tensor sharded_grad = fsdp_group.params()[index]->sharded().grad();
      REQUIRE(sharded_grad.defined());
      CHECK(sharded_grad.dtype() == DType::f32);
      CHECK(bytes_of(sharded_grad) == bytes_of(ops::to(ops::to(grads[index], DType::bf16), DType::f32)));
    }
  });
  return result;
}

}  // namespace

TEST_CASE("fsdp on cuda: a group's copies are one launch per step, whatever its parameter count") {
  const GroupLaunches few = group_launches(2);
  const GroupLaunches many = group_launches(12);
  INFO("unshard, 4 parameters: " << listed(few.unshard) << " 24: " << listed(many.unshard));
  INFO("reduce, 4 parameters: " << listed(few.reduce) << " 24: " << listed(many.reduce));
  // Copy-in and copy-out; then the gradient copy-in (rows and presence
  // flags) and the casts into new sharded gradients.
  CHECK(many.unshard.at("copy_segments_kernel") == 2);
  CHECK(many.reduce.at("copy_segments_kernel") == 2);
  CHECK(total_launches(few.unshard) == total_launches(many.unshard));
  CHECK(total_launches(few.reduce) == total_launches(many.reduce));
  CHECK(total_launches(many.unshard) == 2);  // one rank: the all-gather moves nothing
  CHECK(total_launches(many.reduce) <= 3);
}

#endif  // TESSERA_HAVE_CUDA_SIM
