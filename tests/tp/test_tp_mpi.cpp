// Tensor parallelism under FSDP over the mpi backend, mpirun -np 4: (dp 2,
// tp 2) GPT and Llama, one process a rank. In deterministic mode
// (TESSERA_DIST_DETERMINISTIC=1) every reduction adds in rank order on every
// backend, so the loss and every gathered gradient equal bitwise those of the
// same job on 4 thread ranks of the local backend, which each process runs
// too.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <map>

#include "autograd/engine.h"
#include "dist/backends/local_backend.h"
#include "dist/backends/mpi_backend.h"
#include "tests/tp/composed_models.h"

using namespace tessera;
using namespace tessera::tp::testing;

namespace {

dist::ProcessGroupPtr mpi_world;

struct StepResult {
  double loss = 0.0;
  std::map<std::string, Tensor> gradients;  // whole
};

// One forward and backward of (dp 2, tp 2) on `world`; every rank gets the
// whole gradients.
StepResult composed_step(const dist::ProcessGroupPtr& world, const ComposedFactory& make) {
  const ComposedMesh meshes = composed_mesh(world, 1, 2, 2);
  auto model = composed_model(make, meshes);
  const Tensor idx = global_tokens(2, 11);
  const Tensor targets = global_tokens(2, 12);
  const Tensor loss = model->loss(rows_of_dp_rank(idx, meshes.dp_rank), rows_of_dp_rank(targets, meshes.dp_rank));
  autograd::backward(loss);
  StepResult result;
  result.loss = doubles(loss)[0];
  for (const auto& [name, parameter] : model->named_parameters()) {
    result.gradients[name] = gathered(*parameter, parameter->grad());
  }
  return result;
}

}  // namespace

TEST_CASE("tp x fsdp over mpi, deterministic: 4 processes give the bits of 4 thread ranks") {
  REQUIRE(mpi_world->size() == 4);
  REQUIRE(mpi_world->options().deterministic);
  for (const auto& [label, make] : composed_models()) {
    INFO(label);
    const StepResult over_mpi = composed_step(mpi_world, make);
    std::map<int, StepResult> over_threads;
    dist::LocalOptions options;
    options.group.deterministic = true;
    options.threads_per_rank = 1;
    dist::run_local(
        4,
        [&](const dist::ProcessGroupPtr& world) {
          StepResult result = composed_step(world, make);
          if (world->rank() == mpi_world->rank()) over_threads[world->rank()] = std::move(result);
        },
        options);
    const StepResult& local = over_threads.at(mpi_world->rank());
    CHECK(over_mpi.loss == local.loss);
    for (const auto& [name, gradient] : local.gradients) {
      CAPTURE(name);
      CHECK(worst_difference(over_mpi.gradients.at(name), gradient) == 0.0);
    }
  }
}

int main(int argc, char** argv) {
  mpi_world = dist::init_mpi_world(dist::ProcessGroupOptions::from_environment());
  doctest::Context context(argc, argv);
  const int status = context.run();
  mpi_world.reset();
  dist::finalize_mpi();
  return status;
}
