// Loss parallel against one rank: the loss and each rank's gradient columns
// equal ops::cross_entropy's on the whole logits (f64 to 1e-12, f32 to its
// rounding), on 1, 2, 3 and 8 ranks with uneven (97 classes) and empty
// shares (5 classes over 8) and ignored rows; the gradient against central
// finite differences of the parallel loss itself; three all-reduces in the
// forward and none in the backward; the errors.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "dist/backends/local_backend.h"
#include "dist/dtensor.h"
#include "tensor/ops.h"
#include "tp/loss_parallel.h"

using namespace tessera;
namespace ops = tessera::ops;

namespace {

dist::LocalOptions loss_options() {
  dist::LocalOptions options;
  options.group.timeout = std::chrono::seconds(20);
  return options;
}

// Logits spread wide enough that the max shift matters, equal on every rank.
Tensor wide_logits(int64_t rows, int64_t classes, DType dtype) {
  return ops::to(ops::mul(ops::randn({rows, classes}, PhiloxKey{.seed = 21, .stream = 4}, {.dtype = DType::f64}), 6.0),
                 dtype);
}

// Targets with every third row ignored (-100).
Tensor targets_for(int64_t rows, int64_t classes) {
  std::vector<int64_t> targets;
  for (int64_t row = 0; row < rows; ++row) targets.push_back(row % 3 == 2 ? -100 : (row * 37 + 11) % classes);
  return ops::from_vector(targets, {rows});
}

Tensor columns_of(const Tensor& full, int64_t ranks, int64_t rank) {
  const dist::ShardExtent share = dist::shard_extent(full.size(1), ranks, rank);
  return ops::contiguous(ops::narrow(full, 1, share.offset, share.length));
}

std::vector<double> values(const Tensor& t) { return ops::to(t.detach(), DType::f64).to_vector<double>(); }

// The parallel loss and this rank's gradient columns against ops::cross_entropy
// on the whole logits, on `world` ranks.
void check_against_one_rank(int world, int64_t rows, int64_t classes, DType dtype, double tolerance) {
  const Tensor full = wide_logits(rows, classes, dtype);
  const Tensor targets = targets_for(rows, classes);
  Tensor whole = ops::clone(full);
  whole.set_requires_grad(true);
  const Tensor reference = tessera::cross_entropy(whole, targets);
  autograd::backward(reference);
  const double reference_loss = values(reference)[0];
  const Tensor reference_grad = whole.grad();

  dist::run_local(
      world,
      [&](const dist::ProcessGroupPtr& group) {
        INFO(world, " ranks, ", classes, " classes, ", dtype_name(dtype));
        Tensor local = columns_of(full, world, group->rank());
        local.set_requires_grad(true);
        const Tensor loss = tp::vocab_parallel_cross_entropy(local, targets, group, classes);
        CHECK(loss.dim() == 0);
        CHECK(std::abs(values(loss)[0] - reference_loss) <= tolerance * std::abs(reference_loss));
        autograd::backward(loss);
        const std::vector<double> mine = values(local.grad());
        const std::vector<double> wanted = values(columns_of(reference_grad, world, group->rank()));
        REQUIRE(mine.size() == wanted.size());
        for (size_t i = 0; i < mine.size(); ++i) {
          CAPTURE(i);
          CHECK(std::abs(mine[i] - wanted[i]) <= tolerance);
        }
      },
      loss_options());
}

}  // namespace

TEST_CASE("loss parallel: loss and gradient columns as one rank's cross-entropy, uneven and empty shares") {
  for (int world : {1, 2, 3, 8}) {
    check_against_one_rank(world, 7, 97, DType::f64, 1e-12);
    check_against_one_rank(world, 7, 5, DType::f64, 1e-12);  // over 8: three ranks hold no column
    check_against_one_rank(world, 7, 97, DType::f32, 2e-6);
  }
}

TEST_CASE("loss parallel: the gradient against finite differences of the parallel loss") {
  const int64_t rows = 4;
  const int64_t classes = 11;
  const Tensor targets = targets_for(rows, classes);
  for (int world : {2, 3}) {
    dist::run_local(
        world,
        [&](const dist::ProcessGroupPtr& group) {
          const std::vector<double> base = values(wide_logits(rows, classes, DType::f64));
          auto loss_at = [&](const std::vector<double>& logits) {
            const Tensor full = ops::from_vector(logits, {rows, classes}, {.dtype = DType::f64});
            return values(tp::vocab_parallel_cross_entropy(columns_of(full, world, group->rank()), targets, group,
                                                           classes))[0];
          };
          const double step = 1e-5;
          std::vector<double> numeric(base.size());
          for (size_t i = 0; i < base.size(); ++i) {
            std::vector<double> plus = base;
            std::vector<double> minus = base;
            plus[i] += step;
            minus[i] -= step;
            numeric[i] = (loss_at(plus) - loss_at(minus)) / (2 * step);
          }
          Tensor local = columns_of(ops::from_vector(base, {rows, classes}, {.dtype = DType::f64}), world, group->rank());
          local.set_requires_grad(true);
          autograd::backward(tp::vocab_parallel_cross_entropy(local, targets, group, classes));
          const std::vector<double> analytic = values(local.grad());
          const std::vector<double> wanted =
              values(columns_of(ops::from_vector(numeric, {rows, classes}, {.dtype = DType::f64}), world, group->rank()));
          REQUIRE(analytic.size() == wanted.size());
          for (size_t i = 0; i < analytic.size(); ++i) {
            CAPTURE(i);
            CHECK(std::abs(analytic[i] - wanted[i]) <= 1e-7);
          }
        },
        loss_options());
  }
}

TEST_CASE("loss parallel: three all-reduces of one value a row, none in the backward") {
  dist::run_local(
      3,
      [](const dist::ProcessGroupPtr& group) {
        Tensor local = columns_of(wide_logits(6, 97, DType::f32), 3, group->rank());
        local.set_requires_grad(true);
        group->reset_stats();
        const Tensor loss = tp::vocab_parallel_cross_entropy(local, targets_for(6, 97), group, 97);
        const dist::CommStats forward = group->stats();
        CHECK(forward[dist::CollectiveKind::all_reduce].calls == 3);
        CHECK(forward.total().calls == 3);
        // 6 rows of 4 bytes, three times: 2(N-1)/N of 24 bytes each way each time.
        CHECK(forward[dist::CollectiveKind::all_reduce].bytes_sent == 3 * 2 * 2 * 24 / 3);
        autograd::backward(loss);
        CHECK(group->stats().total().calls == 3);
      },
      loss_options());
}

TEST_CASE("loss parallel: errors name what was wrong") {
  dist::run_local(
      2,
      [](const dist::ProcessGroupPtr& group) {
        const Tensor targets = targets_for(4, 9);
        const Tensor local = columns_of(wide_logits(4, 9, DType::f32), 2, group->rank());
        // 9 columns split 5 | 4, where 12 columns would be 6 | 6: both ranks refuse.
        const std::string held = group->rank() == 0 ? "rank 0 of 2 holds 5 logit columns, but its share of 12 "
                                                      "columns is 6 (columns 0 to 6)"
                                                    : "rank 1 of 2 holds 4 logit columns, but its share of 12 "
                                                      "columns is 6 (columns 6 to 12)";
        CHECK_THROWS_WITH_AS(tp::vocab_parallel_cross_entropy(local, targets, group, 12),
                             ("vocab_parallel_cross_entropy: " + held).c_str(), Error);
        CHECK_THROWS_WITH_AS(
            tp::vocab_parallel_cross_entropy(local, ops::from_vector(std::vector<int64_t>{0, 1, 9, 2}, {4}), group, 9),
            "vocab_parallel_cross_entropy: target 9 of row 2 is outside [0, 9) and is not ignore_index -100", Error);
        CHECK_THROWS_WITH_AS(tp::vocab_parallel_cross_entropy(local, ops::from_vector(std::vector<int64_t>{0, 1}, {2}),
                                                              group, 9),
                             "vocab_parallel_cross_entropy: targets must be [4] like the logits' rows, got [2]", Error);
        CHECK_THROWS_WITH_AS(tp::vocab_parallel_cross_entropy(ops::to(local, DType::i64), targets, group, 9),
                             "vocab_parallel_cross_entropy: logits must be floating, got i64", Error);
        CHECK_THROWS_WITH_AS(tp::vocab_parallel_cross_entropy(local, targets, nullptr, 9),
                             "vocab_parallel_cross_entropy: the group is null", Error);
        CHECK_THROWS_WITH_AS(tp::vocab_parallel_cross_entropy(local, targets, group, 0),
                             "vocab_parallel_cross_entropy: classes must be >= 1, got 0", Error);
      },
      loss_options());
}

TEST_CASE("loss parallel: bf16 logits are computed on in f32, their gradient comes back in bf16") {
  dist::run_local(
      2,
      [](const dist::ProcessGroupPtr& group) {
        const Tensor full = ops::to(wide_logits(6, 29, DType::f32), DType::bf16);
        const Tensor targets = targets_for(6, 29);
        Tensor low = columns_of(full, 2, group->rank());
        low.set_requires_grad(true);
        Tensor widened = ops::to(columns_of(full, 2, group->rank()), DType::f32);  // the same values in f32
        widened.set_requires_grad(true);
        const Tensor loss = tp::vocab_parallel_cross_entropy(low, targets, group, 29);
        const Tensor reference = tp::vocab_parallel_cross_entropy(widened, targets, group, 29);
        CHECK(loss.dtype() == DType::f32);
        CHECK(values(loss) == values(reference));
        autograd::backward(loss);
        autograd::backward(reference);
        CHECK(low.grad().dtype() == DType::bf16);
        CHECK(values(low.grad()) == values(ops::to(widened.grad(), DType::bf16)));
      },
      loss_options());
}
