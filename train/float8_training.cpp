// Which layers --float8 switches.
#include "train/float8_training.h"

#include "train/lora_fine_tuning.h"

namespace tessera::train {

int64_t prepare_float8(nn::CausalLM& model, const TrainConfig& config) {
  if (!config.float8) return 0;
  int64_t switched = 0;
  for (const NamedLinear& projection : block_linears(model)) {
    projection.linear->use_float8();
    ++switched;
  }
  return switched;
}

}  // namespace tessera::train
