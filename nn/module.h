// nn::Module: the base of every layer and model. It owns a registry of named
// parameters, buffers and child modules (fully qualified names such as
// "blocks.3.attn.qkv.weight"), runs forward hooks around forward, and walks the
// tree for to_empty, reset_parameters, state_dict and train/eval.
//
// Forward signature. A module maps a list of input tensors to one output
// tensor: `Tensor forward_inputs(const TensorList& inputs)`. Single-input
// layers (nearly all) override `Tensor forward(const Tensor& input)` instead;
// the default forward_inputs checks for exactly one input and calls it.
// Multi-input modules override forward_inputs (GPT: {idx} -> logits,
// {idx, targets} -> loss). Call a module with operator(): `model(x)` or
// `model({idx, targets})`; that runs, in order,
//   forward-pre hooks (module, inputs) -> optional replacement inputs,
//   forward_inputs(inputs),
//   forward hooks (module, inputs, output) -> optional replacement output.
// FSDP installs its all-gather as a pre hook and its reshard as a forward hook.
//
// Parameters live in registry slots (shared_ptr<Parameter>); layers read them
// by name at forward time and never cache the tensor, so a slot's Parameter (or
// the tensor inside it) can be swapped between calls.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "autograd/hooks.h"
#include "nn/parameter.h"
#include "tensor/philox.h"

namespace tessera::nn {

using TensorList = std::vector<Tensor>;
using autograd::HookHandle;

class Module;

using NamedParameter = std::pair<std::string, std::shared_ptr<Parameter>>;
using NamedBuffer = std::pair<std::string, Tensor>;
using NamedModule = std::pair<std::string, Module*>;
// Fully qualified name -> tensor (parameters and buffers). Values share
// storage with the module; they carry no autograd history.
using StateDict = std::map<std::string, Tensor>;

// Runs before forward; returning a list replaces the inputs.
using ForwardPreHook = std::function<std::optional<TensorList>(Module& module, const TensorList& inputs)>;
// Runs after forward; returning a tensor replaces the output.
using ForwardHook =
    std::function<std::optional<Tensor>(Module& module, const TensorList& inputs, const Tensor& output)>;

// What a module's forward keeps for backward (nn/activation_checkpoint.h):
// everything (off), its inputs (full), or its inputs and the outputs of its
// GEMMs and attention (selective).
enum class Checkpointing { off, full, selective };

// What load_state_dict(strict = false) did not match (shape mismatches always throw).
struct LoadResult {
  std::vector<std::string> missing_keys;     // expected by the module, absent from the dict
  std::vector<std::string> unexpected_keys;  // in the dict, unknown to the module
};

// Handed to each module's own init: the run's seed and the module's prefix, so
// that a parameter's random stream is named by its fully qualified name and
// init is the same whatever the creation order, device or rank.
struct InitContext {
  uint64_t seed = 0;
  std::string prefix;  // "" for the root, else "blocks.3.attn"

  std::string qualified(std::string_view name) const;  // prefix + "." + name
  PhiloxKey key(std::string_view name) const;          // {seed, stream_id_for(qualified(name))}
};

// State that a layer above nn attaches to a module and that lives as long as
// the module (fsdp's FSDPState: what fully_shard turns a module into).
class ModuleExtension {
 public:
  virtual ~ModuleExtension() = default;
};

class Module {
 public:
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // "Linear", "GPT", ...: used in error messages.
  const std::string& type_name() const { return type_name_; }

  // ---- calling ---------------------------------------------------------------
  Tensor operator()(const Tensor& input);
  Tensor operator()(TensorList inputs);
  // The general forward; the default requires one input and calls forward(input).
  virtual Tensor forward_inputs(const TensorList& inputs);
  // The single-input forward; the default throws (the module takes other inputs).
  virtual Tensor forward(const Tensor& input);

  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);
  // Whether a forward-pre or forward hook is registered (FSDP's, a user's):
  // a parent that would fuse this module's forward into its own calls it
  // instead while one is (nn::MLP).
  bool has_forward_hooks() const;

  // Activation checkpointing (nn/activation_checkpoint.h): operator() then
  // runs forward keeping only the inputs (full), or the inputs and the
  // outputs of its GEMMs and attention (selective), and backward recomputes
  // the rest.
  void set_activation_checkpointing(Checkpointing mode) { checkpointing_ = mode; }
  void set_activation_checkpointing(bool enabled) { checkpointing_ = enabled ? Checkpointing::full : Checkpointing::off; }
  bool activation_checkpointing() const { return checkpointing_ != Checkpointing::off; }
  Checkpointing activation_checkpointing_mode() const { return checkpointing_; }
  // Expires when the module is destroyed (what a recorded recompute checks).
  std::weak_ptr<const void> lifetime() const { return hooks_; }

  // ---- registry ----------------------------------------------------------------
  // Names are non-empty, contain no '.', and are unique within the module
  // across parameters, buffers and children.
  std::shared_ptr<Parameter> register_parameter(std::string name, std::shared_ptr<Parameter> parameter);
  std::shared_ptr<Parameter> register_parameter(std::string name, Tensor tensor, bool requires_grad = true);
  // A non-persistent buffer (RoPE's tables) is derived from the module's
  // configuration: it is left out of state_dict and load_state_dict.
  void register_buffer(std::string name, Tensor tensor, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    add_child(std::move(name), module);
    return module;
  }

  // This module's own entries (not its children's); unknown names throw.
  const std::shared_ptr<Parameter>& parameter(std::string_view name) const;
  bool has_parameter(std::string_view name) const;
  // Puts `parameter` in the slot `name` (tying: the same object in two
  // modules). The shape must match the slot's current one.
  void set_parameter(std::string_view name, std::shared_ptr<Parameter> parameter);
  const Tensor& buffer(std::string_view name) const;
  void set_buffer(std::string_view name, Tensor tensor);
  bool is_persistent_buffer(std::string_view name) const;
  const std::shared_ptr<Module>& child(std::string_view name) const;

  // ---- walking the tree ----------------------------------------------------------
  // Pre-order, each module and each parameter once (shared ones by identity,
  // under the first name met), like torch.
  std::vector<NamedParameter> named_parameters(bool recurse = true) const;
  std::vector<std::shared_ptr<Parameter>> parameters(bool recurse = true) const;
  std::vector<NamedBuffer> named_buffers(bool recurse = true) const;
  std::vector<NamedModule> named_modules(const std::string& prefix = "");  // self first, as ""
  std::vector<Module*> modules();
  std::vector<NamedModule> named_children() const;
  std::vector<Module*> children() const;
  // fn on every module, children before parents (like torch); returns *this.
  Module& apply(const std::function<void(Module&)>& fn);
  // Elements over distinct parameters (tied ones counted once).
  int64_t num_parameters() const;

  // ---- materialisation and init --------------------------------------------------
  // Replaces every parameter and buffer with uninitialised storage on `device`
  // (same shape and dtype), then lets each module compute its derived buffers
  // (compute_own_buffers). Meta -> cpu is the FSDP2 flow: build on meta,
  // shard, to_empty, reset_parameters.
  void to_empty(Device device);
  // Copies every parameter and buffer to `device` (torch's module.to(device)),
  // keeping requires_grad; tensors already there are kept as they are, the
  // others lose their gradients. Sharded parameters refuse:
  // a sharded model materialises where it trains (to_empty, then a load).
  void to(Device device);
  // Initialises every parameter and buffer of the tree: each module's
  // reset_own_parameters with its prefix. The bits depend only on (seed, fully
  // qualified name, element index).
  void reset_parameters(uint64_t seed);

  // ---- state -----------------------------------------------------------------------
  // Every parameter and persistent buffer by fully qualified name (a tied
  // parameter under each of its names, like torch).
  StateDict state_dict();
  // Copies `state` into the module's tensors (converting dtype). Shape
  // mismatches always throw; with strict, so do missing and unexpected keys.
  // All problems are named in one message, and nothing is copied unless the
  // whole dict fits.
  LoadResult load_state_dict(const StateDict& state, bool strict = true);

  // ---- extensions ------------------------------------------------------------------
  void add_extension(std::shared_ptr<ModuleExtension> extension);
  // The first extension of type T, or null.
  template <typename T>
  T* extension() const {
    for (const auto& attached : extensions_) {
      if (auto* typed = dynamic_cast<T*>(attached.get())) return typed;
    }
    return nullptr;
  }

  void train(bool mode = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }

 protected:
  explicit Module(std::string type_name);

  // Initialises this module's own parameters and buffers (not its children's);
  // keys come from context.key(name). The default does nothing.
  virtual void reset_own_parameters(const InitContext& context);
  // Fills this module's buffers that are a function of its configuration
  // (RoPE's cos/sin tables). to_empty calls it on every module once the
  // storage is real, so such buffers are right on any device without
  // reset_parameters or a checkpoint. The default does nothing.
  virtual void compute_own_buffers();
  // For constructors: parameters are created on meta; on any other device
  // this allocates them there and initialises them with a seed drawn from the
  // thread's default generator (init::next_seed). Composite modules build
  // their children on meta and call this once at the end, so nothing is
  // initialised twice.
  void materialize(Device device);

 private:
  struct HookLists;
  void add_child(std::string name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  void collect_modules(const std::string& prefix, std::vector<NamedModule>& out,
                       std::vector<const Module*>& seen) const;
  // This module alone, or the whole tree with prefixes (shared children once).
  std::vector<NamedModule> modules_to_visit(bool recurse) const;

  std::string type_name_;
  bool training_ = true;
  Checkpointing checkpointing_ = Checkpointing::off;
  std::vector<NamedParameter> parameters_;
  std::vector<NamedBuffer> buffers_;
  std::vector<std::string> non_persistent_buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::shared_ptr<HookLists> hooks_;
  std::vector<std::shared_ptr<ModuleExtension>> extensions_;
};

}  // namespace tessera::nn
