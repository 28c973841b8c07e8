// FSDP under mpirun -np 3 (one process per rank, the mpi backend) against
// unsharded training in one process, on the awkward GPT. In deterministic mode
// (TESSERA_DIST_DETERMINISTIC=1) reductions add in rank order, as unsharded
// training adds micro-batches: bitwise. Otherwise MPI picks the order, and the
// runs are compared in f64 with AdamW and in f32 with SGD (tolerances and
// their reasons: training_harness.h).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "dist/backends/mpi_backend.h"
#include "tests/fsdp/training_harness.h"

using namespace tessera;
using namespace tessera::fsdp::testing;

namespace {

dist::ProcessGroupPtr mpi_world;

TrainingSetup awkward() {
  TrainingSetup setup;
  setup.model = gpt_recipe({.vocab_size = 97, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 72, .bias = false});
  return setup;
}

}  // namespace

TEST_CASE("fsdp over mpi: 3 processes match unsharded training in the world's reduction order") {
  const int world = mpi_world->size();
  if (mpi_world->options().deterministic) {
    check_bitwise(train_unsharded(awkward(), world), train_fsdp_on(mpi_world, awkward(), {}));
    return;
  }
  const TrainingSetup f64 = in_f64(awkward()), sgd = with_sgd(awkward());
  check_close(train_unsharded(f64, world), train_fsdp_on(mpi_world, f64, {}), kF64AdamW);
  check_close(train_unsharded(sgd, world), train_fsdp_on(mpi_world, sgd, {}), kF32Sgd);
}

int main(int argc, char** argv) {
  mpi_world = dist::init_mpi_world(dist::ProcessGroupOptions::from_environment());
  doctest::Context context(argc, argv);
  const int status = context.run();
  mpi_world.reset();
  dist::finalize_mpi();
  return status;
}
