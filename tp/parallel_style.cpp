// Tensor-parallel styles: parameter layouts and the activation moves their
// hooks run.
#include "tp/parallel_style.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "autograd/functions.h"
#include "dist/redistribute.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/tied_linear.h"
#include "tensor/ops.h"
#include "tp/collective_matmul.h"

namespace tessera::tp {

namespace {

// Shard(-1) and friends as a dim of a tensor of `ndim` dims.
Layout with_dim_wrapped(const Layout& layout, int64_t ndim) {
  const auto* shard = std::get_if<dist::Shard>(&layout);
  if (shard == nullptr || shard->dim >= 0) return layout;
  return dist::Shard{shard->dim + ndim};
}

std::string layout_name(const std::optional<Layout>& layout) {
  return layout ? dist::placement_name(*layout) : "as prepared";
}

void check_mesh(const dist::DeviceMesh& mesh, const std::string& name) {
  TESSERA_CHECK(mesh.ndim() == 1, "tensor parallelism on {}: the tp mesh must be 1-D, got {}", name,
                mesh.to_string());
}

// Tensor parallelism comes first: FSDP shards the pieces it leaves.
void refuse_sharded(const nn::Parameter& parameter, const std::string& name) {
  TESSERA_CHECK(!parameter.is_sharded(),
                "tensor parallelism: {} is already sharded by FSDP; parallelize the model first, then fully_shard "
                "it on the data-parallel mesh",
                name);
}

// Lays `parameter` out as `placement` over the mesh: this rank keeps its
// piece (on meta, only the shape). A parameter already laid out so (a tied
// weight met a second time) is left alone; one laid out otherwise is refused.
void lay_out(nn::Parameter& parameter, const std::string& name, const dist::DeviceMesh& mesh,
             const Layout& placement, int64_t sections = 1) {
  refuse_sharded(parameter, name);
  auto spec = std::make_shared<nn::TensorParallelSpec>(
      nn::TensorParallelSpec{.mesh = mesh, .placement = placement, .global_shape = parameter.global_shape(),
                             .sections = sections});
  if (const auto& held = parameter.tensor_parallel()) {
    TESSERA_CHECK(held->placement == spec->placement && held->sections == spec->sections &&
                      held->mesh.size() == mesh.size(),
                  "tensor parallelism: {} is laid out as {} already, and a style asks for {}", name, held->to_string(),
                  spec->to_string());
    return;
  }
  const int64_t dim = spec->shard_dim();
  TESSERA_CHECK(dim < parameter.tensor().dim() &&
                    (dim < 0 || spec->global_shape[static_cast<size_t>(dim)] % sections == 0),
                "tensor parallelism: {} of shape {} cannot be laid out as {}", name, parameter.global_shape(),
                spec->to_string());
  const Tensor whole = parameter.tensor().detach();
  Tensor local;
  if (dim < 0) {
    local = whole;
  } else if (whole.is_meta()) {
    local = ops::empty(spec->local_shape(mesh.coordinate(0)), {.dtype = whole.dtype(), .device = kMeta});
  } else {
    std::vector<Tensor> boxes;
    for (const dist::ShardExtent& box : spec->boxes(mesh.coordinate(0))) {
      boxes.push_back(ops::narrow(whole, dim, box.offset, box.length));
    }
    local = ops::contiguous(ops::cat(boxes, dim));
  }
  parameter.set_tensor_parallel(std::move(local), std::move(spec));
}

// A replicated parameter that meets sequence-sharded activations: its
// gradients are partial, summed over the tp group.
void lay_out_with_partial_gradient(nn::Parameter& parameter, const std::string& name, const dist::DeviceMesh& mesh) {
  refuse_sharded(parameter, name);
  if (const auto& held = parameter.tensor_parallel()) {
    TESSERA_CHECK(held->shard_dim() < 0 && held->partial_gradient,
                  "tensor parallelism: {} is laid out as {} already, and sequence parallelism needs it replicated",
                  name, held->to_string());
    return;
  }
  parameter.set_tensor_parallel(
      parameter.tensor().detach(),
      std::make_shared<nn::TensorParallelSpec>(nn::TensorParallelSpec{.mesh = mesh,
                                                                      .placement = dist::Replicate{},
                                                                      .global_shape = parameter.global_shape(),
                                                                      .partial_gradient = true}));
}

class ColwiseParallel final : public ParallelStyle {
 public:
  explicit ColwiseParallel(ColwiseOptions options) : options_(std::move(options)) {
    const Layout output = options_.output_layout;
    TESSERA_CHECK(output == Layout{dist::Shard{-1}} || output == Layout{dist::Replicate{}},
                  "ColwiseParallel: the output layout must be Shard(-1) or Replicate(), got {}",
                  dist::placement_name(output));
    TESSERA_CHECK(options_.sections >= 1, "ColwiseParallel: sections must be >= 1, got {}", options_.sections);
    TESSERA_CHECK(options_.sections == 1 || output == Layout{dist::Shard{-1}},
                  "ColwiseParallel: a fused projection of {} sections keeps its output sharded (gathered, its "
                  "columns would come out in rank order, not in the sections' order)",
                  options_.sections);
    TESSERA_CHECK(!options_.input_layout || !std::holds_alternative<dist::Partial>(*options_.input_layout),
                  "ColwiseParallel: the input cannot be Partial (sum it first)");
    TESSERA_CHECK(options_.async_chunks >= 0, "ColwiseParallel: async_chunks must be >= 0, got {}",
                  options_.async_chunks);
    TESSERA_CHECK(options_.async_chunks == 0 ||
                      (options_.input_layout == Layout{dist::Shard{1}} && output == Layout{dist::Shard{-1}}),
                  "ColwiseParallel: async_chunks {} fuses the sequence's all-gather into the product: the input must "
                  "be Shard(1) and the output Shard(-1), got {} and {}",
                  options_.async_chunks, layout_name(options_.input_layout), dist::placement_name(output));
  }

  void check(const nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    ParallelStyle::check(module, name, mesh);
    const auto* linear = dynamic_cast<const nn::Linear*>(&module);
    const auto* tied = dynamic_cast<const nn::TiedLinear*>(&module);
    TESSERA_CHECK(linear != nullptr || tied != nullptr, "ColwiseParallel applies to a Linear or TiedLinear; {} is a {}",
                  name, module.type_name());
    TESSERA_CHECK(options_.async_chunks == 0 || linear != nullptr,
                  "ColwiseParallel on {}: async_chunks needs a Linear (its product is replaced), not a {}", name,
                  module.type_name());
    const int64_t out_features = (linear ? linear->weight() : tied->weight()).global_shape()[0];
    TESSERA_CHECK(out_features % options_.sections == 0,
                  "ColwiseParallel on {}: {} output features do not split into {} equal sections", name, out_features,
                  options_.sections);
  }

  void apply(nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    check(module, name, mesh);
    auto* linear = dynamic_cast<nn::Linear*>(&module);
    auto* tied = dynamic_cast<nn::TiedLinear*>(&module);
    nn::Parameter& weight = linear ? linear->weight() : tied->weight();
    const int64_t out_features = weight.global_shape()[0];
    lay_out(weight, name + ".weight", mesh, dist::Shard{0}, options_.sections);
    if (linear && linear->has_bias()) lay_out(linear->bias(), name + ".bias", mesh, dist::Shard{0}, options_.sections);
    if (options_.async_chunks > 0) {
      linear->set_product([mesh, chunks = options_.async_chunks](const Tensor& x, const Tensor& w, const Tensor& b) {
        return all_gather_linear(x, w, b, mesh, chunks);
      });
    } else if (options_.input_layout) {
      module.register_forward_pre_hook([mesh, from = *options_.input_layout](
                                           nn::Module&, const nn::TensorList& inputs) -> std::optional<nn::TensorList> {
        return nn::TensorList{move_activation(inputs.at(0), mesh, from, dist::Replicate{}, dist::Partial{})};
      });
    }
    if (options_.output_layout == Layout{dist::Replicate{}}) {
      module.register_forward_hook([mesh, out_features](nn::Module&, const nn::TensorList&,
                                                        const Tensor& output) -> std::optional<Tensor> {
        return move_activation(output, mesh, dist::Shard{-1}, dist::Replicate{}, std::nullopt, out_features);
      });
    }
  }

  std::string describe() const override {
    std::string text = fmt::format("ColwiseParallel(input {}, output {}", layout_name(options_.input_layout),
                                   dist::placement_name(options_.output_layout));
    if (options_.sections > 1) text += fmt::format(", {} sections", options_.sections);
    if (options_.async_chunks > 0) text += fmt::format(", async in {} chunks", options_.async_chunks);
    return text + ")";
  }

 private:
  ColwiseOptions options_;
};

class RowwiseParallel final : public ParallelStyle {
 public:
  explicit RowwiseParallel(RowwiseOptions options) : options_(std::move(options)) {
    TESSERA_CHECK(!std::holds_alternative<dist::Partial>(options_.output_layout),
                  "RowwiseParallel: the output is summed here; Partial is not an output layout");
    TESSERA_CHECK(options_.async_chunks >= 0, "RowwiseParallel: async_chunks must be >= 0, got {}",
                  options_.async_chunks);
    TESSERA_CHECK(options_.async_chunks == 0 || options_.output_layout == Layout{dist::Shard{1}},
                  "RowwiseParallel: async_chunks {} fuses the reduce-scatter onto the sequence into the product: the "
                  "output must be Shard(1), got {}",
                  options_.async_chunks, dist::placement_name(options_.output_layout));
  }

  void check(const nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    ParallelStyle::check(module, name, mesh);
    TESSERA_CHECK(dynamic_cast<const nn::Linear*>(&module) != nullptr, "RowwiseParallel applies to a Linear; {} is a {}",
                  name, module.type_name());
  }

  void apply(nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    check(module, name, mesh);
    auto* linear = dynamic_cast<nn::Linear*>(&module);
    lay_out(linear->weight(), name + ".weight", mesh, dist::Shard{1});
    const bool sharded_output = std::holds_alternative<dist::Shard>(options_.output_layout);
    if (linear->has_bias()) {
      if (sharded_output) {
        lay_out_with_partial_gradient(linear->bias(), name + ".bias", mesh);
      } else {
        lay_out(linear->bias(), name + ".bias", mesh, dist::Replicate{});
      }
      linear->set_defers_bias(true);
    }
    const bool fused = options_.async_chunks > 0;
    if (fused) {
      linear->set_product([mesh, chunks = options_.async_chunks](const Tensor& x, const Tensor& w, const Tensor&) {
        return linear_reduce_scatter(x, w, mesh, chunks);  // the bias is deferred: added below
      });
    }
    module.register_forward_hook([mesh, to = options_.output_layout, fused](
                                     nn::Module& self, const nn::TensorList&,
                                     const Tensor& output) -> std::optional<Tensor> {
      const Tensor summed = fused ? output : move_activation(output, mesh, dist::Partial{}, to);
      const auto& row_wise = static_cast<const nn::Linear&>(self);
      return row_wise.has_bias() ? tessera::add(summed, row_wise.bias().tensor()) : summed;
    });
  }

  std::string describe() const override {
    return fmt::format("RowwiseParallel(output {}{})", dist::placement_name(options_.output_layout),
                       options_.async_chunks > 0 ? fmt::format(", async in {} chunks", options_.async_chunks) : "");
  }

 private:
  RowwiseOptions options_;
};

class VocabParallelEmbedding final : public ParallelStyle {
 public:
  explicit VocabParallelEmbedding(VocabParallelOptions options) : options_(std::move(options)) {
    TESSERA_CHECK(!std::holds_alternative<dist::Partial>(options_.output_layout),
                  "VocabParallelEmbedding: the lookup's terms are summed here; Partial is not an output layout");
  }

  void check(const nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    ParallelStyle::check(module, name, mesh);
    TESSERA_CHECK(dynamic_cast<const nn::Embedding*>(&module) != nullptr,
                  "VocabParallelEmbedding applies to an Embedding; {} is a {}", name, module.type_name());
  }

  void apply(nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    check(module, name, mesh);
    auto* embedding = dynamic_cast<nn::Embedding*>(&module);
    lay_out(embedding->weight(), name + ".weight", mesh, dist::Shard{0});
    module.register_forward_hook([mesh, to = options_.output_layout](nn::Module&, const nn::TensorList&,
                                                                     const Tensor& output) -> std::optional<Tensor> {
      return move_activation(output, mesh, dist::Partial{}, to);
    });
  }

  std::string describe() const override {
    return fmt::format("VocabParallelEmbedding(output {})", dist::placement_name(options_.output_layout));
  }

 private:
  VocabParallelOptions options_;
};

class SequenceParallel final : public ParallelStyle {
 public:
  void apply(nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    check(module, name, mesh);
    if (auto* dropout = dynamic_cast<nn::Dropout*>(&module)) {
      dropout->set_sequence_slice(1, mesh.size(), mesh.coordinate(0));
    }
    for (const auto& [own, parameter] : module.named_parameters(/*recurse=*/false)) {
      lay_out_with_partial_gradient(*parameter, name.empty() ? own : name + "." + own, mesh);
    }
  }
  std::string describe() const override { return "SequenceParallel()"; }
};

class PrepareModuleInput final : public ParallelStyle {
 public:
  explicit PrepareModuleInput(PrepareInputOptions options) : options_(std::move(options)) {
    TESSERA_CHECK(options_.input_layouts.size() == options_.desired_input_layouts.size(),
                  "PrepareModuleInput: {} input layouts and {} desired ones", options_.input_layouts.size(),
                  options_.desired_input_layouts.size());
    for (size_t i = 0; i < options_.input_layouts.size(); ++i) {
      TESSERA_CHECK(options_.input_layouts[i].has_value() == options_.desired_input_layouts[i].has_value(),
                    "PrepareModuleInput: input {} has a layout {} and a desired layout {}: give both or neither", i,
                    layout_name(options_.input_layouts[i]), layout_name(options_.desired_input_layouts[i]));
    }
  }

  void apply(nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    check(module, name, mesh);
    module.register_forward_pre_hook([mesh, options = options_, name](
                                         nn::Module&, const nn::TensorList& inputs) -> std::optional<nn::TensorList> {
      TESSERA_CHECK(inputs.size() >= options.input_layouts.size(),
                    "PrepareModuleInput on {}: layouts for {} inputs, called with {}", name,
                    options.input_layouts.size(), inputs.size());
      nn::TensorList moved = inputs;
      for (size_t i = 0; i < options.input_layouts.size(); ++i) {
        if (!options.input_layouts[i]) continue;
        const Layout& to = *options.desired_input_layouts[i];
        const bool feeds_parallel_children = std::holds_alternative<dist::Replicate>(to);
        moved[i] = move_activation(inputs[i], mesh, *options.input_layouts[i], to,
                                   feeds_parallel_children ? std::optional<Layout>(dist::Partial{}) : std::nullopt);
      }
      return moved;
    });
  }

  std::string describe() const override {
    std::string text = "PrepareModuleInput(";
    for (size_t i = 0; i < options_.input_layouts.size(); ++i) {
      text += fmt::format("{}{} -> {}", i ? ", " : "", layout_name(options_.input_layouts[i]),
                          layout_name(options_.desired_input_layouts[i]));
    }
    return text + ")";
  }

 private:
  PrepareInputOptions options_;
};

// The products of a group of sibling Linears that share one input: the
// first of them to be called computes all (one chunked all-gather), the
// others take theirs. A call with another input, or a second call of one
// member before the rest took theirs, starts over with that input.
class SharedGatherProducts {
 public:
  SharedGatherProducts(std::vector<nn::Linear*> members, dist::DeviceMesh mesh, int64_t chunks)
      : members_(std::move(members)), mesh_(std::move(mesh)), chunks_(chunks) {}

  Tensor product_of(size_t member, const Tensor& x) {
    if (!input_.defined() || !input_.is_same(x) || taken_[member]) compute_all(x);
    taken_[member] = true;
    Tensor output = std::move(outputs_[member]);
    outputs_[member] = Tensor();
    if (std::all_of(taken_.begin(), taken_.end(), [](bool taken) { return taken; })) input_ = Tensor();
    return output;
  }

 private:
  void compute_all(const Tensor& x) {
    std::vector<Tensor> weights, biases;
    for (nn::Linear* linear : members_) {
      weights.push_back(linear->weight().tensor());
      biases.push_back(linear->has_bias() && !linear->defers_bias() ? linear->bias().tensor() : Tensor());
    }
    outputs_ = all_gather_linears(x, weights, biases, mesh_, chunks_);
    taken_.assign(members_.size(), false);
    input_ = x;
  }

  std::vector<nn::Linear*> members_;
  dist::DeviceMesh mesh_;
  int64_t chunks_;
  Tensor input_;
  std::vector<Tensor> outputs_;
  std::vector<bool> taken_;
};

class GatherSequenceInto final : public ParallelStyle {
 public:
  explicit GatherSequenceInto(GatherIntoOptions options) : options_(std::move(options)) {
    TESSERA_CHECK(!options_.children.empty(), "GatherSequenceInto: name the Linears that share the input");
    TESSERA_CHECK(options_.async_chunks >= 1, "GatherSequenceInto: async_chunks must be >= 1, got {}",
                  options_.async_chunks);
  }

  void check(const nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    ParallelStyle::check(module, name, mesh);
    int64_t in_features = -1;
    for (const std::string& child : options_.children) {
      const auto* linear = dynamic_cast<const nn::Linear*>(module.child(child).get());
      TESSERA_CHECK(linear != nullptr, "GatherSequenceInto on {}: {}.{} is a {}, not a Linear", name, name, child,
                    module.child(child)->type_name());
      TESSERA_CHECK(!linear->has_product(),
                    "GatherSequenceInto on {}: {}.{} already has a fused product (async ColwiseParallel?)", name,
                    name, child);
      const int64_t features = linear->weight().global_shape()[1];
      TESSERA_CHECK(in_features < 0 || features == in_features,
                    "GatherSequenceInto on {}: {}.{} takes {} input features, the others {}", name, name, child,
                    features, in_features);
      in_features = features;
    }
  }

  void apply(nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    check(module, name, mesh);
    std::vector<nn::Linear*> members;
    for (const std::string& child : options_.children) {
      members.push_back(dynamic_cast<nn::Linear*>(module.child(child).get()));
    }
    auto shared = std::make_shared<SharedGatherProducts>(members, mesh, options_.async_chunks);
    for (size_t i = 0; i < members.size(); ++i) {
      members[i]->set_product([shared, i](const Tensor& x, const Tensor&, const Tensor&) {
        return shared->product_of(i, x);
      });
    }
  }

  std::string describe() const override {
    return fmt::format("GatherSequenceInto({}, async in {} chunks)", fmt::join(options_.children, ", "),
                       options_.async_chunks);
  }

 private:
  GatherIntoOptions options_;
};

class PrepareModuleOutput final : public ParallelStyle {
 public:
  explicit PrepareModuleOutput(PrepareOutputOptions options) : options_(std::move(options)) {}

  void apply(nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const override {
    check(module, name, mesh);
    module.register_forward_hook([mesh, options = options_](nn::Module&, const nn::TensorList&,
                                                            const Tensor& output) -> std::optional<Tensor> {
      return move_activation(output, mesh, options.output_layout, options.desired_output_layout);
    });
  }

  std::string describe() const override {
    return fmt::format("PrepareModuleOutput({} -> {})", dist::placement_name(options_.output_layout),
                       dist::placement_name(options_.desired_output_layout));
  }

 private:
  PrepareOutputOptions options_;
};

}  // namespace

void ParallelStyle::check(const nn::Module& /*module*/, const std::string& name,
                          const dist::DeviceMesh& mesh) const {
  check_mesh(mesh, name);
}

Tensor move_activation(const Tensor& local, const dist::DeviceMesh& mesh, const Layout& from, const Layout& to,
                       std::optional<Layout> grad_layout, int64_t global_size) {
  TESSERA_CHECK(local.defined(), "tensor parallelism: an undefined activation");
  check_mesh(mesh, "an activation");
  const int64_t ndim = local.dim();
  const Layout source = with_dim_wrapped(from, ndim);
  const Layout target = with_dim_wrapped(to, ndim);
  const int64_t ranks = mesh.size();
  Shape global = local.sizes();
  if (const auto* shard = std::get_if<dist::Shard>(&source)) {
    TESSERA_CHECK(shard->dim >= 0 && shard->dim < ndim, "tensor parallelism: {} of an activation of shape {}",
                  dist::placement_name(from), local.sizes());
    global[static_cast<size_t>(shard->dim)] = global_size >= 0 ? global_size : local.size(shard->dim) * ranks;
  }
  if (const auto* shard = std::get_if<dist::Shard>(&target); shard && source != target) {
    TESSERA_CHECK(shard->dim >= 0 && shard->dim < ndim, "tensor parallelism: {} of an activation of shape {}",
                  dist::placement_name(to), local.sizes());
    const int64_t size = global[static_cast<size_t>(shard->dim)];
    TESSERA_CHECK(size % ranks == 0,
                  "tensor parallelism: dim {} of an activation of shape {} has size {}, which does not divide by the "
                  "tp size {} (sequence parallelism needs a sequence length that the tp size divides)",
                  shard->dim, global, size, ranks);
  }
  dist::RedistributeOptions options;
  if (grad_layout) options.grad_placements = dist::Placements{with_dim_wrapped(*grad_layout, ndim)};
  return dist::redistribute(dist::DTensor(local, mesh, {source}, global), {target}, options).local();
}

ParallelStylePtr colwise_parallel(ColwiseOptions options) {
  return std::make_shared<ColwiseParallel>(std::move(options));
}
ParallelStylePtr rowwise_parallel(RowwiseOptions options) {
  return std::make_shared<RowwiseParallel>(std::move(options));
}
ParallelStylePtr vocab_parallel_embedding(VocabParallelOptions options) {
  return std::make_shared<VocabParallelEmbedding>(std::move(options));
}
ParallelStylePtr sequence_parallel() { return std::make_shared<SequenceParallel>(); }
ParallelStylePtr prepare_module_input(PrepareInputOptions options) {
  return std::make_shared<PrepareModuleInput>(std::move(options));
}
ParallelStylePtr gather_sequence_into(GatherIntoOptions options) {
  return std::make_shared<GatherSequenceInto>(std::move(options));
}
ParallelStylePtr prepare_module_output(PrepareOutputOptions options) {
  return std::make_shared<PrepareModuleOutput>(std::move(options));
}

}  // namespace tessera::tp
