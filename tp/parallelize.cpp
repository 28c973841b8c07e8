// parallelize_module: pattern matching, the styles in plan order, and the
// gathers that give back whole tensors.
#include "tp/parallelize.h"

#include <map>
#include <sstream>

#include "tensor/ops.h"

namespace tessera::tp {

namespace {

// Marks a tree a plan was applied to: a second plan would stack a second set
// of hooks on the same modules (every activation moved twice).
struct Parallelized : nn::ModuleExtension {};

std::vector<std::string> name_parts(const std::string& name) {
  std::vector<std::string> parts;
  if (name.empty()) return parts;
  std::stringstream stream(name);
  std::string part;
  while (std::getline(stream, part, '.')) parts.push_back(part);
  return parts;
}

}  // namespace

bool matches_module_pattern(const std::string& pattern, const std::string& name) {
  const std::vector<std::string> wanted = name_parts(pattern);
  const std::vector<std::string> parts = name_parts(name);
  if (wanted.size() != parts.size()) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (wanted[i] != "*" && wanted[i] != parts[i]) return false;
  }
  return true;
}

void parallelize_module(nn::Module& root, const dist::DeviceMesh& tp_mesh, const ParallelizePlan& plan) {
  TESSERA_CHECK(tp_mesh.ndim() == 1, "parallelize_module: the tp mesh must be 1-D, got {}", tp_mesh.to_string());
  TESSERA_CHECK(root.extension<Parallelized>() == nullptr,
                "parallelize_module: this {} is parallelized already; give one plan with every style it needs",
                root.type_name());
  for (const auto& [name, parameter] : root.named_parameters()) {
    TESSERA_CHECK(!parameter->is_sharded(),
                  "parallelize_module: {} is already sharded by FSDP; parallelize the model first, then fully_shard "
                  "it on the data-parallel mesh",
                  name);
  }
  // Every pattern is matched and every style checked on its modules before
  // any is applied: a bad plan leaves the model as it was.
  const std::vector<nn::NamedModule> modules = root.named_modules();
  std::vector<std::vector<nn::NamedModule>> matches;
  for (const auto& [pattern, style] : plan) {
    TESSERA_CHECK(style != nullptr, "parallelize_module: the style for '{}' is null", pattern);
    std::vector<nn::NamedModule>& matched = matches.emplace_back();
    for (const auto& named : modules) {
      if (matches_module_pattern(pattern, named.first)) matched.push_back(named);
    }
    TESSERA_CHECK(!matched.empty(), "parallelize_module: '{}' ({}) matches no module of the {}", pattern,
                  style->describe(), root.type_name());
    for (const auto& [name, module] : matched) style->check(*module, name, tp_mesh);
  }
  for (size_t entry = 0; entry < plan.size(); ++entry) {
    for (const auto& [name, module] : matches[entry]) plan[entry].second->apply(*module, name, tp_mesh);
  }
  // What no style split is replicated over tp (GPT's position embedding):
  // its spec says so, so that checkpoints write one copy and FSDP knows it.
  for (const auto& [name, parameter] : root.named_parameters()) {
    if (parameter->tensor_parallel()) continue;
    parameter->set_tensor_parallel(parameter->tensor().detach(),
                                   std::make_shared<nn::TensorParallelSpec>(nn::TensorParallelSpec{
                                       .mesh = tp_mesh, .global_shape = parameter->global_shape()}));
  }
  root.add_extension(std::make_shared<Parallelized>());
}

Tensor full_tensor(const nn::Parameter& parameter) {
  TESSERA_CHECK(!parameter.is_sharded(),
                "tp::full_tensor: the parameter is sharded by FSDP; gather it with fsdp's state dicts");
  const auto& spec = parameter.tensor_parallel();
  return spec ? full_tensor(parameter.tensor(), *spec) : ops::clone(parameter.tensor().detach());
}

Tensor full_tensor(const Tensor& local, const nn::TensorParallelSpec& spec) { return spec.gather(local); }

nn::StateDict full_state_dict(nn::Module& root) {
  // Each parameter under every name it has (a tied weight under both), found
  // through the modules that register it.
  std::map<std::string, const nn::Parameter*> parameters;
  for (const auto& [prefix, module] : root.named_modules()) {
    for (const auto& [own, parameter] : module->named_parameters(/*recurse=*/false)) {
      parameters[prefix.empty() ? own : prefix + "." + own] = parameter.get();
    }
  }
  nn::StateDict whole;
  std::map<const nn::Parameter*, Tensor> gathered;  // a tied parameter gathered once
  for (const auto& [name, tensor] : root.state_dict()) {  // sorted: the same collectives in the same order everywhere
    const auto found = parameters.find(name);
    if (found == parameters.end()) {
      whole[name] = ops::clone(tensor);
      continue;
    }
    auto [slot, first] = gathered.try_emplace(found->second);
    if (first) slot->second = full_tensor(*found->second);
    whole[name] = slot->second;
  }
  return whole;
}

}  // namespace tessera::tp
