// bench/schedule_fit: from the schedules a small model's runs record on the
// simulator to the schedule of a target model, each op with its PREDICTED
// seconds (bench/fsdp_step_prediction and bench/tp_step_prediction use it).
//
// The small model keeps the target's ratios between its widths (C, F, V and
// the heads shrink by one factor w, so every tp-local width does too) and runs
// the target's layout (ranks per group, tp, options). Four runs at
// (B, T) = (2, T0), (4, T0), (2, 2 T0), (4, 2 T0) give each op, separately,
//     work(B, T) = p + t T + a B T + s B T^2
// for each counted quantity (device bytes, shared bytes, FLOPs, bytes a copy
// or collective moves); a fifth run checks the fit. At the target, p
// (parameters, shards, optimizer state: ~C^2) grows by the ratio of the
// parameter counts; t, a and s (activations, attention: ~C) by w. A GEMM gets
// its target shape: a dimension that is a fixed fraction of B T (the tokens,
// a sequence shard, a batch chunk), of T or of B in every run is that fraction
// of the target's; a width grows by w unless the scale maps it.
//
// Every run must record the same sequence of ops; one that does not is an
// error naming the first op that differs.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "bench/gpu_roofline.h"
#include "bench/step_schedule.h"
#include "tensor/cuda/sim/schedule_recorder.h"

namespace bench {

struct RunShape {
  int64_t batch = 1, seq = 1;
};

// The target and how the small model's work grows to it.
struct TargetScale {
  RunShape shape;
  double param_ratio = 1;  // p terms
  double width_ratio = 1;  // w: t, a and s terms, and GEMM widths
  // GEMM widths that do not grow by w (small -> target), such as a
  // key/value width where the small model keeps fewer query heads per
  // key/value head than the target. It maps every fixed GEMM dimension of
  // that value, so choose the small model's widths distinct.
  std::map<int64_t, int64_t> gemm_widths = {};
};

enum Quantity { kDeviceBytes, kSharedBytes, kFlops, kMovedBytes, kQuantities };
double quantity(const tessera::cuda::sim::ScheduledOp& op, int q);

struct FittedOp {
  tessera::cuda::sim::ScheduledOp op;                    // from the first run
  std::array<std::array<double, 4>, kQuantities> terms;  // p, t, a, s per quantity
  std::array<double, 3> gemm_dims{};                     // m, n, k at the target
  double gemm_batch = 1;
};

// `runs` at `shapes` (four of them); `program` names the caller in errors.
std::vector<FittedOp> fit(const std::vector<std::vector<tessera::cuda::sim::ScheduledOp>>& runs,
                          const std::vector<RunShape>& shapes, const TargetScale& target, const std::string& program);

// Every run's sequence of ops (kind, stream, name, event) must be the same.
void require_same_sequence(const std::vector<std::vector<tessera::cuda::sim::ScheduledOp>>& runs,
                           const std::vector<RunShape>& shapes, const std::string& program);

// A fitted quantity at shape `s`, its p term grown by param_ratio and the others by w.
double evaluate(const std::array<double, 4>& terms, const RunShape& s, double param_ratio, double w);

// The fit against a run it did not see: the largest error of any op's
// quantity, relative to the run's total of that quantity.
double check_fit(const std::vector<FittedOp>& fitted, const std::vector<tessera::cuda::sim::ScheduledOp>& check,
                 const RunShape& s);

// A collective's seconds and link at the target, given its fitted bytes.
struct CollectiveTiming {
  double seconds = 0;
  int link = 0;
};
using CollectiveModel = std::function<CollectiveTiming(const tessera::cuda::sim::ScheduledOp& op, double bytes)>;

// The replay's ops at the target, each with its PREDICTED seconds: kernels and
// GEMMs on `gpu`'s roofline (tensor-core attention by its calibrated rate),
// copies between host and device at `host`'s PCIe rate, collectives by `collective`.
std::vector<StepOp> target_ops(const std::vector<FittedOp>& fitted, const TargetScale& target, const GpuModel& gpu,
                               const LinkModel& host, const CollectiveModel& collective);

// Whether a kernel is tensor-core attention (its name says "attention" and "mma").
bool is_attention_mma(const std::string& name);

// A prediction program's start: refuses an --prediction-out that is the
// --calibration file (before the minutes of simulation, so a typo costs
// neither), prints where it runs and every figure of the GPU and the links
// with its source, and returns the H100 model with the calibration applied.
GpuModel start_prediction(const std::string& program, const std::string& calibration, const std::string& out_path,
                          const std::vector<LinkModel>& links);
// Writes the predicted figures to `out_path` (none when it is empty).
void write_prediction(const nlohmann::json& figures, const std::string& out_path, const std::string& program);

}  // namespace bench
