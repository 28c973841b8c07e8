// Selective activation checkpointing's memo: the outputs of the costly ops
// (GEMMs and attention), kept from a checkpointed forward so that its
// recompute in backward takes them instead of computing them again.
//
// A checkpointed forward runs with recording off and the memo open to record:
// each memoizable op computes as usual and appends its outputs to the memo.
// The replay in backward runs the same forward with recording on and the
// memo open to replay: each memoizable op takes the next entry instead of
// computing, and records its backward node on the replay's inputs as usual.
// Everything between those ops (norms, activations, dropout, residual adds,
// copies) is recomputed, so the memo is all a selective block holds besides
// its input. The values handed out are the forward's own, and the replay's
// other values are recomputed from them bit for bit, so gradients equal
// those without checkpointing, bitwise.
//
// Entries are matched by position; each names its op and its inputs' shapes,
// and a replay that calls another op, or one on other shapes, is an error.
// One exception to "every GEMM's output is kept": linear_gelu_linear keeps
// only its second product (a memoized linear). Its first product comes out of the GEMM together
// with the GELU of the unrounded sum (cuBLASLt's GELU_AUX epilogue), which a
// separate GELU of the stored product does not reproduce bit for bit, and
// keeping both would hold 8 values a row of its input, half of what the
// whole GPT block holds; so the replay runs that one GEMM again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "autograd/node.h"

namespace tessera::autograd {

enum class MemoizedOp { matmul, linear, attention };
const char* memoized_op_name(MemoizedOp op);

class RecomputeMemo {
 public:
  void append(MemoizedOp op, std::vector<Shape> input_shapes, TensorList outputs);
  // The next entry's outputs, moved out; an error naming both calls where
  // the entry is not `op` on `input_shapes`, or there is none.
  TensorList take(MemoizedOp op, const std::vector<Shape>& input_shapes);
  // An error where the replay left entries untaken: it called fewer ops.
  void check_all_taken(const char* module_name) const;

 private:
  struct Entry {
    MemoizedOp op;
    std::vector<Shape> input_shapes;
    TensorList outputs;
  };
  std::vector<Entry> entries_;
  size_t next_ = 0;
};

// The thread's memo being recorded or replayed, or null.
RecomputeMemo* recording_memo();
RecomputeMemo* replaying_memo();

// Opens `memo` on this thread for a scope, to record into (the checkpointed
// forward) or to replay from (the recompute); the scope before it is
// restored after, so a scope nests inside another.
class MemoScope {
 public:
  enum class Role { record, replay };
  MemoScope(RecomputeMemo& memo, Role role);
  ~MemoScope();
  MemoScope(const MemoScope&) = delete;
  MemoScope& operator=(const MemoScope&) = delete;

 private:
  RecomputeMemo* previous_recording_;
  RecomputeMemo* previous_replaying_;
};

std::vector<Shape> shapes_of(std::initializer_list<const Tensor*> inputs);

// What a memoizable op calls: compute() under no memo or a recording one
// (which keeps its outputs), the memo's entry under a replaying one.
template <typename Compute>
TensorList memoized(MemoizedOp op, std::initializer_list<const Tensor*> inputs, Compute&& compute) {
  if (RecomputeMemo* replay = replaying_memo()) return replay->take(op, shapes_of(inputs));
  TensorList outputs = std::forward<Compute>(compute)();
  if (RecomputeMemo* record = recording_memo()) record->append(op, shapes_of(inputs), outputs);
  return outputs;
}

}  // namespace tessera::autograd
