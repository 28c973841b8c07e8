// bench/step_schedule: the ring model's seconds, and the replay of a schedule
// on it: streams in order, events and host waits honoured, the SMs one kernel
// at a time and slowed while NCCL holds some of them, collectives sharing the
// link, exposed communication counted, impossible schedules refused.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "bench/step_schedule.h"
#include "tensor/error.h"

namespace {

using bench::Engine;
using bench::StepOp;
using Kind = StepOp::Kind;

constexpr double kMs = 1e-3;

StepOp kernel(int stream, double ms, std::string name = "kernel") {
  return {.kind = Kind::work, .stream = stream, .engine = Engine::sms, .seconds = ms * kMs, .name = std::move(name)};
}
StepOp collective(int stream, double ms, int link = 0) {
  return {.kind = Kind::work,
          .stream = stream,
          .engine = Engine::link,
          .seconds = ms * kMs,
          .name = "collective",
          .link = link};
}
StepOp record(int stream, int64_t event) {
  return {.kind = Kind::record, .stream = stream, .event = event, .name = "record"};
}
StepOp wait(int stream, int64_t event) {
  return {.kind = Kind::wait, .stream = stream, .event = event, .name = "wait"};
}
StepOp host_wait(int64_t event) { return {.kind = Kind::host_wait, .event = event, .name = "host wait"}; }

std::string message_of(const std::vector<StepOp>& ops) {
  try {
    bench::replay(ops, bench::h100_nvlink());
  } catch (const tessera::Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("ring model: an all-gather moves (N - 1) / N of the buffer in N - 1 latency steps") {
  const bench::LinkModel link = bench::h100_nvlink();
  CHECK(link.bytes_per_second.value == 450e9);
  CHECK(link.efficiency.value < 1.0);
  const double bandwidth = 450e9 * link.efficiency.value;
  const int64_t bytes = 256 << 20;
  const double all_gather = 7.0 / 8.0 * bytes / bandwidth + 7 * link.step_latency.value;
  CHECK(bench::ring_seconds(link, "all_gather_into", bytes, 8) == doctest::Approx(all_gather).epsilon(1e-12));
  CHECK(bench::ring_seconds(link, "reduce_scatter_into", bytes, 8) == doctest::Approx(all_gather).epsilon(1e-12));
  CHECK(bench::ring_seconds(link, "all_reduce", bytes, 8) == doctest::Approx(2 * all_gather).epsilon(1e-12));
  CHECK(bench::ring_seconds(link, "all_gather_into", bytes, 1) == 0);
  // 2 ranks move half the buffer: 3.5/8 of the 8-rank time's bytes term less.
  CHECK(bench::ring_seconds(link, "all_gather_into", bytes, 2) <
        bench::ring_seconds(link, "all_gather_into", bytes, 8));
  CHECK_THROWS_WITH_AS(bench::ring_seconds(link, "all_to_all", bytes, 8),
                       doctest::Contains("no ring model for collective 'all_to_all'"), tessera::Error);
}

TEST_CASE("replay: one stream runs in order; kernels of two streams share the SMs one at a time") {
  const bench::StepTiming serial = bench::replay({kernel(0, 1), kernel(0, 2)}, bench::h100_nvlink());
  CHECK(serial.step_seconds == doctest::Approx(3 * kMs));
  CHECK(serial.start[1] == doctest::Approx(1 * kMs));
  CHECK(serial.compute_seconds == doctest::Approx(3 * kMs));
  CHECK(serial.communication_seconds == 0);

  const bench::StepTiming two_streams = bench::replay({kernel(0, 1), kernel(1, 2)}, bench::h100_nvlink());
  CHECK(two_streams.step_seconds == doctest::Approx(3 * kMs));
  CHECK(two_streams.start[0] == 0);
  CHECK(two_streams.start[1] == doctest::Approx(1 * kMs));
}

TEST_CASE("replay: a collective beside a kernel hides, and slows the kernel by the SMs NCCL holds") {
  const bench::LinkModel link = bench::h100_nvlink();
  const double f = link.nccl_sm_fraction.value;
  const bench::StepTiming t = bench::replay({kernel(0, 2), collective(1, 1)}, link);
  // 1 ms together (the kernel at 1 - f), then the kernel's rest alone.
  CHECK(t.end[1] == doctest::Approx(1 * kMs));
  CHECK(t.end[0] == doctest::Approx((2 + f) * kMs));
  CHECK(t.step_seconds == doctest::Approx((2 + f) * kMs));
  CHECK(t.communication_seconds == doctest::Approx(1 * kMs));
  CHECK(t.exposed_seconds == 0);
  CHECK(t.compute_alone_seconds == doctest::Approx(2 * kMs));
  CHECK(t.collectives_alone_seconds == doctest::Approx(1 * kMs));
}

TEST_CASE("replay: events order streams, and a collective the compute stream waits for is exposed") {
  // compute: K1, record 0 | comm: wait 0, C, record 1 | compute: wait 1, K2
  const std::vector<StepOp> ops = {kernel(0, 1),     record(0, 0), wait(1, 0),  collective(1, 2),
                                   record(1, 1), wait(0, 1),   kernel(0, 1, "K2")};
  const bench::StepTiming t = bench::replay(ops, bench::h100_nvlink());
  CHECK(t.start[3] == doctest::Approx(1 * kMs));
  CHECK(t.start[6] == doctest::Approx(3 * kMs));
  CHECK(t.step_seconds == doctest::Approx(4 * kMs));
  CHECK(t.exposed_seconds == doctest::Approx(2 * kMs));
  CHECK(t.compute_seconds == doctest::Approx(2 * kMs));
}

TEST_CASE("replay: concurrent collectives share the link") {
  const bench::StepTiming t = bench::replay({collective(1, 1), collective(2, 1)}, bench::h100_nvlink());
  CHECK(t.end[0] == doctest::Approx(2 * kMs));
  CHECK(t.end[1] == doctest::Approx(2 * kMs));
  CHECK(t.exposed_seconds == doctest::Approx(2 * kMs));
}

TEST_CASE("replay: collectives on two links run side by side, each link's exposed time counted apart") {
  const std::vector<bench::LinkModel> links = {bench::h100_nvlink(), bench::h100_infiniband()};
  const bench::StepTiming apart = bench::replay({collective(1, 1, 0), collective(2, 3, 1)}, links);
  CHECK(apart.end[0] == doctest::Approx(1 * kMs));  // not slowed by the other link's collective
  CHECK(apart.end[1] == doctest::Approx(3 * kMs));
  CHECK(apart.exposed_seconds_by_link[0] == doctest::Approx(1 * kMs));
  CHECK(apart.exposed_seconds_by_link[1] == doctest::Approx(3 * kMs));
  CHECK(apart.exposed_seconds == doctest::Approx(3 * kMs));
  // A kernel beside both loses the SMs of both links' NCCL.
  const bench::StepTiming beside = bench::replay({kernel(0, 1), collective(1, 5, 0), collective(2, 5, 1)}, links);
  const double taken = links[0].nccl_sm_fraction.value + links[1].nccl_sm_fraction.value;
  CHECK(beside.end[0] == doctest::Approx(1 * kMs / (1 - taken)));
  CHECK(beside.exposed_seconds_by_link[0] == doctest::Approx(5 * kMs - beside.end[0]));
  // A link the replay does not have is refused, naming the op.
  try {
    bench::replay({collective(1, 1, 2)}, links);
    FAIL("link 2 of 2 links was accepted");
  } catch (const tessera::Error& error) {
    CHECK(std::string(error.what()).find("op 0 ('collective') runs on link 2; the replay has links 0 to 1") !=
          std::string::npos);
  }
}

TEST_CASE("replay: the host gives nothing after a host wait until the record it waits for is reached") {
  const std::vector<StepOp> without = {kernel(0, 1), record(0, 0), collective(1, 1)};
  CHECK(bench::replay(without, bench::h100_nvlink()).start[2] == 0);
  const std::vector<StepOp> with = {kernel(0, 1), record(0, 0), host_wait(0), collective(1, 1)};
  const bench::StepTiming t = bench::replay(with, bench::h100_nvlink());
  CHECK(t.start[3] == doctest::Approx(1 * kMs));
  CHECK(t.step_seconds == doctest::Approx(2 * kMs));
  CHECK(t.exposed_seconds == doctest::Approx(1 * kMs));
}

TEST_CASE("replay: a wait for an event nothing records earlier is refused, naming the op and the event") {
  CHECK(message_of({wait(0, 7), kernel(0, 1)}).find("op 0 (stream 0) waits for event 7, which no earlier op records") !=
        std::string::npos);
  CHECK(message_of({wait(0, 3), record(1, 3)}).find("which no earlier op records") != std::string::npos);
  CHECK(message_of({record(0, 1), record(1, 1)}).find("event 1 is recorded twice (ops 0 and 1)") != std::string::npos);
  CHECK(message_of({host_wait(4)}).find("the host waits for event 4, which no op records") != std::string::npos);
  CHECK(message_of({kernel(0, -1)}).find("op 0 ('kernel') takes") != std::string::npos);
}
