// DTensor: ceil-chunk arithmetic (shard_extent, local_piece with nested
// sharding) against hand-worked figures, then distribute -> full_tensor round
// trips, bit for bit, on 1-D meshes of 1..8 ranks and on 2-D and 3-D meshes,
// with uneven and empty shards, three dtypes, meta tensors, and every error.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <limits>

#include "dist/backends/local_backend.h"
#include "dist/dtensor.h"
#include "tensor/ops.h"
#include "tests/dist/dtensor_pieces.h"

using namespace tessera;
using namespace tessera::dist;
namespace ops = tessera::ops;
using tessera::testing::same_bits;
using tessera::testing::slice_of;

namespace {

LocalOptions dtensor_options() {
  LocalOptions options;
  options.group.timeout = std::chrono::seconds(2);
  return options;
}

// Distinct-looking values in every dtype, equal on every rank (Philox is a
// function of the element index only).
Tensor sample(const Shape& shape, DType dtype) {
  if (dtype == DType::i64) {
    std::vector<int64_t> values(static_cast<size_t>(shape_numel(shape)));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>(i * 2654435761u) - (int64_t{1} << 40);
    return ops::from_vector(values, shape);
  }
  return ops::to(ops::randn(shape, PhiloxKey{.seed = 11, .stream = 3}), dtype);
}

std::string describe(const Shape& shape, const Placements& placements, DType dtype) {
  std::string text = fmt::format("global {} {} (", shape, dtype_name(dtype));
  for (const Placement& placement : placements) text += placement_name(placement) + " ";
  return text + ")";
}

// distribute keeps exactly this rank's slice (contiguous, same dtype), and
// full_tensor gives back the whole tensor bit for bit.
void check_round_trip(const DeviceMesh& mesh, const Placements& placements, const Shape& shape, DType dtype) {
  const std::string context = describe(shape, placements, dtype) + " on " + mesh.to_string();
  INFO(context);
  const Tensor full = sample(shape, dtype);
  const DTensor dtensor = distribute(full, mesh, placements);
  const LocalPiece piece = local_piece(shape, mesh.shape(), mesh.coordinate(), placements);
  CHECK(dtensor.global_shape() == shape);
  CHECK(dtensor.local().sizes() == piece.shape);
  CHECK(dtensor.local_offset() == piece.offset);
  CHECK(dtensor.local().strides() == contiguous_strides(piece.shape));
  CHECK(!dtensor.local().shares_storage_with(full));
  CHECK(dtensor.dtype() == dtype);
  CHECK(same_bits(dtensor.local(), slice_of(full, piece)));
  const Tensor whole = dtensor.full_tensor();
  CHECK(whole.strides() == contiguous_strides(shape));
  CHECK(same_bits(whole, full));
}

// Every Shard(d) of a tensor of `ndim` dims, and Replicate.
Placements one_dim_placements(int64_t ndim) {
  Placements placements{Replicate{}};
  for (int64_t d = 0; d < ndim; ++d) placements.push_back(Shard{d});
  return placements;
}

}  // namespace

TEST_CASE("shard_extent: ceil chunks, short and empty trailing shards") {
  // 97 rows on 8 ranks: chunk 13, seven full shards and one of 6.
  for (int64_t i = 0; i < 7; ++i) {
    CHECK(shard_extent(97, 8, i).offset == 13 * i);
    CHECK(shard_extent(97, 8, i).length == 13);
  }
  CHECK(shard_extent(97, 8, 7).offset == 91);
  CHECK(shard_extent(97, 8, 7).length == 6);
  // 3 rows on 8 ranks: chunk 1; ranks 3..7 hold nothing, at the end.
  for (int64_t i = 0; i < 8; ++i) {
    CHECK(shard_extent(3, 8, i).offset == std::min<int64_t>(i, 3));
    CHECK(shard_extent(3, 8, i).length == (i < 3 ? 1 : 0));
  }
  // 9 over 4: chunk 3 leaves rank 3 empty although 4 x 2 + 1 would fit.
  CHECK(shard_extent(9, 4, 2).offset == 6);
  CHECK(shard_extent(9, 4, 2).length == 3);
  CHECK(shard_extent(9, 4, 3).offset == 9);
  CHECK(shard_extent(9, 4, 3).length == 0);
  CHECK(shard_extent(0, 4, 2).offset == 0);
  CHECK(shard_extent(0, 4, 2).length == 0);
  CHECK(shard_extent(16, 4, 3).offset == 12);
  CHECK(shard_extent(16, 4, 3).length == 4);
  CHECK(shard_extent(5, 1, 0).length == 5);
  // The largest size does not overflow: 2^63 - 1 = 3 x 3074457345618258602 + 1.
  const int64_t big = std::numeric_limits<int64_t>::max();
  CHECK(shard_extent(big, 3, 2).offset == 2 * 3074457345618258603);
  CHECK(shard_extent(big, 3, 2).length == 3074457345618258601);
  CHECK(shard_extent(big, big, big - 1).offset == big - 1);
  CHECK(shard_extent(big, big, big - 1).length == 1);

  CHECK_THROWS_WITH_AS(shard_extent(-1, 4, 0), "shard_extent: size must be >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(shard_extent(8, 0, 0), "shard_extent: num_shards must be >= 1, got 0", Error);
  CHECK_THROWS_WITH_AS(shard_extent(8, 4, 4), "shard_extent: index 4 is outside [0, 4)", Error);
  CHECK_THROWS_WITH_AS(shard_extent(8, 4, -1), "shard_extent: index -1 is outside [0, 4)", Error);
}

TEST_CASE("local_piece: nested sharding splits the earlier piece again, in mesh-dim order") {
  // [10, 6] on a 2x3 mesh with (Shard(0), Shard(0)): rows split 5 | 5, then
  // each 5 splits 2, 2, 1.
  const Placements nested{Shard{0}, Shard{0}};
  const std::vector<int64_t> row_offsets = {0, 2, 4, 5, 7, 9};
  const std::vector<int64_t> row_lengths = {2, 2, 1, 2, 2, 1};
  for (int64_t r = 0; r < 6; ++r) {
    const LocalPiece piece = local_piece({10, 6}, {2, 3}, {r / 3, r % 3}, nested);
    CHECK(piece.shape == Shape{row_lengths[r], 6});
    CHECK(piece.offset == Shape{row_offsets[r], 0});
  }
  // (Shard(0), Shard(1)): rows 5 | 5, columns 2, 2, 2.
  CHECK(local_piece({10, 6}, {2, 3}, {1, 2}, {Shard{0}, Shard{1}}).shape == Shape{5, 2});
  CHECK(local_piece({10, 6}, {2, 3}, {1, 2}, {Shard{0}, Shard{1}}).offset == Shape{5, 4});
  // (Shard(1), Shard(0)) on [7, 5]: columns 3 | 2, then rows 3, 3, 1.
  CHECK(local_piece({7, 5}, {2, 3}, {1, 2}, {Shard{1}, Shard{0}}).shape == Shape{1, 2});
  CHECK(local_piece({7, 5}, {2, 3}, {1, 2}, {Shard{1}, Shard{0}}).offset == Shape{6, 3});
  // (Replicate, Shard(0)): only the second mesh dim splits.
  CHECK(local_piece({7, 5}, {2, 3}, {1, 1}, {Replicate{}, Shard{0}}).shape == Shape{3, 5});
  CHECK(local_piece({7, 5}, {2, 3}, {1, 1}, {Replicate{}, Shard{0}}).offset == Shape{3, 0});
  // 3 rows on 2x4 nested: 2 | 1, then 1,1,0,0 and 1,0,0,0; empty pieces sit at the end.
  CHECK(local_piece({3}, {2, 4}, {0, 2}, nested).shape == Shape{0});
  CHECK(local_piece({3}, {2, 4}, {0, 2}, nested).offset == Shape{2});
  CHECK(local_piece({3}, {2, 4}, {1, 0}, nested).offset == Shape{2});
  CHECK(local_piece({3}, {2, 4}, {1, 0}, nested).shape == Shape{1});
  CHECK(local_piece({3}, {2, 4}, {1, 3}, nested).offset == Shape{3});
  // A 0-d tensor can only be replicated.
  CHECK(local_piece({}, {4}, {3}, {Replicate{}}).shape == Shape{});

  CHECK_THROWS_WITH_AS(local_piece({10, 6}, {2, 3}, {0, 0}, {Shard{0}}),
                       "local_piece: 1 placements (Shard(0)) for a 2-d mesh of shape [2, 3]", Error);
  CHECK_THROWS_WITH_AS(local_piece({10, 6}, {2, 3}, {0, 3}, nested),
                       "local_piece: coordinate [0, 3] is outside a mesh of shape [2, 3]", Error);
  CHECK_THROWS_WITH_AS(local_piece({10, 6}, {2, 3}, {0}, nested),
                       "local_piece: coordinate [0] does not fit a mesh of shape [2, 3]", Error);
  CHECK_THROWS_WITH_AS(local_piece({10, 6}, {2, 3}, {0, 0}, {Shard{2}, Replicate{}}),
                       "local_piece: Shard(2) is out of range for a 2-d tensor of shape [10, 6]", Error);
  CHECK_THROWS_WITH_AS(local_piece({10, 6}, {2, 3}, {0, 0}, {Shard{-1}, Replicate{}}),
                       "local_piece: Shard(-1) is out of range for a 2-d tensor of shape [10, 6]", Error);
  CHECK_THROWS_WITH_AS(local_piece({10, -6}, {2, 3}, {0, 0}, nested),
                       "local_piece: global shape [10, -6] has a negative size", Error);
}

TEST_CASE("placement_name") {
  CHECK(placement_name(Replicate{}) == "Replicate()");
  CHECK(placement_name(Shard{0}) == "Shard(0)");
  CHECK(placement_name(Shard{3}) == "Shard(3)");
  CHECK(Placement{Shard{1}} == Placement{Shard{1}});
  CHECK(Placement{Shard{1}} != Placement{Replicate{}});
}

TEST_CASE("DTensor: 97 rows on 8 ranks hold 13 x 7 + 6 and gather back") {
  std::vector<Shape> local_shapes(8);
  std::vector<Shape> offsets(8);
  std::vector<std::string> descriptions(8);
  run_local(8, [&](const ProcessGroupPtr& world) {
    DeviceMesh mesh(world, kCPU, {8});
    const Tensor full = sample({97, 16}, DType::f32);
    const DTensor dtensor = distribute(full, mesh, {Shard{0}});
    local_shapes[world->rank()] = dtensor.local().sizes();
    offsets[world->rank()] = dtensor.local_offset();
    descriptions[world->rank()] = dtensor.to_string();
    CHECK(same_bits(dtensor.full_tensor(), full));
  });
  for (int r = 0; r < 7; ++r) {
    CHECK(local_shapes[r] == Shape{13, 16});
    CHECK(offsets[r] == Shape{13 * r, 0});
  }
  CHECK(local_shapes[7] == Shape{6, 16});
  CHECK(descriptions[7] ==
        "DTensor(global [97, 16], local [6, 16] at [91, 0], (Shard(0)), f32, "
        "DeviceMesh(cpu, (dim0=8), coordinate (7)))");
}

TEST_CASE("DTensor: round trips on 1-D meshes of 1..8 ranks, uneven and empty shards, f32/bf16/i64") {
  // [3, 5] on 4+ ranks leaves trailing ranks empty along either dim; [13, 7]
  // is uneven for most sizes; [0, 4] is empty everywhere; [2, 9, 3] sharded
  // on its middle dim exercises the move-to-front of the gather.
  const std::vector<Shape> shapes = {{3, 5}, {13, 7}, {0, 4}, {2, 9, 3}, {11}};
  for (int world_size = 1; world_size <= 8; ++world_size) {
    run_local(world_size, [&](const ProcessGroupPtr& world) {
      DeviceMesh mesh(world, kCPU, {world_size}, {"shard"});
      for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
        for (const Shape& shape : shapes) {
          for (const Placement& placement : one_dim_placements(static_cast<int64_t>(shape.size()))) {
            check_round_trip(mesh, {placement}, shape, dtype);
          }
        }
      }
      if (world_size == 8) {
        // 3 rows on 8 ranks: ranks 3..7 hold [0, 5] pieces that start at row 3.
        const DTensor rows = distribute(sample({3, 5}, DType::f32), mesh, {Shard{0}});
        CHECK(rows.local().sizes() == Shape{world->rank() < 3 ? 1 : 0, 5});
        CHECK(rows.local_offset() == Shape{std::min(world->rank(), 3), 0});
      }
    });
  }
}

TEST_CASE("DTensor: round trips on 2-D and 3-D meshes, nested and mixed placements") {
  const std::vector<Placements> two_d = {{Replicate{}, Shard{0}}, {Shard{0}, Shard{1}},    {Shard{0}, Shard{0}},
                                         {Shard{1}, Shard{0}},    {Shard{0}, Replicate{}}, {Replicate{}, Replicate{}}};
  const std::vector<Shape> shapes = {{7, 5}, {3, 2}, {0, 3}, {13, 9}};
  for (const Shape& mesh_shape : std::vector<Shape>{{2, 2}, {2, 3}, {3, 2}, {2, 4}, {1, 3}}) {
    run_local(static_cast<int>(shape_numel(mesh_shape)), [&](const ProcessGroupPtr& world) {
      DeviceMesh mesh(world, kCPU, mesh_shape, {"replicate", "shard"});
      for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
        for (const Shape& shape : shapes) {
          for (const Placements& placements : two_d) check_round_trip(mesh, placements, shape, dtype);
        }
      }
    });
  }
  run_local(8, [&](const ProcessGroupPtr& world) {
    DeviceMesh mesh(world, kCPU, {2, 2, 2});
    const std::vector<Placements> three_d = {
        {Shard{0}, Shard{0}, Shard{0}}, {Shard{0}, Shard{1}, Shard{0}}, {Replicate{}, Shard{2}, Shard{0}}};
    for (const Placements& placements : three_d) {
      check_round_trip(mesh, placements, {9, 5, 3}, DType::f32);
      check_round_trip(mesh, placements, {3, 1, 2}, DType::bf16);
    }
  });
}

TEST_CASE("DTensor: a strided local piece gathers; full_tensor never aliases the local tensor") {
  run_local(2, [&](const ProcessGroupPtr& world) {
    DeviceMesh mesh(world, kCPU, {2});
    const Tensor full = sample({6, 4}, DType::f32);
    // This rank's rows [3r, 3r + 3) as a transposed view of a [4, 3] tensor.
    const Tensor rows = ops::narrow(full, 0, 3 * world->rank(), 3);
    const Tensor local = ops::transpose(ops::contiguous(ops::transpose(rows, 0, 1)), 0, 1);
    CHECK(!local.is_contiguous());
    const DTensor sharded(local, mesh, {Shard{0}}, {6, 4});
    CHECK(sharded.local().is_same(local));
    CHECK(sharded.local_offset() == Shape{3 * world->rank(), 0});
    CHECK(same_bits(sharded.full_tensor(), full));

    const DTensor replicated(full, mesh, {Replicate{}}, {6, 4});
    Tensor whole = replicated.full_tensor();
    CHECK(!whole.shares_storage_with(full));
    ops::fill_(whole, 0.0);
    CHECK(same_bits(replicated.local(), full));
  });
}

TEST_CASE("DTensor: meta tensors distribute and wrap by shape alone") {
  run_local(4, [&](const ProcessGroupPtr& world) {
    DeviceMesh mesh(world, kCPU, {2, 2});
    const Tensor full = ops::empty({7, 5}, {.dtype = DType::bf16, .device = kMeta});
    const DTensor dtensor = distribute(full, mesh, {Shard{0}, Shard{1}});
    const LocalPiece piece = local_piece({7, 5}, {2, 2}, mesh.coordinate(), {Shard{0}, Shard{1}});
    CHECK(dtensor.local().is_meta());
    CHECK(dtensor.dtype() == DType::bf16);
    CHECK(dtensor.local().sizes() == piece.shape);
    CHECK(dtensor.local_offset() == piece.offset);

    const DTensor wrapped(ops::empty(piece.shape, {.device = kMeta}), mesh, {Shard{0}, Shard{1}}, {7, 5});
    const Tensor whole = wrapped.full_tensor();
    CHECK(whole.is_meta());
    CHECK(whole.sizes() == Shape{7, 5});
    CHECK_THROWS_WITH_AS(DTensor(ops::empty({7, 5}, {.device = kMeta}), mesh, {Shard{0}, Shard{1}}, {7, 5}),
                         doctest::Contains("DTensor: local shape [7, 5] is not the piece"), Error);
  });
}

TEST_CASE("DTensor: constructor and distribute errors name what was expected and what came") {
  run_local(
      2,
      [&](const ProcessGroupPtr& world) {
        const int r = world->rank();
        DeviceMesh mesh(world, kCPU, {2}, {"shard"});
        // [5, 4] over 2 ranks: rank 0 holds [3, 4], rank 1 holds [2, 4].
        const Tensor wrong = ops::zeros({r == 0 ? 2 : 3, 4});
        const std::string mismatch = fmt::format(
            "DTensor: local shape [{}, 4] is not the piece [{}, 4] that coordinate ({}) holds of global shape "
            "[5, 4] under (Shard(0))",
            r == 0 ? 2 : 3, r == 0 ? 3 : 2, r);
        CHECK_THROWS_WITH_AS(DTensor(wrong, mesh, {Shard{0}}, {5, 4}), mismatch.c_str(), Error);
        CHECK_THROWS_WITH_AS(DTensor(ops::zeros({5, 4}), mesh, {Shard{0}, Replicate{}}, {5, 4}),
                             "DTensor: 2 placements (Shard(0), Replicate()) for a 1-d mesh of shape [2]", Error);
        CHECK_THROWS_WITH_AS(DTensor(ops::zeros({5, 4}), mesh, {Shard{2}}, {5, 4}),
                             "DTensor: Shard(2) is out of range for a 2-d tensor of shape [5, 4]", Error);
        CHECK_THROWS_WITH_AS(DTensor(ops::zeros({5, 4}), mesh, {Replicate{}}, {5, -4}),
                             "DTensor: global shape [5, -4] has a negative size", Error);
        CHECK_THROWS_WITH_AS(DTensor(Tensor(), mesh, {Replicate{}}, {5, 4}), "DTensor: the local tensor is undefined",
                             Error);
        CHECK_THROWS_WITH_AS(DTensor(ops::zeros({5, 4}), DeviceMesh(), {}, {5, 4}),
                             "DTensor: the mesh is empty (default-constructed)", Error);

        CHECK_THROWS_WITH_AS(distribute(ops::zeros({5, 4}), mesh, {}),
                             "distribute: 0 placements () for a 1-d mesh of shape [2]", Error);
        CHECK_THROWS_WITH_AS(distribute(ops::zeros({5}), mesh, {Shard{1}}),
                             "distribute: Shard(1) is out of range for a 1-d tensor of shape [5]", Error);
        CHECK_THROWS_WITH_AS(distribute(Tensor(), mesh, {Shard{0}}), "distribute: the tensor is undefined", Error);
        CHECK_THROWS_WITH_AS(distribute(ops::zeros({5}), DeviceMesh(), {}),
                             "distribute: the mesh is empty (default-constructed)", Error);
      },
      dtensor_options());
  CHECK_THROWS_WITH_AS(DTensor().full_tensor(), "DTensor::full_tensor: the DTensor is undefined", Error);
  CHECK(DTensor().to_string() == "DTensor(undefined)");
}
