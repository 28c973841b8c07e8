// FSDP under mpirun -np 3 (one process per rank, the mpi backend): the awkward
// GPT trained 10 AdamW steps matches unsharded training in one process.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "dist/mpi_backend.h"
#include "tests/fsdp/training_harness.h"

using namespace tessera;
using namespace tessera::fsdp::testing;

namespace {
dist::ProcessGroupPtr mpi_world;
}

TEST_CASE("fsdp over mpi: 3 processes match unsharded training") {
  TrainingSetup setup;
  setup.model = nn::GPTConfig{.vocab_size = 97, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 72, .bias = false};
  const TrainingResult actual = train_fsdp_on(mpi_world, setup, {});
  const TrainingResult expected = train_unsharded(setup, mpi_world->size());
  check_close(expected, actual, 1e-5, 1e-4);
}

int main(int argc, char** argv) {
  mpi_world = dist::init_mpi_world(dist::ProcessGroupOptions::from_environment());
  doctest::Context context(argc, argv);
  const int status = context.run();
  mpi_world.reset();
  dist::finalize_mpi();
  return status;
}
