// The `mpi` backend under mpirun (meson runs it with -np 2 and -np 4): every
// collective x dtype x op against exact values, in-place and async forms,
// deterministic mode bitwise equal to the local backend computed in the same
// process, sub-groups, misuse errors and a DeviceMesh. Its own main() starts
// the job through dist::init, so the launcher's MPI path is exercised too.
//
// With TEST_DIST_MPI_APP_INIT=serialized the application initialises MPI
// itself at MPI_THREAD_SERIALIZED before dist::init: the backend must then
// serialise its MPI calls, and leave MPI_Finalize to the application.
//
// Every rank must issue the same collectives: checks never steer control flow
// around a collective (CHECK, never REQUIRE), so a failing check fails this
// rank's run instead of leaving its peers waiting.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "dist/backends/local_backend.h"
#include "dist/backends/mpi_backend.h"
#include "dist/device_mesh.h"
#include "dist/init.h"
#include "dist/launch/launch_environment.h"
#include "dist/launch/tcp_store.h"
#include "tensor/ops.h"

using namespace tessera;
using namespace tessera::dist;
namespace ops = tessera::ops;

namespace {

const std::vector<DType> kDTypes = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};
const std::vector<ReduceOp> kOps = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

std::string describe(DType dtype, ReduceOp op) { return fmt::format("{} {}", dtype_name(dtype), reduce_op_name(op)); }

// Rank r's value at flat index i: integers in [-5, 5], so every sum over 4
// ranks and every AVG (a multiple of 1/4) is exact in every dtype.
double contribution(int rank, int64_t i) { return static_cast<double>((3 * i + 5 * rank) % 11) - 5; }

Tensor contributions(int rank, int64_t begin, int64_t count, DType dtype) {
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = contribution(rank, begin + i);
  return ops::from_vector(values, {count}, {.dtype = dtype});
}

// The contract's reduction of every rank's contribution at index i: AVG is
// the sum divided once, truncated toward zero for integers.
double expected_reduction(ReduceOp op, DType dtype, int ranks, int64_t i) {
  double sum = 0;
  double max = -std::numeric_limits<double>::infinity();
  double min = std::numeric_limits<double>::infinity();
  for (int r = 0; r < ranks; ++r) {
    const double value = contribution(r, i);
    sum += value;
    max = std::max(max, value);
    min = std::min(min, value);
  }
  switch (op) {
    case ReduceOp::sum: return sum;
    case ReduceOp::avg:
      return is_floating(dtype) ? sum / ranks : static_cast<double>(static_cast<int64_t>(sum) / ranks);
    case ReduceOp::max: return max;
    case ReduceOp::min: return min;
  }
  return 0;
}

std::vector<double> expected_reductions(ReduceOp op, DType dtype, int ranks, int64_t begin, int64_t count) {
  std::vector<double> values;
  for (int64_t i = begin; i < begin + count; ++i) values.push_back(expected_reduction(op, dtype, ranks, i));
  return values;
}

std::vector<double> values_of(const Tensor& tensor) { return tensor.to_vector<double>(); }

// Rank r's inputs for the bitwise comparisons: Philox values that round
// differently in every order of addition, converted to `dtype`.
Tensor random_input(int rank, int64_t count, DType dtype) {
  Tensor values =
      ops::randn({count}, PhiloxKey{.seed = 1234, .stream = static_cast<uint64_t>(rank)}, {.dtype = DType::f64});
  if (!is_floating(dtype)) values = ops::mul(values, 1.0e6);
  return ops::to(values, dtype);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.nbytes())) == 0;
}

// The reductions the deterministic tests run, identical on both backends.
struct DeterministicResults {
  Tensor all_reduced;       // all_reduce of 1001 elements (ceil chunks of unequal length)
  Tensor tiny_all_reduced;  // all_reduce of 2 elements (trailing ranks' chunks empty)
  Tensor scattered;         // reduce_scatter_into, 37 elements per rank
};

DeterministicResults run_deterministic_collectives(const ProcessGroupPtr& group, DType dtype, ReduceOp op) {
  const int rank = group->rank();
  DeterministicResults results;
  results.all_reduced = random_input(rank, 1001, dtype);
  group->all_reduce(results.all_reduced, op);
  results.tiny_all_reduced = random_input(rank + 100, 2, dtype);
  group->all_reduce(results.tiny_all_reduced, op);
  Tensor in = random_input(rank + 200, 37 * group->size(), dtype);
  results.scattered = ops::zeros({37}, {.dtype = dtype});
  group->reduce_scatter_into(results.scattered, in, op);
  return results;
}

int world_size() { return world()->size(); }

bool application_initialises_mpi() { return process_environment("TEST_DIST_MPI_APP_INIT") == "serialized"; }

// 0, 1, ..., n-1: the member list of a split that keeps the whole group.
std::vector<int> all_ranks(int n) {
  std::vector<int> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

}  // namespace

TEST_CASE("mpi: the world is mpirun's") {
  const ProcessGroupPtr& group = world();
  CHECK(mpi_backend_built());
  CHECK(group->backend_name() == "mpi");
  CHECK(group->name() == "world");
  LaunchInfo launch = detect_launch();
  CHECK(launch.launcher == Launcher::mpirun);
  CHECK(group->rank() == launch.rank);
  CHECK(group->size() == launch.world_size);
  CHECK(group->local_rank() == launch.local_rank);
  CHECK(group->local_size() == launch.local_world_size);
  CHECK(group->world_ranks() == all_ranks(group->size()));
  int provided = 0;
  MPI_Query_thread(&provided);
  CHECK(provided == (application_initialises_mpi() ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE));
}

// The NCCL world's rendezvous under mpirun: MPI hands out rank 0's store,
// through which rank 0's ncclUniqueId would travel (tests/dist/test_nccl.cpp
// runs the rest on a GPU).
TEST_CASE("mpi: connect_store_through hands every rank rank 0's store") {
  const ProcessGroupPtr& group = world();
  LaunchStore launch = connect_store_through(*group, std::chrono::seconds(60));
  CHECK((launch.server != nullptr) == (group->rank() == 0));
  if (group->rank() == 0) launch.store->set("nccl/world/id", std::string("0123456789abcdef"));
  CHECK(launch.store->get_string("nccl/world/id") == "0123456789abcdef");
  launch.leave(group->rank(), group->size());
}

TEST_CASE("mpi: all_reduce of every dtype and op gives the exact reduction") {
  const ProcessGroupPtr& group = world();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      CAPTURE(describe(dtype, op));
      Tensor tensor = contributions(group->rank(), 0, 23, dtype);
      group->all_reduce(tensor, op);
      CHECK(tensor.dtype() == dtype);
      CHECK(values_of(tensor) == expected_reductions(op, dtype, group->size(), 0, 23));
    }
  }
}

TEST_CASE("mpi: reduce_scatter_into of every dtype and op, out-of-place and in-place") {
  const ProcessGroupPtr& group = world();
  const int rank = group->rank();
  const int64_t chunk = 9;
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      CAPTURE(describe(dtype, op));
      const std::vector<double> expected = expected_reductions(op, dtype, group->size(), rank * chunk, chunk);
      Tensor in = contributions(rank, 0, chunk * group->size(), dtype);
      Tensor out = ops::zeros({chunk}, {.dtype = dtype});
      group->reduce_scatter_into(out, in, op);
      CHECK(values_of(out) == expected);
      CHECK(values_of(in) == values_of(contributions(rank, 0, chunk * group->size(), dtype)));  // untouched

      Tensor buffer = contributions(rank, 0, chunk * group->size(), dtype);
      Tensor own_chunk = ops::narrow(buffer, 0, rank * chunk, chunk);
      group->reduce_scatter_into(own_chunk, buffer, op);
      CHECK(values_of(own_chunk) == expected);
    }
  }
}

TEST_CASE("mpi: integer AVG sums in i64 and truncates toward zero") {
  const ProcessGroupPtr& group = world();
  const int n = group->size();
  // Every rank holds 2e9: the i32 sum overflows, the average does not.
  Tensor large = ops::full({3}, 2.0e9, {.dtype = DType::i32});
  group->all_reduce(large, ReduceOp::avg);
  CHECK(values_of(large) == std::vector<double>{2.0e9, 2.0e9, 2.0e9});
  Tensor large_in = ops::full({3 * n}, 2.0e9, {.dtype = DType::i32});
  Tensor large_out = ops::zeros({3}, {.dtype = DType::i32});
  group->reduce_scatter_into(large_out, large_in, ReduceOp::avg);
  CHECK(values_of(large_out) == std::vector<double>{2.0e9, 2.0e9, 2.0e9});
  // -3 from rank 0 only: -3 / 2 = -1 and -3 / 4 = 0 (toward zero, not down).
  for (DType dtype : {DType::i32, DType::i64}) {
    Tensor negative = ops::full({1}, group->rank() == 0 ? -3.0 : 0.0, {.dtype = dtype});
    group->all_reduce(negative, ReduceOp::avg);
    CHECK(negative.item<int64_t>() == -3 / n);
  }
}

TEST_CASE("mpi: MAX and MIN propagate NaN from any rank, in f32, f64, bf16 and f16") {
  const ProcessGroupPtr& group = world();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
      CAPTURE(describe(dtype, op));
      // Index k holds NaN on rank k only, so NaN comes first, last and between.
      std::vector<double> values(static_cast<size_t>(group->size()), 1.0 + group->rank());
      values[static_cast<size_t>(group->rank())] = nan;
      Tensor tensor = ops::from_vector(values, {group->size()}, {.dtype = dtype});
      group->all_reduce(tensor, op);
      for (double value : values_of(tensor)) CHECK(std::isnan(value));
    }
  }
}

TEST_CASE("mpi: 16-bit sums combine in f32 and round once per combine step") {
  const ProcessGroupPtr& group = world();
  // Values in [1, 2): bf16 keeps 8 bits, so each rounding of a partial sum
  // errs by at most 2^-8 relative; N ranks combine in N-1 steps.
  for (DType dtype : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    std::vector<double> exact(64, 0.0);
    std::vector<Tensor> inputs;
    for (int r = 0; r < group->size(); ++r) {
      Tensor input =
          ops::to(ops::add(ops::rand({64}, PhiloxKey{.seed = 99, .stream = static_cast<uint64_t>(r)}), 1.0), dtype);
      std::vector<double> input_values = values_of(input);
      for (size_t i = 0; i < exact.size(); ++i) exact[i] += input_values[i];
      inputs.push_back(input);
    }
    Tensor tensor = ops::clone(inputs[static_cast<size_t>(group->rank())]);
    group->all_reduce(tensor, ReduceOp::sum);
    const double ulp = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const std::vector<double> result = values_of(tensor);
    for (size_t i = 0; i < exact.size(); ++i) {
      CHECK(std::abs(result[i] - exact[i]) <= (group->size() - 1) * ulp * exact[i]);
    }
    if (group->size() == 2) {
      // One combine step: exactly f32 accumulation rounded once.
      Tensor once = ops::to(ops::add(ops::to(inputs[0], DType::f32), ops::to(inputs[1], DType::f32)), dtype);
      CHECK(same_bytes(tensor, once));
    }
  }
}

TEST_CASE("mpi: all_gather_into of every dtype, out-of-place and in-place") {
  const ProcessGroupPtr& group = world();
  const int rank = group->rank();
  const int n = group->size();
  const int64_t chunk = 5;
  for (DType dtype : kDTypes) {
    CAPTURE(dtype_name(dtype));
    std::vector<double> expected;
    for (int r = 0; r < n; ++r) {
      for (double value : values_of(contributions(r, 0, chunk, dtype))) expected.push_back(value);
    }
    Tensor out = ops::zeros({n * chunk}, {.dtype = dtype});
    group->all_gather_into(out, contributions(rank, 0, chunk, dtype));
    CHECK(values_of(out) == expected);

    Tensor buffer = ops::zeros({n, chunk}, {.dtype = dtype});
    Tensor own_row = ops::select(buffer, 0, rank);
    ops::copy_(own_row, contributions(rank, 0, chunk, dtype));
    group->all_gather_into(buffer, own_row);
    CHECK(values_of(buffer) == expected);
  }
  // A chunk of odd byte length travels as bytes.
  Tensor odd_out = ops::zeros({3 * n}, {.dtype = DType::bf16});
  group->all_gather_into(odd_out, ops::full({3}, rank, {.dtype = DType::bf16}));
  for (int r = 0; r < n; ++r) CHECK(odd_out.to_vector<double>()[static_cast<size_t>(3 * r + 2)] == r);
}

TEST_CASE("mpi: a large all-gather and reduce-scatter (4 MiB per rank)") {
  const ProcessGroupPtr& group = world();
  const int rank = group->rank();
  const int n = group->size();
  const int64_t chunk = 1 << 20;
  Tensor mine = ops::add(ops::arange(0, chunk), rank * 1.0e6);
  Tensor gathered = ops::zeros({n * chunk});
  group->all_gather_into(gathered, mine);
  const float* data = gathered.data_ptr<float>();
  for (int r = 0; r < n; ++r) {
    CHECK(data[r * chunk] == r * 1.0e6f);
    CHECK(data[r * chunk + chunk - 1] == r * 1.0e6f + (chunk - 1));
  }
  Tensor ones = ops::ones({n * chunk});
  Tensor scattered = ops::zeros({chunk});
  group->reduce_scatter_into(scattered, ones, ReduceOp::sum);
  CHECK(ops::sum(scattered).item<double>() == static_cast<double>(chunk) * n);
}

TEST_CASE("mpi: broadcast from every root, every dtype") {
  const ProcessGroupPtr& group = world();
  for (DType dtype : kDTypes) {
    for (int root = 0; root < group->size(); ++root) {
      CAPTURE(describe(dtype, ReduceOp::sum));
      CAPTURE(root);
      Tensor tensor = contributions(group->rank(), 0, 6, dtype);
      group->broadcast(tensor, root);
      CHECK(values_of(tensor) == values_of(contributions(root, 0, 6, dtype)));
    }
  }
}

TEST_CASE("mpi: barrier, all_gather_bytes of unequal lengths, and the stats they leave") {
  const ProcessGroupPtr group = world()->split(all_ranks(world_size()), "stats");  // fresh stats
  group->barrier();
  std::vector<uint8_t> mine(static_cast<size_t>(group->rank() + 1), static_cast<uint8_t>(10 + group->rank()));
  std::vector<std::vector<uint8_t>> all = group->all_gather_bytes(mine);
  CHECK(all.size() == static_cast<size_t>(group->size()));
  for (int r = 0; r < group->size(); ++r) {
    CHECK(all[static_cast<size_t>(r)] ==
          std::vector<uint8_t>(static_cast<size_t>(r + 1), static_cast<uint8_t>(10 + r)));
  }
  Tensor out = ops::zeros({4 * group->size()});
  group->all_gather_into(out, ops::ones({4}));
  CommStats stats = group->stats();
  CHECK(stats[CollectiveKind::barrier].calls == 1);
  CHECK(stats[CollectiveKind::all_gather_bytes].calls == 1);
  CHECK(stats[CollectiveKind::all_gather].calls == 1);
  CHECK(stats[CollectiveKind::all_gather].bytes_sent == 16 * (group->size() - 1));
  CHECK(stats[CollectiveKind::all_gather].bytes_received == 16 * (group->size() - 1));
}

TEST_CASE("mpi: async collectives overlap the caller and complete in issue order") {
  const ProcessGroupPtr& group = world();
  const int n = group->size();
  Tensor big = ops::full({1 << 20}, 1.0 + group->rank());
  Tensor small = ops::full({8}, 1.0);
  Tensor gathered = ops::zeros({8 * n});
  Work first = group->all_reduce(big, ReduceOp::sum, /*async_op=*/true);
  Work second = group->all_gather_into(gathered, small, /*async_op=*/true);
  Work third = group->barrier(/*async_op=*/true);
  // The caller keeps computing while the comm thread works.
  Tensor product = ops::matmul(ops::ones({64, 64}), ops::ones({64, 64}));
  CHECK(product.to_vector<float>()[0] == 64.0f);
  third.wait();
  CHECK(first.is_completed());  // issue order: done before the barrier after it
  CHECK(second.is_completed());
  first.wait();
  second.wait();
  CHECK(first.description().find("all_reduce #") == 0);
  CHECK(first.description().find("on group 'world'") != std::string::npos);
  const double expected_sum = n * (n + 1) / 2.0;
  CHECK(big.to_vector<float>()[0] == expected_sum);
  CHECK(big.to_vector<float>()[(1 << 20) - 1] == expected_sum);
  CHECK(values_of(gathered) == std::vector<double>(static_cast<size_t>(8 * n), 1.0));
}

TEST_CASE("mpi: deterministic mode is bitwise equal to the local backend and to itself") {
  ProcessGroupOptions options = world()->options();
  options.deterministic = true;
  // A second world over its own communicator; every rank creates it.
  const ProcessGroupPtr deterministic = init_mpi_world(options);
  CHECK(deterministic->backend_name() == "mpi");
  CHECK(deterministic->size() == world_size());
  const int rank = deterministic->rank();
  const int n = deterministic->size();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      CAPTURE(describe(dtype, op));
      const DeterministicResults mpi = run_deterministic_collectives(deterministic, dtype, op);
      const DeterministicResults again = run_deterministic_collectives(deterministic, dtype, op);
      // The same n ranks simulated as threads in this process.
      std::vector<DeterministicResults> local(static_cast<size_t>(n));
      LocalOptions local_options;
      local_options.group.deterministic = true;
      local_options.threads_per_rank = 1;
      run_local(
          n,
          [&](const ProcessGroupPtr& group) {
            local[static_cast<size_t>(group->rank())] = run_deterministic_collectives(group, dtype, op);
          },
          local_options);
      const DeterministicResults& reference = local[static_cast<size_t>(rank)];
      CHECK(same_bytes(mpi.all_reduced, reference.all_reduced));
      CHECK(same_bytes(mpi.tiny_all_reduced, reference.tiny_all_reduced));
      CHECK(same_bytes(mpi.scattered, reference.scattered));
      CHECK(same_bytes(mpi.all_reduced, again.all_reduced));
      CHECK(same_bytes(mpi.scattered, again.scattered));
    }
  }
  // In-place reduce-scatter takes the same path.
  Tensor buffer = random_input(rank + 200, 37 * n, DType::bf16);
  Tensor expected = ops::zeros({37}, {.dtype = DType::bf16});
  deterministic->reduce_scatter_into(expected, buffer, ReduceOp::avg);
  Tensor own_chunk = ops::narrow(buffer, 0, rank * 37, 37);
  deterministic->reduce_scatter_into(own_chunk, buffer, ReduceOp::avg);
  CHECK(same_bytes(ops::contiguous(own_chunk), expected));
}

TEST_CASE("mpi: sub-groups from split, in any member order, nested, and side by side") {
  const ProcessGroupPtr& group = world();
  const int rank = group->rank();
  const int n = group->size();
  const int half = n / 2;
  // Halves, listed high rank first: sub-group rank = index in the list.
  std::vector<int> members;
  const int first = rank < half ? 0 : half;
  for (int r = first + half - 1; r >= first; --r) members.push_back(r);
  const ProcessGroupPtr sub = group->split(members, "half");
  CHECK(sub->backend_name() == "mpi");
  CHECK(sub->name() == "half");
  CHECK(sub->size() == half);
  CHECK(sub->world_ranks() == members);
  CHECK(sub->rank() == first + half - 1 - rank);
  CHECK(sub->local_rank() == group->local_rank());

  Tensor gathered = ops::zeros({half}, {.dtype = DType::i64});
  sub->all_gather_into(gathered, ops::from_vector(std::vector<int64_t>{rank}, {1}));
  std::vector<int64_t> members64(members.begin(), members.end());
  CHECK(gathered.to_vector<int64_t>() == members64);

  // Collectives on the world and the sub-group at the same time, each on its
  // own communication thread.
  Tensor on_world = ops::full({4096}, 1.0);
  Tensor on_sub = ops::full({4096}, 2.0);
  Work world_work = group->all_reduce(on_world, ReduceOp::sum, true);
  Work sub_work = sub->all_reduce(on_sub, ReduceOp::sum, true);
  sub_work.wait();
  world_work.wait();
  CHECK(on_world.to_vector<float>()[4095] == n);
  CHECK(on_sub.to_vector<float>()[4095] == 2.0f * half);

  // Singletons split from the half.
  const ProcessGroupPtr single = sub->split({sub->rank()}, "single");
  CHECK(single->size() == 1);
  CHECK(single->world_ranks() == std::vector<int>{rank});
  Tensor alone = ops::full({3}, 7.0);
  single->all_reduce(alone, ReduceOp::avg);
  CHECK(values_of(alone) == std::vector<double>{7.0, 7.0, 7.0});
}

TEST_CASE("mpi: misuse throws on every rank before anything is issued") {
  const ProcessGroupPtr& group = world();
  const int n = group->size();
  CHECK_THROWS_WITH_AS(group->all_gather_into(ops::zeros({3}), ops::zeros({2})),
                       doctest::Contains("all_gather_into: out must hold"), Error);
  CHECK_THROWS_WITH_AS(group->all_gather_into(ops::zeros({2 * n}, {.dtype = DType::f64}), ops::zeros({2})),
                       "all_gather_into: out is f64 but in is f32", Error);
  CHECK_THROWS_WITH_AS(group->reduce_scatter_into(ops::zeros({2}), ops::zeros({2 * n + 1})),
                       doctest::Contains("reduce_scatter_into: in must hold"), Error);
  CHECK_THROWS_WITH_AS(group->all_reduce(ops::transpose(ops::zeros({2, 3}), 0, 1)),
                       doctest::Contains("is not contiguous"), Error);
  CHECK_THROWS_WITH_AS(group->broadcast(ops::zeros({2}), n), doctest::Contains("root"), Error);
  CHECK_THROWS_WITH_AS(group->split({(group->rank() + 1) % n}, "elsewhere"),
                       doctest::Contains("is not among its members"), Error);
  // Lists that do not partition the group (rank r with its successor: every
  // rank's list overlaps another's) fail on every rank alike.
  const std::vector<int> overlapping = {group->rank(), (group->rank() + 1) % n};
  if (n > 1) {
    CHECK_THROWS_WITH_AS(group->split(overlapping, "overlapping"), doctest::Contains("do not partition"), Error);
  }
  // Nothing was left half-issued: the group still works.
  Tensor value = ops::full({1}, 1.0);
  group->all_reduce(value, ReduceOp::sum);
  CHECK(value.item<double>() == n);
}

TEST_CASE("mpi: a DeviceMesh of (replicate=2, shard=N/2) over the MPI world") {
  const int n = world_size();
  const int rank = world()->rank();
  DeviceMesh mesh = init_device_mesh(kCPU, {2, n / 2}, {"replicate", "shard"});
  CHECK(mesh.size() == n);
  CHECK(mesh.coordinate() == std::vector<int64_t>{rank / (n / 2), rank % (n / 2)});
  const ProcessGroupPtr& shard = mesh.group("shard");
  const ProcessGroupPtr& replicate = mesh.group("replicate");
  CHECK(shard->backend_name() == "mpi");
  CHECK(shard->size() == n / 2);
  CHECK(replicate->size() == 2);
  std::vector<int> shard_members;
  for (int c = 0; c < n / 2; ++c) shard_members.push_back(rank / (n / 2) * (n / 2) + c);
  CHECK(shard->world_ranks() == shard_members);
  CHECK(replicate->world_ranks() == std::vector<int>{rank % (n / 2), rank % (n / 2) + n / 2});
  // HSDP's pattern: reduce-scatter along shard, then all-reduce along replicate.
  Tensor gradient = ops::full({2 * (n / 2)}, 1.0 + rank);
  Tensor shard_of_gradient = ops::zeros({2});
  shard->reduce_scatter_into(shard_of_gradient, gradient, ReduceOp::sum);
  replicate->all_reduce(shard_of_gradient, ReduceOp::sum);
  const double total = n * (n + 1) / 2.0;
  CHECK(values_of(shard_of_gradient) == std::vector<double>{total, total});
  CHECK(mesh["shard"].group() == shard);
}

// Run by the dist-mpi-watchdog meson test only (TESSERA_DIST_TIMEOUT_S=1):
// rank 0 waits in collective #2 that no other rank issues, so the watchdog
// must report it and abort the job.
TEST_CASE("mpi watchdog: a collective one rank skips aborts the job with its name" * doctest::skip()) {
  const ProcessGroupPtr group = world()->split(all_ranks(world_size()), "watchdog");
  group->barrier();  // #0
  Tensor value = ops::ones({3});
  group->all_reduce(value);  // #1
  if (group->rank() == 0) {
    group->all_reduce(value);  // #2: nobody else comes
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // ended by the abort
  }
  FAIL("the watchdog did not abort the job");
}

// Run by the dist-mpi-rank-failure meson test only: rank 1's function throws
// inside dist::init, which must report it and abort the job, or rank 0 would
// wait in the second barrier forever.
TEST_CASE("mpi init: a rank that throws ends the whole job" * doctest::skip()) {
  init({}, [](const ProcessGroupPtr& group) {
    group->barrier();
    if (group->rank() == 1) fail("rank 1 gave up");
    group->barrier();
  });
  FAIL("dist::init did not abort the job");
}

// After dist::init returns, a new world needs MPI still up: refused once
// dist::init has finalised it, allowed on the application's own MPI.
bool restart_after_init_behaves() {
  if (!application_initialises_mpi()) {
    const std::string expected = "init_mpi_world: MPI was finalised in this process; it cannot start again";
    try {
      init_mpi_world({});
    } catch (const Error& error) {
      if (error.what() == expected) return true;
      fmt::print(stderr, "test_dist_mpi: init_mpi_world after finalize said '{}'\n", error.what());
      return false;
    }
    fmt::print(stderr, "test_dist_mpi: init_mpi_world after finalize did not throw\n");
    return false;
  }
  ProcessGroupPtr again = init_mpi_world({});
  Tensor value = ops::ones({1});
  again->all_reduce(value);
  const bool summed = value.item<double>() == again->size();
  if (!summed) fmt::print(stderr, "test_dist_mpi: the restarted world's all_reduce gave {}\n", value.item<double>());
  again.reset();
  finalize_mpi();
  return summed;
}

int main(int argc, char** argv) {
  if (detect_launch().launcher == Launcher::local) {
    fmt::print(stderr, "test_dist_mpi: start it with mpirun, e.g. mpirun -np 2 {}\n", argv[0]);
    return 1;
  }
  InitOptions options;
  // A failed rank must end the run well inside meson's timeout.
  if (!process_environment("TESSERA_DIST_TIMEOUT_S")) options.local.group.timeout = std::chrono::seconds(60);
  if (application_initialises_mpi()) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  }
  int failed = 0;
  try {
    init(options, [&](const ProcessGroupPtr& group) {
      doctest::Context context(argc, argv);
      if (group->rank() != 0) {  // one full report, failures from all
        context.setOption("minimal", true);
        context.setOption("no-colors", true);
      }
      failed = context.run();
      if (context.shouldExit()) return;
      // Every rank learns which ranks failed, so all exit alike.
      Tensor failures = ops::zeros({group->size()}, {.dtype = DType::i32});
      group->all_gather_into(failures, ops::full({1}, failed != 0 ? 1.0 : 0.0, {.dtype = DType::i32}));
      const std::vector<int64_t> by_rank = failures.to_vector<int64_t>();
      for (int r = 0; r < group->size(); ++r) {
        if (group->rank() == 0 && by_rank[static_cast<size_t>(r)] != 0) {
          fmt::print(stderr, "test_dist_mpi: rank {} had failures\n", r);
        }
      }
      failed = std::count(by_rank.begin(), by_rank.end(), 1) != 0 ? 1 : 0;
    });
  } catch (const std::exception& error) {
    fmt::print(stderr, "test_dist_mpi: {}\n", error.what());
    return 1;
  }
  if (!restart_after_init_behaves()) failed = 1;
  if (application_initialises_mpi()) MPI_Finalize();
  return failed;
}
