// The local backend against expected values computed here: every collective x
// dtype x op for world sizes 1..8, sizes spanning many pieces and past the
// streaming threshold, in-place forms, async work that overlaps the caller and
// completes in issue order, bitwise-deterministic reductions, sub-groups from
// split, and what run_local sets up on each rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dist/backends/local_backend.h"
#include "dist/init.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

using namespace tessera;
using namespace tessera::dist;
namespace ops = tessera::ops;

namespace {

const DType kCollectiveDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};
const ReduceOp kCollectiveOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

// What `rank` contributes at element i: small integers, exact in every dtype
// (sums over 8 ranks too), different for every rank.
double value_at(int rank, int64_t i) { return static_cast<double>((rank * 5 + i * 3) % 13) - 6; }

Tensor contribution(int rank, int64_t count, DType dtype) {
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = value_at(rank, i);
  return ops::from_vector(values, {count}, {.dtype = dtype});
}

// An f32 value rounded into a 16-bit float type (or kept, for f32).
double round_float_to(DType dtype, float value) {
  if (dtype == DType::bf16) return static_cast<float>(BFloat16(value));
  if (dtype == DType::f16) return static_cast<float>(Half(value));
  return value;
}

// op over every rank's value_at(., i); AVG sums first and divides once in the
// accumulation type (f32 for 16-bit floats, truncating for integers).
double reduced_at(int world_size, int64_t i, ReduceOp op, DType dtype) {
  double sum = 0, max = value_at(0, i), min = value_at(0, i);
  for (int p = 0; p < world_size; ++p) {
    sum += value_at(p, i);
    max = std::max(max, value_at(p, i));
    min = std::min(min, value_at(p, i));
  }
  switch (op) {
    case ReduceOp::sum: return sum;
    case ReduceOp::max: return max;
    case ReduceOp::min: return min;
    case ReduceOp::avg: break;
  }
  if (dtype == DType::i32 || dtype == DType::i64) return static_cast<double>(static_cast<int64_t>(sum) / world_size);
  if (dtype == DType::f64) return sum / world_size;
  return round_float_to(dtype, static_cast<float>(sum) / static_cast<float>(world_size));
}

std::vector<double> gathered(int world_size, int64_t count) {
  std::vector<double> values;
  for (int p = 0; p < world_size; ++p) {
    for (int64_t i = 0; i < count; ++i) values.push_back(value_at(p, i));
  }
  return values;
}

// Element i of `rank`'s reduce-scatter result: chunk `rank` of the reduction.
std::vector<double> scattered(int world_size, int rank, int64_t count, ReduceOp op, DType dtype) {
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    values[static_cast<size_t>(i)] = reduced_at(world_size, rank * count + i, op, dtype);
  }
  return values;
}

std::vector<double> all_reduced(int world_size, int64_t count, ReduceOp op, DType dtype) {
  return scattered(world_size, 0, count, op, dtype);
}

// Every collective of `world` on `count` elements per rank, checked.
void check_every_collective(const ProcessGroupPtr& world, int64_t count, DType dtype) {
  const int n = world->size();
  const int r = world->rank();
  CAPTURE(n);
  CAPTURE(r);
  CAPTURE(dtype_name(dtype));

  Tensor out = ops::zeros({n * count}, {.dtype = dtype});
  world->all_gather_into(out, contribution(r, count, dtype));
  CHECK(out.to_vector<double>() == gathered(n, count));

  const int root = n - 1;
  Tensor data = contribution(r, count, dtype);
  world->broadcast(data, root);
  CHECK(data.to_vector<double>() == contribution(root, count, dtype).to_vector<double>());

  for (ReduceOp op : kCollectiveOps) {
    CAPTURE(reduce_op_name(op));
    Tensor chunk = ops::zeros({count}, {.dtype = dtype});
    world->reduce_scatter_into(chunk, contribution(r, n * count, dtype), op);
    CHECK(chunk.to_vector<double>() == scattered(n, r, count, op, dtype));

    Tensor reduced = contribution(r, count, dtype);
    world->all_reduce(reduced, op);
    CHECK(reduced.to_vector<double>() == all_reduced(n, count, op, dtype));
  }
}

}  // namespace

TEST_CASE("local: every collective x dtype x op is exact for world sizes 1 to 8") {
  for (int n = 1; n <= 8; ++n) {
    run_local(n, [&](const ProcessGroupPtr& world) {
      CHECK(world->backend_name() == "local");
      for (DType dtype : kCollectiveDTypes) check_every_collective(world, 7, dtype);
      check_every_collective(world, 0, DType::f32);  // empty tensors are fine too
    });
  }
}

TEST_CASE("local: u8 bytes are gathered and broadcast exactly, every byte value; reducing them is refused") {
  for (int n : {1, 3, 8}) {
    run_local(n, [&](const ProcessGroupPtr& world) {
      const int r = world->rank();
      std::vector<uint8_t> mine(256), expected;
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(i * 7 + static_cast<size_t>(r) * 31);
      for (int p = 0; p < n; ++p) {
        for (size_t i = 0; i < mine.size(); ++i) {
          expected.push_back(static_cast<uint8_t>(i * 7 + static_cast<size_t>(p) * 31));
        }
      }
      Tensor out = ops::zeros({n * 256}, {.dtype = DType::u8});
      world->all_gather_into(out, ops::from_vector(mine, {256}));
      CHECK(out.to_vector<uint8_t>() == expected);
      Tensor data = ops::from_vector(mine, {256});
      world->broadcast(data, 0);
      CHECK(data.to_vector<uint8_t>() == std::vector<uint8_t>(expected.begin(), expected.begin() + 256));
      // Refused on every rank before anything is issued: no rank waits.
      Tensor summed = ops::from_vector(mine, {256});
      CHECK_THROWS_WITH_AS(world->all_reduce(summed, ReduceOp::sum), doctest::Contains("cannot reduce dtype u8"),
                           Error);
      Tensor f8 = ops::zeros({4}, {.dtype = DType::f8e4m3});
      CHECK_THROWS_WITH_AS(world->all_reduce(f8, ReduceOp::sum), doctest::Contains("cannot reduce dtype f8e4m3"),
                           Error);
      Tensor chunk = ops::zeros({1}, {.dtype = DType::u8});
      Tensor whole = ops::zeros({n}, {.dtype = DType::u8});
      CHECK_THROWS_WITH_AS(world->reduce_scatter_into(chunk, whole, ReduceOp::sum),
                           doctest::Contains("cannot reduce dtype u8"), Error);
      world->barrier();
    });
  }
}

TEST_CASE("local: collectives over many pieces and past the streaming threshold") {
  // 3 MiB + 4 bytes of f32 per rank on 4 ranks: every all-gather, all-reduce
  // and broadcast writes more than the last-level cache, so they stream, and
  // the odd count puts every chunk boundary off a cache line. bf16 on 3 ranks
  // covers 16-bit reductions over many pieces without streaming.
  for (const auto& [n, count, dtype] :
       {std::tuple{4, int64_t{786433}, DType::f32}, std::tuple{3, int64_t{200001}, DType::bf16}}) {
    run_local(n, [&](const ProcessGroupPtr& world) {
      const int r = world->rank();
      CAPTURE(dtype_name(dtype));
      Tensor out = ops::zeros({n * count}, {.dtype = dtype});
      world->all_gather_into(out, contribution(r, count, dtype));
      CHECK(out.to_vector<double>() == gathered(n, count));

      Tensor data = contribution(r, count, dtype);
      world->broadcast(data, 1);
      CHECK(data.to_vector<double>() == contribution(1, count, dtype).to_vector<double>());

      Tensor chunk = ops::zeros({count}, {.dtype = dtype});
      world->reduce_scatter_into(chunk, contribution(r, n * count, dtype), ReduceOp::sum);
      CHECK(chunk.to_vector<double>() == scattered(n, r, count, ReduceOp::sum, dtype));

      Tensor reduced = contribution(r, count, dtype);
      world->all_reduce(reduced, ReduceOp::avg);
      CHECK(reduced.to_vector<double>() == all_reduced(n, count, ReduceOp::avg, dtype));
    });
  }
}

TEST_CASE("local: in-place all-gather and reduce-scatter use the rank's own chunk") {
  for (const auto& [n, count] : {std::pair{1, int64_t{5}}, std::pair{3, int64_t{7}}, std::pair{4, int64_t{786433}}}) {
    run_local(n, [&](const ProcessGroupPtr& world) {
      const int r = world->rank();
      for (DType dtype : {DType::f32, DType::bf16}) {
        CAPTURE(dtype_name(dtype));
        // all-gather: `in` is this rank's chunk of `out`.
        Tensor out = ops::zeros({n * count}, {.dtype = dtype});
        Tensor own = ops::narrow(out, 0, r * count, count);
        ops::copy_(own, contribution(r, count, dtype));
        world->all_gather_into(out, own);
        CHECK(out.to_vector<double>() == gathered(n, count));

        // reduce-scatter: `out` is this rank's chunk of `in`.
        Tensor in = contribution(r, n * count, dtype);
        Tensor result = ops::narrow(in, 0, r * count, count);
        world->reduce_scatter_into(result, in, ReduceOp::sum);
        CHECK(result.to_vector<double>() == scattered(n, r, count, ReduceOp::sum, dtype));
      }
    });
  }
}

TEST_CASE("local: async work runs while the caller computes and completes in issue order") {
  std::atomic<bool> rank0_computed{false};
  run_local(2, [&](const ProcessGroupPtr& world) {
    const int r = world->rank();
    Tensor out = ops::zeros({8});
    if (r == 1) {
      // Joins only once rank 0 has computed with its all-gather in flight.
      while (!rank0_computed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      world->all_gather_into(out, ops::full({4}, 2.0));
      world->all_reduce(out);
      return;
    }
    const Work gather = world->all_gather_into(out, ops::full({4}, 1.0), /*async_op=*/true);
    Tensor summed = ops::zeros({8});
    const Work reduce = world->all_reduce(summed, ReduceOp::sum, /*async_op=*/true);
    CHECK_FALSE(gather.is_completed());  // rank 1 has not joined yet

    // Work on the caller's thread while the collectives are pending.
    const Tensor a = ops::full({64, 64}, 0.5);
    const double total = ops::sum(ops::matmul(a, a)).item();
    CHECK(total == 64.0 * 64.0 * 64.0 * 0.25);
    CHECK_FALSE(gather.is_completed());
    CHECK_FALSE(reduce.is_completed());
    rank0_computed.store(true);

    // Completion order is issue order: once the later one is done, so is the earlier.
    reduce.wait();
    CHECK(gather.is_completed());
    gather.wait();
    CHECK(out.to_vector<float>() == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2});
    CHECK(gather.description() == "all_gather_into #0 on group 'world'");
    CHECK(reduce.description() == "all_reduce #1 on group 'world'");
  });
}

TEST_CASE("local: the communication thread finishes async work without wait() being called") {
  run_local(3, [&](const ProcessGroupPtr& world) {
    Tensor data = ops::full({16}, static_cast<double>(world->rank()));
    const Work work = world->all_reduce(data, ReduceOp::max, /*async_op=*/true);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!work.is_completed() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(work.is_completed());
    CHECK(data.to_vector<float>() == std::vector<float>(16, 2.0f));
  });
}

TEST_CASE("local: reductions add in rank order, so repeated runs are bitwise equal") {
  // Magnitudes from 1e-3 to 1e7 with mixed signs: f32 sums depend on the order.
  const int n = 5;
  const int64_t count = 50000;
  auto value = [](int rank, int64_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank) * std::pow(10.0, (rank * 3 + i) % 11 - 3));
  };
  std::vector<float> in_rank_order(count, 0.0f);
  for (int64_t i = 0; i < count; ++i) {
    float sum = value(0, i);
    for (int p = 1; p < n; ++p) sum += value(p, i);
    in_rank_order[static_cast<size_t>(i)] = sum;
  }
  for (bool deterministic : {true, false}) {
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 3; ++run) {
      std::vector<float> result(count);
      LocalOptions options;
      options.group.deterministic = deterministic;
      run_local(
          n,
          [&](const ProcessGroupPtr& world) {
            std::vector<float> mine(count);
            for (int64_t i = 0; i < count; ++i) mine[static_cast<size_t>(i)] = value(world->rank(), i);
            Tensor data = ops::from_vector(mine, {count});
            world->all_reduce(data, ReduceOp::sum);
            Tensor chunk = ops::zeros({count / n});
            world->reduce_scatter_into(chunk, ops::from_vector(mine, {count}), ReduceOp::sum);
            const auto all = data.to_vector<float>();
            const auto part = chunk.to_vector<float>();
            CHECK(std::equal(part.begin(), part.end(), all.begin() + world->rank() * (count / n)));
            if (world->rank() == 2) result = all;
          },
          options);
      runs.push_back(result);
    }
    CAPTURE(deterministic);
    CHECK(std::memcmp(runs[0].data(), runs[1].data(), count * sizeof(float)) == 0);
    CHECK(std::memcmp(runs[0].data(), runs[2].data(), count * sizeof(float)) == 0);
    CHECK(runs[0] == in_rank_order);
  }
}

TEST_CASE("local: split makes sub-groups whose members meet only each other") {
  run_local(6, [&](const ProcessGroupPtr& world) {
    const int r = world->rank();
    // Evens listed backwards: the list order is the sub-group rank order.
    const std::vector<int> members = r % 2 == 0 ? std::vector<int>{4, 2, 0} : std::vector<int>{1, 3, 5};
    const std::string name = r % 2 == 0 ? "evens" : "odds";
    const ProcessGroupPtr sub = world->split(members, name);
    const int sub_rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    CHECK(sub->name() == name);
    CHECK(sub->size() == 3);
    CHECK(sub->rank() == sub_rank);
    CHECK(sub->world_ranks() == members);
    CHECK(sub->local_rank() == r);
    CHECK(sub->local_size() == 6);
    CHECK(sub->backend_name() == "local");

    Tensor out = ops::zeros({3}, {.dtype = DType::i64});
    sub->all_gather_into(out, ops::from_vector(std::vector<int64_t>{r}, {1}));
    CHECK(out.to_vector<int64_t>() == std::vector<int64_t>(members.begin(), members.end()));

    // A second split with the same lists is a different group: collectives
    // interleaved across the two pair up within each group only.
    const ProcessGroupPtr again = world->split(members, name + "-again");
    Tensor on_again = ops::full({2}, 1.0);
    const Work pending = again->all_reduce(on_again, ReduceOp::sum, /*async_op=*/true);
    Tensor on_sub = ops::full({3}, static_cast<double>(r));
    sub->all_reduce(on_sub, ReduceOp::max);
    pending.wait();
    CHECK(on_again.to_vector<float>() == std::vector<float>{3, 3});
    CHECK(on_sub.to_vector<float>() == std::vector<float>(3, static_cast<float>(r % 2 == 0 ? 4 : 5)));

    // Sub-groups split further, and the world keeps working beside them.
    const ProcessGroupPtr pair = sub->split(sub_rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2}, "pair");
    Tensor pair_sum = ops::from_vector(std::vector<int64_t>{r}, {1});
    pair->all_reduce(pair_sum, ReduceOp::sum);
    const int64_t expected_pair = sub_rank < 2 ? members[0] + members[1] : r;
    CHECK(pair_sum.item<int64_t>() == expected_pair);
    CHECK(pair->world_ranks() == (sub_rank < 2 ? std::vector<int>{members[0], members[1]} : std::vector<int>{r}));

    Tensor world_sum = ops::from_vector(std::vector<int64_t>{r}, {1});
    world->all_reduce(world_sum, ReduceOp::sum);
    CHECK(world_sum.item<int64_t>() == 15);
  });
}

TEST_CASE("local: barrier and all_gather_bytes") {
  std::atomic<int> arrived{0};
  run_local(4, [&](const ProcessGroupPtr& world) {
    const int r = world->rank();
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * r));
    arrived.fetch_add(1);
    world->barrier();
    CHECK(arrived.load() == 4);  // nobody passes before everyone came

    const std::vector<uint8_t> mine(static_cast<size_t>(r + 1), static_cast<uint8_t>(10 + r));
    const auto all = world->all_gather_bytes(mine);
    REQUIRE(all.size() == 4);
    for (int p = 0; p < 4; ++p) CHECK(all[p] == std::vector<uint8_t>(static_cast<size_t>(p + 1), 10 + p));
  });
}

TEST_CASE("run_local: each rank gets its world, thread count and memory scope") {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  for (int n : {1, 4}) {
    run_local(n, [&](const ProcessGroupPtr& group) {
      CHECK(world() == group);
      CHECK(group->name() == "world");
      CHECK(group->local_rank() == group->rank());
      CHECK(group->local_size() == n);
      CHECK(num_threads() == std::max(1, cores / n));
    });
  }
  LocalOptions three_threads;
  three_threads.threads_per_rank = 3;
  run_local(2, [&](const ProcessGroupPtr&) { CHECK(num_threads() == 3); }, three_threads);

  run_local(3, [&](const ProcessGroupPtr& group) {
    const int r = group->rank();
    group->barrier();
    const MemoryStats before = rank_memory_stats();
    {
      const Tensor mine = ops::empty({(r + 1) * 1024});  // (r + 1) * 4 KiB on this rank only
      const MemoryStats during = rank_memory_stats();
      CHECK(during.live_bytes - before.live_bytes == (r + 1) * 4096);
      CHECK(during.peak_bytes >= during.live_bytes);
      group->barrier();  // every rank holds its tensor now: still only its own counted
      CHECK(rank_memory_stats().live_bytes == during.live_bytes);
    }
    CHECK(rank_memory_stats().live_bytes == before.live_bytes);
    reset_rank_peak_memory();
    CHECK(rank_memory_stats().peak_bytes == before.live_bytes);
  });
  CHECK(rank_memory_stats().live_bytes == memory_stats(kCPU).live_bytes);
}

TEST_CASE("run_local: bad arguments are errors") {
  const auto noop = [](const ProcessGroupPtr&) {};
  CHECK_THROWS_WITH_AS(run_local(0, noop), "run_local: world_size must be at least 1, got 0", Error);
  LocalOptions negative;
  negative.threads_per_rank = -2;
  CHECK_THROWS_WITH_AS(run_local(2, noop, negative),
                       "run_local: threads_per_rank must be >= 0 (0: cores / world size), got -2", Error);
}

#if TESSERA_HAVE_CUDA
TEST_CASE("local: a group of one rank takes cuda tensors (copies on the device); a larger one needs a device a rank") {
  const Device cuda(DeviceType::cuda);
  run_local(1, [&](const ProcessGroupPtr& world) {
    const Tensor shard = ops::to(ops::arange(0.0, 6.0, 1.0), cuda);
    Tensor whole = ops::zeros({6}, {.device = cuda});
    world->all_gather_into(whole, shard);
    CHECK(whole.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
    Tensor reduced = ops::zeros({6}, {.device = cuda});
    world->reduce_scatter_into(reduced, ops::mul(shard, 2.0), ReduceOp::avg);  // the average of one value
    CHECK(reduced.to_vector<float>() == std::vector<float>{0, 2, 4, 6, 8, 10});
    world->all_reduce(whole, ReduceOp::sum);
    world->broadcast(whole, 0);
    CHECK(whole.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
    world->all_gather_into(whole, whole);  // the in-place form is no copy at all
    CHECK(world->stats()[CollectiveKind::all_gather].calls == 2);
    CHECK_THROWS_WITH_AS(world->all_gather_into(ops::zeros({6}), shard), doctest::Contains("out is on cpu but in on cuda:0"),
                         Error);
  });
#if TESSERA_HAVE_CUDA_SIM
  // Device collectives between ranks (test_device_collectives.cpp) want a device each.
  CHECK_THROWS_WITH_AS(run_local(2,
                                 [&](const ProcessGroupPtr& world) {
                                   Tensor tensor = ops::ones({4}, {.device = cuda});
                                   world->all_reduce(tensor);
                                   world->synchronize();
                                 }),
                       doctest::Contains("ranks 0 and 1 are both on cuda:0; each rank needs a device of its own"),
                       Error);
#else
  run_local(2, [&](const ProcessGroupPtr& world) {
    Tensor tensor = ops::ones({4}, {.device = cuda});
    CHECK_THROWS_WITH_AS(world->all_reduce(tensor), doctest::Contains("need device collectives"), Error);
  });
#endif
}
#endif

TEST_CASE("coalesced host collectives: one Work for several, each as the single call; misuse refused before any") {
  run_local(3, [](const ProcessGroupPtr& world) {
    const std::vector<Tensor> ins = {contribution(world->rank(), 5, DType::f32),
                                     contribution(world->rank(), 7, DType::bf16),
                                     contribution(world->rank(), 2, DType::i64)};
    std::vector<Tensor> outs, singles;
    for (const Tensor& in : ins) {
      outs.push_back(ops::empty({in.numel() * 3}, {.dtype = in.dtype()}));
      singles.push_back(ops::empty({in.numel() * 3}, {.dtype = in.dtype()}));
      world->all_gather_into(singles.back(), in);
    }
    const int64_t calls = world->stats()[CollectiveKind::all_gather].calls;
    Work work = world->all_gather_into_coalesced(outs, ins, /*async_op=*/true);
    work.wait();
    CHECK(work.is_completed());
    CHECK(world->stats()[CollectiveKind::all_gather].calls == calls + 3);
    for (size_t index = 0; index < ins.size(); ++index) {
      CHECK(ops::to(outs[index], DType::f64).to_vector<double>() ==
            ops::to(singles[index], DType::f64).to_vector<double>());
    }

    std::vector<Tensor> reduced = {ops::empty({2}), ops::empty({1}, {.dtype = DType::f64})};
    world->reduce_scatter_into_coalesced(reduced, {contribution(world->rank(), 6, DType::f32),
                                                   contribution(world->rank(), 3, DType::f64)}, ReduceOp::sum);
    double expected = 0;
    for (int rank = 0; rank < 3; ++rank) expected += value_at(rank, world->rank());
    CHECK(reduced[1].to_vector<double>()[0] == expected);
    const std::vector<Tensor> summed = {contribution(world->rank(), 4, DType::f32),
                                        contribution(world->rank(), 1, DType::i32)};
    world->all_reduce_coalesced(summed, ReduceOp::max);
    CHECK(summed[1].to_vector<int32_t>()[0] == std::max({value_at(0, 0), value_at(1, 0), value_at(2, 0)}));

    // Refused on every rank, before anything is issued: the group goes on in step.
    const std::vector<Tensor> two = {ops::empty({6}), ops::empty({6})};
    CHECK_THROWS_WITH_AS(world->all_gather_into_coalesced(two, {ops::empty({2})}),
                         "all_gather_into_coalesced: 2 outputs for 1 inputs", Error);
    CHECK_THROWS_WITH_AS(world->all_reduce_coalesced({}), "all_reduce_coalesced: no tensors to issue", Error);
    CHECK_THROWS_WITH_AS(world->all_gather_into_coalesced(two, {ops::empty({2}), ops::empty({3})}),
                         doctest::Contains("all_gather_into_coalesced (collective 1): out must hold 3 ranks x 3 "
                                           "elements = 9, got 6 elements"),
                         Error);
    world->all_reduce(ops::ones({1}));
  });
}
