// nn::Module: the registry, hooks, tree walks, materialisation and state dict
// shared by every layer.
#include "nn/module.h"

#include <algorithm>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "nn/activation_checkpoint.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace tessera::nn {

// Shared with the handles' removers through a weak_ptr, so removing a hook
// after its module is gone is harmless.
struct Module::HookLists {
  int64_t next_id = 0;
  std::vector<std::pair<int64_t, ForwardPreHook>> pre_hooks;
  std::vector<std::pair<int64_t, ForwardHook>> hooks;
};

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

template <typename Entries>
auto find_entry(Entries& entries, std::string_view name) {
  return std::find_if(entries.begin(), entries.end(), [&](const auto& entry) { return entry.first == name; });
}

template <typename Entries>
std::vector<std::string> entry_names(const Entries& entries) {
  std::vector<std::string> names;
  for (const auto& entry : entries) names.push_back(entry.first);
  return names;
}

}  // namespace

std::string InitContext::qualified(std::string_view name) const { return join_name(prefix, std::string(name)); }

PhiloxKey InitContext::key(std::string_view name) const {
  return PhiloxKey{seed, stream_id_for(qualified(name).c_str())};
}

Module::Module(std::string type_name) : type_name_(std::move(type_name)), hooks_(std::make_shared<HookLists>()) {}

// ---- calling ---------------------------------------------------------------------

Tensor Module::operator()(const Tensor& input) { return (*this)(TensorList{input}); }

Tensor Module::operator()(TensorList inputs) {
  // Copies of the lists: a hook may remove itself (or add others) while running.
  const auto pre_hooks = hooks_->pre_hooks;
  for (const auto& [id, hook] : pre_hooks) {
    if (auto replaced = hook(*this, inputs)) inputs = std::move(*replaced);
  }
  Tensor output = activation_checkpointing() ? checkpointed_forward(*this, inputs) : forward_inputs(inputs);
  const auto hooks = hooks_->hooks;
  for (const auto& [id, hook] : hooks) {
    if (auto replaced = hook(*this, inputs, output)) output = std::move(*replaced);
  }
  return output;
}

Tensor Module::forward_inputs(const TensorList& inputs) {
  TESSERA_CHECK(inputs.size() == 1, "{}: forward takes 1 input, got {}", type_name_, inputs.size());
  return forward(inputs[0]);
}

Tensor Module::forward(const Tensor&) {
  fail("{}: has no single-input forward (call it with its input list)", type_name_);
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  TESSERA_CHECK(hook != nullptr, "{}: register_forward_pre_hook: the hook is empty", type_name_);
  const int64_t id = hooks_->next_id++;
  hooks_->pre_hooks.emplace_back(id, std::move(hook));
  return HookHandle([weak = std::weak_ptr<HookLists>(hooks_), id] {
    if (auto lists = weak.lock()) std::erase_if(lists->pre_hooks, [id](const auto& entry) { return entry.first == id; });
  });
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  TESSERA_CHECK(hook != nullptr, "{}: register_forward_hook: the hook is empty", type_name_);
  const int64_t id = hooks_->next_id++;
  hooks_->hooks.emplace_back(id, std::move(hook));
  return HookHandle([weak = std::weak_ptr<HookLists>(hooks_), id] {
    if (auto lists = weak.lock()) std::erase_if(lists->hooks, [id](const auto& entry) { return entry.first == id; });
  });
}

bool Module::has_forward_hooks() const { return !hooks_->pre_hooks.empty() || !hooks_->hooks.empty(); }

// ---- registry ----------------------------------------------------------------------

void Module::check_new_name(const std::string& name) const {
  TESSERA_CHECK(!name.empty(), "{}: a registered name must not be empty", type_name_);
  TESSERA_CHECK(name.find('.') == std::string::npos, "{}: registered name '{}' must not contain '.'", type_name_,
                name);
  const bool taken = find_entry(parameters_, name) != parameters_.end() ||
                     find_entry(buffers_, name) != buffers_.end() || find_entry(children_, name) != children_.end();
  TESSERA_CHECK(!taken, "{}: the name '{}' is already registered", type_name_, name);
}

std::shared_ptr<Parameter> Module::register_parameter(std::string name, std::shared_ptr<Parameter> parameter) {
  check_new_name(name);
  TESSERA_CHECK(parameter != nullptr, "{}: register_parameter('{}'): the parameter is null", type_name_, name);
  parameters_.emplace_back(std::move(name), parameter);
  return parameter;
}

std::shared_ptr<Parameter> Module::register_parameter(std::string name, Tensor tensor, bool requires_grad) {
  return register_parameter(std::move(name), std::make_shared<Parameter>(std::move(tensor), requires_grad));
}

void Module::register_buffer(std::string name, Tensor tensor, bool persistent) {
  check_new_name(name);
  TESSERA_CHECK(tensor.defined(), "{}: register_buffer('{}'): the tensor is undefined", type_name_, name);
  if (!persistent) non_persistent_buffers_.push_back(name);
  buffers_.emplace_back(std::move(name), std::move(tensor));
}

void Module::add_child(std::string name, std::shared_ptr<Module> module) {
  check_new_name(name);
  TESSERA_CHECK(module != nullptr, "{}: register_module('{}'): the module is null", type_name_, name);
  TESSERA_CHECK(module.get() != this, "{}: register_module('{}'): a module cannot be its own child", type_name_,
                name);
  children_.emplace_back(std::move(name), std::move(module));
}

const std::shared_ptr<Parameter>& Module::parameter(std::string_view name) const {
  auto it = find_entry(parameters_, name);
  TESSERA_CHECK(it != parameters_.end(), "{}: no parameter '{}' (has {})", type_name_, name,
                entry_names(parameters_));
  return it->second;
}

bool Module::has_parameter(std::string_view name) const {
  return find_entry(parameters_, name) != parameters_.end();
}

void Module::set_parameter(std::string_view name, std::shared_ptr<Parameter> parameter) {
  auto it = find_entry(parameters_, name);
  TESSERA_CHECK(it != parameters_.end(), "{}: set_parameter: no parameter '{}' (has {})", type_name_, name,
                entry_names(parameters_));
  TESSERA_CHECK(parameter != nullptr, "{}: set_parameter('{}'): the parameter is null", type_name_, name);
  TESSERA_CHECK(parameter->sizes() == it->second->sizes(), "{}: set_parameter('{}'): shape {} does not match the slot's {}",
                type_name_, name, parameter->sizes(), it->second->sizes());
  it->second = std::move(parameter);
}

const Tensor& Module::buffer(std::string_view name) const {
  auto it = find_entry(buffers_, name);
  TESSERA_CHECK(it != buffers_.end(), "{}: no buffer '{}' (has {})", type_name_, name, entry_names(buffers_));
  return it->second;
}

void Module::set_buffer(std::string_view name, Tensor tensor) {
  auto it = find_entry(buffers_, name);
  TESSERA_CHECK(it != buffers_.end(), "{}: set_buffer: no buffer '{}' (has {})", type_name_, name,
                entry_names(buffers_));
  TESSERA_CHECK(tensor.defined(), "{}: set_buffer('{}'): the tensor is undefined", type_name_, name);
  it->second = std::move(tensor);
}

bool Module::is_persistent_buffer(std::string_view name) const {
  buffer(name);  // throws for an unknown name
  return std::find(non_persistent_buffers_.begin(), non_persistent_buffers_.end(), name) ==
         non_persistent_buffers_.end();
}

const std::shared_ptr<Module>& Module::child(std::string_view name) const {
  auto it = find_entry(children_, name);
  TESSERA_CHECK(it != children_.end(), "{}: no child module '{}' (has {})", type_name_, name,
                entry_names(children_));
  return it->second;
}

// ---- walking the tree ----------------------------------------------------------------

void Module::collect_modules(const std::string& prefix, std::vector<NamedModule>& out,
                             std::vector<const Module*>& seen) const {
  if (std::find(seen.begin(), seen.end(), this) != seen.end()) return;
  seen.push_back(this);
  // The walk hands out mutable pointers; constness of the walk itself is only
  // about not changing the registry.
  out.emplace_back(prefix, const_cast<Module*>(this));
  for (const auto& [name, child] : children_) child->collect_modules(join_name(prefix, name), out, seen);
}

std::vector<NamedModule> Module::modules_to_visit(bool recurse) const {
  std::vector<NamedModule> out;
  if (!recurse) {
    out.emplace_back("", const_cast<Module*>(this));
    return out;
  }
  std::vector<const Module*> seen;
  collect_modules("", out, seen);
  return out;
}

std::vector<NamedModule> Module::named_modules(const std::string& prefix) {
  std::vector<NamedModule> out;
  std::vector<const Module*> seen;
  collect_modules(prefix, out, seen);
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  for (const auto& [name, module] : named_modules()) out.push_back(module);
  return out;
}

std::vector<NamedModule> Module::named_children() const {
  std::vector<NamedModule> out;
  for (const auto& [name, child] : children_) out.emplace_back(name, child.get());
  return out;
}

std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (const auto& [name, child] : children_) out.push_back(child.get());
  return out;
}

std::vector<NamedParameter> Module::named_parameters(bool recurse) const {
  std::vector<NamedParameter> out;
  std::unordered_set<const Parameter*> seen_parameters;
  for (const auto& [prefix, module] : modules_to_visit(recurse)) {
    for (const auto& [name, parameter] : module->parameters_) {
      if (seen_parameters.insert(parameter.get()).second) out.emplace_back(join_name(prefix, name), parameter);
    }
  }
  return out;
}

std::vector<std::shared_ptr<Parameter>> Module::parameters(bool recurse) const {
  std::vector<std::shared_ptr<Parameter>> out;
  for (auto& [name, parameter] : named_parameters(recurse)) out.push_back(std::move(parameter));
  return out;
}

std::vector<NamedBuffer> Module::named_buffers(bool recurse) const {
  std::vector<NamedBuffer> out;
  std::unordered_set<const TensorImpl*> seen_buffers;
  for (const auto& [prefix, module] : modules_to_visit(recurse)) {
    for (const auto& [name, tensor] : module->buffers_) {
      if (seen_buffers.insert(tensor.impl()).second) out.emplace_back(join_name(prefix, name), tensor);
    }
  }
  return out;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (const auto& [name, child] : children_) child->apply(fn);
  fn(*this);
  return *this;
}

int64_t Module::num_parameters() const {
  int64_t total = 0;
  for (const auto& [name, parameter] : named_parameters()) total += parameter->numel();
  return total;
}

// ---- materialisation and init ----------------------------------------------------------

void Module::to_empty(Device device) {
  for (auto& [name, parameter] : named_parameters()) {
    const Tensor& current = parameter->tensor();
    auto sharding = parameter->sharding();
    if (!sharding) {
      parameter->set_tensor(ops::to_empty(current, device));
      continue;
    }
    // A shard gets its padded buffer: the rows it holds, then zero padding,
    // so the buffer is the same size on every rank; an offloaded one in host memory.
    Shape padded_shape = current.sizes();
    padded_shape[0] = sharding->padded_rows;
    Tensor padded = padded_shard_buffer(padded_shape, current.dtype(), device, sharding->memory);
    const int64_t rows = current.size(0);
    if (!device.is_meta() && rows < sharding->padded_rows) {
      Tensor padding = ops::narrow(padded, 0, rows, sharding->padded_rows - rows);
      ops::zero_(padding);
    }
    parameter->set_tensor(ops::narrow(padded, 0, 0, rows), std::move(sharding));
  }
  for (Module* module : modules()) {
    for (auto& [name, tensor] : module->buffers_) tensor = ops::to_empty(tensor, device);
  }
  if (device.is_meta()) return;
  autograd::NoGradGuard no_grad;
  for (Module* module : modules()) module->compute_own_buffers();
}

void Module::to(Device device) {
  autograd::NoGradGuard no_grad;
  const std::vector<NamedParameter> parameters = named_parameters();
  for (const auto& [name, parameter] : parameters) {
    TESSERA_CHECK(!parameter->sharding(),
                  "Module::to({}): parameter {} is sharded; a sharded model materialises on its device with "
                  "to_empty and then loads its state",
                  device.str(), name);
    TESSERA_CHECK(!parameter->tensor().is_meta() || device.is_meta(),
                  "Module::to({}): parameter {} is on meta and holds no values; use to_empty({}) and initialise or load",
                  device.str(), name, device.str());
  }
  for (const auto& [name, parameter] : parameters) {
    if (parameter->tensor().device() != device) parameter->set_tensor(ops::to(parameter->tensor(), device).detach());
  }
  for (Module* module : modules()) {
    for (auto& [name, tensor] : module->buffers_) tensor = ops::to(tensor, device);
  }
}

void Module::reset_parameters(uint64_t seed) {
  autograd::NoGradGuard no_grad;
  for (const auto& [prefix, module] : named_modules()) module->reset_own_parameters(InitContext{seed, prefix});
}

void Module::reset_own_parameters(const InitContext&) {}

void Module::compute_own_buffers() {}

void Module::add_extension(std::shared_ptr<ModuleExtension> extension) {
  TESSERA_CHECK(extension != nullptr, "{}: add_extension got null", type_name_);
  extensions_.push_back(std::move(extension));
}

void Module::materialize(Device device) {
  if (device.is_meta()) return;
  to_empty(device);
  reset_parameters(init::next_seed());
}

// ---- state ---------------------------------------------------------------------------------

StateDict Module::state_dict() {
  StateDict state;
  for (const auto& [prefix, module] : named_modules()) {
    for (const auto& [name, parameter] : module->parameters_) {
      state.emplace(join_name(prefix, name), parameter->tensor().detach());
    }
    for (const auto& [name, tensor] : module->buffers_) {
      if (module->is_persistent_buffer(name)) state.emplace(join_name(prefix, name), tensor.detach());
    }
  }
  return state;
}

LoadResult Module::load_state_dict(const StateDict& state, bool strict) {
  // The destinations, by fully qualified name: every parameter slot and buffer.
  std::map<std::string, Tensor*> targets;
  for (const auto& [prefix, module] : named_modules()) {
    for (auto& [name, parameter] : module->parameters_) targets.emplace(join_name(prefix, name), &parameter->tensor());
    for (auto& [name, tensor] : module->buffers_) {
      if (module->is_persistent_buffer(name)) targets.emplace(join_name(prefix, name), &tensor);
    }
  }

  LoadResult result;
  std::vector<std::string> mismatches;
  for (const auto& [name, target] : targets) {
    auto it = state.find(name);
    if (it == state.end()) {
      result.missing_keys.push_back(name);
    } else if (!it->second.defined()) {
      mismatches.push_back(fmt::format("{}: the tensor is undefined", name));
    } else if (it->second.sizes() != target->sizes()) {
      mismatches.push_back(fmt::format("{}: expected shape {}, got {}", name, target->sizes(), it->second.sizes()));
    }
  }
  for (const auto& [name, tensor] : state) {
    if (!targets.contains(name)) result.unexpected_keys.push_back(name);
  }

  const bool key_errors = strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty());
  if (key_errors || !mismatches.empty()) {
    std::vector<std::string> problems;
    if (strict && !result.missing_keys.empty()) {
      problems.push_back(fmt::format("missing keys: {}", fmt::join(result.missing_keys, ", ")));
    }
    if (strict && !result.unexpected_keys.empty()) {
      problems.push_back(fmt::format("unexpected keys: {}", fmt::join(result.unexpected_keys, ", ")));
    }
    if (!mismatches.empty()) problems.push_back(fmt::format("shape mismatches: {}", fmt::join(mismatches, "; ")));
    fail("{}: load_state_dict: {}", type_name_, fmt::join(problems, "; "));
  }

  autograd::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) {
    auto it = state.find(name);
    if (it != state.end()) ops::copy_(*target, it->second);
  }
  return result;
}

void Module::train(bool mode) {
  for (Module* module : modules()) module->training_ = mode;
}

}  // namespace tessera::nn
