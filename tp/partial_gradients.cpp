// Partial gradients: an all-reduce of each partial gradient as it reaches its
// parameter, the handles kept on the owning module.
#include "tp/partial_gradients.h"

#include <vector>

#include "tensor/ops.h"

namespace tessera::tp {

namespace {

struct PartialGradientSums : nn::ModuleExtension {
  std::vector<autograd::HookHandle> handles;
};

}  // namespace

void sum_partial_gradients(nn::Module& module, nn::Parameter& parameter, const dist::DeviceMesh& mesh) {
  auto* sums = module.extension<PartialGradientSums>();
  if (sums == nullptr) {
    auto created = std::make_shared<PartialGradientSums>();
    sums = created.get();
    module.add_extension(std::move(created));
  }
  sums->handles.push_back(parameter.register_gradient_hook([group = mesh.group(0)](const Tensor& grad) {
    Tensor summed = ops::clone(grad);
    group->all_reduce(summed, dist::ReduceOp::sum);
    return summed;
  }));
}

void remove_partial_gradient_sums(nn::Module& root) {
  for (nn::Module* module : root.modules()) {
    if (auto* sums = module->extension<PartialGradientSums>()) {
      for (autograd::HookHandle& handle : sums->handles) handle.remove();
      sums->handles.clear();
    }
  }
}

}  // namespace tessera::tp
