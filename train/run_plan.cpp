// The plan of a run: its fully_shard calls planned on meta for the run's
// mesh, and the sweep over world sizes with its table, files and chart.
#include "train/float8_training.h"
#include "train/lora_fine_tuning.h"
#include "train/run_plan.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>

#include "dist/comm_stats.h"
#include "dist/launch/launch_environment.h"
#include "tensor/error.h"
#include "tp/plans.h"
#include "tp/traffic.h"
#include "train/activation_plan.h"
#include "train/file_roles.h"
#include "train/model_family.h"
#include "train/output_claim.h"
#include "train/resource_limits.h"

namespace tessera::train {

namespace fsdp = tessera::fsdp;

namespace {

std::string series_name(int64_t replicate, int64_t tensor_parallel) {
  const std::string data = replicate == 1 ? std::string("FSDP") : fmt::format("HSDP R={}", replicate);
  return tensor_parallel == 1 ? data : fmt::format("{} x TP {}", data, tensor_parallel);
}

// 1, then `extra`, then the run's own when it is not among them.
template <size_t N>
std::vector<int64_t> one_extra_and(const std::array<int64_t, N>& extra, int64_t own) {
  std::vector<int64_t> sizes = {1};
  sizes.insert(sizes.end(), extra.begin(), extra.end());
  if (std::find(sizes.begin(), sizes.end(), own) == sizes.end()) sizes.push_back(own);
  return sizes;
}

SweepPoint sweep_point(const TrainConfig& config, tessera::nn::CausalLM& model, const fsdp::PlanMesh& mesh) {
  const RunPlan plan = plan_run(config, model, mesh);
  return SweepPoint{.series = series_name(mesh.replicate, mesh.tensor_parallel),
                    .mesh = mesh,
                    .parameter_shard_bytes = plan.sharding.shard_bytes,
                    .gradient_shard_bytes = plan.sharding.gradient_bytes,
                    .optimizer_state_bytes = kAdamWState.copies * plan.sharding.gradient_bytes,
                    .peak_unsharded_bytes = plan.sharding.peak.bytes,
                    .peak_moment = plan.sharding.peak.moment,
                    .traffic = plan.traffic};
}

// One all-reduce of `bytes` over `ranks` ranks, added to `volume`.
void add_all_reduce(tessera::dist::CommVolume& volume, int64_t bytes, int64_t ranks) {
  const tessera::dist::CommVolume one = tessera::dist::collective_volume(
      tessera::dist::CollectiveKind::all_reduce, bytes, static_cast<int>(ranks), /*is_root=*/false);
  volume.sent += one.sent;
  volume.received += one.received;
}

// The tp size `model`'s parameters are laid out over (1 when they are whole).
int64_t model_tensor_parallel(const tessera::nn::CausalLM& model) {
  for (const auto& parameter : model.parameters()) {
    if (parameter->tensor_parallel()) return parameter->tensor_parallel()->mesh.size();
  }
  return 1;
}

void add_stats(tessera::dist::CommStats& total, const tessera::dist::CommStats& more, int64_t times) {
  for (size_t kind = 0; kind < total.by_kind.size(); ++kind) {
    total.by_kind[kind].calls += times * more.by_kind[kind].calls;
    total.by_kind[kind].bytes_sent += times * more.by_kind[kind].bytes_sent;
    total.by_kind[kind].bytes_received += times * more.by_kind[kind].bytes_received;
  }
}

// What keeps the sweep from planning tensor parallelism over `tensor_parallel`
// ranks, as the run would refuse it; nothing when it can.
std::optional<std::string> tensor_parallel_refusal(const TrainConfig& config, int64_t tensor_parallel) {
  if (tensor_parallel == 1) return std::nullopt;
  if (config.lora_rank > 0) return std::string("LoRA adapters under tensor parallelism are not supported");
  if (config.seq_len % tensor_parallel != 0) {
    return fmt::format("--seq-len {} does not divide by tp {}", config.seq_len, tensor_parallel);
  }
  if (const std::optional<int64_t> ranks = config.reshard_after_forward.group_size()) {
    return fmt::format("--reshard-after-forward {}: a group size is refused with tensor parallelism", *ranks);
  }
  try {
    plan_model(config, tensor_parallel);
  } catch (const tessera::Error& error) {
    return error.what();  // the model's head counts, named by tp/plans.h
  }
  return std::nullopt;
}

// "16384 B (16.0 KiB)": exact, to hold against the run's log, and readable.
std::string exact_bytes(int64_t bytes) {
  return bytes < 1024 ? tessera::dist::human_bytes(bytes)
                      : fmt::format("{} B ({})", bytes, tessera::dist::human_bytes(bytes));
}

// One line of the step's traffic: calls and exact bytes sent.
void traffic_line(std::ostream& out, const std::string& what, int64_t calls, int64_t bytes_sent) {
  out << fmt::format("  {:<42} {:>5} calls  {:>28}\n", what, calls, exact_bytes(bytes_sent));
}

// The bytes a rank sends in one step of the run, by kind; their total is
// the "sent" the run logs each step.
void print_step_traffic(const TrainConfig& config, const StepTraffic& traffic, std::ostream& out) {
  using tessera::dist::CollectiveKind;
  out << fmt::format("\nsent per rank in a step of the run ({} micro-batch{}{}), by kind\n", config.grad_accum,
                     config.grad_accum == 1 ? "" : "es",
                     config.grad_accum == 1 ? "" : fmt::format(", synced {}", grad_sync_name(config.grad_sync)));
  const fsdp::StepCommVolume& fsdp = traffic.fsdp;
  traffic_line(out, "FSDP all-gather (shard group)", fsdp.all_gather_calls, fsdp.all_gather_bytes_sent);
  traffic_line(out, "FSDP reduce-scatter (shard group)", fsdp.reduce_scatter_calls, fsdp.reduce_scatter_bytes_sent);
  if (fsdp.all_reduce_calls > 0) {
    traffic_line(out, "HSDP all-reduce (replicate group)", fsdp.all_reduce_calls, fsdp.all_reduce_bytes_sent);
  }
  if (fsdp.partial_gradient_calls > 0) {
    traffic_line(out, "partial gradients' all-reduce (tp group)", fsdp.partial_gradient_calls,
                 fsdp.partial_gradient_bytes_sent);
  }
  if (config.tp > 1) {
    const tessera::dist::CommStats& tp = traffic.tensor_parallel;
    traffic_line(out, "TP activations' all-gather (tp group)", tp[CollectiveKind::all_gather].calls,
                 tp[CollectiveKind::all_gather].bytes_sent);
    traffic_line(out, "TP activations' reduce-scatter (tp group)", tp[CollectiveKind::reduce_scatter].calls,
                 tp[CollectiveKind::reduce_scatter].bytes_sent);
    traffic_line(out, "vocabulary-parallel loss (tp group)", tp[CollectiveKind::all_reduce].calls,
                 tp[CollectiveKind::all_reduce].bytes_sent);
  }
  out << fmt::format("  {:<42} {:>41}\n", "gradient norm and mean loss (all-reduces)",
                     exact_bytes(traffic.gradient_norm.sent + traffic.mean_loss.sent));
  out << fmt::format("  {:<42} {:>41}\n", "total (the run's sent per rank)", exact_bytes(traffic.total_sent()));
}

// "5.8 GiB" in a column.
std::string bytes_cell(int64_t bytes) { return tessera::dist::human_bytes(bytes); }

void print_sweep(const TrainConfig& config, const Sweep& sweep, std::ostream& out) {
  out << fmt::format("\nsweep: per-rank memory and bytes per step of {} over 1 to {} ranks (AdamW, {} parameters, "
                     "reshard_after_forward {}, {} micro-batch{} a step{})\n",
                     config.preset, kSweepMaxRanks, tessera::dtype_name(config.param_dtype),
                     config.reshard_after_forward.to_string(), config.grad_accum, config.grad_accum == 1 ? "" : "es",
                     config.grad_accum == 1 ? "" : fmt::format(", synced {}", grad_sync_name(config.grad_sync)));
  out << fmt::format("  {:<18} {:>30} {:>6} {:>12} {:>12} {:>12} {:>15} {:>13} {:>14} {:>12}\n", "series", "mesh",
                     "ranks", "param shards", "grad shards", "AdamW state", "unsharded peak", "memory total",
                     "sent per step", "of it by TP");
  for (const SweepPoint& point : sweep.points) {
    out << fmt::format("  {:<18} {:>30} {:>6} {:>12} {:>12} {:>12} {:>15} {:>13} {:>14} {:>12}\n", point.series,
                       point.mesh.to_string(), point.mesh.world(), bytes_cell(point.parameter_shard_bytes),
                       bytes_cell(point.gradient_shard_bytes), bytes_cell(point.optimizer_state_bytes),
                       bytes_cell(point.peak_unsharded_bytes), bytes_cell(point.memory_bytes()),
                       bytes_cell(point.traffic.total_sent()),
                       bytes_cell(point.traffic.tensor_parallel.total().bytes_sent));
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

int64_t StepTraffic::total_sent() const {
  return fsdp.total_sent() + tensor_parallel.total().bytes_sent + gradient_norm.sent + mean_loss.sent;
}

int64_t StepTraffic::total_received() const {
  return fsdp.total_received() + tensor_parallel.total().bytes_received + gradient_norm.received +
         mean_loss.received;
}

fsdp::PlanMesh run_mesh(const TrainConfig& config) { return fsdp::plan_mesh(config.nproc, config.hsdp, config.tp); }

std::unique_ptr<tessera::nn::CausalLM> plan_model(const TrainConfig& config, int64_t tensor_parallel) {
  std::unique_ptr<tessera::nn::CausalLM> model = build_model(config.model_config(), tessera::kMeta);
  prepare_fine_tuning(*model, config);  // as shard_model_meta: adapters, NF4 and float8 before any sharding
  prepare_float8(*model, config);
  if (tensor_parallel > 1) {
    tessera::tp::parallelize_causal_lm(*model,
                                       tessera::dist::DeviceMesh::planning(config.device, {tensor_parallel}, {"tp"}, {0}),
                                       {.async_chunks = config.async_tp});
  }
  // As shard_model_meta: a checkpointed block repeats its TP moves in backward (tp::plan_traffic counts them).
  tessera::nn::apply_activation_checkpointing(model->blocks(), config.ac);
  return model;
}

std::vector<fsdp::PlannedCall> fully_shard_calls(const TrainConfig& config, tessera::nn::CausalLM& model) {
  std::vector<fsdp::PlannedCall> calls;
  for (const auto& block : model.blocks()) {
    calls.push_back({.module = block.get(), .options = fully_shard_options(config, /*root=*/false, std::nullopt)});
  }
  calls.push_back({.module = &model, .options = fully_shard_options(config, /*root=*/true, std::nullopt)});
  return calls;
}

RunPlan plan_run(const TrainConfig& config, tessera::nn::CausalLM& model, const fsdp::PlanMesh& mesh) {
  RunPlan plan{.sharding = fsdp::plan_fully_shard(fully_shard_calls(config, model), mesh), .traffic = {}};
  StepTraffic& traffic = plan.traffic;
  traffic.fsdp = fsdp::comm_per_step(plan.sharding, config.grad_accum, config.grad_sync);
  if (mesh.tensor_parallel > 1) {
    const tessera::tp::TensorParallelTraffic micro_batch = tessera::tp::plan_traffic(
        model, {.batch = config.batch,
                .seq_len = config.seq_len,
                .activation_dtype = config.param_dtype,
                .fsdp_sums_partial_gradients = true,
                .async_chunks = config.async_tp});
    add_stats(traffic.tensor_parallel, micro_batch.forward, config.grad_accum);
    add_stats(traffic.tensor_parallel, micro_batch.backward, config.grad_accum);
  }
  // clip_grad_norm_ sums one f64 over each group a gradient is split across:
  // FSDP's shard group, and the tp group too for a tp-sharded piece (one set
  // of groups for each kind of parameter there is).
  bool split_over_tp = false, whole_over_tp = false;
  for (const auto& parameter : model.parameters()) {
    const bool tp_shard = parameter->tensor_parallel() && parameter->tensor_parallel()->shard_dim() >= 0;
    (tp_shard ? split_over_tp : whole_over_tp) = true;
  }
  constexpr int64_t kF64 = 8;
  if (whole_over_tp) add_all_reduce(traffic.gradient_norm, kF64, mesh.shard);
  if (split_over_tp) {
    add_all_reduce(traffic.gradient_norm, kF64, mesh.shard);
    add_all_reduce(traffic.gradient_norm, kF64, mesh.tensor_parallel);
  }
  add_all_reduce(traffic.mean_loss, kF64, mesh.world());
  return plan;
}

Sweep sweep_plans(const TrainConfig& config, tessera::nn::CausalLM& model) {
  Sweep sweep;
  const std::optional<int64_t> post_forward_ranks = config.reshard_after_forward.group_size();
  for (const int64_t tensor_parallel : one_extra_and(kSweepTensorParallel, config.tp)) {
    if (const std::optional<std::string> refusal = tensor_parallel_refusal(config, tensor_parallel)) {
      sweep.skipped.push_back(fmt::format("tp {}: {}", tensor_parallel, *refusal));
      continue;
    }
    // One layout of the model serves every mesh with this tp: FSDP's plan
    // reads only the pieces' shapes.
    const std::unique_ptr<tessera::nn::CausalLM> laid_out =
        tensor_parallel == model_tensor_parallel(model) ? nullptr : plan_model(config, tensor_parallel);
    tessera::nn::CausalLM& pieces = laid_out ? *laid_out : model;
    for (const int64_t replicate : one_extra_and(kSweepReplicas, config.hsdp)) {
      for (int64_t shard = 1; replicate * shard * tensor_parallel <= kSweepMaxRanks; shard *= 2) {
        const fsdp::PlanMesh mesh{.replicate = replicate, .shard = shard, .tensor_parallel = tensor_parallel};
        if (post_forward_ranks && mesh.shard % *post_forward_ranks != 0) {
          sweep.skipped.push_back(fmt::format("{} {}: --reshard-after-forward {} must divide its shard group of {}",
                                              series_name(replicate, tensor_parallel), mesh.to_string(),
                                              *post_forward_ranks, mesh.shard));
          continue;
        }
        sweep.points.push_back(sweep_point(config, pieces, mesh));
      }
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
                      {"tp", point.mesh.tensor_parallel},
                      {"parameter_shard_bytes", point.parameter_shard_bytes},
                      {"gradient_shard_bytes", point.gradient_shard_bytes},
                      {"optimizer_state_bytes", point.optimizer_state_bytes},
                      {"peak_unsharded_bytes", point.peak_unsharded_bytes},
                      {"peak_moment", point.peak_moment},
                      {"memory_bytes", point.memory_bytes()},
                      {"all_gather_bytes_sent", point.traffic.fsdp.all_gather_bytes_sent},
                      {"reduce_scatter_bytes_sent", point.traffic.fsdp.reduce_scatter_bytes_sent},
                      {"all_reduce_bytes_sent", point.traffic.fsdp.all_reduce_bytes_sent},
                      {"partial_gradient_bytes_sent", point.traffic.fsdp.partial_gradient_bytes_sent},
                      {"tensor_parallel_bytes_sent", point.traffic.tensor_parallel.total().bytes_sent},
                      {"norm_and_loss_bytes_sent", point.traffic.gradient_norm.sent + point.traffic.mean_loss.sent},
                      {"bytes_sent", point.traffic.total_sent()},
                      {"bytes_received", point.traffic.total_received()}});
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
      "series,ranks,replicate,shard,tp,parameter_shard_bytes,gradient_shard_bytes,optimizer_state_bytes,"
      "peak_unsharded_bytes,memory_bytes,all_gather_bytes_sent,reduce_scatter_bytes_sent,all_reduce_bytes_sent,"
      "partial_gradient_bytes_sent,tensor_parallel_bytes_sent,norm_and_loss_bytes_sent,bytes_sent,bytes_received,"
      "peak_moment\n";
  for (const SweepPoint& point : sweep.points) {
    const StepTraffic& traffic = point.traffic;
    csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(point.series),
                       point.mesh.world(), point.mesh.replicate, point.mesh.shard, point.mesh.tensor_parallel,
                       point.parameter_shard_bytes, point.gradient_shard_bytes, point.optimizer_state_bytes,
                       point.peak_unsharded_bytes, point.memory_bytes(), traffic.fsdp.all_gather_bytes_sent,
                       traffic.fsdp.reduce_scatter_bytes_sent, traffic.fsdp.all_reduce_bytes_sent,
                       traffic.fsdp.partial_gradient_bytes_sent, traffic.tensor_parallel.total().bytes_sent,
                       traffic.gradient_norm.sent + traffic.mean_loss.sent, traffic.total_sent(),
                       traffic.total_received(), csv_field(point.peak_moment));
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
      if (point.traffic.total_sent() > 0) {
        sent.x.push_back(ranks);
        sent.y.push_back(mebibytes(point.traffic.total_sent()));
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
  const std::unique_ptr<tessera::nn::CausalLM> model = plan_model(config, config.tp);
  const RunPlan plan = plan_run(config, *model, run_mesh(config));
  out << describe(config) << "\n\n";
  if (config.tp > 1) {
    out << fmt::format("mesh {} over {} ranks: tp innermost (ranks r x {} .. r x {} + {} hold one model's pieces "
                       "between them); FSDP shards each piece over the {} ranks that hold it\n",
                       plan.sharding.mesh.to_string(), config.nproc, config.tp, config.tp, config.tp - 1,
                       config.nproc / config.tp);
  }
  out << fsdp::format_plan(plan.sharding, kAdamWState);

  // What forward keeps for backward, under the run's activation checkpointing.
  const ActivationBytes activations = plan_activations(config);
  out << fmt::format("\nactivations held after forward (--ac {}, train/activation_plan.h): {} a rank{}: {} of {} "
                     "blocks checkpointed at {} each, the others {} each, {} outside the blocks\n",
                     config.ac.str(), tessera::dist::human_bytes(activations.total),
                     config.tp > 1 ? " (one rank's without the tp split: an upper bound)" : "",
                     checkpointed_blocks(config), n_layer(config.model_config()),
                     tessera::dist::human_bytes(activations.checkpointed_block),
                     tessera::dist::human_bytes(activations.block),
                     tessera::dist::human_bytes(activations.outside_blocks));

  // What FSDP's plan does not hold: the step's own tensors, from the run's estimate.
  const RankMemoryEstimate estimate = estimate_rank_memory(config);
  out << fmt::format("not in the plan (estimate_rank_memory, --batch {} x --seq-len {}): about {} of activations "
                     "and {} of gradients in flight per rank{}\n",
                     config.batch, config.seq_len, tessera::dist::human_bytes(estimate.activations),
                     tessera::dist::human_bytes(estimate.gathered_gradients),
                     estimate.buffers > 0
                         ? fmt::format(", and {} of buffers every rank holds whole",
                                       tessera::dist::human_bytes(estimate.buffers))
                         : std::string());
  print_step_traffic(config, plan.traffic, out);
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
