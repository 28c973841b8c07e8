// bench/schedule_fit: the fit recovers each op's work law from four sizes and
// evaluates it at the target; GEMM dimensions become the target's (tokens,
// sequence shards and batch chunks by their fraction, widths by w or by the
// scale's map); schedules that differ, and dimensions that follow no law,
// are refused by name; collectives take the model's link and seconds.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "bench/schedule_fit.h"
#include "tensor/error.h"

using bench::RunShape;
using tessera::cuda::sim::ScheduledOp;

namespace {

const std::vector<RunShape> kFitShapes = {{2, 64}, {4, 64}, {2, 128}, {4, 128}};

// One run's schedule: a kernel whose bytes follow p + t T + a B T + s B T^2,
// a GEMM of [B T / chunks, width] x [width, 3 * width], and a collective.
std::vector<ScheduledOp> schedule_at(const RunShape& s, int64_t width, int64_t chunks = 1) {
  const double b = static_cast<double>(s.batch), t = static_cast<double>(s.seq);
  ScheduledOp kernel{.kind = ScheduledOp::Kind::kernel, .stream = 0, .name = "norm"};
  kernel.device_bytes = static_cast<int64_t>(1000 + 3 * t + 5 * b * t + 7 * b * t * t);
  ScheduledOp gemm{.kind = ScheduledOp::Kind::gemm, .stream = 0, .name = "cublasLtMatmul"};
  gemm.m = 3 * width;
  gemm.n = s.batch * s.seq / chunks;
  gemm.k = width;
  ScheduledOp collective{.kind = ScheduledOp::Kind::collective, .stream = 1, .name = "all_gather_into"};
  collective.bytes = 4096 + 2 * s.batch * s.seq * width;
  collective.ranks = 2;
  collective.group = "tp";
  return {kernel, gemm, collective};
}

std::vector<std::vector<ScheduledOp>> runs_of(int64_t width, int64_t chunks = 1) {
  std::vector<std::vector<ScheduledOp>> runs;
  for (const RunShape& s : kFitShapes) runs.push_back(schedule_at(s, width, chunks));
  return runs;
}

std::string error_of(auto&& body) {
  try {
    body();
  } catch (const tessera::Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("bench") {

TEST_CASE("schedule fit: each op's law from four sizes, at the target with p by the parameters, the rest by w") {
  const bench::TargetScale target{.shape = {16, 1024}, .param_ratio = 100, .width_ratio = 8};
  const std::vector<bench::FittedOp> fitted = bench::fit(runs_of(32), kFitShapes, target, "test");
  REQUIRE(fitted.size() == 3);
  const auto& norm = fitted[0].terms[bench::kDeviceBytes];
  CHECK(norm[0] == doctest::Approx(1000));
  CHECK(norm[1] == doctest::Approx(3));
  CHECK(norm[2] == doctest::Approx(5));
  CHECK(norm[3] == doctest::Approx(7));
  const double b = 16, t = 1024;
  const double expected = 1000 * 100 + 8 * (3 * t + 5 * b * t + 7 * b * t * t);
  CHECK(bench::evaluate(norm, target.shape, 100, 8) == doctest::Approx(expected));
  // The fit against a size it did not see.
  CHECK(bench::check_fit(fitted, schedule_at({3, 64}, 32), {3, 64}) < 1e-9);
  // The GEMM: m = 3 C grows by w, n = B T becomes the target's, k = C grows by w.
  CHECK(fitted[1].gemm_dims[0] == doctest::Approx(3 * 32 * 8));
  CHECK(fitted[1].gemm_dims[1] == doctest::Approx(b * t));
  CHECK(fitted[1].gemm_dims[2] == doctest::Approx(32 * 8));
}

TEST_CASE("schedule fit: a batch chunk stays its fraction of the target's tokens; a mapped width takes its target") {
  bench::TargetScale target{.shape = {16, 1024}, .param_ratio = 1, .width_ratio = 8};
  target.gemm_widths = {{32, 128}};  // k = 32 -> 128 (not 256); m = 96 still grows by w
  const std::vector<bench::FittedOp> fitted = bench::fit(runs_of(32, 2), kFitShapes, target, "test");
  CHECK(fitted[1].gemm_dims[0] == doctest::Approx(96 * 8));
  CHECK(fitted[1].gemm_dims[1] == doctest::Approx(16 * 1024 / 2));
  CHECK(fitted[1].gemm_dims[2] == doctest::Approx(128));
}

TEST_CASE("schedule fit: collectives take the model's seconds and link; the rest their roofline times") {
  const bench::TargetScale target{.shape = {16, 1024}, .param_ratio = 1, .width_ratio = 8};
  const std::vector<bench::FittedOp> fitted = bench::fit(runs_of(32), kFitShapes, target, "test");
  double seen_bytes = 0;
  const std::vector<bench::StepOp> ops = bench::target_ops(
      fitted, target, bench::h100_sxm(), bench::h100_nvlink(), [&](const ScheduledOp& op, double bytes) {
        CHECK(op.group == "tp");
        seen_bytes = bytes;
        return bench::CollectiveTiming{.seconds = 0.25, .link = 1};
      });
  REQUIRE(ops.size() == 3);
  CHECK(seen_bytes == doctest::Approx(4096 + 8 * 2 * 16 * 1024 * 32));
  CHECK(ops[2].engine == bench::Engine::link);
  CHECK(ops[2].link == 1);
  CHECK(ops[2].seconds == 0.25);
  CHECK(ops[0].seconds > 0);
  CHECK(ops[1].seconds > 0);
}

TEST_CASE("schedule fit: differing schedules and lawless GEMM dimensions are refused, naming the op") {
  const bench::TargetScale target{.shape = {16, 1024}, .param_ratio = 1, .width_ratio = 8};
  std::vector<std::vector<ScheduledOp>> runs = runs_of(32);
  runs[2][2].group = "shard";
  CHECK(error_of([&] { bench::fit(runs, kFitShapes, target, "test"); })
            .find("test: the schedules of (B 2, T 64) and (B 2, T 128) differ at op 2") != std::string::npos);
  runs = runs_of(32);
  runs[3][1].k = 33;  // neither fixed nor a fraction of B T, T or B
  CHECK(error_of([&] { bench::fit(runs, kFitShapes, target, "test"); })
            .find("GEMM op 1 has a dimension that is no fixed fraction of B T, T or B, and not fixed: 32 at (B 2, T "
                  "64); 32 at (B 4, T 64); 32 at (B 2, T 128); 33 at (B 4, T 128);") != std::string::npos);
}

}  // TEST_SUITE
