// The plan: fsdp::sharding_plan on allocated shards, or the meta shards' figures.
#include "examples/gpt/run_plan.h"

#include <fmt/format.h>

#include "dist/comm_stats.h"
#include "fsdp/plan.h"
#include "tensor/dtype.h"

namespace gpt {

namespace {

// "16384 B (16.0 KiB)", as sharding_plan writes bytes.
std::string bytes_text(int64_t bytes) {
  return fmt::format("{} B ({})", bytes, tessera::dist::human_bytes(bytes));
}

// What fully_shard made of `model` on this rank, read from its parameters'
// sharding specs (meta tensors with the shard's shape: no bytes behind them).
struct MetaShards {
  int64_t parameters = 0;     // tensors
  int64_t elements = 0;       // of the whole model
  int64_t shard_bytes = 0;    // this rank's rows, without padding, as sharding_plan counts them
  int64_t fsdp_modules = 0;   // fully_shard units: the blocks and the root
};

MetaShards meta_shards(tessera::nn::CausalLM& model) {
  MetaShards shards;
  for (const auto& [name, parameter] : model.named_parameters()) {
    shards.parameters += 1;
    shards.elements += tessera::shape_numel(parameter->global_shape());
    shards.shard_bytes += parameter->numel() * static_cast<int64_t>(tessera::element_size(parameter->tensor().dtype()));
  }
  for (tessera::nn::Module* module : model.modules()) {
    if (tessera::fsdp::fsdp_module(*module)) shards.fsdp_modules += 1;
  }
  return shards;
}

void print_meta_plan(const TrainConfig& config, const MachineResources& machine, const Distributed& distributed,
                     tessera::nn::CausalLM& model, std::ostream& out) {
  const MetaShards shards = meta_shards(model);
  const RankMemoryEstimate estimate = estimate_rank_memory(config);
  const int ranks = ranks_on_machine(config, tessera::dist::detect_launch());
  const std::string available =
      machine.available_memory_bytes
          ? fmt::format("{:.0f}% of the {} available", 100.0 * kMemoryWarningFraction,
                        tessera::dist::human_bytes(*machine.available_memory_bytes))
          : std::string("the available memory, which is unknown");
  out << fmt::format("\nFSDP sharding of {} on meta (nothing allocated), seen from mesh rank {}\nmesh {}\n",
                     model.type_name(), distributed.mesh.rank(), distributed.mesh.to_string());
  out << fmt::format("the per-parameter plan needs the shards allocated: {} x {} of parameter shards, more than "
                     "--plan allocates ({}, and {})\n",
                     ranks, tessera::dist::human_bytes(estimate.sharded_state / 4),
                     tessera::dist::human_bytes(kPlanMaxBytes), available);
  out << fmt::format("\nper rank (rank {})\n", distributed.mesh.rank());
  out << fmt::format("  parameters            {} ({:.3f} M) in {} tensors, {} FSDP modules\n", shards.elements,
                     static_cast<double>(shards.elements) / 1e6, shards.parameters, shards.fsdp_modules);
  out << fmt::format("  parameter shards      {}\n", bytes_text(shards.shard_bytes));
  out << fmt::format("  gradient shards       {}\n", bytes_text(shards.shard_bytes));
  out << fmt::format("  AdamW state (m, v)    {}\n", bytes_text(2 * shards.shard_bytes));
  out << fmt::format("  memory estimate       {}\n", describe_memory(estimate, ranks, machine)) << std::flush;
}

}  // namespace

void print_plan(const TrainConfig& config, const MachineResources& machine, const Distributed& distributed,
                std::ostream& out) {
  const std::unique_ptr<tessera::nn::CausalLM> model = shard_model_meta(config, distributed);
  const bool leader = distributed.rank() == 0;
  if (plan_materializes(config, machine)) {
    model->to_empty(tessera::kCPU);
    if (leader) {
      out << '\n' << tessera::fsdp::sharding_plan(*model, {.description = "AdamW state (m, v)", .copies = 2})
          << std::flush;
    }
    return;
  }
  if (leader) print_meta_plan(config, machine, distributed, *model, out);
}

}  // namespace gpt
