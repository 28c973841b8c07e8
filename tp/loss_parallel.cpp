// Loss parallel: the three all-reduces of the forward, and a backward that
// needs none (each rank's softmax columns and one-hot mask are kept).
#include "tp/loss_parallel.h"

#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "dist/dtensor.h"
#include "tensor/ops.h"

namespace tessera::tp {

namespace {

using autograd::TensorList;

// Targets as host integers, checked: [0, classes) or ignore_index.
std::vector<int64_t> checked_targets(const Tensor& targets, int64_t rows, int64_t classes, int64_t ignore_index) {
  TESSERA_CHECK(targets.dim() == 1 && targets.size(0) == rows,
                "vocab_parallel_cross_entropy: targets must be [{}] like the logits' rows, got {}", rows,
                targets.sizes());
  TESSERA_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64,
                "vocab_parallel_cross_entropy: targets must be i32 or i64, got {}", dtype_name(targets.dtype()));
  std::vector<int64_t> values = ops::to(ops::to(targets, kCPU), DType::i64).to_vector<int64_t>();
  for (size_t row = 0; row < values.size(); ++row) {
    TESSERA_CHECK(values[row] == ignore_index || (values[row] >= 0 && values[row] < classes),
                  "vocab_parallel_cross_entropy: target {} of row {} is outside [0, {}) and is not ignore_index {}",
                  values[row], row, classes, ignore_index);
  }
  return values;
}

class VocabParallelCrossEntropy : public autograd::Function {
 public:
  VocabParallelCrossEntropy(Tensor targets, dist::ProcessGroupPtr group, int64_t classes, int64_t ignore_index,
                            int64_t columns)
      : targets_(std::move(targets)),
        group_(std::move(group)),
        classes_(classes),
        ignore_index_(ignore_index),
        columns_(columns) {}

  TensorList forward(autograd::FunctionContext& ctx, const TensorList& inputs) override {
    TESSERA_CHECK(inputs[0].dim() == 2, "vocab_parallel_cross_entropy: logits must be [N, local classes], got {}",
                  inputs[0].sizes());
    TESSERA_CHECK(is_floating(inputs[0].dtype()), "vocab_parallel_cross_entropy: logits must be floating, got {}",
                  dtype_name(inputs[0].dtype()));
    // bf16 and f16 logits (a bf16 run's head) are computed on in f32; the
    // gradient goes back in their own dtype.
    logits_dtype_ = inputs[0].dtype();
    const Tensor computed = compute_dtype(logits_dtype_) == logits_dtype_
                                ? inputs[0]
                                : ops::to(inputs[0], compute_dtype(logits_dtype_));
    const int64_t rows = computed.size(0);
    const int64_t columns = computed.size(1);
    const dist::ShardExtent mine = dist::shard_extent(columns_, group_->size(), group_->rank());
    TESSERA_CHECK(columns == mine.length,
                  "vocab_parallel_cross_entropy: rank {} of {} holds {} logit columns, but its share of {} columns "
                  "is {} (columns {} to {})",
                  group_->rank(), group_->size(), columns, columns_, mine.length, mine.offset,
                  mine.offset + mine.length);
    const std::vector<int64_t> targets = checked_targets(targets_, rows, classes_, ignore_index_);
    int64_t kept_rows = 0;
    for (int64_t target : targets) kept_rows += target != ignore_index_ ? 1 : 0;

    const TensorOptions like{.dtype = computed.dtype(), .device = computed.device()};
    const Shape matrix{rows, columns};
    const Tensor column_ids = ops::arange(static_cast<double>(mine.offset), static_cast<double>(mine.offset + columns),
                                          1.0, {.dtype = DType::i64, .device = computed.device()});
    // Padding columns (past the classes) take no part: -inf logits, zero
    // probability and zero gradient.
    const Tensor is_padding =
        ops::expand(ops::reshape(ops::ge(column_ids, static_cast<double>(classes_)), {1, columns}), matrix);
    const Tensor logits = columns_ == classes_ ? computed
                                               : ops::masked_fill(computed, is_padding,
                                                                  -std::numeric_limits<double>::infinity());
    // 1. The row maxima over every rank's columns (an empty share has none).
    Tensor row_max = columns > 0 ? ops::contiguous(ops::amax(logits, {1}))
                                 : ops::full({rows}, -std::numeric_limits<double>::infinity(), like);
    if (rows > 0) group_->all_reduce(row_max, dist::ReduceOp::max);
    // 2. The softmax's denominator.
    const Tensor exps = ops::exp(ops::sub(logits, ops::expand(ops::reshape(row_max, {rows, 1}), matrix)));
    Tensor denominator = columns > 0 ? ops::contiguous(ops::sum(exps, {1})) : ops::zeros({rows}, like);
    if (rows > 0) group_->all_reduce(denominator, dist::ReduceOp::sum);
    // 3. The target's logit, from the one rank whose columns hold it.
    const Tensor target_ids = ops::to(ops::to(targets_, DType::i64), logits.device());
    const Tensor one_hot = ops::eq(ops::expand(ops::reshape(target_ids, {rows, 1}), matrix),
                                   ops::expand(ops::reshape(column_ids, {1, columns}), matrix));
    Tensor target_logit = columns > 0
                              ? ops::contiguous(ops::sum(ops::where(one_hot, logits, ops::zeros(matrix, like)), {1}))
                              : ops::zeros({rows}, like);
    if (rows > 0) group_->all_reduce(target_logit, dist::ReduceOp::sum);

    const Tensor kept = ops::to(ops::ne(target_ids, static_cast<double>(ignore_index_)), logits.dtype());
    const Tensor row_loss = ops::sub(ops::add(ops::log(denominator), row_max), target_logit);
    const Tensor loss = ops::div(ops::sum(ops::mul(row_loss, kept)), static_cast<double>(kept_rows));

    // The backward's (softmax - one-hot) on kept rows, ready to scale.
    const Tensor softmax = ops::div(exps, ops::expand(ops::reshape(denominator, {rows, 1}), matrix));
    ctx.save_for_backward({ops::mul(ops::sub(softmax, ops::to(one_hot, logits.dtype())),
                                    ops::expand(ops::reshape(kept, {rows, 1}), matrix))});
    kept_rows_ = kept_rows;
    return {loss};
  }

  TensorList backward(autograd::FunctionContext& ctx, const TensorList& grads) override {
    const double scale = ops::to(grads[0], kCPU).to_vector<double>()[0] / static_cast<double>(kept_rows_);
    return {ops::to(ops::mul(ctx.saved()[0], scale), logits_dtype_)};
  }
  std::string name() const override { return "VocabParallelCrossEntropy"; }

 private:
  Tensor targets_;
  dist::ProcessGroupPtr group_;
  int64_t classes_;
  int64_t ignore_index_;
  int64_t columns_;
  int64_t kept_rows_ = 0;
  DType logits_dtype_ = DType::f32;
};

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    const dist::ProcessGroupPtr& group, int64_t classes, int64_t ignore_index,
                                    int64_t padded_classes) {
  TESSERA_CHECK(group != nullptr, "vocab_parallel_cross_entropy: the group is null");
  TESSERA_CHECK(classes >= 1, "vocab_parallel_cross_entropy: classes must be >= 1, got {}", classes);
  const int64_t columns = padded_classes == 0 ? classes : padded_classes;
  TESSERA_CHECK(columns >= classes, "vocab_parallel_cross_entropy: padded_classes ({}) is fewer than classes ({})",
                padded_classes, classes);
  TESSERA_CHECK(local_logits.defined() && targets.defined(),
                "vocab_parallel_cross_entropy: undefined logits or targets");
  return autograd::Function::apply<VocabParallelCrossEntropy>({local_logits}, targets, group, classes,
                                                              ignore_index, columns)[0];
}

}  // namespace tessera::tp
