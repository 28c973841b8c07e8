// The backward engine. One call is one pass (a GraphTask): count, for every
// node reachable from the roots, how many edges lead into it; deliver the
// root gradients; then repeatedly run the ready node with the highest
// sequence_nr (latest recorded first), summing what it returns into the
// input buffers of the nodes its edges point to. Callbacks queued during the
// pass run once at its end. Everything lives on the calling thread: each
// simulated rank runs its own engine, with no locks.
#include "autograd/engine.h"

#include <limits>
#include <queue>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace tessera::autograd {

namespace {

struct NodeState {
  std::shared_ptr<Node> node;  // keeps the node alive while its parents free their edges
  int dependencies = 0;        // edges into the node not yet delivered
  bool is_accumulator = false;
  bool needed = true;   // grad(): a captured gradient is at or below this node
  bool execute = true;  // grad(): run apply (false for capture-only nodes)
  TensorList inputs;    // gradient of each output of the node, summed over consumers
  std::vector<std::pair<uint32_t, size_t>> captures;  // grad(): (output_nr, result slot)
};

struct GraphTask {
  bool retain_graph = false;
  bool accumulate = true;  // false for grad(): leaves' .grad stay untouched
  std::unordered_map<Node*, NodeState> states;
  std::vector<std::function<void()>> callbacks;
  TensorList captured;  // grad(): one gradient per input
};

thread_local GraphTask* current_task = nullptr;

// Makes `task` the pass that queue_callback talks to, restoring the outer one
// (a backward run from inside a hook) on exit, exceptions included.
class CurrentTaskScope {
 public:
  explicit CurrentTaskScope(GraphTask* task) : previous_(current_task) { current_task = task; }
  ~CurrentTaskScope() { current_task = previous_; }
  CurrentTaskScope(const CurrentTaskScope&) = delete;
  CurrentTaskScope& operator=(const CurrentTaskScope&) = delete;

 private:
  GraphTask* previous_;
};

struct ReadyNode {
  uint64_t priority;
  uint64_t sequence_nr;
  NodeState* state;
  bool operator<(const ReadyNode& other) const {
    return priority != other.priority ? priority < other.priority : sequence_nr < other.sequence_nr;
  }
};

using ReadyQueue = std::priority_queue<ReadyNode>;

// AccumulateGrad runs as soon as it is ready, so a leaf's post-accumulate
// hooks (FSDP's reduce-scatter trigger) fire as early as possible.
uint64_t priority_of(const NodeState& state) {
  return state.is_accumulator ? std::numeric_limits<uint64_t>::max() : state.node->sequence_nr();
}

// Counts the edges into every node reachable from the roots (root edges
// included). Returns the nodes in post-order (children before parents) when
// grad() needs it.
std::vector<Node*> count_dependencies(GraphTask& task, const std::vector<Edge>& root_edges) {
  std::vector<Node*> post_order;
  std::vector<std::pair<Node*, size_t>> stack;  // (node, next edge to look at)
  auto visit = [&](const std::shared_ptr<Node>& node) {
    auto [it, inserted] = task.states.try_emplace(node.get());
    it->second.dependencies++;
    if (inserted) {
      it->second.node = node;
      it->second.is_accumulator = dynamic_cast<AccumulateGrad*>(node.get()) != nullptr;
      stack.emplace_back(node.get(), 0);
    }
  };
  for (const Edge& edge : root_edges) {
    if (edge.is_valid()) visit(edge.node);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      const auto& edges = node->next_edges();
      if (next < edges.size()) {
        const Edge& child = edges[next++];
        if (child.is_valid()) visit(child.node);
      } else {
        if (!task.accumulate) post_order.push_back(node);
        stack.pop_back();
      }
    }
  }
  return post_order;
}

// grad(): a node runs only when a captured gradient lies below it. A node
// freed by an earlier pass has lost its edges, so what lies below is unknown:
// it is marked to run, which reports the freed graph.
void mark_needed(GraphTask& task, const std::vector<Node*>& post_order) {
  for (Node* node : post_order) {
    NodeState& state = task.states.at(node);
    bool below = node->is_released();
    for (const Edge& edge : node->next_edges()) {
      if (edge.is_valid() && task.states.at(edge.node.get()).needed) below = true;
    }
    state.execute = below;
    state.needed = below || !state.captures.empty();
  }
}

void accumulate_into(Tensor& buffer, Tensor&& grad) {
  if (!buffer.defined()) {
    buffer = std::move(grad);
    return;
  }
  // Add in place only into a buffer nobody else can see.
  const bool exclusive = buffer.impl_ptr().use_count() == 1 && buffer.storage().use_count() == 1 &&
                         buffer.is_contiguous() && buffer.sizes() == grad.sizes() && buffer.dtype() == grad.dtype();
  if (exclusive) {
    ops::add_(buffer, grad);
  } else {
    buffer = ops::add(buffer, grad);
  }
}

void deliver(GraphTask& task, ReadyQueue& ready, const Edge& edge, Tensor&& grad) {
  NodeState& state = task.states.at(edge.node.get());
  if (grad.defined() && state.needed) {
    if (state.inputs.empty()) state.inputs.resize(state.node->num_outputs());
    TESSERA_CHECK(edge.input_nr < state.inputs.size(), "backward: gradient for output {} of {}, which has {} outputs",
                  edge.input_nr, state.node->name(), state.inputs.size());
    accumulate_into(state.inputs[edge.input_nr], std::move(grad));
  }
  if (--state.dependencies == 0 && state.needed) ready.push({priority_of(state), state.node->sequence_nr(), &state});
}

void run_output_hooks(Node& node, TensorList& grads) {
  auto hooks = node.output_hooks();  // a hook may remove itself
  for (auto& [id, output_nr, hook] : hooks) {
    if (output_nr >= grads.size() || !grads[output_nr].defined()) continue;
    Tensor replaced = hook(grads[output_nr]);
    if (!replaced.defined()) continue;
    TESSERA_CHECK(replaced.sizes() == grads[output_nr].sizes(),
                  "backward: a tensor hook on output {} of {} returned shape {} for a gradient of shape {}", output_nr,
                  node.name(), replaced.sizes(), grads[output_nr].sizes());
    grads[output_nr] = std::move(replaced);
  }
}

void run_pre_hooks(Node& node, TensorList& grads) {
  auto hooks = node.pre_hooks();
  for (auto& [id, hook] : hooks) {
    TensorList replaced = hook(grads);
    if (replaced.empty()) continue;
    TESSERA_CHECK(replaced.size() == grads.size(), "backward: a pre-hook of {} returned {} gradients for {} outputs",
                  node.name(), replaced.size(), grads.size());
    grads = std::move(replaced);
  }
}

void run_node(GraphTask& task, ReadyQueue& ready, NodeState& state) {
  Node& node = *state.node;
  TensorList grads = std::move(state.inputs);
  grads.resize(node.num_outputs());
  if (state.execute) {
    TESSERA_CHECK(!node.is_released(),
                  "backward: {} was freed by an earlier backward pass (its saved tensors and edges are gone); pass "
                  "retain_graph = true to the first backward to run backward through the graph twice",
                  node.name());
  }
  if (!node.output_hooks().empty()) run_output_hooks(node, grads);
  for (auto [output_nr, slot] : state.captures) task.captured[slot] = grads[output_nr];
  if (!state.execute) return;
  if (!node.pre_hooks().empty()) run_pre_hooks(node, grads);

  bool any_defined = false;
  for (const Tensor& grad : grads) any_defined = any_defined || grad.defined();
  TensorList results;
  if (any_defined) results = node.apply(std::move(grads));

  const auto& edges = node.next_edges();
  TESSERA_CHECK(results.empty() || results.size() == edges.size(),
                "backward: {} returned {} gradients for {} inputs", node.name(), results.size(), edges.size());
  for (size_t i = 0; i < edges.size(); ++i) {
    if (!edges[i].is_valid()) continue;
    deliver(task, ready, edges[i], results.empty() ? Tensor() : std::move(results[i]));
  }
  if (!task.retain_graph && !state.is_accumulator) node.release();
}

void run_callbacks(GraphTask& task) {
  // Index loop: a callback may queue another one, which runs in this pass too.
  for (size_t i = 0; i < task.callbacks.size(); ++i) {
    std::function<void()> callback = std::move(task.callbacks[i]);
    callback();
  }
}

// Runs one pass. For grad(), `input_edges` name where the wanted gradients
// arrive; they are captured there and only the nodes above them run.
void execute(GraphTask& task, const std::vector<Edge>& root_edges, TensorList& root_grads,
             const std::vector<Edge>& input_edges) {
  NoGradGuard no_grad;  // backward formulas compute; they record nothing
  CurrentTaskScope scope(&task);
  const std::vector<Node*> post_order = count_dependencies(task, root_edges);
  if (!task.accumulate) {
    for (size_t i = 0; i < input_edges.size(); ++i) {
      auto it = task.states.find(input_edges[i].node.get());
      if (it != task.states.end()) it->second.captures.emplace_back(input_edges[i].input_nr, i);
    }
    mark_needed(task, post_order);
  }

  ReadyQueue ready;
  for (size_t i = 0; i < root_edges.size(); ++i) deliver(task, ready, root_edges[i], std::move(root_grads[i]));
  while (!ready.empty()) {
    NodeState& state = *ready.top().state;
    ready.pop();
    run_node(task, ready, state);
  }
  run_callbacks(task);
}

// The gradient a root starts with: ones for a one-element root, else the
// given one (checked against the root's shape, cast to its dtype).
Tensor root_gradient(const Tensor& root, const Tensor& given, size_t index, const char* op) {
  if (!given.defined()) {
    TESSERA_CHECK(root.numel() == 1,
                  "{}: output {} has shape {}; a gradient can be implied only for a one-element output, pass one "
                  "explicitly",
                  op, index, root.sizes());
    return ops::ones_like(root);
  }
  TESSERA_CHECK(given.sizes() == root.sizes(), "{}: gradient {} has shape {} but output {} has shape {}", op, index,
                given.sizes(), index, root.sizes());
  return ops::to(given, root.dtype());
}

std::vector<Edge> root_edges_of(const TensorList& roots, const char* op) {
  std::vector<Edge> edges;
  edges.reserve(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    TESSERA_CHECK(roots[i].defined(), "{}: output {} is an undefined tensor", op, i);
    Edge edge = gradient_edge(roots[i]);
    TESSERA_CHECK(edge.is_valid(),
                  "{}: output {} does not require grad and has no grad_fn (was it computed under NoGradGuard, or "
                  "from tensors that do not require grad?)",
                  op, i);
    edges.push_back(std::move(edge));
  }
  return edges;
}

TensorList root_gradients(const TensorList& roots, const TensorList& given, const char* op) {
  TESSERA_CHECK(given.empty() || given.size() == roots.size(), "{}: {} gradients given for {} outputs", op,
                given.size(), roots.size());
  NoGradGuard no_grad;  // a given gradient is data here, even one that requires grad: backward records nothing
  TensorList grads;
  grads.reserve(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) grads.push_back(root_gradient(roots[i], given.empty() ? Tensor() : given[i], i, op));
  return grads;
}

}  // namespace

void backward(const TensorList& roots, const TensorList& grad_roots, BackwardOptions options) {
  TESSERA_CHECK(!roots.empty(), "backward: no outputs given");
  const std::vector<Edge> edges = root_edges_of(roots, "backward");
  TensorList grads = root_gradients(roots, grad_roots, "backward");
  GraphTask task;
  task.retain_graph = options.retain_graph;
  execute(task, edges, grads, {});
}

void backward(const Tensor& root, const Tensor& grad_root, BackwardOptions options) {
  backward(TensorList{root}, grad_root.defined() ? TensorList{grad_root} : TensorList{}, options);
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                BackwardOptions options) {
  TESSERA_CHECK(!outputs.empty(), "grad: no outputs given");
  const std::vector<Edge> edges = root_edges_of(outputs, "grad");
  TensorList grads = root_gradients(outputs, grad_outputs, "grad");

  GraphTask task;
  task.retain_graph = options.retain_graph;
  task.accumulate = false;
  task.captured.resize(inputs.size());
  // Taken before the traversal, so that a leaf's AccumulateGrad exists and
  // the traversal meets it.
  std::vector<Edge> input_edges;
  input_edges.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TESSERA_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "grad: input {} does not require grad", i);
    input_edges.push_back(gradient_edge(inputs[i]));
  }
  execute(task, edges, grads, input_edges);
  return std::move(task.captured);
}

void queue_callback(std::function<void()> callback) {
  TESSERA_CHECK(current_task != nullptr, "queue_callback: no backward pass is running on this thread");
  current_task->callbacks.push_back(std::move(callback));
}

bool in_backward() { return current_task != nullptr; }

}  // namespace tessera::autograd
