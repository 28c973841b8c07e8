// The memo of selective activation checkpointing, and its thread's scopes.
#include "autograd/recompute_memo.h"

#include <fmt/format.h>

#include "tensor/error.h"

namespace tessera::autograd {

namespace {

thread_local RecomputeMemo* thread_recording = nullptr;
thread_local RecomputeMemo* thread_replaying = nullptr;

std::string describe_call(MemoizedOp op, const std::vector<Shape>& input_shapes) {
  return fmt::format("{}({})", memoized_op_name(op), fmt::join(input_shapes, ", "));
}

}  // namespace

const char* memoized_op_name(MemoizedOp op) {
  switch (op) {
    case MemoizedOp::matmul: return "matmul";
    case MemoizedOp::linear: return "linear";
    case MemoizedOp::attention: return "scaled_dot_product_attention";
  }
  return "?";
}

std::vector<Shape> shapes_of(std::initializer_list<const Tensor*> inputs) {
  std::vector<Shape> shapes;
  shapes.reserve(inputs.size());
  for (const Tensor* input : inputs) shapes.push_back(input->defined() ? input->sizes() : Shape{});
  return shapes;
}

void RecomputeMemo::append(MemoizedOp op, std::vector<Shape> input_shapes, TensorList outputs) {
  entries_.push_back({op, std::move(input_shapes), std::move(outputs)});
}

TensorList RecomputeMemo::take(MemoizedOp op, const std::vector<Shape>& input_shapes) {
  TESSERA_CHECK(next_ < entries_.size(),
                "selective activation checkpointing: the recompute called {}, but the forward called only {} "
                "memoized ops; a checkpointed forward must call the same ops on the same shapes again",
                describe_call(op, input_shapes), entries_.size());
  Entry& entry = entries_[next_];
  TESSERA_CHECK(entry.op == op && entry.input_shapes == input_shapes,
                "selective activation checkpointing: the recompute's memoized op {} is {}, but the forward's was "
                "{}; a checkpointed forward must call the same ops on the same shapes again",
                next_ + 1, describe_call(op, input_shapes), describe_call(entry.op, entry.input_shapes));
  ++next_;
  return std::move(entry.outputs);  // the replay's graph holds them from here
}

void RecomputeMemo::check_all_taken(const char* module_name) const {
  TESSERA_CHECK(next_ == entries_.size(),
                "selective activation checkpointing: {}'s recompute called {} memoized ops, but its forward called "
                "{}; a checkpointed forward must call the same ops on the same shapes again",
                module_name, next_, entries_.size());
}

RecomputeMemo* recording_memo() { return thread_recording; }
RecomputeMemo* replaying_memo() { return thread_replaying; }

MemoScope::MemoScope(RecomputeMemo& memo, Role role)
    : previous_recording_(thread_recording), previous_replaying_(thread_replaying) {
  thread_recording = role == Role::record ? &memo : nullptr;
  thread_replaying = role == Role::replay ? &memo : nullptr;
}

MemoScope::~MemoScope() {
  thread_recording = previous_recording_;
  thread_replaying = previous_replaying_;
}

}  // namespace tessera::autograd
