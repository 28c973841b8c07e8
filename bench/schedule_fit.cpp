#include "bench/schedule_fit.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "bench/machine_context.h"
#include "bench/recorded_step.h"
#include "tensor/error.h"

namespace bench {

namespace sim = tessera::cuda::sim;
using sim::ScheduledOp;

namespace {

std::array<double, 4> basis(const RunShape& s) {
  const double b = static_cast<double>(s.batch), t = static_cast<double>(s.seq);
  return {1.0, t, b * t, b * t * t};
}

// Solves the 4 x 4 system rows x = values (Gaussian elimination, partial pivoting).
std::array<double, 4> solve(std::array<std::array<double, 4>, 4> rows, std::array<double, 4> values) {
  for (int column = 0; column < 4; ++column) {
    int pivot = column;
    for (int r = column + 1; r < 4; ++r) {
      if (std::abs(rows[r][column]) > std::abs(rows[pivot][column])) pivot = r;
    }
    std::swap(rows[column], rows[pivot]);
    std::swap(values[column], values[pivot]);
    for (int r = column + 1; r < 4; ++r) {
      const double factor = rows[r][column] / rows[column][column];
      for (int k = column; k < 4; ++k) rows[r][k] -= factor * rows[column][k];
      values[r] -= factor * values[column];
    }
  }
  std::array<double, 4> x{};
  for (int r = 3; r >= 0; --r) {
    double sum = values[r];
    for (int k = r + 1; k < 4; ++k) sum -= rows[r][k] * x[k];
    x[r] = sum / rows[r][r];
  }
  return x;
}

const char* kind_name(ScheduledOp::Kind kind) {
  constexpr std::array<const char*, 7> names = {"kernel", "gemm", "copy", "collective", "record", "wait", "host wait"};
  return names[static_cast<size_t>(kind)];
}

// A GEMM dimension at the target: a fixed fraction of B T, T or B if it is
// that in every run (the tokens, a sequence shard, a batch chunk), else a
// width (the same in every run), mapped or grown by w.
double target_dimension(const std::vector<int64_t>& per_run, const std::vector<RunShape>& shapes,
                        const TargetScale& target, double w, size_t op, const std::string& program) {
  const auto same_fraction = [&](auto size_of) {
    // per_run[r] / size_of(r) == per_run[0] / size_of(0), in integers.
    for (size_t r = 0; r < per_run.size(); ++r) {
      if (per_run[r] * size_of(shapes.at(0)) != per_run[0] * size_of(shapes.at(r))) return false;
    }
    return true;
  };
  const auto fraction_of = [&](int64_t small, int64_t at_target) {
    return static_cast<double>(per_run[0]) / static_cast<double>(small) * static_cast<double>(at_target);
  };
  const RunShape& first = shapes.at(0);
  const RunShape& t = target.shape;
  if (same_fraction([](const RunShape& s) { return s.batch * s.seq; })) {
    return fraction_of(first.batch * first.seq, t.batch * t.seq);
  }
  if (same_fraction([](const RunShape& s) { return s.seq; })) {
    return fraction_of(first.seq, t.seq);
  }
  if (same_fraction([](const RunShape& s) { return s.batch; })) {
    return fraction_of(first.batch, t.batch);
  }
  if (std::all_of(per_run.begin(), per_run.end(), [&](int64_t v) { return v == per_run[0]; })) {
    const auto mapped = target.gemm_widths.find(per_run[0]);
    return mapped != target.gemm_widths.end() ? static_cast<double>(mapped->second)
                                              : static_cast<double>(per_run[0]) * w;
  }
  std::string values;
  for (size_t r = 0; r < per_run.size(); ++r) {
    values += fmt::format(" {} at (B {}, T {});", per_run[r], shapes.at(r).batch, shapes.at(r).seq);
  }
  tessera::fail("{}: GEMM op {} has a dimension that is no fixed fraction of B T, T or B, and not fixed:{}", program,
                op, values);
}

}  // namespace

double quantity(const ScheduledOp& op, int q) {
  switch (q) {
    case kDeviceBytes: return static_cast<double>(op.device_bytes);
    case kSharedBytes: return static_cast<double>(op.shared_bytes);
    case kFlops: return static_cast<double>(op.flops);
    default: return static_cast<double>(op.bytes);
  }
}

void require_same_sequence(const std::vector<std::vector<ScheduledOp>>& runs, const std::vector<RunShape>& shapes,
                           const std::string& program) {
  const std::vector<ScheduledOp>& first = runs[0];
  for (size_t r = 1; r < runs.size(); ++r) {
    const std::vector<ScheduledOp>& other = runs[r];
    for (size_t i = 0; i < std::max(first.size(), other.size()); ++i) {
      const bool same = i < first.size() && i < other.size() && first[i].kind == other[i].kind &&
                        first[i].stream == other[i].stream && first[i].name == other[i].name &&
                        first[i].event == other[i].event && first[i].group == other[i].group;
      TESSERA_CHECK(same,
                    "{}: the schedules of (B {}, T {}) and (B {}, T {}) differ at op {}: {} against {}; the prediction "
                    "needs one sequence of ops for every size",
                    program, shapes[0].batch, shapes[0].seq, shapes[r].batch, shapes[r].seq, i,
                    i < first.size() ? fmt::format("{} '{}' on stream {}", kind_name(first[i].kind), first[i].name,
                                                   first[i].stream)
                                     : "the end",
                    i < other.size() ? fmt::format("{} '{}' on stream {}", kind_name(other[i].kind), other[i].name,
                                                   other[i].stream)
                                     : "the end");
    }
  }
}

std::vector<FittedOp> fit(const std::vector<std::vector<ScheduledOp>>& runs, const std::vector<RunShape>& shapes,
                          const TargetScale& target, const std::string& program) {
  TESSERA_CHECK(runs.size() == 4 && shapes.size() == 4, "{}: the fit takes 4 runs, got {}", program, runs.size());
  require_same_sequence(runs, shapes, program);
  const std::vector<ScheduledOp>& first = runs[0];
  std::array<std::array<double, 4>, 4> rows{};
  for (int r = 0; r < 4; ++r) rows[r] = basis(shapes[r]);
  std::vector<FittedOp> fitted;
  for (size_t i = 0; i < first.size(); ++i) {
    FittedOp f{first[i], {}, {}, 1};
    for (int q = 0; q < kQuantities; ++q) {
      std::array<double, 4> values{};
      for (int r = 0; r < 4; ++r) values[r] = quantity(runs[r][i], q);
      f.terms[q] = solve(rows, values);
    }
    if (first[i].kind == ScheduledOp::Kind::gemm) {
      const auto dims = [&](auto member) {
        std::vector<int64_t> per_run;
        for (const auto& run : runs) per_run.push_back(run[i].*member);
        return target_dimension(per_run, shapes, target, target.width_ratio, i, program);
      };
      f.gemm_dims = {dims(&ScheduledOp::m), dims(&ScheduledOp::n), dims(&ScheduledOp::k)};
      std::vector<int64_t> batches;
      for (const auto& run : runs) batches.push_back(run[i].batch);
      f.gemm_batch = batches[0] == 1 ? 1 : target_dimension(batches, shapes, target, 1.0, i, program);
    }
    fitted.push_back(std::move(f));
  }
  return fitted;
}

double evaluate(const std::array<double, 4>& terms, const RunShape& s, double param_ratio, double w) {
  const std::array<double, 4> x = basis(s);
  return terms[0] * param_ratio * x[0] + w * (terms[1] * x[1] + terms[2] * x[2] + terms[3] * x[3]);
}

double check_fit(const std::vector<FittedOp>& fitted, const std::vector<ScheduledOp>& check, const RunShape& s) {
  double worst = 0;
  for (int q = 0; q < kQuantities; ++q) {
    double total = 0;
    for (const ScheduledOp& op : check) total += quantity(op, q);
    if (total == 0) continue;
    for (size_t i = 0; i < fitted.size(); ++i) {
      const double error = std::abs(evaluate(fitted[i].terms[q], s, 1.0, 1.0) - quantity(check[i], q));
      worst = std::max(worst, error / total);
    }
  }
  return worst;
}

bool is_attention_mma(const std::string& name) {
  return name.find("attention") != std::string::npos && name.find("mma") != std::string::npos;
}

std::vector<StepOp> target_ops(const std::vector<FittedOp>& fitted, const TargetScale& target, const GpuModel& gpu,
                               const LinkModel& host, const CollectiveModel& collective) {
  std::vector<StepOp> ops;
  for (const FittedOp& f : fitted) {
    const ScheduledOp& op = f.op;
    StepOp out = step_op(op);
    const auto at_target = [&](int q) {
      return std::max(0.0, evaluate(f.terms[q], target.shape, target.param_ratio, target.width_ratio));
    };
    switch (op.kind) {
      case ScheduledOp::Kind::record:
      case ScheduledOp::Kind::wait:
      case ScheduledOp::Kind::host_wait: break;
      case ScheduledOp::Kind::collective: {
        const CollectiveTiming timing = collective(op, at_target(kMovedBytes));
        out.seconds = timing.seconds;
        out.link = timing.link;
        break;
      }
      case ScheduledOp::Kind::copy: {
        const double bytes = at_target(kMovedBytes);
        if (op.name.find("host to device") != std::string::npos) {
          out.engine = Engine::host_to_device;
          out.seconds = bytes / host.host_bytes_per_second.value;
        } else if (op.name.find("device to host") != std::string::npos) {
          out.engine = Engine::device_to_host;
          out.seconds = bytes / host.host_bytes_per_second.value;
        } else {
          const KernelWork copy{.name = op.name, .launches = 1, .hbm_bytes = 2 * bytes, .gemms = {}};
          out.seconds = predict_kernel(gpu, copy).seconds;
        }
        break;
      }
      case ScheduledOp::Kind::kernel:
      case ScheduledOp::Kind::gemm: {
        KernelWork work{.name = op.name,
                        .launches = 1,
                        .hbm_bytes = at_target(kDeviceBytes),
                        .shared_bytes = at_target(kSharedBytes),
                        .flops = at_target(kFlops),
                        .gemms = {}};
        if (op.kind == ScheduledOp::Kind::gemm) {
          work.unit = ComputeUnit::tensor_core_gemm;
          const auto [m, n, k] = f.gemm_dims;
          work.flops = 2 * m * n * k * f.gemm_batch;
          // cuBLASLt's column-major D[m, n] is tessera's row-major [n, m]:
          // the roofline's table holds row-major shapes (rows, out, in).
          work.gemms = {{{static_cast<int64_t>(n), static_cast<int64_t>(m), static_cast<int64_t>(k)}, f.gemm_batch}};
        } else if (is_attention_mma(op.name)) {
          work.unit = ComputeUnit::tensor_core_attention;
        } else {
          // CUDA-core arithmetic is not counted; one FLOP per byte, as
          // gpt2_step_prediction assumes, never binds at these rates.
          work.flops = work.hbm_bytes;
        }
        out.seconds = predict_kernel(gpu, work).seconds;
        break;
      }
    }
    ops.push_back(std::move(out));
  }
  return ops;
}

GpuModel start_prediction(const std::string& program, const std::string& calibration, const std::string& out_path,
                          const std::vector<LinkModel>& links) {
  TESSERA_CHECK(out_path.empty() || calibration.empty() || !std::filesystem::exists(out_path) ||
                    !std::filesystem::equivalent(out_path, calibration),
                "{}: --prediction-out {} is the --calibration file; it would be overwritten", program, out_path);
  fmt::print("# {}: simulated on {} (load {})\n", program, cpu_model(), load_average());
  GpuModel gpu = h100_sxm();
  if (!calibration.empty()) apply_calibration_file(gpu, calibration);
  fmt::print("PREDICTED, not measured. The GPU:\n");
  for (const std::string& line : describe(gpu)) fmt::print("  {}\n", line);
  for (const LinkModel& link : links) {
    fmt::print("The {} links:\n", link.name);
    for (const std::string& line : describe(link)) fmt::print("  {}\n", line);
  }
  return gpu;
}

void write_prediction(const nlohmann::json& figures, const std::string& out_path, const std::string& program) {
  if (out_path.empty()) return;
  std::ofstream file(out_path);
  file << figures.dump(2) << "\n";
  TESSERA_CHECK(file.good(), "{}: cannot write --prediction-out {}", program, out_path);
}

}  // namespace bench
