// A recorded FSDP step (the nano GPT on 2 simulated GPUs), as
// bench/fsdp_step_prediction records it: the collectives are where FSDP puts
// them, the compute stream waits for the all-gathers through events, and the
// replay finds the overlap that prefetching gives.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <vector>

#include "bench/recorded_step.h"
#include "bench/step_schedule.h"

using namespace tessera;
namespace sim = tessera::cuda::sim;
using sim::ScheduledOp;

namespace {

std::vector<ScheduledOp> record_second_step() {
  tessera::train::TrainConfig config;
  config.model = nn::GPTConfig::preset("nano");
  config.model.n_layer = 2;
  config.seq_len = 16;
  config.batch = 1;
  config.steps = 2;
  config.warmup = 0;
  config.data = tessera::train::kSyntheticData;
  config.eval_every = 0;
  config.threads = 1;
  config.device = Device(DeviceType::cuda);
  config.nproc = 2;
  return bench::record_second_step(config);
}

// Every kernel and GEMM `kernel_us`, every collective `collective_us`.
std::vector<bench::StepOp> with_times(const std::vector<ScheduledOp>& recorded, double kernel_us,
                                      double collective_us) {
  std::vector<bench::StepOp> ops;
  for (const ScheduledOp& op : recorded) {
    bench::StepOp out = bench::step_op(op);
    if (out.kind == bench::StepOp::Kind::work) {
      out.seconds = (out.engine == bench::Engine::link ? collective_us : kernel_us) * 1e-6;
    }
    ops.push_back(std::move(out));
  }
  return ops;
}

}  // namespace

TEST_CASE("a recorded FSDP step: collectives on their own streams, waited for by compute through events") {
  const std::vector<ScheduledOp> ops = record_second_step();
  REQUIRE(!ops.empty());
  std::set<int> gemm_streams, collective_streams;
  int all_gathers = 0, reduce_scatters = 0;
  for (const ScheduledOp& op : ops) {
    if (op.kind == ScheduledOp::Kind::gemm) {
      gemm_streams.insert(op.stream);
      CHECK(op.flops == 2 * op.m * op.n * op.k * op.batch);
    }
    if (op.kind != ScheduledOp::Kind::collective) continue;
    collective_streams.insert(op.stream);
    CHECK(op.ranks == 2);
    CHECK(op.bytes > 0);
    all_gathers += op.name == "all_gather_into";
    reduce_scatters += op.name == "reduce_scatter_into";
  }
  // Forward and backward matmuls on the one compute stream; no collective there.
  REQUIRE(gemm_streams.size() == 1);
  const int compute = *gemm_streams.begin();
  CHECK(!collective_streams.contains(compute));
  // Two blocks and the root: each all-gathered in forward, the blocks again
  // in backward (resharded after forward), each reduce-scattered once.
  CHECK(all_gathers == 5);
  CHECK(reduce_scatters == 3);
  // The compute stream waits for records made on the collective streams.
  std::map<int64_t, int> record_stream;
  int compute_waits_for_collectives = 0;
  for (const ScheduledOp& op : ops) {
    if (op.kind == ScheduledOp::Kind::record) record_stream[op.event] = op.stream;
    if (op.kind == ScheduledOp::Kind::wait && op.stream == compute &&
        collective_streams.contains(record_stream.at(op.event))) {
      ++compute_waits_for_collectives;
    }
  }
  CHECK(compute_waits_for_collectives >= all_gathers);

  SUBCASE("replayed, collectives beside compute hide behind it, and the rest is counted as exposed") {
    const bench::LinkModel link = bench::h100_nvlink();
    const bench::StepTiming free_links = bench::replay(with_times(ops, 10, 0), link);
    CHECK(free_links.exposed_seconds == 0);
    CHECK(free_links.step_seconds == doctest::Approx(free_links.compute_alone_seconds));
    const bench::StepTiming t = bench::replay(with_times(ops, 10, 20), link);
    CHECK(t.collectives_alone_seconds == doctest::Approx(8 * 20e-6));
    // Prefetch overlaps some collectives with compute, never all: the first
    // all-gather has nothing before it to hide behind.
    CHECK(t.exposed_seconds > 0);
    CHECK(t.exposed_seconds < t.collectives_alone_seconds);
    CHECK(t.step_seconds < t.compute_alone_seconds + t.collectives_alone_seconds);
    CHECK(t.step_seconds > t.compute_alone_seconds);
  }
}
