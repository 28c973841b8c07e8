// DeviceMesh on the local backend: row-major coordinates, the sub-group of
// every mesh dim (its members, ranks and a collective over it) for 2x3 and
// 2x2x2 meshes, named slicing, every validation error, and the planning mesh
// (sizes and a coordinate, no groups).
#include <doctest/doctest.h>

#include <chrono>

#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "dist/init.h"
#include "tensor/ops.h"

using namespace tessera;
using namespace tessera::dist;
namespace ops = tessera::ops;

namespace {

// Failure tests must not hang: every rank throws before any collective, but
// a short timeout bounds the damage if one ever did not.
LocalOptions quick_options() {
  LocalOptions options;
  options.group.timeout = std::chrono::seconds(2);
  return options;
}

// The sum over `group` of each member's world rank (an i64 all_reduce).
int64_t sum_of_world_ranks(const ProcessGroupPtr& group, int world_rank) {
  Tensor value = ops::from_vector(std::vector<int64_t>{world_rank}, {1});
  group->all_reduce(value, ReduceOp::sum);
  return value.item<int64_t>();
}

}  // namespace

TEST_CASE("DeviceMesh: a 2x3 mesh lays ranks out row-major with one sub-group per dim") {
  // world rank -> coordinate, and the world ranks of its sub-group along each dim.
  const std::vector<std::vector<int64_t>> coordinates = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}};
  const std::vector<std::vector<int>> replicate_members = {{0, 3}, {1, 4}, {2, 5}, {0, 3}, {1, 4}, {2, 5}};
  const std::vector<std::vector<int>> shard_members = {{0, 1, 2}, {0, 1, 2}, {0, 1, 2},
                                                       {3, 4, 5}, {3, 4, 5}, {3, 4, 5}};
  std::vector<std::string> descriptions(6);
  run_local(6, [&](const ProcessGroupPtr& world) {
    const int r = world->rank();
    DeviceMesh mesh(world, kCPU, {2, 3}, {"replicate", "shard"});
    CHECK(mesh.ndim() == 2);
    CHECK(mesh.size() == 6);
    CHECK(mesh.size(0) == 2);
    CHECK(mesh.size(-1) == 3);
    CHECK(mesh.rank() == r);
    CHECK(mesh.group() == world);
    CHECK(mesh.coordinate() == coordinates[r]);
    CHECK(mesh.coordinate(1) == coordinates[r][1]);
    CHECK(mesh.dim_index("shard") == 1);

    const ProcessGroupPtr& replicate = mesh.group("replicate");
    CHECK(replicate == mesh.group(0));
    CHECK(replicate->size() == 2);
    CHECK(replicate->rank() == coordinates[r][0]);
    CHECK(replicate->world_ranks() == replicate_members[r]);
    CHECK(replicate->name() == "replicate");
    const ProcessGroupPtr& shard = mesh.group("shard");
    CHECK(shard->name() == "shard");
    CHECK(shard->size() == 3);
    CHECK(shard->rank() == coordinates[r][1]);
    CHECK(shard->world_ranks() == shard_members[r]);

    // The groups really connect those ranks: sums of world ranks over them.
    CHECK(sum_of_world_ranks(replicate, r) == replicate_members[r][0] + replicate_members[r][1]);
    CHECK(sum_of_world_ranks(shard, r) == 3 * shard_members[r][0] + 3);
    CHECK(sum_of_world_ranks(mesh.group(), r) == 15);
    descriptions[r] = mesh.to_string();

    // A mesh over a sub-group lays out that group's ranks, not the world's.
    DeviceMesh inner(shard, kCPU, {1, 3}, {"one", "three"});
    CHECK(inner.coordinate() == std::vector<int64_t>{0, coordinates[r][1]});
    CHECK(inner.group("three")->world_ranks() == shard_members[r]);
    CHECK(inner.group("one")->world_ranks() == std::vector<int>{r});
    CHECK(sum_of_world_ranks(inner.group("three"), r) == 3 * shard_members[r][0] + 3);
  });
  CHECK(descriptions[0] == "DeviceMesh(cpu, (replicate=2, shard=3), coordinate (0, 0))");
  CHECK(descriptions[5] == "DeviceMesh(cpu, (replicate=2, shard=3), coordinate (1, 2))");
}

TEST_CASE("DeviceMesh: a 2x2x2 mesh has the sub-groups the bits of the rank say") {
  // In a 2x2x2 row-major mesh, coordinate d of rank r is bit (2 - d) of r, and
  // the sub-group along d holds r with that bit cleared and set.
  run_local(8, [&](const ProcessGroupPtr& world) {
    const int r = world->rank();
    DeviceMesh mesh(world, kCPU, {2, 2, 2}, {"a", "b", "c"});
    CHECK(mesh.coordinate() == std::vector<int64_t>{(r >> 2) & 1, (r >> 1) & 1, r & 1});
    for (int64_t d = 0; d < 3; ++d) {
      const int bit = 1 << (2 - d);
      const ProcessGroupPtr& group = mesh.group(d);
      CHECK(group->size() == 2);
      CHECK(group->rank() == mesh.coordinate(d));
      CHECK(group->world_ranks() == std::vector<int>{r & ~bit, r | bit});
      CHECK(sum_of_world_ranks(group, r) == (r & ~bit) + (r | bit));
    }
    // A sub-mesh is the 1-D mesh along one dim, backed by that dim's group.
    DeviceMesh b = mesh["b"];
    CHECK(b.ndim() == 1);
    CHECK(b.shape() == Shape{2});
    CHECK(b.dim_names() == std::vector<std::string>{"b"});
    CHECK(b.coordinate() == std::vector<int64_t>{(r >> 1) & 1});
    CHECK(b.rank() == ((r >> 1) & 1));
    CHECK(b.group() == mesh.group(1));
    CHECK(b.group("b") == mesh.group(1));
    CHECK(sum_of_world_ranks(b.group(), r) == (r & ~2) + (r | 2));
  });
}

TEST_CASE("DeviceMesh: sub-meshes of a 2x3 mesh and collectives over them") {
  std::vector<std::string> descriptions(6);
  run_local(6, [&](const ProcessGroupPtr& world) {
    const int r = world->rank();
    DeviceMesh mesh(world, kCPU, {2, 3}, {"replicate", "shard"});
    DeviceMesh shard = mesh["shard"];
    DeviceMesh replicate = mesh["replicate"];
    CHECK(shard.shape() == Shape{3});
    CHECK(shard.rank() == r % 3);
    CHECK(shard.group(0) == mesh.group(1));
    CHECK(replicate.shape() == Shape{2});
    CHECK(replicate.rank() == r / 3);
    // AVG over the shard row of f32 world ranks: (3 * row + 0 + 1 + 2) / 3.
    Tensor value = ops::full({2}, r);
    shard.group()->all_reduce(value, ReduceOp::avg);
    CHECK(value.to_vector<float>() == std::vector<float>{3.0f * (r / 3) + 1, 3.0f * (r / 3) + 1});
    descriptions[r] = shard.to_string();
  });
  CHECK(descriptions[4] == "DeviceMesh(cpu, (shard=3), coordinate (1))");
}

TEST_CASE("DeviceMesh: default names, a 1-D mesh, and init_device_mesh over dist::world()") {
  for (int world_size : {1, 3, 4}) {
    run_local(world_size, [&](const ProcessGroupPtr& world) {
      DeviceMesh flat(world, kCPU, {world_size});
      CHECK(flat.dim_names() == std::vector<std::string>{"dim0"});
      CHECK(flat.coordinate() == std::vector<int64_t>{world->rank()});
      CHECK(flat.group(0)->world_ranks() == world->world_ranks());
      CHECK(sum_of_world_ranks(flat.group(0), world->rank()) == world_size * (world_size - 1) / 2);

      DeviceMesh mesh = init_device_mesh(kMeta, {1, world_size});
      CHECK(mesh.group() == world);
      CHECK(mesh.device() == kMeta);
      CHECK(mesh.dim_names() == std::vector<std::string>{"dim0", "dim1"});
      CHECK(mesh.group(0)->size() == 1);
      CHECK(mesh.group(1)->size() == world_size);
    });
  }
}

TEST_CASE("DeviceMesh: bad shapes, names and dims throw before any collective") {
  run_local(
      6,
      [&](const ProcessGroupPtr& world) {
        const std::string wrong_product =
            fmt::format("DeviceMesh: shape [2, 2] holds 4 ranks but group \"{}\" has 6", world->name());
        CHECK_THROWS_WITH_AS(DeviceMesh(world, kCPU, {2, 2}), wrong_product.c_str(), Error);
        const int64_t huge = int64_t{1} << 62;
        CHECK_THROWS_WITH_AS(DeviceMesh(world, kCPU, {huge, huge, 6}),
                             doctest::Contains("shape [4611686018427387904, 4611686018427387904, 6] holds "
                                               "1.2760588759535192e+38 ranks but group"),
                             Error);
        CHECK_THROWS_WITH_AS(DeviceMesh(world, kCPU, {6, 0}),
                             "DeviceMesh: mesh sizes must be positive, got shape [6, 0]", Error);
        CHECK_THROWS_WITH_AS(DeviceMesh(world, kCPU, {-2, -3}),
                             "DeviceMesh: mesh sizes must be positive, got shape [-2, -3]", Error);
        CHECK_THROWS_WITH_AS(DeviceMesh(world, kCPU, {}), "DeviceMesh: the mesh shape needs at least one dim, got []",
                             Error);
        CHECK_THROWS_WITH_AS(DeviceMesh(world, kCPU, {2, 3}, {"dp", "dp"}),
                             "DeviceMesh: dim name \"dp\" repeats in [\"dp\", \"dp\"]", Error);
        CHECK_THROWS_WITH_AS(DeviceMesh(world, kCPU, {2, 3}, {"dp", ""}),
                             "DeviceMesh: dim names must be non-empty, got [\"dp\", \"\"]", Error);
        CHECK_THROWS_WITH_AS(DeviceMesh(world, kCPU, {2, 3}, {"dp"}),
                             "DeviceMesh: 1 dim names [\"dp\"] for a 2-d mesh of shape [2, 3]", Error);
        CHECK_THROWS_WITH_AS(DeviceMesh(nullptr, kCPU, {6}), "DeviceMesh: the process group is null", Error);

        // The failed attempts issued nothing: a good mesh still builds after them.
        DeviceMesh mesh(world, kCPU, {2, 3}, {"replicate", "shard"});
        CHECK_THROWS_WITH_AS(mesh["tp"], "DeviceMesh: no dim named \"tp\"; the dims are [\"replicate\", \"shard\"]",
                             Error);
        CHECK_THROWS_WITH_AS(mesh.group("tp"),
                             "DeviceMesh: no dim named \"tp\"; the dims are [\"replicate\", \"shard\"]", Error);
        CHECK_THROWS_WITH_AS(mesh.group(2),
                             "DeviceMesh::group: dim 2 out of range for a 2-d mesh (replicate=2, shard=3)", Error);
        CHECK_THROWS_WITH_AS(mesh.size(-3),
                             "DeviceMesh::size: dim -3 out of range for a 2-d mesh (replicate=2, shard=3)", Error);
        CHECK_THROWS_WITH_AS(mesh.coordinate(5),
                             "DeviceMesh::coordinate: dim 5 out of range for a 2-d mesh (replicate=2, shard=3)", Error);
        CHECK(sum_of_world_ranks(mesh.group("shard"), world->rank()) == 9 * mesh.coordinate(0) + 3);
      },
      quick_options());

  DeviceMesh empty;
  CHECK(empty.ndim() == 0);
  CHECK_THROWS_WITH_AS(empty.rank(), doctest::Contains("DeviceMesh::rank: the mesh has no process group"), Error);
  CHECK_THROWS_WITH_AS(empty.group(0), "DeviceMesh::group: dim 0 out of range for a 0-d mesh ()", Error);
  CHECK_THROWS_WITH_AS(init_device_mesh(kCPU, {1}), doctest::Contains("world"), Error);
}

TEST_CASE("DeviceMesh::planning: sizes and one rank's coordinate, sliced as a real mesh, and no groups") {
  const DeviceMesh mesh = DeviceMesh::planning(kCPU, {2, 4, 8}, {"replicate", "shard", "tp"}, {1, 3, 5});
  CHECK(mesh.size() == 64);
  CHECK(mesh.coordinate() == std::vector<int64_t>{1, 3, 5});
  CHECK_FALSE(mesh.has_groups());
  CHECK(mesh.group() == nullptr);
  const DeviceMesh tp = mesh["tp"];
  CHECK(tp.shape() == Shape{8});
  CHECK(tp.coordinate(0) == 5);
  CHECK(tp.dim_names() == std::vector<std::string>{"tp"});
  CHECK_FALSE(tp.has_groups());
  CHECK_THROWS_WITH_AS(tp.group(0), doctest::Contains("is a planning mesh (sizes only) and has no process groups"),
                       Error);
  CHECK_THROWS_WITH_AS(mesh.rank(), doctest::Contains("DeviceMesh::rank: the mesh has no process group"), Error);

  CHECK_THROWS_WITH_AS(DeviceMesh::planning(kCPU, {2, 4}, {"dp", "tp"}, {0}),
                       "DeviceMesh::planning: coordinate [0] for a 2-d mesh of shape [2, 4]", Error);
  CHECK_THROWS_WITH_AS(DeviceMesh::planning(kCPU, {2, 4}, {"dp", "tp"}, {0, 4}),
                       "DeviceMesh::planning: coordinate [0, 4] is outside the mesh of shape [2, 4]", Error);
  CHECK_THROWS_WITH_AS(DeviceMesh::planning(kCPU, {2, 0}, {"dp", "tp"}, {0, 0}),
                       "DeviceMesh::planning: mesh sizes must be positive, got shape [2, 0]", Error);
  CHECK_THROWS_WITH_AS(DeviceMesh::planning(kCPU, {2, 2}, {"tp", "tp"}, {0, 0}), doctest::Contains("repeats"), Error);

  // A real mesh has its groups.
  run_local(2, [](const ProcessGroupPtr& world) { CHECK(DeviceMesh(world, kCPU, {2}).has_groups()); });
}
