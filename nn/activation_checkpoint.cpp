// Activation checkpointing: the forward that keeps only its inputs, the node
// that recomputes, and the block policy of train --ac.
#include "nn/activation_checkpoint.h"

#include <charconv>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/recompute_memo.h"
#include "tensor/philox.h"

namespace tessera::nn {

namespace {

// The thread's default generator, where a forward found it: the replay
// starts there so that dropout draws the same keys, then puts it back.
struct GeneratorPosition {
  uint64_t seed = 0;
  uint64_t next_stream = 0;

  static GeneratorPosition now() {
    const Generator& generator = default_generator();
    return {generator.seed(), generator.next_stream()};
  }
  void restore() const {
    Generator& generator = default_generator();
    generator.manual_seed(seed);
    generator.set_next_stream(next_stream);
  }
};

class GeneratorReplay {
 public:
  explicit GeneratorReplay(const GeneratorPosition& at) : after_(GeneratorPosition::now()) { at.restore(); }
  ~GeneratorReplay() { after_.restore(); }
  GeneratorReplay(const GeneratorReplay&) = delete;
  GeneratorReplay& operator=(const GeneratorReplay&) = delete;

 private:
  GeneratorPosition after_;
};

// The module's parameters that will want gradients, as the tensors forward
// reads (under FSDP: the unsharded ones, gathered by its pre-forward hook).
TensorList trainable_tensors(const Module& module) {
  TensorList tensors;
  for (const auto& parameter : module.parameters()) {
    if (parameter->tensor().defined() && parameter->tensor().requires_grad()) tensors.push_back(parameter->tensor());
  }
  return tensors;
}

// Edges: the inputs that want gradients, then the trainable parameters.
class CheckpointBackward : public autograd::Node {
 public:
  CheckpointBackward(Module& module, TensorList inputs, TensorList parameters, GeneratorPosition generator,
                     Shape output_shape, std::unique_ptr<autograd::RecomputeMemo> memo)
      : module_(&module),
        module_alive_(module.lifetime()),
        training_(module.is_training()),
        inputs_(std::move(inputs)),
        parameters_(std::move(parameters)),
        generator_(generator),
        output_shape_(std::move(output_shape)),
        memo_(std::move(memo)) {}

  std::string name() const override { return "CheckpointBackward"; }
  void release_saved_tensors() override {
    inputs_.clear();
    parameters_.clear();
    memo_.reset();
  }

  autograd::TensorList apply(autograd::TensorList&& grad_outputs) override {
    TESSERA_CHECK(!module_alive_.expired(), "activation checkpointing: the checkpointed module was destroyed before "
                  "backward reached it; it must live until backward recomputes its forward");
    check_unchanged();
    // The replay: recording on (the engine runs nodes with it off), each
    // input a fresh leaf, so that autograd::grad stops there.
    TensorList replay_inputs;
    TensorList wanted;
    replay_inputs.reserve(inputs_.size());
    for (const Tensor& input : inputs_) {
      if (!input.defined()) {
        replay_inputs.push_back(input);
        continue;
      }
      Tensor leaf = input.detach();
      if (input.requires_grad()) {
        leaf.set_requires_grad(true);
        wanted.push_back(leaf);
      }
      replay_inputs.push_back(std::move(leaf));
    }
    for (const Tensor& parameter : parameters_) wanted.push_back(parameter);
    Tensor output;
    {
      const GeneratorReplay replay(generator_);
      const autograd::GradModeGuard recording(true);
      std::optional<autograd::MemoScope> kept_outputs;
      if (memo_) kept_outputs.emplace(*memo_, autograd::MemoScope::Role::replay);
      output = module_->forward_inputs(replay_inputs);
      if (memo_) memo_->check_all_taken(module_->type_name().c_str());
    }
    memo_.reset();
    TESSERA_CHECK(output.sizes() == output_shape_,
                  "activation checkpointing: {}'s recomputed forward gave shape {}, but its forward gave {}; a "
                  "checkpointed forward must depend only on its inputs, parameters and random generator",
                  module_->type_name(), output.sizes(), output_shape_);
    TESSERA_CHECK(output.requires_grad(), "activation checkpointing: {}'s recomputed output needs no gradient, but "
                  "its forward's did", module_->type_name());
    return autograd::grad({output}, wanted, {grad_outputs[0]});
  }

 private:
  // What forward saw must be what the replay sees.
  void check_unchanged() const {
    TESSERA_CHECK(module_->is_training() == training_,
                  "activation checkpointing: {} ran forward in {} mode but is in {} mode at backward; the recompute "
                  "would draw different dropout", module_->type_name(), training_ ? "train" : "eval",
                  training_ ? "eval" : "train");
    const TensorList now = trainable_tensors(*module_);
    bool same = now.size() == parameters_.size();
    for (size_t i = 0; same && i < now.size(); ++i) same = now[i].impl_ptr() == parameters_[i].impl_ptr();
    TESSERA_CHECK(same,
                  "activation checkpointing: {}'s trainable parameters changed between forward and backward ({} "
                  "then {}); the recompute would use other weights", module_->type_name(), parameters_.size(),
                  now.size());
  }

  Module* module_;
  std::weak_ptr<const void> module_alive_;
  bool training_;
  TensorList inputs_;
  TensorList parameters_;
  GeneratorPosition generator_;
  Shape output_shape_;
  std::unique_ptr<autograd::RecomputeMemo> memo_;  // selective checkpointing's kept outputs; null under full
};

}  // namespace

Tensor checkpointed_forward(Module& module, const TensorList& inputs) {
  TensorList parameters = autograd::GradMode::is_enabled() ? trainable_tensors(module) : TensorList{};
  const bool inputs_want_grad = autograd::any_requires_grad(inputs);
  if (!inputs_want_grad && parameters.empty()) return module.forward_inputs(inputs);  // nothing to differentiate

  const GeneratorPosition generator = GeneratorPosition::now();
  std::unique_ptr<autograd::RecomputeMemo> memo;
  if (module.activation_checkpointing_mode() == Checkpointing::selective) {
    memo = std::make_unique<autograd::RecomputeMemo>();
  }
  Tensor computed;
  {
    const autograd::NoGradGuard not_recorded;
    std::optional<autograd::MemoScope> keeping;
    if (memo) keeping.emplace(*memo, autograd::MemoScope::Role::record);
    computed = module.forward_inputs(inputs);
  }
  // A handle of its own: the forward may return an input itself, whose
  // history must not change.
  Tensor output = computed.detach();
  std::vector<autograd::Edge> edges;
  TensorList saved;
  saved.reserve(inputs.size());
  for (const Tensor& input : inputs) {
    if (input.defined() && input.requires_grad()) edges.push_back(autograd::gradient_edge(input));
    saved.push_back(input);
  }
  for (const Tensor& parameter : parameters) edges.push_back(autograd::gradient_edge(parameter));
  auto node = std::make_shared<CheckpointBackward>(module, std::move(saved), std::move(parameters), generator,
                                                   output.sizes(), std::move(memo));
  node->set_next_edges(std::move(edges));
  autograd::set_history(output, node);
  return output;
}

// ---- the policy ------------------------------------------------------------------------------

ActivationCheckpointPolicy ActivationCheckpointPolicy::parse(std::string_view text) {
  if (text == "off") return {};
  if (text == "full") return {.mode = Mode::full};
  if (text == "selective") return {.mode = Mode::selective};
  constexpr std::string_view every_prefix = "every:";
  if (text.starts_with(every_prefix)) {
    const std::string_view number = text.substr(every_prefix.size());
    int64_t k = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), k);
    const bool whole = error == std::errc() && end == number.data() + number.size();
    if (whole && k >= 1) return {.mode = Mode::every, .every = k};
  }
  fail("activation checkpointing: '{}' is not a policy; give off, full, every:K with K >= 1 (every:2 checkpoints "
       "every second block) or selective", text);
}

std::string ActivationCheckpointPolicy::str() const {
  switch (mode) {
    case Mode::off: return "off";
    case Mode::full: return "full";
    case Mode::every: return fmt::format("every:{}", every);
    case Mode::selective: return "selective";
  }
  return "off";
}

bool ActivationCheckpointPolicy::checkpoints(int64_t block_index) const {
  switch (mode) {
    case Mode::off: return false;
    case Mode::full:
    case Mode::selective: return true;
    case Mode::every: return (block_index + 1) % every == 0;
  }
  return false;
}

Checkpointing ActivationCheckpointPolicy::mode_of(int64_t block_index) const {
  if (!checkpoints(block_index)) return Checkpointing::off;
  return mode == Mode::selective ? Checkpointing::selective : Checkpointing::full;
}

int64_t apply_activation_checkpointing(const ModuleList& blocks, const ActivationCheckpointPolicy& policy) {
  int64_t turned_on = 0;
  for (int64_t index = 0; index < blocks.size(); ++index) {
    const Checkpointing mode = policy.mode_of(index);
    blocks[index].set_activation_checkpointing(mode);
    turned_on += mode != Checkpointing::off ? 1 : 0;
  }
  return turned_on;
}

}  // namespace tessera::nn
