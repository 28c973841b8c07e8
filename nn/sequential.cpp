// nn::Sequential: children applied in order.
#include "nn/sequential.h"

namespace tessera::nn {

Sequential::Sequential() : ModuleList("Sequential") {}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Sequential() {
  for (const auto& module : modules) push_back(module);
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& module : *this) y = (*module)(y);
  return y;
}

}  // namespace tessera::nn
