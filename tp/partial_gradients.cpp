// Partial gradients: the switch that stops their sums.
#include "tp/partial_gradients.h"

namespace tessera::tp {

void remove_partial_gradient_sums(nn::Module& root) {
  for (const auto& parameter : root.parameters()) {
    if (parameter->sums_partial_gradient()) parameter->set_sums_partial_gradient(false);
  }
}

}  // namespace tessera::tp
