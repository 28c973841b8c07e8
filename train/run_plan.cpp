// The plan of a run: its fully_shard calls planned on meta for the run's
// mesh, and the sweep over world sizes with its table, files and chart.
#include "train/run_plan.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>

#include "dist/comm_stats.h"
#include "dist/launch/launch_environment.h"
#include "tensor/error.h"
#include "train/file_roles.h"
#include "train/model_family.h"
#include "train/output_claim.h"
#include "train/resource_limits.h"

namespace tessera::train {

namespace fsdp = tessera::fsdp;

namespace {

std::string series_name(int64_t replicate) {
  return replicate == 1 ? std::string("FSDP") : fmt::format("HSDP R={}", replicate);
}

// The replicate degrees the sweep plans: 1 (FSDP), kSweepReplicas, the run's.
std::vector<int64_t> sweep_replicas(const TrainConfig& config) {
  std::vector<int64_t> replicas = {1};
  replicas.insert(replicas.end(), kSweepReplicas.begin(), kSweepReplicas.end());
  if (std::find(replicas.begin(), replicas.end(), config.hsdp) == replicas.end()) replicas.push_back(config.hsdp);
  return replicas;
}

SweepPoint sweep_point(const TrainConfig& config, tessera::nn::CausalLM& model, const fsdp::PlanMesh& mesh) {
  const fsdp::ShardingPlan plan = plan_run(config, model, mesh);
  return SweepPoint{.series = series_name(mesh.replicate),
                    .mesh = mesh,
                    .parameter_shard_bytes = plan.shard_bytes,
                    .gradient_shard_bytes = plan.gradient_bytes,
                    .optimizer_state_bytes = kAdamWState.copies * plan.gradient_bytes,
                    .peak_unsharded_bytes = plan.peak.bytes,
                    .peak_moment = plan.peak.moment,
                    .comm = fsdp::comm_per_step(plan, config.grad_accum, config.grad_sync)};
}

// "5.8 GiB" in a column.
std::string bytes_cell(int64_t bytes) { return tessera::dist::human_bytes(bytes); }

void print_sweep(const TrainConfig& config, const Sweep& sweep, std::ostream& out) {
  out << fmt::format("\nsweep: per-rank memory and bytes per step of {} over 1 to {} ranks (AdamW, {} parameters, "
                     "reshard_after_forward {}, {} micro-batch{} a step{})\n",
                     config.preset, kSweepMaxRanks, tessera::dtype_name(config.param_dtype),
                     config.reshard_after_forward.to_string(), config.grad_accum, config.grad_accum == 1 ? "" : "es",
                     config.grad_accum == 1 ? "" : fmt::format(", synced {}", grad_sync_name(config.grad_sync)));
  out << fmt::format("  {:<9} {:>24} {:>6} {:>12} {:>12} {:>12} {:>15} {:>13} {:>14}\n", "series", "mesh", "ranks",
                     "param shards", "grad shards", "AdamW state", "unsharded peak", "memory total", "sent per step");
  for (const SweepPoint& point : sweep.points) {
    out << fmt::format("  {:<9} {:>24} {:>6} {:>12} {:>12} {:>12} {:>15} {:>13} {:>14}\n", point.series,
                       point.mesh.to_string(), point.mesh.world(), bytes_cell(point.parameter_shard_bytes),
                       bytes_cell(point.gradient_shard_bytes), bytes_cell(point.optimizer_state_bytes),
                       bytes_cell(point.peak_unsharded_bytes), bytes_cell(point.memory_bytes()),
                       bytes_cell(point.comm.total_sent()));
  }
  for (const std::string& reason : sweep.skipped) out << "  skipped " << reason << '\n';
}

// `text` as the output `path` (given by `flag`): claimed, written to
// PATH.partial and renamed into place, so that a reader never sees half a
// file and two plans given one path never mix theirs (output_claim.h).
void write_output(const TrainConfig& config, const char* flag, const std::string& path, const std::string& text) {
  const checkpoint::Publish publish = config.overwrite ? checkpoint::Publish::replace : checkpoint::Publish::no_clobber;
  OutputClaim(flag, path, partial_path(path), publish).write(text);
}

// A CSV field: quoted when it holds a comma or a quote (doubled inside).
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

double mebibytes(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

std::vector<fsdp::PlannedCall> fully_shard_calls(const TrainConfig& config, tessera::nn::CausalLM& model) {
  std::vector<fsdp::PlannedCall> calls;
  for (const auto& block : model.blocks()) {
    calls.push_back({.module = block.get(), .options = fully_shard_options(config, /*root=*/false, std::nullopt)});
  }
  calls.push_back({.module = &model, .options = fully_shard_options(config, /*root=*/true, std::nullopt)});
  return calls;
}

fsdp::ShardingPlan plan_run(const TrainConfig& config, tessera::nn::CausalLM& model, const fsdp::PlanMesh& mesh) {
  return fsdp::plan_fully_shard(fully_shard_calls(config, model), mesh);
}

Sweep sweep_plans(const TrainConfig& config, tessera::nn::CausalLM& model) {
  Sweep sweep;
  const std::optional<int64_t> post_forward_ranks = config.reshard_after_forward.group_size();
  for (const int64_t replicate : sweep_replicas(config)) {
    for (int64_t shard = 1; replicate * shard <= kSweepMaxRanks; shard *= 2) {
      const fsdp::PlanMesh mesh = fsdp::plan_mesh(replicate * shard, replicate);
      if (post_forward_ranks && mesh.shard % *post_forward_ranks != 0) {
        sweep.skipped.push_back(fmt::format("{} {}: --reshard-after-forward {} must divide its shard group of {}",
                                            series_name(replicate), mesh.to_string(), *post_forward_ranks,
                                            mesh.shard));
        continue;
      }
      sweep.points.push_back(sweep_point(config, model, mesh));
    }
  }
  return sweep;
}

nlohmann::json sweep_json(const TrainConfig& config, const Sweep& sweep) {
  nlohmann::json points = nlohmann::json::array();
  for (const SweepPoint& point : sweep.points) {
    points.push_back({{"series", point.series},
                      {"ranks", point.mesh.world()},
                      {"replicate", point.mesh.replicate},
                      {"shard", point.mesh.shard},
                      {"parameter_shard_bytes", point.parameter_shard_bytes},
                      {"gradient_shard_bytes", point.gradient_shard_bytes},
                      {"optimizer_state_bytes", point.optimizer_state_bytes},
                      {"peak_unsharded_bytes", point.peak_unsharded_bytes},
                      {"peak_moment", point.peak_moment},
                      {"memory_bytes", point.memory_bytes()},
                      {"all_gather_bytes_sent", point.comm.all_gather_bytes_sent},
                      {"reduce_scatter_bytes_sent", point.comm.reduce_scatter_bytes_sent},
                      {"all_reduce_bytes_sent", point.comm.all_reduce_bytes_sent},
                      {"bytes_sent", point.comm.total_sent()},
                      {"bytes_received", point.comm.total_received()}});
  }
  const ModelConfig model = config.model_config();
  return {{"model",
           {{"family", family_name(config.family())},
            {"preset", config.preset},
            {"shape", describe_shape(model)},
            {"parameters", num_parameters(model)}}},
          {"param_dtype", tessera::dtype_name(config.param_dtype)},
          {"reduce_dtype", tessera::dtype_name(config.reduce_dtype.value_or(config.param_dtype))},
          {"reshard_after_forward", config.reshard_after_forward.to_string()},
          {"optimizer", kAdamWState.description},
          {"micro_batches_per_step", config.grad_accum},
          {"grad_sync", grad_sync_name(config.grad_sync)},
          {"points", points},
          {"skipped", sweep.skipped}};
}

std::string sweep_csv(const Sweep& sweep) {
  std::string csv =
      "series,ranks,replicate,shard,parameter_shard_bytes,gradient_shard_bytes,optimizer_state_bytes,"
      "peak_unsharded_bytes,memory_bytes,all_gather_bytes_sent,reduce_scatter_bytes_sent,all_reduce_bytes_sent,"
      "bytes_sent,bytes_received,peak_moment\n";
  for (const SweepPoint& point : sweep.points) {
    csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(point.series), point.mesh.world(),
                       point.mesh.replicate, point.mesh.shard, point.parameter_shard_bytes,
                       point.gradient_shard_bytes, point.optimizer_state_bytes, point.peak_unsharded_bytes,
                       point.memory_bytes(), point.comm.all_gather_bytes_sent, point.comm.reduce_scatter_bytes_sent,
                       point.comm.all_reduce_bytes_sent, point.comm.total_sent(), point.comm.total_received(),
                       csv_field(point.peak_moment));
  }
  return csv;
}

charts::LineChart sweep_chart(const TrainConfig& config, const Sweep& sweep) {
  charts::LineChart chart{
      .title = fmt::format("{}: per-rank memory (solid) and bytes sent per step (dashed)", config.preset),
      .x_label = "ranks",
      .y_label = "MiB per rank",
      .log_x = true,
      .log_y = true,
      .series = {}};
  std::vector<std::string> names;
  for (const SweepPoint& point : sweep.points) {
    if (std::find(names.begin(), names.end(), point.series) == names.end()) names.push_back(point.series);
  }
  for (const std::string& name : names) {
    charts::Series memory{.label = "memory " + name, .x = {}, .y = {}, .dashed = false, .markers = true};
    charts::Series sent{.label = "sent " + name, .x = {}, .y = {}, .dashed = true, .markers = true};
    for (const SweepPoint& point : sweep.points) {
      if (point.series != name) continue;
      const double ranks = static_cast<double>(point.mesh.world());
      memory.x.push_back(ranks);
      memory.y.push_back(mebibytes(point.memory_bytes()));
      if (point.comm.total_sent() > 0) {
        sent.x.push_back(ranks);
        sent.y.push_back(mebibytes(point.comm.total_sent()));
      }
    }
    chart.series.push_back(std::move(memory));
    if (!sent.x.empty()) chart.series.push_back(std::move(sent));
  }
  return chart;
}

void check_plan_outputs(const TrainConfig& config) {
  FileRoles roles;
  const std::vector<std::pair<const char*, std::string>> outputs = {{"--sweep-out", config.sweep_out},
                                                                    {"--sweep-svg", config.sweep_svg}};
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    roles.add_output(flag, path);
    if (!config.overwrite) {
      refuse_existing_output(flag, path, "pass --overwrite to replace it, or choose another path");
    }
  }
  roles.add_output_stream("standard output", STDOUT_FILENO);
  roles.check();
}

void print_plan(const TrainConfig& config, std::ostream& out) {
  if (tessera::dist::detect_launch().rank != 0) return;  // one launched process speaks for all
  const std::unique_ptr<tessera::nn::CausalLM> model = build_model(config.model_config(), tessera::kMeta);
  const fsdp::ShardingPlan plan = plan_run(config, *model, fsdp::plan_mesh(config.nproc, config.hsdp));
  out << describe(config) << "\n\n" << fsdp::format_plan(plan, kAdamWState);

  // What FSDP's plan does not hold: the step's own tensors, from the run's estimate.
  const RankMemoryEstimate estimate = estimate_rank_memory(config);
  out << fmt::format("\nnot in the plan (estimate_rank_memory, --batch {} x --seq-len {}): about {} of activations "
                     "and {} of gradients in flight per rank{}\n",
                     config.batch, config.seq_len, tessera::dist::human_bytes(estimate.activations),
                     tessera::dist::human_bytes(estimate.gathered_gradients),
                     estimate.buffers > 0
                         ? fmt::format(", and {} of buffers every rank holds whole",
                                       tessera::dist::human_bytes(estimate.buffers))
                         : std::string());
  if (config.grad_accum > 1) {  // the plan's communication is one micro-batch's
    const fsdp::StepCommVolume step = fsdp::comm_per_step(plan, config.grad_accum, config.grad_sync);
    out << fmt::format("a step of {} micro-batches synced {}: {} all-gathers, {} reduce-scatters{}, {} sent per rank\n",
                       config.grad_accum, grad_sync_name(config.grad_sync), step.all_gather_calls,
                       step.reduce_scatter_calls,
                       step.all_reduce_calls > 0 ? fmt::format(", {} all-reduces", step.all_reduce_calls) : "",
                       tessera::dist::human_bytes(step.total_sent()));
  }
  out << std::flush;
  if (!config.sweep) return;

  const Sweep sweep = sweep_plans(config, *model);
  print_sweep(config, sweep, out);
  if (!config.sweep_out.empty()) {
    write_output(config, "--sweep-out", config.sweep_out,
                 config.sweep_out.ends_with(".csv") ? sweep_csv(sweep) : sweep_json(config, sweep).dump(2) + "\n");
    out << fmt::format("  wrote {}\n", config.sweep_out);
  }
  if (!config.sweep_svg.empty()) {
    write_output(config, "--sweep-svg", config.sweep_svg, charts::to_svg(sweep_chart(config, sweep)));
    out << fmt::format("  wrote {}\n", config.sweep_svg);
  }
  out << std::flush;
}

}  // namespace tessera::train
