// Device collectives on the simulator (docs/fsdp_on_gpus.md, piece 3): the
// local backend's ranks as threads, each on its own simulated device, with
// collectives enqueued on the group's stream of the device. Checked: every
// collective bitwise equal to the same one on host tensors, for 2, 3 and 4
// ranks and each wire dtype; the in-place forms; a sub-group; Work::wait()
// orders the caller's stream, and reading the output without it is caught
// by the stream-ordering checker, naming both operations; ranks that
// disagree, or one that never comes, fail on every rank instead of hanging.
#include <doctest/doctest.h>

#if TESSERA_HAVE_CUDA_SIM

#include <fmt/format.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "dist/backends/local_backend.h"
#include "dist/errors.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/stream.h"
#include "tests/dist/error_message.h"

using namespace tessera;
using namespace tessera::dist;
using tessera::test::message_of;
namespace ops = tessera::ops;

namespace {

Device device_of_rank(int rank) { return Device(DeviceType::cuda, rank); }

// Small integers and halves: exact in every dtype, different for every rank.
Tensor device_contribution(int rank, int64_t count, DType dtype) {
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = ((rank * 7 + i * 3) % 17) * 0.5 - 4;
  return ops::from_vector(values, {count}, {.dtype = dtype});
}

std::vector<double> as_doubles(const Tensor& tensor) { return ops::to(ops::to(tensor, kCPU), DType::f64).to_vector<double>(); }

// Runs `collective` on host tensors and on device copies of the same
// tensors, on every rank, and checks the outputs are bitwise equal.
void check_against_host(int world_size, DType dtype,
                        const std::function<Tensor(const ProcessGroupPtr&, const Tensor& input)>& collective) {
  std::vector<std::vector<double>> host(static_cast<size_t>(world_size)), device(static_cast<size_t>(world_size));
  run_local(world_size, [&](const ProcessGroupPtr& world) {
    const Tensor input = device_contribution(world->rank(), 4 * 1000, dtype);
    host[static_cast<size_t>(world->rank())] = as_doubles(collective(world, input));
    const Tensor on_device = ops::to(input, device_of_rank(world->rank()));
    device[static_cast<size_t>(world->rank())] = as_doubles(collective(world, on_device));
  });
  for (int rank = 0; rank < world_size; ++rank) {
    CAPTURE(rank);
    CHECK(device[static_cast<size_t>(rank)] == host[static_cast<size_t>(rank)]);
  }
}

}  // namespace

TEST_SUITE("dist device collectives") {

TEST_CASE("each device collective equals the host one bitwise, at 2, 3 and 4 ranks") {
  for (int world_size : {2, 3, 4}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
      CAPTURE(world_size);
      CAPTURE(dtype_name(dtype));
      check_against_host(world_size, dtype, [](const ProcessGroupPtr& group, const Tensor& in) {
        Tensor out = ops::empty({in.numel() * group->size()}, {.dtype = in.dtype(), .device = in.device()});
        group->all_gather_into(out, in);
        return out;
      });
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        check_against_host(world_size, dtype, [op](const ProcessGroupPtr& group, const Tensor& in) {
          const int64_t chunk = in.numel() / group->size();
          Tensor out = ops::empty({chunk}, {.dtype = in.dtype(), .device = in.device()});
          group->reduce_scatter_into(out, ops::narrow(in, 0, 0, chunk * group->size()), op);
          return out;
        });
        check_against_host(world_size, dtype, [op](const ProcessGroupPtr& group, const Tensor& in) {
          Tensor data = ops::clone(in);
          group->all_reduce(data, op);
          return data;
        });
      }
      check_against_host(world_size, dtype, [](const ProcessGroupPtr& group, const Tensor& in) {
        Tensor data = ops::clone(in);
        group->broadcast(data, group->size() - 1);
        return data;
      });
    }
  }
}

TEST_CASE("in-place device all-gather and reduce-scatter, and a sub-group's all-reduce") {
  run_local(4, [](const ProcessGroupPtr& world) {
    const int rank = world->rank();
    const Device device = device_of_rank(rank);
    // All-gather into the rank's own chunk of the output.
    Tensor whole = ops::zeros({4 * 8}, {.device = device});
    Tensor mine = ops::narrow(whole, 0, rank * 8, 8);
    ops::copy_(mine, ops::full({8}, rank + 1.0, {.device = device}));
    world->all_gather_into(whole, mine);
    const std::vector<float> gathered = ops::to(whole, kCPU).to_vector<float>();
    for (int r = 0; r < 4; ++r) CHECK(gathered[static_cast<size_t>(r * 8 + 3)] == r + 1.0f);
    // Reduce-scatter out of the rank's own chunk of the input.
    Tensor input = ops::full({4 * 8}, rank + 1.0, {.device = device});
    world->reduce_scatter_into(ops::narrow(input, 0, rank * 8, 8), input);
    CHECK(ops::to(input, kCPU).to_vector<float>()[static_cast<size_t>(rank * 8)] == 1.0f + 2 + 3 + 4);
    // HSDP's replicate groups: {0, 2} and {1, 3}.
    const ProcessGroupPtr replicas = world->split(rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3},
                                                  "replicate");
    Tensor value = ops::full({5}, rank * 10.0, {.device = device});
    replicas->all_reduce(value);
    CHECK(ops::to(value, kCPU).to_vector<float>()[0] == (rank % 2 == 0 ? 0.0f + 20 : 10.0f + 30));
  });
}

TEST_CASE("an async device collective: wait() orders the caller's stream; reading before it is caught") {
  run_local(2, [](const ProcessGroupPtr& world) {
    const Device device = device_of_rank(world->rank());
    const Tensor in = ops::full({256}, world->rank() + 1.0, {.device = device});
    Tensor out = ops::empty({512}, {.device = device});
    Work work = world->all_gather_into(out, in, /*async_op=*/true);
    work.wait();
    CHECK(ops::to(out, kCPU).to_vector<float>()[300] == 2.0f);
    CHECK(work.description() == "all_gather_into #0 on group 'world'");

    Tensor unread = ops::empty({512}, {.device = device});
    Work pending = world->all_gather_into(unread, in, /*async_op=*/true);
    const std::string error = message_of([&] { ops::to(unread, kCPU); });
    CHECK(error.find("stream-order checker") != std::string::npos);
    CHECK(error.find("which `#1 all_gather_into(f32, in [256], out [512]) on group 'world'` on cuda:") !=
          std::string::npos);
    CHECK(error.find("memcpy device to host") != std::string::npos);
    pending.wait();
    world->synchronize();
  });
}

TEST_CASE("coalesced device collectives: one batch, each equal to the single call, one Work orders them all") {
  run_local(3, [](const ProcessGroupPtr& world) {
    const Device device = device_of_rank(world->rank());
    std::vector<Tensor> ins, outs, singles;
    for (const auto& [count, dtype] : std::vector<std::pair<int64_t, DType>>{{5, DType::f32}, {700, DType::bf16},
                                                                              {3, DType::f64}}) {
      ins.push_back(ops::to(device_contribution(world->rank(), count, dtype), device));
      outs.push_back(ops::empty({count * 3}, {.dtype = dtype, .device = device}));
      singles.push_back(ops::empty({count * 3}, {.dtype = dtype, .device = device}));
      world->all_gather_into(singles.back(), ins.back());
    }
    const int64_t calls = world->stats()[CollectiveKind::all_gather].calls;
    Work work = world->all_gather_into_coalesced(outs, ins, /*async_op=*/true);
    // The batch's one event covers its first collective as well as its last.
    const std::string early = message_of([&] { ops::to(outs[0], kCPU); });
    CHECK(early.find("stream-order checker") != std::string::npos);
    CHECK(early.find("all_gather_into(f32, in [5], out [15]) on group 'world'` on cuda:") != std::string::npos);
    work.wait();
    for (size_t index = 0; index < ins.size(); ++index) CHECK(as_doubles(outs[index]) == as_doubles(singles[index]));
    CHECK(world->stats()[CollectiveKind::all_gather].calls == calls + 3);

    std::vector<Tensor> reduced = {ops::empty({100}, {.dtype = DType::bf16, .device = device}),
                                   ops::empty({1}, {.dtype = DType::f64, .device = device})};
    world->reduce_scatter_into_coalesced(reduced, {ops::narrow(ins[1], 0, 0, 300), ins[2]}, ReduceOp::avg);
    Tensor single = ops::empty({100}, {.dtype = DType::bf16, .device = device});
    world->reduce_scatter_into(single, ops::narrow(ins[1], 0, 0, 300), ReduceOp::avg);
    CHECK(as_doubles(reduced[0]) == as_doubles(single));

    const std::vector<Tensor> summed = {ops::to(ins[0], DType::f32), ops::to(ins[2], DType::f64)};
    world->all_reduce_coalesced(summed, ReduceOp::sum);
    double expected = 0;
    for (int rank = 0; rank < 3; ++rank) expected += as_doubles(device_contribution(rank, 3, DType::f64))[1];
    CHECK(as_doubles(summed[1])[1] == expected);

    CHECK(message_of([&] { world->all_reduce_coalesced({ins[0], ops::ones({2})}); }) ==
          fmt::format("all_reduce_coalesced: every tensor must be on one device, got cuda:{} and cpu", world->rank()));
    world->synchronize();
  });
}

TEST_CASE("a device collective reading memory nobody wrote is refused on its rank; its peers fail at once" *
          doctest::skip(TESSERA_SIM_CHECKS == 0)) {
  // Without the refusal reaching the rendezvous, ranks 0 and 2 would wait
  // for rank 1's part until the timeout, far beyond the milliseconds a refusal takes.
  std::vector<std::string> errors(3);
  LocalOptions options;
  options.group.timeout = std::chrono::minutes(2);
  run_local(
      3,
      [&](const ProcessGroupPtr& world) {
        const Device device = device_of_rank(world->rank());
        // Rank 1's memory is fresh from the device, not a cached block an earlier test wrote.
        if (world->rank() == 1) release_cached_memory(device);
        Tensor data = world->rank() == 1 ? ops::empty({64}, {.device = device}) : ops::ones({64}, {.device = device});
        world->all_reduce(data);
        errors[static_cast<size_t>(world->rank())] = message_of([&] { world->synchronize(); });
      },
      options);
  CHECK(errors[1].find("cuda sim initcheck: #0 all_reduce(f32, sum, [64]) on group 'world' reads buffer `tensor`") ==
        0);
  CHECK(errors[1].find("whose byte 0 was never written") != std::string::npos);
  for (const size_t peer : {size_t{0}, size_t{2}}) {
    CAPTURE(peer);
    CHECK(errors[peer].find("group rank 1 (world rank 1) could not take part: cuda sim initcheck") !=
          std::string::npos);
  }
}

TEST_CASE("ranks that disagree fail on every rank, naming both collectives") {
  std::vector<std::string> errors(2);
  run_local(2, [&](const ProcessGroupPtr& world) {
    const Device device = device_of_rank(world->rank());
    Tensor data = ops::ones({64}, {.device = device});
    if (world->rank() == 0) {
      world->all_reduce(data);
    } else {
      world->broadcast(data, 0);
    }
    errors[static_cast<size_t>(world->rank())] = message_of([&] { world->synchronize(); });
  });
  for (const std::string& error : errors) {
    CHECK(error.find("all_reduce") != std::string::npos);
    CHECK(error.find("broadcast") != std::string::npos);
  }
}

TEST_CASE("a rank that never comes: the others' device collective times out naming it") {
  LocalOptions options;
  options.group.timeout = std::chrono::milliseconds(300);
  std::string error;
  run_local(
      2,
      [&](const ProcessGroupPtr& world) {
        if (world->rank() == 1) return;
        Tensor data = ops::ones({64}, {.device = device_of_rank(0)});
        world->all_reduce(data);
        error = message_of([&] { world->synchronize(); });
      },
      options);
  CHECK(error.find("#0 all_reduce(f32, sum, [64]) on group 'world' timed out after 0.3 s: ranks [1] never arrived") !=
        std::string::npos);
}

}  // TEST_SUITE

#endif  // TESSERA_HAVE_CUDA_SIM
