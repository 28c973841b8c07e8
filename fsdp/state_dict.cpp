// fsdp state dicts: one walk over the model's parameter slots and buffers,
// matched to the FSDPParams that manage them.
#include "fsdp/state_dict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>
#include <vector>

#include "autograd/grad_mode.h"
#include "fsdp/module_names.h"
#include "fsdp/state.h"
#include "tensor/host_staging.h"
#include "tensor/ops.h"

namespace tessera::fsdp {

namespace {

// One name of the state dict and what it refers to.
struct Entry {
  std::shared_ptr<nn::Parameter> parameter;  // null for a buffer
  const FSDPParam* managed = nullptr;        // the FSDPParam of a parameter FSDP shards
  Tensor buffer;                             // a buffer's tensor (shares its storage)
};

FSDPState& root_state(nn::Module& root, std::string_view caller) {
  FSDPState* state = root.extension<FSDPState>();
  TESSERA_CHECK(state != nullptr, "{}: this {} is not an FSDP module; apply fully_shard to it (after its blocks) first",
                caller, root.type_name());
  return *state;
}

// Every parameter slot and buffer by fully qualified name (sorted, so every
// rank walks them, and issues collectives, in the same order).
std::map<std::string, Entry> entries_of(nn::Module& root) {
  std::unordered_map<const nn::Parameter*, const FSDPParam*> managed;
  for (nn::Module* module : root.modules()) {
    const FSDPState* state = module->extension<FSDPState>();
    if (state == nullptr || state->group() == nullptr) continue;
    state->group()->wait_for_host_step();  // an overlapped optimizer step may still write the shards
    for (const auto& param : state->group()->params()) managed.emplace(&param->param(), param.get());
  }
  std::map<std::string, Entry> entries;
  for (const auto& [prefix, module] : root.named_modules()) {
    for (const auto& [name, parameter] : module->named_parameters(/*recurse=*/false)) {
      const auto found = managed.find(parameter.get());
      entries.emplace(join_name(prefix, name),
                      Entry{.parameter = parameter,
                            .managed = found == managed.end() ? nullptr : found->second,
                            .buffer = Tensor()});
    }
    for (const auto& [name, tensor] : module->named_buffers(/*recurse=*/false)) {
      if (!module->is_persistent_buffer(name)) continue;
      entries.emplace(join_name(prefix, name), Entry{.parameter = nullptr, .managed = nullptr, .buffer = tensor});
    }
  }
  return entries;
}

// The tensor an unmanaged entry holds whole.
const Tensor& whole_tensor(const Entry& entry) {
  return entry.parameter ? entry.parameter->tensor() : entry.buffer;
}

const Shape& global_shape(const Entry& entry) {
  return entry.managed ? entry.managed->global_shape() : whole_tensor(entry).sizes();
}

dist::DTensor replicated(const Tensor& tensor, const dist::DeviceMesh& mesh) {
  return dist::DTensor(tensor.detach(), mesh, dist::Placements(static_cast<size_t>(mesh.ndim()), dist::Replicate{}),
                       tensor.sizes());
}

// Sharded state dicts and loads of tensor-parallel pieces need the layout
// "tp first, dp inside" in the checkpoint format, which is not built yet.
void refuse_tensor_parallel(const std::map<std::string, Entry>& entries, std::string_view caller) {
  for (const auto& [name, entry] : entries) {
    TESSERA_CHECK(entry.parameter == nullptr || entry.parameter->tensor_parallel() == nullptr,
                  "{}: {} is a tensor-parallel piece ({}); sharded state dicts and loads of tensor-parallel models "
                  "are not supported yet (full_state_dict gathers them)",
                  caller, name, entry.parameter->tensor_parallel()->to_string());
  }
}

}  // namespace

std::map<std::string, dist::DTensor> sharded_state_dict(nn::Module& root) {
  const dist::DeviceMesh& mesh = root_state(root, "sharded_state_dict").mesh();
  std::map<std::string, dist::DTensor> state;
  const auto entries = entries_of(root);
  refuse_tensor_parallel(entries, "sharded_state_dict");
  for (const auto& [name, entry] : entries) {
    state.emplace(name, entry.managed ? entry.managed->sharded_dtensor() : replicated(whole_tensor(entry), mesh));
  }
  return state;
}

nn::StateDict full_state_dict(nn::Module& root) {
  root_state(root, "full_state_dict");
  std::unordered_map<const FSDPParam*, Tensor> gathered;  // a tied parameter is gathered once
  nn::StateDict state;
  for (const auto& [name, entry] : entries_of(root)) {
    // A tensor-parallel piece, gathered over FSDP's mesh, is gathered over tp.
    const nn::TensorParallelSpec* tensor_parallel =
        entry.parameter ? entry.parameter->tensor_parallel().get() : nullptr;
    if (entry.managed == nullptr) {
      const Tensor& whole = whole_tensor(entry);
      state.emplace(name, tensor_parallel ? tensor_parallel->gather(whole) : whole.detach());
      continue;
    }
    auto found = gathered.find(entry.managed);
    if (found == gathered.end()) {
      const Tensor piece = entry.managed->sharded_dtensor().full_tensor();
      found = gathered.emplace(entry.managed, tensor_parallel ? tensor_parallel->gather(piece) : piece).first;
    }
    state.emplace(name, found->second);
  }
  return state;
}

void load_full_state_dict(nn::Module& root, const nn::StateDict& state) {
  root_state(root, "load_full_state_dict");
  refuse_tensor_parallel(entries_of(root), "load_full_state_dict");
  for (nn::Module* module : root.modules()) {
    const FSDPState* fsdp_state = module->extension<FSDPState>();
    if (fsdp_state == nullptr || fsdp_state->group() == nullptr) continue;
    TESSERA_CHECK(fsdp_state->group()->state() == ShardState::sharded,
                  "load_full_state_dict: FSDP module '{}' ({}) is not sharded now (between a forward and its "
                  "backward?); load between steps",
                  fsdp_state->fqn(), module->type_name());
  }

  const std::map<std::string, Entry> entries = entries_of(root);
  std::vector<std::string> missing, unexpected, mismatches;
  for (const auto& [name, entry] : entries) {
    const auto found = state.find(name);
    if (found == state.end()) {
      missing.push_back(name);
    } else if (!found->second.defined()) {
      mismatches.push_back(fmt::format("{}: the tensor is undefined", name));
    } else if (found->second.sizes() != global_shape(entry)) {
      mismatches.push_back(fmt::format("{}: expected shape [{}], got [{}]", name, fmt::join(global_shape(entry), ", "),
                                       fmt::join(found->second.sizes(), ", ")));
    }
  }
  for (const auto& [name, tensor] : state) {
    if (!entries.contains(name)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatches.empty()) {
    std::vector<std::string> problems;
    if (!missing.empty()) problems.push_back(fmt::format("missing keys: {}", fmt::join(missing, ", ")));
    if (!unexpected.empty()) problems.push_back(fmt::format("unexpected keys: {}", fmt::join(unexpected, ", ")));
    if (!mismatches.empty()) problems.push_back(fmt::format("shape mismatches: {}", fmt::join(mismatches, "; ")));
    fail("load_full_state_dict({}): {}", root.type_name(), fmt::join(problems, "; "));
  }

  // Offloaded shards are written on the host: after every copy still reading them.
  for (nn::Module* module : root.modules()) {
    const FSDPState* fsdp_state = module->extension<FSDPState>();
    if (fsdp_state != nullptr && fsdp_state->group() != nullptr) fsdp_state->group()->wait_for_shard_reads();
  }
  autograd::NoGradGuard no_grad;
  for (const auto& [name, entry] : entries) {
    const Tensor& full = state.at(name);
    if (entry.managed == nullptr) {
      Tensor target = whole_tensor(entry);
      ops::copy_(target, full);
      continue;
    }
    // This rank's rows [row_offset, row_offset + local rows) of the full tensor.
    Tensor shard = entry.managed->sharded();
    const int64_t rows = shard.size(0);
    if (rows == 0) continue;
    check_host_access(shard, /*writes=*/true, "load_full_state_dict");
    ops::copy_(shard, ops::narrow(full, 0, entry.managed->spec()->row_offset, rows));
  }
}

}  // namespace tessera::fsdp
