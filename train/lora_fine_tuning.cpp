// Adapters and NF4 on a CausalLM's projections; loading into and exporting
// out of such a model as a dense one.
#include "train/lora_fine_tuning.h"

#include <set>

#include "autograd/grad_mode.h"
#include "checkpoint/state_dict.h"
#include "tensor/ops.h"

namespace tessera::train {

namespace {

// The entry for this rank's `rows` of a dense [out, in] weight laid out like
// `parameter` (whose rows it mirrors: the packed weight's or the weight's).
checkpoint::StateEntry rows_entry(const nn::Parameter& parameter, const Tensor& rows, int64_t in_features) {
  if (!parameter.is_sharded()) return rows;
  const nn::ShardingSpec& spec = *parameter.sharding();
  return dist::DTensor(rows, spec.mesh, spec.placements, {spec.global_shape[0], in_features});
}

// The whole tensor of a parameter FSDP may have sharded (collective then).
Tensor whole(const nn::Parameter& parameter) {
  return parameter.is_sharded() ? parameter.dtensor().full_tensor() : parameter.tensor().detach();
}

}  // namespace

std::vector<NamedLinear> block_linears(nn::CausalLM& model) {
  std::set<const nn::Module*> inside_blocks;
  for (const auto& block : model.blocks()) {
    for (nn::Module* module : block->modules()) inside_blocks.insert(module);
  }
  std::vector<NamedLinear> linears;
  for (const auto& [name, module] : model.named_modules()) {
    auto* linear = dynamic_cast<nn::Linear*>(module);
    if (linear != nullptr && inside_blocks.contains(module)) linears.push_back({name, linear});
  }
  return linears;
}

void prepare_fine_tuning(nn::CausalLM& model, const TrainConfig& config) {
  if (config.lora_rank == 0) return;
  for (const auto& [name, parameter] : model.named_parameters()) parameter->set_requires_grad(false);
  const nn::LoRAOptions options{.rank = config.lora_rank, .alpha = config.lora_scale_alpha()};
  for (const NamedLinear& projection : block_linears(model)) {
    if (config.nf4) projection.linear->quantize_nf4();
    projection.linear->add_lora(options, nn::InitContext{config.seed, projection.name});
  }
}

PretrainedWeightsTarget::PretrainedWeightsTarget(nn::CausalLM& model) : state_(checkpoint::model_state(model, "")) {
  for (const NamedLinear& projection : block_linears(model)) {
    nn::Linear& linear = *projection.linear;
    if (linear.has_lora()) {
      state_.erase(projection.name + ".lora_a");
      state_.erase(projection.name + ".lora_b");
    }
    if (!linear.is_nf4()) continue;
    const Tensor& packed = linear.weight().tensor();
    const DType dtype = linear.has_lora() ? linear.lora_a().tensor().dtype() : DType::f32;
    Tensor rows = ops::empty({packed.size(0), linear.in_features()}, {.dtype = dtype, .device = packed.device()});
    state_[projection.name + ".weight"] = rows_entry(linear.weight(), rows, linear.in_features());
    stand_ins_.push_back({&linear, std::move(rows)});
  }
}

void PretrainedWeightsTarget::quantize_loaded() {
  for (DenseStandIn& stand_in : stand_ins_) {
    stand_in.linear->load_dense_weight(stand_in.rows);
    stand_in.rows = Tensor();  // the dense copy goes as soon as it is packed
  }
  stand_ins_.clear();
}

checkpoint::DistributedStateDict merged_model_state(nn::CausalLM& model) {
  autograd::NoGradGuard no_grad;
  checkpoint::DistributedStateDict state = checkpoint::model_state(model, "");
  for (const NamedLinear& projection : block_linears(model)) {
    nn::Linear& linear = *projection.linear;
    if (!linear.is_nf4() && !linear.has_lora()) continue;
    const DType dtype = linear.has_lora() ? linear.lora_b().tensor().dtype() : DType::f32;
    Tensor rows = linear.dense_weight(dtype).detach();
    if (linear.has_lora()) {
      state.erase(projection.name + ".lora_a");
      state.erase(projection.name + ".lora_b");
      const Tensor product = ops::matmul(linear.lora_b().tensor().detach(), whole(linear.lora_a()));
      rows = ops::add(rows, ops::mul(product, linear.lora().scaling()));
    }
    state[projection.name + ".weight"] = rows_entry(linear.weight(), rows, linear.in_features());
  }
  return state;
}

}  // namespace tessera::train
