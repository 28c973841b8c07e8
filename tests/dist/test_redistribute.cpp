// redistribute: every move between Replicate, Shard(0), Shard(1) and Partial
// on 1-D meshes of 1, 2, 3 and 8 ranks and on 2-D and 3-D meshes (nested
// shards of one tensor dim among them), bit for bit on integer-valued data
// with uneven (97 over 2, 3 and 8) and empty pieces (3 over 8); the one
// collective each single move costs; the gradient of every move against
// finite differences of a loss summed over the ranks, with the gradient laid
// out each way it may be; and the errors.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "autograd/engine.h"
#include "dist/backends/local_backend.h"
#include "dist/redistribute.h"
#include "tensor/ops.h"
#include "tests/dist/dtensor_pieces.h"

using namespace tessera;
using namespace tessera::dist;
namespace ops = tessera::ops;
using tessera::testing::same_bits;
using tessera::testing::slice_of;

namespace {

LocalOptions redistribute_options() {
  LocalOptions options;
  options.group.timeout = std::chrono::seconds(20);
  return options;
}

// Integers in [-40, 40] as f64, a function of (seed, element index) alone, so
// equal on every rank: sums of them are exact in any order, so results are
// compared bit for bit whatever order a collective adds in.
Tensor integer_values(const Shape& shape, uint64_t seed) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) {
    const uint64_t mixed = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
    values[i] = static_cast<double>(static_cast<int64_t>((mixed >> 29) % 81) - 40);
  }
  return ops::from_vector(values, shape, {.dtype = DType::f64});
}

std::string names_of(const Placements& placements) {
  std::vector<std::string> names;
  for (const Placement& placement : placements) names.push_back(placement_name(placement));
  return fmt::format("({})", fmt::join(names, ", "));
}

bool is_partial_placement(const Placement& placement) { return std::holds_alternative<Partial>(placement); }

// This rank's piece of `full` under `placements`, with Partial mesh dims
// holding terms that sum to it: every rank whose Partial coordinates are not
// all 0 holds integer terms of its own, and the all-0 one holds the rest.
Tensor partial_piece(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  const LocalPiece piece = local_piece(full.sizes(), mesh.shape(), mesh.coordinate(), placements);
  std::vector<int64_t> partial_dims;
  for (size_t m = 0; m < placements.size(); ++m) {
    if (is_partial_placement(placements[m])) partial_dims.push_back(static_cast<int64_t>(m));
  }
  // Every combination of Partial coordinates, as one index; 0 is all zeros.
  int64_t combinations = 1;
  int64_t mine = 0;
  for (int64_t m : partial_dims) {
    mine = mine * mesh.size(m) + mesh.coordinate(m);
    combinations *= mesh.size(m);
  }
  auto term = [&](int64_t combination) {
    return integer_values(full.sizes(), 1000 + static_cast<uint64_t>(combination));
  };
  Tensor value;
  if (mine != 0) {
    value = term(mine);
  } else {
    value = ops::clone(full);
    for (int64_t other = 1; other < combinations; ++other) value = ops::sub(value, term(other));
  }
  return slice_of(value, piece);
}

// Every list of `mesh_ndim` placements drawn from `alphabet` (by default
// Replicate, Shard(0), Shard(1) and Partial).
std::vector<Placements> all_placements(int64_t mesh_ndim,
                                       const std::vector<Placement>& alphabet = {Replicate{}, Shard{0}, Shard{1},
                                                                                 Partial{}}) {
  const std::vector<Placement>& one = alphabet;
  std::vector<Placements> lists{{}};
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> longer;
    for (const Placements& list : lists) {
      for (const Placement& placement : one) {
        Placements next = list;
        next.push_back(placement);
        longer.push_back(next);
      }
    }
    lists = longer;
  }
  return lists;
}

// Moves `full` from every placement list to every other on a mesh of
// `mesh_shape` over `world` thread ranks: the result is this rank's piece
// (its terms summing to the value where Partial), never the input's storage.
void check_every_move(int world, const Shape& mesh_shape, const Shape& shape,
                      const std::vector<Placement>& alphabet = {Replicate{}, Shard{0}, Shard{1}, Partial{}}) {
  run_local(
      world,
      [&](const ProcessGroupPtr& group) {
        const DeviceMesh mesh(group, kCPU, mesh_shape);
        const Tensor full = integer_values(shape, 7);
        const std::vector<Placements> lists = all_placements(mesh.ndim(), alphabet);
        for (const Placements& from : lists) {
          const DTensor source(partial_piece(full, mesh, from), mesh, from, shape);
          for (const Placements& to : lists) {
            INFO(names_of(from), " -> ", names_of(to), " of ", fmt::format("{}", shape), " on ", mesh.to_string());
            const DTensor moved = redistribute(source, to);
            CHECK(moved.placements() == to);
            CHECK(!moved.local().shares_storage_with(source.local()));
            const LocalPiece piece = local_piece(shape, mesh.shape(), mesh.coordinate(), to);
            CHECK(moved.local().sizes() == piece.shape);
            bool partial = false;
            for (const Placement& placement : to) partial = partial || is_partial_placement(placement);
            // Without a Partial dim the piece is the value's own slice; with
            // one, what the pieces sum to is checked by full_tensor.
            if (!partial) CHECK(same_bits(moved.local(), slice_of(full, piece)));
            CHECK(same_bits(moved.full_tensor(), full));
          }
        }
      },
      redistribute_options());
}

// The collectives of one move on a 1-D mesh, by kind.
struct MoveCost {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t all_reduces = 0;
};

MoveCost cost_of(const Placement& from, const Placement& to) {
  MoveCost cost;
  run_local(
      3,
      [&](const ProcessGroupPtr& group) {
        const DeviceMesh mesh(group, kCPU, {3});
        const DTensor source(partial_piece(integer_values({97, 2}, 5), mesh, {from}), mesh, {from}, {97, 2});
        mesh.group(0)->reset_stats();
        redistribute(source, {to});
        const CommStats stats = mesh.group(0)->stats();
        if (group->rank() == 0) {
          cost = {stats[CollectiveKind::all_gather].calls, stats[CollectiveKind::reduce_scatter].calls,
                  stats[CollectiveKind::all_reduce].calls};
        }
      },
      redistribute_options());
  return cost;
}

// The gradient of one move against central differences of the loss
//   L = sum over ranks of sum(w_r * y_r) / R
// where y_r is a rank's output piece, w_r its weights and R the number of
// ranks that hold each replicated value (mesh dims where both the output and
// its gradient are Replicate): replicas count once. Weights differ along mesh
// dims whose gradient is Partial (each rank uses the value its own way) and
// are equal along the others, so dL/dy is what `grad` says it is. Each rank's
// input gradient must be its piece of dL/dX, whole along Replicate and Partial
// mesh dims.
void check_gradient(int world, const Shape& mesh_shape, const Shape& shape, const Placements& from,
                    const Placements& to, const std::optional<Placements>& grad) {
  run_local(
      world,
      [&](const ProcessGroupPtr& group) {
        const DeviceMesh mesh(group, kCPU, mesh_shape);
        INFO(names_of(from), " -> ", names_of(to), " grad ", grad ? names_of(*grad) : "(default)", " of ",
             fmt::format("{}", shape), " on ", mesh.to_string());
        Placements grad_layout = grad.value_or(to);
        int64_t weight_seed = 0;
        int64_t replicas = 1;
        for (size_t m = 0; m < to.size(); ++m) {
          if (is_partial_placement(to[m])) grad_layout[m] = Replicate{};
          const auto dim = static_cast<int64_t>(m);
          if (is_partial_placement(grad_layout[m])) weight_seed = weight_seed * 16 + mesh.coordinate(dim) + 1;
          if (std::holds_alternative<Replicate>(grad_layout[m]) && std::holds_alternative<Replicate>(to[m])) {
            replicas *= mesh.size(dim);
          }
        }
        const LocalPiece out_piece = local_piece(shape, mesh.shape(), mesh.coordinate(), to);
        const Tensor weights =
            slice_of(ops::randn(shape, PhiloxKey{.seed = 3, .stream = static_cast<uint64_t>(weight_seed)},
                                {.dtype = DType::f64}),
                     out_piece);

        auto total_loss = [&](const Tensor& full) {
          const DTensor source(partial_piece(full, mesh, from), mesh, from, shape);
          const DTensor moved = redistribute(source, to, {.grad_placements = grad});
          Tensor loss = ops::sum(ops::mul(weights, moved.local()));
          loss = ops::div(ops::reshape(ops::contiguous(loss), {1}), static_cast<double>(replicas));
          mesh.group()->all_reduce(loss);
          return loss.to_vector<double>()[0];
        };

        // dL/dX by central differences, element by element (L is linear in
        // X, so a step of 1 is exact but for rounding).
        const Tensor full = integer_values(shape, 9);
        std::vector<double> numeric(static_cast<size_t>(shape_numel(shape)));
        std::vector<double> values = full.to_vector<double>();
        for (size_t i = 0; i < values.size(); ++i) {
          std::vector<double> plus = values;
          std::vector<double> minus = values;
          plus[i] += 1;
          minus[i] -= 1;
          numeric[i] = (total_loss(ops::from_vector(plus, shape, {.dtype = DType::f64})) -
                        total_loss(ops::from_vector(minus, shape, {.dtype = DType::f64}))) / 2;
        }
        const LocalPiece in_piece = local_piece(shape, mesh.shape(), mesh.coordinate(), from);
        const Tensor expected = slice_of(ops::from_vector(numeric, shape, {.dtype = DType::f64}), in_piece);

        Tensor input = partial_piece(full, mesh, from);
        input.set_requires_grad(true);
        const DTensor moved = redistribute(DTensor(input, mesh, from, shape), to, {.grad_placements = grad});
        // dL/dy: the weights themselves where replicated (each replica holds
        // the whole gradient, as every rank that computes the same loss gets
        // it), each rank's own term where Partial.
        autograd::backward(moved.local(), weights);
        REQUIRE(input.grad().defined());
        const std::vector<double> analytic = input.grad().to_vector<double>();
        const std::vector<double> wanted = expected.to_vector<double>();
        REQUIRE(analytic.size() == wanted.size());
        for (size_t i = 0; i < analytic.size(); ++i) {
          CAPTURE(i);
          CHECK(std::abs(analytic[i] - wanted[i]) <= 1e-9 * (1 + std::abs(wanted[i])));
        }
      },
      redistribute_options());
}

// What a gradient may be laid out as, for each output placement list: as the
// output, and with each Replicate dim read as Partial in turn.
std::vector<std::optional<Placements>> grad_layouts(const Placements& to) {
  std::vector<std::optional<Placements>> layouts{std::nullopt};
  for (size_t m = 0; m < to.size(); ++m) {
    if (!std::holds_alternative<Replicate>(to[m])) continue;
    Placements partial = to;
    for (Placement& placement : partial) {
      if (is_partial_placement(placement)) placement = Replicate{};
    }
    partial[m] = Partial{};
    layouts.push_back(partial);
  }
  return layouts;
}

}  // namespace

TEST_CASE("redistribute: every move on 1-D meshes of 1, 2, 3 and 8 ranks, uneven and empty pieces, bit for bit") {
  for (int world : {1, 2, 3, 8}) check_every_move(world, {world}, {97, 3});
}

TEST_CASE("redistribute: every move on 2x3 and 2x2x2 meshes, nested shards of one dim among them") {
  check_every_move(6, {2, 3}, {13, 5});
  // Three mesh dims over one tensor dim: 27 lists, every move between them.
  check_every_move(8, {2, 2, 2}, {9, 3}, {Replicate{}, Shard{0}, Partial{}});
}

TEST_CASE("redistribute: one move costs one collective, or none") {
  const auto check = [](const Placement& from, const Placement& to, MoveCost expected) {
    INFO(placement_name(from), " -> ", placement_name(to));
    const MoveCost cost = cost_of(from, to);
    CHECK(cost.all_gathers == expected.all_gathers);
    CHECK(cost.reduce_scatters == expected.reduce_scatters);
    CHECK(cost.all_reduces == expected.all_reduces);
  };
  check(Shard{0}, Replicate{}, {.all_gathers = 1});
  check(Partial{}, Replicate{}, {.all_reduces = 1});
  check(Partial{}, Shard{0}, {.reduce_scatters = 1});
  check(Partial{}, Shard{1}, {.reduce_scatters = 1});
  check(Replicate{}, Shard{1}, {});
  check(Replicate{}, Partial{}, {});
  check(Shard{0}, Shard{0}, {});
  check(Shard{0}, Shard{1}, {.all_gathers = 1});
}

TEST_CASE("redistribute: the gradient of every 1-D move, laid out each way it may be, against finite differences") {
  // 97 rows over 2 and 3 ranks (uneven); 13 x 3 over 8 (columns empty on 5 ranks).
  const std::vector<std::pair<int, Shape>> cases{{2, {97, 2}}, {3, {97, 2}}, {8, {13, 3}}};
  for (const auto& [world, shape] : cases) {
    for (const Placements& from : all_placements(1)) {
      for (const Placements& to : all_placements(1)) {
        for (const std::optional<Placements>& grad : grad_layouts(to)) {
          check_gradient(world, {world}, shape, from, to, grad);
        }
      }
    }
  }
}

TEST_CASE("redistribute: the gradient on a 2x2 mesh, nested shards and mixed layouts") {
  const std::vector<std::pair<Placements, Placements>> moves{
      {{Shard{0}, Shard{0}}, {Replicate{}, Replicate{}}}, {{Shard{0}, Shard{0}}, {Shard{0}, Replicate{}}},
      {{Replicate{}, Shard{0}}, {Shard{0}, Shard{0}}},    {{Partial{}, Partial{}}, {Shard{0}, Shard{1}}},
      {{Partial{}, Shard{1}}, {Shard{1}, Replicate{}}},   {{Shard{1}, Partial{}}, {Replicate{}, Shard{0}}},
      {{Partial{}, Replicate{}}, {Shard{0}, Shard{0}}},
  };
  for (const auto& [from, to] : moves) {
    for (const std::optional<Placements>& grad : grad_layouts(to)) check_gradient(4, {2, 2}, {7, 3}, from, to, grad);
  }
}

TEST_CASE("DTensor with Partial: distribute puts the value on coordinate 0, full_tensor sums") {
  run_local(
      3,
      [](const ProcessGroupPtr& group) {
        const DeviceMesh mesh(group, kCPU, {3});
        const Tensor full = integer_values({5, 2}, 4);
        const DTensor dtensor = distribute(full, mesh, {Partial{}});
        CHECK(placement_name(dtensor.placements()[0]) == "Partial(sum)");
        CHECK(same_bits(dtensor.local(), group->rank() == 0 ? full : ops::zeros({5, 2}, {.dtype = DType::f64})));
        CHECK(same_bits(dtensor.full_tensor(), full));
        const DTensor terms(partial_piece(full, mesh, {Partial{}}), mesh, {Partial{}}, {5, 2});
        CHECK(same_bits(terms.full_tensor(), full));
      },
      redistribute_options());
}

TEST_CASE("redistribute: errors name what was wrong") {
  run_local(
      2,
      [](const ProcessGroupPtr& group) {
        const DeviceMesh mesh(group, kCPU, {2});
        const DTensor dtensor = distribute(integer_values({4, 2}, 1), mesh, {Shard{0}});
        CHECK_THROWS_WITH_AS(redistribute(DTensor(), {Replicate{}}), "redistribute: the DTensor is undefined", Error);
        CHECK_THROWS_WITH_AS(redistribute(dtensor, {Replicate{}, Replicate{}}),
                             doctest::Contains("2 placements (Replicate(), Replicate()) for a 1-d mesh"), Error);
        CHECK_THROWS_WITH_AS(redistribute(dtensor, {Shard{2}}),
                             doctest::Contains("Shard(2) is out of range for a 2-d tensor"), Error);
        CHECK_THROWS_WITH_AS(
            redistribute(dtensor, {Replicate{}}, {.grad_placements = Placements{Shard{0}}}),
            "redistribute: grad placement Shard(0) on mesh dim 0 does not fit output placement Replicate() (a Shard "
            "output's gradient is sharded alike, a Replicate one's is Replicate or Partial, a Partial one's is "
            "Replicate)",
            Error);
        CHECK_THROWS_WITH_AS(redistribute(dtensor, {Partial{}}, {.grad_placements = Placements{Partial{}}}),
                             doctest::Contains("grad placement Partial(sum) on mesh dim 0 does not fit output "
                                               "placement Partial(sum)"),
                             Error);
        CHECK_THROWS_WITH_AS(redistribute(dtensor, {Shard{0}}, {.grad_placements = Placements{Shard{1}}}),
                             doctest::Contains("grad placement Shard(1) on mesh dim 0 does not fit output placement "
                                               "Shard(0)"),
                             Error);
        CHECK_THROWS_WITH_AS(redistribute(dtensor, {Replicate{}}, {.grad_placements = Placements{}}),
                             "redistribute: 0 grad_placements for 1 placements", Error);
        CHECK_THROWS_WITH_AS(redistribute_local(ops::zeros({3, 2}), mesh, {4, 2}, {Shard{0}}, {Replicate{}}),
                             doctest::Contains("redistribute: local shape [3, 2] is not the piece [2, 2]"), Error);
      },
      redistribute_options());
}
