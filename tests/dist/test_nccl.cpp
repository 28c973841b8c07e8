// The NCCL backend on real GPUs (dist/backends/nccl_backend.h). Built with NCCL (the
// nvidia runtime), run where a GPU is, by tools/gpu_check.sh:
//   - the `nccl` stage runs it as one process: the "nccl: " cases on a world
//     of one rank, which goes through NCCL all the same (the group's stream,
//     the watchdog, the staged host collectives), and the cases that make
//     their own ranks as threads: a rank that never arrives at init, a
//     collective that never finishes, two ranks on one GPU;
//   - the `multi` stage runs the "nccl: " cases as one process per GPU
//     (torchrun-style variables), so every collective crosses GPUs.
// The "nccl: " cases therefore hold for any world size: each expectation is
// computed from every rank's contribution.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/backends/nccl_backend.h"
#include "dist/device_mesh.h"
#include "dist/errors.h"
#include "dist/init.h"
#include "dist/launch/launch_environment.h"
#include "dist/launch/tcp_store.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tests/dist/error_message.h"

using namespace tessera;
using namespace tessera::dist;
using tessera::test::message_of;
using namespace std::chrono_literals;
namespace ops = tessera::ops;

namespace {

const Device kGpu(DeviceType::cuda, 0);

// The GPU a rank is bound to (cuda:<local rank>).
Device gpu_of(const ProcessGroupPtr& group) { return Device(DeviceType::cuda, group->local_rank()); }

// Rank `salt`'s contribution: integers and halves in [-2, 2]. Sums of up to
// 64 ranks, and their premultiplied averages at power-of-two sizes, are
// exact in every dtype, so NCCL's ring or tree order cannot show.
std::vector<double> small_values(int64_t count, DType dtype, int salt) {
  std::vector<double> data(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(i)] = ((salt * 7 + i * 3) % 9) * 0.5 - 2;
  if (dtype == DType::i32 || dtype == DType::i64) {
    for (double& value : data) value = std::floor(value);
  }
  return data;
}
Tensor values(int64_t count, DType dtype, int salt = 0) {
  return ops::from_vector(small_values(count, dtype, salt), {count}, {.dtype = dtype});
}

std::vector<double> as_doubles(const Tensor& tensor) {
  return ops::to(ops::to(tensor, kCPU), DType::f64).to_vector<double>();
}

bool is_integer(DType dtype) { return dtype == DType::i32 || dtype == DType::i64; }

// The reduction over ranks 0..size-1 of small_values(count, dtype, rank)
// narrowed to [offset, offset + count). Float AVG is the exact mean; NCCL's
// premultiplied sum rounds each 1/N-scaled term (see avg_tolerance).
std::vector<double> expected_reduction(ReduceOp op, int size, int64_t whole, int64_t offset, int64_t count,
                                       DType dtype) {
  std::vector<double> result(static_cast<size_t>(count));
  for (int rank = 0; rank < size; ++rank) {
    const std::vector<double> mine = small_values(whole, dtype, rank);
    for (int64_t i = 0; i < count; ++i) {
      const double value = mine[static_cast<size_t>(offset + i)];
      double& out = result[static_cast<size_t>(i)];
      if (rank == 0) {
        out = value;
      } else if (op == ReduceOp::max) {
        out = std::max(out, value);
      } else if (op == ReduceOp::min) {
        out = std::min(out, value);
      } else {
        out += value;
      }
    }
  }
  if (op == ReduceOp::avg) {
    for (double& value : result) value = is_integer(dtype) ? std::trunc(value / size) : value / size;
  }
  return result;
}

// How far ncclAvg may be from the exact mean: each of the N terms is
// rounded once when scaled by 1/N and each partial sum once more (|terms|
// <= 2). Exact at power-of-two sizes.
double avg_tolerance(DType dtype, int size) {
  if (is_integer(dtype) || (size & (size - 1)) == 0) return 0.0;
  const double epsilon = dtype == DType::bf16  ? 0x1p-8
                         : dtype == DType::f16 ? 0x1p-11
                         : dtype == DType::f32 ? 0x1p-24
                                               : 0x1p-53;
  return 2.0 * size * 2.0 * epsilon;
}

void check_close(const std::vector<double>& got, const std::vector<double>& expected, double tolerance) {
  REQUIRE(got.size() == expected.size());
  if (tolerance == 0.0) {
    CHECK(got == expected);
    return;
  }
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - expected[i]));
  CHECK(worst <= tolerance);
}

// Runs fn on the NCCL world: the launched one (one process per GPU under
// torchrun-style variables, mpirun or srun), else one rank on cuda:0.
void on_world(const std::function<void(const ProcessGroupPtr&)>& fn, ProcessGroupOptions group = {}) {
  InitOptions options;
  options.nccl = true;
  options.local.group = group;
  init(options, fn);
}

}  // namespace

TEST_CASE("nccl: every device collective through NCCL, in every dtype, exact against every rank's contribution") {
  on_world([](const ProcessGroupPtr& world) {
    CHECK(world->backend_name() == "nccl");
    const int n = world->size();
    const int rank = world->rank();
    const Device gpu = gpu_of(world);
    const int64_t count = 3000;
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64}) {
      CAPTURE(dtype_name(dtype));
      const Tensor input = ops::to(values(count, dtype, rank), gpu);

      Tensor gathered = ops::empty({count * n}, {.dtype = dtype, .device = gpu});
      world->all_gather_into(gathered, input, /*async_op=*/true).wait();
      std::vector<double> concatenated;
      for (int r = 0; r < n; ++r) {
        const std::vector<double> theirs = small_values(count, dtype, r);
        concatenated.insert(concatenated.end(), theirs.begin(), theirs.end());
      }
      CHECK(as_doubles(gathered) == concatenated);

      const Tensor whole = ops::to(values(count * n, dtype, rank), gpu);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        CAPTURE(reduce_op_name(op));
        const double tolerance = op == ReduceOp::avg ? avg_tolerance(dtype, n) : 0.0;
        Tensor scattered = ops::empty({count}, {.dtype = dtype, .device = gpu});
        world->reduce_scatter_into(scattered, whole, op);
        check_close(as_doubles(scattered), expected_reduction(op, n, count * n, rank * count, count, dtype), tolerance);
        Tensor reduced = ops::to(values(count, dtype, rank), gpu);
        world->all_reduce(reduced, op);
        check_close(as_doubles(reduced), expected_reduction(op, n, count, 0, count, dtype), tolerance);
      }
      for (int root = 0; root < n; ++root) {
        Tensor broadcast = ops::to(values(count, dtype, rank), gpu);
        world->broadcast(broadcast, root);
        CHECK(as_doubles(broadcast) == small_values(count, dtype, root));
      }
    }
    world->synchronize();
  });
}

TEST_CASE("nccl: the caller's stream waits for the collective, which waits for the caller's stream") {
  on_world([](const ProcessGroupPtr& world) {
    // A long chain of device work before the collective and a read right
    // after wait(): every rank's chunk is the chain's, so both orderings held.
    const int64_t count = 1 << 20;
    Tensor x = ops::to(values(count, DType::f32), gpu_of(world));
    Tensor expected_host = values(count, DType::f32);
    for (int i = 0; i < 50; ++i) {
      x = ops::add(x, 1.0);
      expected_host = ops::add(expected_host, 1.0);
    }
    Tensor out = ops::empty({count * world->size()}, {.dtype = DType::f32, .device = gpu_of(world)});
    Work work = world->all_gather_into(out, x, /*async_op=*/true);
    work.wait();
    const Tensor doubled = ops::mul(out, 2.0);
    const std::vector<double> expected_chunk = as_doubles(ops::mul(expected_host, 2.0));
    for (int r = 0; r < world->size(); ++r) {
      CAPTURE(r);
      CHECK(as_doubles(ops::narrow(doubled, 0, r * count, count)) == expected_chunk);
    }
    CHECK(work.description() == "all_gather_into #0 on group 'world'");
  });
}

TEST_CASE("nccl: host collectives are staged through the GPU and reduce in rank order") {
  on_world([](const ProcessGroupPtr& world) {
    const int n = world->size();
    const int rank = world->rank();
    Tensor host = values(257, DType::bf16, rank);
    world->all_reduce(host, ReduceOp::avg);
    // The rank-order sum is exact; one division and one rounding to bf16.
    check_close(as_doubles(host), expected_reduction(ReduceOp::avg, n, 257, 0, 257, DType::bf16), 0x1p-8 * 2);
    // Every rank's bytes, of a length of its own.
    const std::vector<uint8_t> bytes(static_cast<size_t>(rank + 1), static_cast<uint8_t>(rank));
    const auto all = world->all_gather_bytes(bytes);
    REQUIRE(all.size() == static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      CHECK(all[static_cast<size_t>(r)] == std::vector<uint8_t>(static_cast<size_t>(r + 1), static_cast<uint8_t>(r)));
    }
    world->barrier();
    Tensor whole = values(64 * n, DType::f64, rank);
    Tensor chunk = ops::empty({64}, {.dtype = DType::f64});
    world->reduce_scatter_into(chunk, whole, ReduceOp::sum);
    CHECK(as_doubles(chunk) == expected_reduction(ReduceOp::sum, n, 64 * n, rank * 64, 64, DType::f64));
  });
}

TEST_CASE("nccl: deterministic SUM and AVG on the device are bitwise the host's rank-order reduction") {
  ProcessGroupOptions options;
  options.deterministic = true;
  on_world(
      [](const ProcessGroupPtr& world) {
        const int n = world->size();
        const int rank = world->rank();
        for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
          CAPTURE(dtype_name(dtype));
          // Full-mantissa values: a sum in another order would differ.
          const int64_t count = 4097;
          std::vector<double> data(static_cast<size_t>(count * n));
          for (size_t i = 0; i < data.size(); ++i) data[i] = 3.0 * std::sin(0.37 * static_cast<double>(i) + 1.3 * rank);
          const Tensor host = ops::from_vector(data, {count * n}, {.dtype = dtype});
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
            CAPTURE(reduce_op_name(op));
            Tensor on_device = ops::empty({count}, {.dtype = dtype, .device = gpu_of(world)});
            world->reduce_scatter_into(on_device, ops::to(host, gpu_of(world)), op);
            Tensor on_host = ops::empty({count}, {.dtype = dtype});
            world->reduce_scatter_into(on_host, host, op);
            CHECK(as_doubles(on_device) == as_doubles(on_host));

            Tensor reduced_on_device = ops::to(host, gpu_of(world));
            world->all_reduce(reduced_on_device, op);
            Tensor reduced_on_host = ops::clone(host);
            world->all_reduce(reduced_on_host, op);
            CHECK(as_doubles(reduced_on_device) == as_doubles(reduced_on_host));
          }
        }
      },
      options);
}

TEST_CASE("nccl: sub-groups from ncclCommSplit, side by side with the world, and HSDP's mesh") {
  on_world([](const ProcessGroupPtr& world) {
    const int n = world->size();
    const int rank = world->rank();
    const Device gpu = gpu_of(world);
    // Two halves (one group on a world of one), listed high rank first:
    // a member's sub-group rank is its index in the list.
    const int half = std::max(1, n / 2);
    const int first = rank < half ? 0 : half;
    const int last = rank < half ? half : n;
    std::vector<int> members;
    for (int r = last - 1; r >= first; --r) members.push_back(r);
    const ProcessGroupPtr sub = world->split(members, "half");
    CHECK(sub->backend_name() == "nccl");
    CHECK(sub->name() == "half");
    CHECK(sub->world_ranks() == members);
    CHECK(sub->rank() == last - 1 - rank);
    Tensor gathered = ops::empty({sub->size()}, {.dtype = DType::i64, .device = gpu});
    sub->all_gather_into(gathered, ops::to(ops::from_vector(std::vector<int64_t>{rank}, {1}), gpu));
    std::vector<double> expected_members(members.begin(), members.end());
    CHECK(as_doubles(gathered) == expected_members);

    // The world's and the sub-group's collectives in flight together.
    Tensor on_world = ops::full({4096}, 1.0, {.device = gpu});
    Tensor on_sub = ops::full({4096}, 2.0, {.device = gpu});
    Work world_work = world->all_reduce(on_world, ReduceOp::sum, true);
    Work sub_work = sub->all_reduce(on_sub, ReduceOp::sum, true);
    sub_work.wait();
    world_work.wait();
    CHECK(as_doubles(on_world)[4095] == n);
    CHECK(as_doubles(on_sub)[4095] == 2.0 * sub->size());

    // HSDP: reduce-scatter along the shard dimension, all-reduce along the
    // replicas (2 of them on an even world).
    const int64_t replicas = n % 2 == 0 ? 2 : 1;
    const int64_t shards = n / replicas;
    DeviceMesh mesh = init_device_mesh(gpu, {replicas, shards}, {"replicate", "shard"});
    CHECK(mesh.coordinate() == std::vector<int64_t>{rank / shards, rank % shards});
    const ProcessGroupPtr& shard = mesh.group("shard");
    const ProcessGroupPtr& replicate = mesh.group("replicate");
    CHECK(shard->backend_name() == "nccl");
    Tensor gradient = ops::full({2 * shards}, 1.0 + rank, {.device = gpu});
    Tensor shard_of_gradient = ops::empty({2}, {.device = gpu});
    shard->reduce_scatter_into(shard_of_gradient, gradient, ReduceOp::sum);
    replicate->all_reduce(shard_of_gradient, ReduceOp::sum);
    const double total = n * (n + 1) / 2.0;
    CHECK(as_doubles(shard_of_gradient) == std::vector<double>{total, total});
    world->synchronize();
  });
}

TEST_CASE("nccl: coalesced collectives are one NCCL group, each equal to the single call") {
  on_world([](const ProcessGroupPtr& world) {
    const int n = world->size();
    const int rank = world->rank();
    const Device gpu = gpu_of(world);
    std::vector<Tensor> ins, outs, singles;
    for (const auto& [count, dtype] :
         std::vector<std::pair<int64_t, DType>>{{5, DType::f32}, {700, DType::bf16}, {3, DType::f64}}) {
      ins.push_back(ops::to(values(count * n, dtype, rank), gpu));
      outs.push_back(ops::empty({count * n * n}, {.dtype = dtype, .device = gpu}));
      singles.push_back(ops::empty({count * n * n}, {.dtype = dtype, .device = gpu}));
      world->all_gather_into(singles.back(), ins.back());
    }
    world->all_gather_into_coalesced(outs, ins, /*async_op=*/true).wait();
    for (size_t index = 0; index < ins.size(); ++index) CHECK(as_doubles(outs[index]) == as_doubles(singles[index]));

    std::vector<Tensor> scattered = {ops::empty({700}, {.dtype = DType::bf16, .device = gpu}),
                                     ops::empty({3}, {.dtype = DType::f64, .device = gpu})};
    world->reduce_scatter_into_coalesced(scattered, {ins[1], ins[2]}, ReduceOp::sum);
    CHECK(as_doubles(scattered[0]) == expected_reduction(ReduceOp::sum, n, 700 * n, rank * 700, 700, DType::bf16));
    CHECK(as_doubles(scattered[1]) == expected_reduction(ReduceOp::sum, n, 3 * n, rank * 3, 3, DType::f64));

    const std::vector<Tensor> summed = {ops::to(values(5, DType::f32, rank), gpu),
                                        ops::to(values(3, DType::f64, rank), gpu)};
    world->all_reduce_coalesced(summed, ReduceOp::sum);
    CHECK(as_doubles(summed[0]) == expected_reduction(ReduceOp::sum, n, 5, 0, 5, DType::f32));
    CHECK(as_doubles(summed[1]) == expected_reduction(ReduceOp::sum, n, 3, 0, 3, DType::f64));
    world->synchronize();
  });
}

TEST_CASE("nccl watchdog: a collective that does not finish within the timeout is aborted and named") {
  ProcessGroupOptions options;
  options.timeout = 1000ms;
  // dist::init ends with the world's synchronize(), which rethrows it.
  CHECK_THROWS_AS(on_world(
      [](const ProcessGroupPtr& world) {
        Tensor x = ops::to(values(16, DType::f32), kGpu);
        world->all_reduce(x, ReduceOp::sum);  // #0
        delay_next_device_collective_for_testing(*world, 3000ms);
        world->all_reduce(x, ReduceOp::sum, /*async_op=*/true);  // #1, held 3 s on the device
        // Past the 1 s timeout but before the stall ends, the watchdog has
        // aborted the group: the next collective is refused with its reason.
        std::this_thread::sleep_for(2000ms);
        const std::string message = message_of([&] { world->all_reduce(x, ReduceOp::sum); });
        CHECK(message.starts_with(
            "tessera nccl watchdog: #1 all_reduce(f32, sum, [16]) on group 'world' did not complete within the 1 s "
            "timeout on rank 0 of 1; every rank issued it"));
        CHECK(message.find("ncclCommAbort ends the group") != std::string::npos);
        // synchronize() reports it too, once the stalled stream has drained.
        CHECK(message_of([&] { world->synchronize(); }) == message);
        CHECK_THROWS_AS(world->synchronize(), CollectiveTimeout);
      },
      options), CollectiveTimeout);
}

TEST_CASE("nccl init: a rank that never arrives is named within the timeout") {
  TcpStoreServer server("127.0.0.1", 0);
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 10s);
  ProcessGroupOptions options;
  options.timeout = 2000ms;
  const LaunchInfo launch{.launcher = Launcher::torchrun, .rank = 0, .world_size = 2, .local_rank = 0,
                          .local_world_size = 2};
  const auto start = std::chrono::steady_clock::now();
  const std::string message = message_of([&] { init_nccl_world(launch, store, options); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(message == "NCCL init of the world (rank 0 of 2, cuda:0): did not complete within the 2 s timeout; ranks "
                   "that never arrived: 1 (never arrived)");
  CHECK(waited < 10.0);
}

TEST_CASE("nccl init: two ranks on one GPU are refused with NCCL's reason") {
  TcpStoreServer server("127.0.0.1", 0);
  ProcessGroupOptions options;
  options.timeout = 20s;
  std::vector<std::string> messages(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 20s);
      const LaunchInfo launch{.launcher = Launcher::torchrun, .rank = rank, .world_size = 2, .local_rank = 0,
                              .local_world_size = 1};
      messages[static_cast<size_t>(rank)] = message_of([&] { init_nccl_world(launch, store, options); });
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(messages[static_cast<size_t>(rank)]);
    CHECK(messages[static_cast<size_t>(rank)].starts_with(
        fmt::format("NCCL init of the world (rank {} of 2, cuda:0): ", rank)));
    CHECK(messages[static_cast<size_t>(rank)].find("invalid usage") != std::string::npos);
    CHECK(messages[static_cast<size_t>(rank)].find("; ranks 0, 1 are all on host ") != std::string::npos);
    CHECK(messages[static_cast<size_t>(rank)].find(": NCCL takes one GPU per rank") != std::string::npos);
  }
}

TEST_CASE("nccl init: a local rank without a GPU of its own is an error naming both") {
  TcpStoreServer server("127.0.0.1", 0);
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 10s);
  const int gpus = cuda::device_count();
  const LaunchInfo launch{.launcher = Launcher::torchrun, .rank = gpus, .world_size = gpus + 1,
                          .local_rank = gpus, .local_world_size = gpus + 1};
  CHECK(message_of([&] { init_nccl_world(launch, store, {}); }) ==
        fmt::format("init_nccl_world: rank {0} is local rank {0} on its machine and so needs cuda:{0}, but this "
                    "process sees {0} GPU(s); start one process per GPU (and check CUDA_VISIBLE_DEVICES)",
                    gpus));
}
