// The NCCL backend on a real GPU (dist/nccl_backend.h). Built with NCCL
// (the nvidia runtime), run where a GPU is: tools/gpu_check.sh's `nccl`
// stage. NCCL refuses two ranks on one GPU, so on a machine with one GPU
// the collectives run on a world of one rank, which goes through NCCL all
// the same (the group's stream, the watchdog, the staged host collectives);
// what needs a missing peer is checked as one: a rank that never arrives at
// init, and a collective that never finishes.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/errors.h"
#include "dist/launch.h"
#include "dist/nccl_backend.h"
#include "dist/tcp_store.h"
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

// Small integers and halves: exact in every dtype.
Tensor values(int64_t count, DType dtype, int salt = 0) {
  std::vector<double> data(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(i)] = ((salt * 7 + i * 3) % 17) * 0.5 - 4;
  if (dtype == DType::i32 || dtype == DType::i64) {
    for (double& value : data) value = std::floor(value);
  }
  return ops::from_vector(data, {count}, {.dtype = dtype});
}

std::vector<double> as_doubles(const Tensor& tensor) {
  return ops::to(ops::to(tensor, kCPU), DType::f64).to_vector<double>();
}

// Runs fn on a world of one NCCL rank (dist::init with no launcher).
void on_one_rank(const std::function<void(const ProcessGroupPtr&)>& fn, ProcessGroupOptions group = {}) {
  InitOptions options;
  options.nccl = true;
  options.local.group = group;
  init(options, fn);
}

}  // namespace

TEST_CASE("nccl: the world of one rank runs every device collective through NCCL, in every dtype") {
  on_one_rank([](const ProcessGroupPtr& world) {
    CHECK(world->backend_name() == "nccl");
    CHECK(world->size() == 1);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64}) {
      CAPTURE(dtype_name(dtype));
      const Tensor host = values(3000, dtype);
      const std::vector<double> expected = as_doubles(host);
      const Tensor input = ops::to(host, kGpu);

      Tensor gathered = ops::empty({3000}, {.dtype = dtype, .device = kGpu});
      world->all_gather_into(gathered, input, /*async_op=*/true).wait();
      CHECK(as_doubles(gathered) == expected);

      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        CAPTURE(reduce_op_name(op));
        Tensor scattered = ops::empty({3000}, {.dtype = dtype, .device = kGpu});
        world->reduce_scatter_into(scattered, input, op);
        CHECK(as_doubles(scattered) == expected);
        Tensor reduced = ops::to(host, kGpu);
        world->all_reduce(reduced, op);
        CHECK(as_doubles(reduced) == expected);
      }
      Tensor broadcast = ops::to(host, kGpu);
      world->broadcast(broadcast, 0);
      CHECK(as_doubles(broadcast) == expected);
    }
    world->synchronize();
  });
}

TEST_CASE("nccl: the caller's stream waits for the collective, which waits for the caller's stream") {
  on_one_rank([](const ProcessGroupPtr& world) {
    // A long chain of device work before the collective and a read right
    // after wait(): the result is the chain's, so both orderings held.
    Tensor x = ops::to(values(1 << 20, DType::f32), kGpu);
    Tensor expected_host = values(1 << 20, DType::f32);
    for (int i = 0; i < 50; ++i) {
      x = ops::add(x, 1.0);
      expected_host = ops::add(expected_host, 1.0);
    }
    Tensor out = ops::empty({1 << 20}, {.dtype = DType::f32, .device = kGpu});
    Work work = world->all_gather_into(out, x, /*async_op=*/true);
    work.wait();
    const Tensor doubled = ops::mul(out, 2.0);
    CHECK(as_doubles(doubled) == as_doubles(ops::mul(expected_host, 2.0)));
    CHECK(work.description() == "all_gather_into #0 on group 'world'");
  });
}

TEST_CASE("nccl: host collectives are staged through the GPU and reduce in rank order") {
  on_one_rank([](const ProcessGroupPtr& world) {
    Tensor host = values(257, DType::bf16);
    const std::vector<double> expected = as_doubles(host);
    world->all_reduce(host, ReduceOp::avg);
    CHECK(as_doubles(host) == expected);
    const std::vector<uint8_t> bytes = {1, 2, 3, 4, 5};
    const auto all = world->all_gather_bytes(bytes);
    REQUIRE(all.size() == 1);
    CHECK(all[0] == bytes);
    world->barrier();
    Tensor whole = values(64, DType::f64);
    Tensor chunk = ops::empty({64}, {.dtype = DType::f64});
    world->reduce_scatter_into(chunk, whole, ReduceOp::sum);
    CHECK(as_doubles(chunk) == as_doubles(whole));
  });
}

TEST_CASE("nccl: deterministic SUM and AVG go through send/recv and the rank-order sum on the device") {
  ProcessGroupOptions options;
  options.deterministic = true;
  on_one_rank(
      [](const ProcessGroupPtr& world) {
        for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
          CAPTURE(dtype_name(dtype));
          const Tensor host = values(4097, dtype, 3);
          Tensor scattered = ops::empty({4097}, {.dtype = dtype, .device = kGpu});
          world->reduce_scatter_into(scattered, ops::to(host, kGpu), ReduceOp::avg);
          CHECK(as_doubles(scattered) == as_doubles(host));
          Tensor reduced = ops::to(host, kGpu);
          world->all_reduce(reduced, ReduceOp::sum);
          CHECK(as_doubles(reduced) == as_doubles(host));
        }
      },
      options);
}

TEST_CASE("nccl: a sub-group from ncclCommSplit runs collectives of its own") {
  on_one_rank([](const ProcessGroupPtr& world) {
    const ProcessGroupPtr shard = world->split({0}, "shard");
    CHECK(shard->backend_name() == "nccl");
    CHECK(shard->name() == "shard");
    Tensor x = ops::to(values(100, DType::f32), kGpu);
    shard->all_reduce(x, ReduceOp::sum);
    world->all_reduce(x, ReduceOp::sum);
    CHECK(as_doubles(x) == as_doubles(values(100, DType::f32)));
  });
}

TEST_CASE("nccl watchdog: a collective that does not finish within the timeout is aborted and named") {
  ProcessGroupOptions options;
  options.timeout = 1000ms;
  // dist::init ends with the world's synchronize(), which rethrows it.
  CHECK_THROWS_AS(on_one_rank(
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
  TcpStoreServer server(0);
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
  TcpStoreServer server(0);
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
  TcpStoreServer server(0);
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 10s);
  const int gpus = cuda::device_count();
  const LaunchInfo launch{.launcher = Launcher::torchrun, .rank = gpus, .world_size = gpus + 1,
                          .local_rank = gpus, .local_world_size = gpus + 1};
  CHECK(message_of([&] { init_nccl_world(launch, store, {}); }) ==
        fmt::format("init_nccl_world: rank {0} is local rank {0} on its machine and so needs cuda:{0}, but this "
                    "process sees {0} GPU(s); start one process per GPU (and check CUDA_VISIBLE_DEVICES)",
                    gpus));
}
