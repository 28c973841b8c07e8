// FSDP's communication, hooks and errors, through the public API alone
// (fsdp/fully_shard.h): bytes per step equal the FSDP volume (and the
// all-gathers halve under bf16), async unshard and explicit prefetch, overlap
// visible in the trace, the settings' effects, and every misuse a clear error.
#include <doctest/doctest.h>

#include <algorithm>

#include "autograd/engine.h"
#include "dist/backends/local_backend.h"
#include "dist/comm_stats.h"
#include "dist/trace.h"
#include "fsdp/fully_shard.h"
#include "fsdp/plan.h"
#include "nn/models/gpt.h"
#include "tensor/ops.h"
#include "tests/fsdp/sharded_gpt.h"

using namespace tessera;
using namespace tessera::fsdp;
using namespace tessera::fsdp::testing;

namespace {

// The per-rank volume FSDP should move in one step, from the parameters'
// shapes: every group all-gathers once in forward (and the blocks, resharded,
// again in backward) and reduce-scatters its slot plus one presence flag per
// parameter.
struct Expected {
  int64_t all_gather_sent = 0, reduce_scatter_sent = 0;
};
Expected expected_volume(const ShardedGPT& sharded, int world, DType param_dtype, DType reduce_dtype) {
  Expected expected;
  std::vector<std::pair<nn::Module*, int64_t>> groups;  // module, all-gathers per step
  for (const auto& block : sharded.model->blocks()) groups.emplace_back(block.get(), 2);
  groups.emplace_back(sharded.model.get(), 1);
  for (const auto& [module, gathers] : groups) {
    const auto params = group_parameters(*module);
    const int64_t slot = slot_numel(params, world);
    expected.all_gather_sent +=
        gathers * dist::collective_volume(dist::CollectiveKind::all_gather, slot * element_size(param_dtype), world,
                                          false).sent;
    const int64_t flags = static_cast<int64_t>(params.size());
    expected.reduce_scatter_sent +=
        dist::collective_volume(dist::CollectiveKind::reduce_scatter, (slot + flags) * element_size(reduce_dtype),
                                world, false)
            .sent;
  }
  return expected;
}

void check_same_counts(const dist::CollectiveStats& actual, const dist::CollectiveStats& expected) {
  CHECK(actual.calls == expected.calls);
  CHECK(actual.bytes_sent == expected.bytes_sent);
  CHECK(actual.bytes_received == expected.bytes_received);
}

}  // namespace

TEST_CASE("fsdp comm: bytes per step equal the FSDP volume, and bf16 params halve the all-gathers") {
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    std::vector<int64_t> all_gather_f32(static_cast<size_t>(world)), all_gather_bf16(static_cast<size_t>(world));
    dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
      const dist::DeviceMesh mesh(group, kCPU, {world});
      for (const bool bf16 : {false, true}) {
        FullyShardOptions options;
        if (bf16) options.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32};
        ShardedGPT sharded = build_sharded_gpt(mesh, options);
        train_step(*sharded.model, group->rank());  // records the prefetch order
        mesh.group(0)->reset_stats();
        sharded.root->reset_communication_stats();
        train_step(*sharded.model, group->rank());
        const dist::CommStats stats = mesh.group(0)->stats();
        const Expected expected = expected_volume(sharded, world, bf16 ? DType::bf16 : DType::f32, DType::f32);
        CHECK(stats[dist::CollectiveKind::all_gather].bytes_sent == expected.all_gather_sent);
        CHECK(stats[dist::CollectiveKind::reduce_scatter].bytes_sent == expected.reduce_scatter_sent);
        CHECK(stats[dist::CollectiveKind::all_gather].calls == 1 + 2 * kAwkward.n_layer);  // root once, blocks twice
        CHECK(stats[dist::CollectiveKind::reduce_scatter].calls == 1 + kAwkward.n_layer);
        // FSDP's own count agrees with the group's, and with the plan's figures.
        const dist::CommStats counted = sharded.root->communication_stats();
        for (const auto kind : {dist::CollectiveKind::all_gather, dist::CollectiveKind::reduce_scatter,
                                dist::CollectiveKind::all_reduce}) {
          check_same_counts(counted[kind], stats[kind]);
        }
        const StepCommVolume plan = expected_comm_per_step(*sharded.model);
        CHECK(plan.all_gather_calls == counted[dist::CollectiveKind::all_gather].calls);
        CHECK(plan.all_gather_bytes_sent == counted[dist::CollectiveKind::all_gather].bytes_sent);
        CHECK(plan.reduce_scatter_bytes_sent == counted[dist::CollectiveKind::reduce_scatter].bytes_sent);
        (bf16 ? all_gather_bf16 : all_gather_f32)[static_cast<size_t>(group->rank())] =
            stats[dist::CollectiveKind::all_gather].bytes_sent;
      }
    });
    for (int rank = 0; rank < world; ++rank) {
      CHECK(all_gather_bf16[static_cast<size_t>(rank)] * 2 == all_gather_f32[static_cast<size_t>(rank)]);
    }
  }
}

TEST_CASE("fsdp comm: reshard_after_forward to_group_of(2) gathers over 2 ranks in backward; never() skips it") {
  dist::run_local(4, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {4});
    for (const ReshardAfterForward mode : {ReshardAfterForward::to_group_of(2), ReshardAfterForward::never()}) {
      CAPTURE(mode.to_string());
      ShardedGPT sharded = build_sharded_gpt(mesh, {.reshard_after_forward = mode});
      auto tracer = std::make_shared<dist::Tracer>();
      mesh.group(0)->set_tracer(tracer);
      train_step(*sharded.model, group->rank());
      mesh.group(0)->reset_stats();
      sharded.root->reset_communication_stats();
      tracer->clear();

      nn::Module& block = sharded.model->block(0);
      const auto params = group_parameters(block);
      const Tensor idx = rank_tokens(group->rank());
      const Tensor loss = sharded.model->loss(idx, idx);
      // Between forward and backward: all of the block (never) or its rows of
      // a 2-way sharding, which the Parameter does not show: it holds the shard.
      CHECK(holds_shards(params) == !mode.is_never());
      autograd::backward(loss);
      CHECK(holds_shards(params));

      // Forward stays on the 4-rank shard group; the block's backward gather
      // runs over 2 ranks (its slot of a 2-way split), or not at all.
      const int64_t slot4 = slot_numel(params, 4) * 4;
      const int64_t slot2 = slot_numel(params, 2) * 4;
      const dist::CommStats own = sharded.blocks.front().communication_stats(/*recurse=*/false);
      const int64_t expected_sent =
          dist::collective_volume(dist::CollectiveKind::all_gather, slot4, 4, false).sent +
          (mode.is_never() ? 0 : dist::collective_volume(dist::CollectiveKind::all_gather, slot2, 2, false).sent);
      CHECK(own[dist::CollectiveKind::all_gather].calls == (mode.is_never() ? 1 : 2));
      CHECK(own[dist::CollectiveKind::all_gather].bytes_sent == expected_sent);
      CHECK(mesh.group(0)->stats()[dist::CollectiveKind::all_gather].calls == 1 + kAwkward.n_layer);
      // The 2-rank group FSDP made records to the shard group's tracer.
      const auto events = tracer->events();
      const auto on_pairs = std::count_if(events.begin(), events.end(), [](const dist::TraceEvent& event) {
        return event.category == "collective" && event.name == "all_gather_into" &&
               event.track.find(":reshard2") != std::string::npos;
      });
      CHECK(on_pairs == (mode.is_never() ? 0 : kAwkward.n_layer));
      mesh.group(0)->set_tracer(nullptr);
    }
  });
}

TEST_CASE("fsdp hooks: async unshard, explicit prefetch, reshard, and overlap in the trace") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh);
    auto tracer = std::make_shared<dist::Tracer>();
    mesh.group(0)->set_tracer(tracer);

    // Async unshard: the next forward waits on it; the parameters are whole.
    FSDPModule& first = sharded.blocks.front();
    const auto params = group_parameters(sharded.model->block(0));
    train_step(*sharded.model, group->rank());
    UnshardHandle handle = first.unshard(/*async_op=*/true);
    handle.wait();
    CHECK_FALSE(holds_shards(params));
    CHECK(params.front()->tensor().sizes() == params.front()->global_shape());
    first.reshard();
    CHECK(holds_shards(params));

    // Explicit prefetch: block 0 prefetches blocks 1 and 2 in forward.
    first.set_modules_to_forward_prefetch({sharded.blocks[1], sharded.blocks[2]});
    tracer->clear();
    train_step(*sharded.model, group->rank());
    const auto events = tracer->events();
    auto count = [&](const std::string& name) {
      return std::count_if(events.begin(), events.end(), [&](const dist::TraceEvent& e) { return e.name == name; });
    };
    for (const std::string phase : {"forward", "backward", "copy_in", "copy_out", "all_gather_wait", "reduce_scatter_wait",
                              "all_gather_into", "reduce_scatter_into"}) {
      CAPTURE(phase);
      CHECK(count(phase) > 0);
    }
    // Some collective ran while a module computed: communication overlapped.
    bool overlapped = false;
    for (const auto& comm : events) {
      if (comm.category != "collective") continue;
      for (const auto& compute : events) {
        if (compute.name != "forward" && compute.name != "backward") continue;
        if (compute.args.value("module", "") == "") continue;  // the root spans everything
        const int64_t begin = std::max(comm.start_us, compute.start_us);
        const int64_t end = std::min(comm.start_us + comm.duration_us, compute.start_us + compute.duration_us);
        overlapped = overlapped || end > begin;
      }
    }
    CHECK(overlapped);
  });
}

// The order in which the groups' copy-ins (each all-gather's start) ran in
// the forward and in the backward of one step, by module name.
struct GatherOrder {
  std::vector<std::string> forward, backward;
};
GatherOrder gather_order(const dist::DeviceMesh& mesh, ShardedGPT& sharded) {
  const auto copy_ins = [](const dist::Tracer& tracer) {
    std::vector<dist::TraceEvent> copies;
    for (const dist::TraceEvent& event : tracer.events()) {
      if (event.name == "copy_in") copies.push_back(event);
    }
    std::sort(copies.begin(), copies.end(), [](const auto& a, const auto& b) { return a.start_us < b.start_us; });
    std::vector<std::string> order;
    for (const dist::TraceEvent& event : copies) order.push_back(event.args.value("module", ""));
    return order;
  };
  auto tracer = std::make_shared<dist::Tracer>();
  mesh.group(0)->set_tracer(tracer);
  std::vector<int64_t> tokens(16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 5 % 97);
  const Tensor idx = ops::from_vector(tokens, {2, 8});
  GatherOrder order;
  const Tensor loss = sharded.model->loss(idx, idx);
  order.forward = copy_ins(*tracer);
  tracer->clear();
  autograd::backward(loss);
  order.backward = copy_ins(*tracer);
  mesh.group(0)->set_tracer(nullptr);
  return order;
}

TEST_CASE("fsdp settings: reshard_after_backward, is_last_backward and explicit backward prefetch do what they say") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    {  // set_reshard_after_backward(false) keeps a group unsharded after an
       // unsynced backward (accumulation); synced gradients live on the
       // shards, so a synced backward reshards regardless.
      ShardedGPT sharded = build_sharded_gpt(mesh);
      const auto sharded_now = [&](int block) {
        return holds_shards(group_parameters(block < 0 ? static_cast<nn::Module&>(*sharded.model)
                                                       : sharded.model->block(block)));
      };
      sharded.root->set_requires_gradient_sync(false);
      sharded.root->set_reshard_after_backward(false);
      train_step(*sharded.model, group->rank());
      for (int block = 0; block < kAwkward.n_layer; ++block) CHECK_FALSE(sharded_now(block));
      CHECK_FALSE(sharded_now(-1));
      sharded.root->set_reshard_after_backward(true);
      sharded.blocks[1].set_reshard_after_backward(false, /*recurse=*/false);
      train_step(*sharded.model, group->rank());
      CHECK(sharded_now(0));
      CHECK_FALSE(sharded_now(1));
      CHECK(sharded_now(2));
      CHECK(sharded_now(-1));
      sharded.root->set_requires_gradient_sync(true);
      train_step(*sharded.model, group->rank());
      CHECK(sharded_now(1));
    }
    {  // set_is_last_backward(false): the last reduce-scatter (the root's:
       // wte's gradient comes last) stays in flight past backward, so its
       // sharded gradients are not there yet; the blocks' are.
      ShardedGPT sharded = build_sharded_gpt(mesh);
      nn::Parameter& wte = sharded.model->wte().weight();
      sharded.root->set_is_last_backward(false);
      train_step(*sharded.model, group->rank());
      CHECK_FALSE(wte.grad().defined());
      for (const auto& param : sharded.model->block(0).parameters()) CHECK(param->grad().defined());
      sharded.root->set_is_last_backward(true);
      train_step(*sharded.model, group->rank());
      CHECK(wte.grad().defined());
    }
    {  // backward prefetch: by default each block gathers the one before it; explicitly, block 2 gathers block 0
      ShardedGPT by_default = build_sharded_gpt(mesh);
      CHECK(gather_order(mesh, by_default).backward == std::vector<std::string>{"blocks.2", "blocks.1", "blocks.0"});
      ShardedGPT explicitly = build_sharded_gpt(mesh);
      explicitly.blocks[2].set_modules_to_backward_prefetch({explicitly.blocks[0]});
      CHECK(gather_order(mesh, explicitly).backward == std::vector<std::string>{"blocks.2", "blocks.0", "blocks.1"});
    }
    {  // forward prefetch: explicitly, block 0 gathers block 2 before block 1 (the first
       // iteration has no default prefetch yet: modules gather as they run)
      ShardedGPT by_default = build_sharded_gpt(mesh);
      CHECK(gather_order(mesh, by_default).forward == std::vector<std::string>{"", "blocks.0", "blocks.1", "blocks.2"});
      ShardedGPT explicitly = build_sharded_gpt(mesh);
      explicitly.blocks[0].set_modules_to_forward_prefetch({explicitly.blocks[2], explicitly.blocks[1]});
      CHECK(gather_order(mesh, explicitly).forward == std::vector<std::string>{"", "blocks.0", "blocks.2", "blocks.1"});
    }
  });
}

TEST_CASE("fsdp errors: misuse gives a clear tessera::Error") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    const Tensor idx = ops::from_vector(std::vector<int64_t>(8, 1), {1, 8});
    {  // tied weights split across groups
      nn::GPT model(kAwkward, kMeta);
      fully_shard(model.wte(), {.mesh = mesh});
      fully_shard(model, {.mesh = mesh});
      model.to_empty(kCPU);
      model.reset_parameters(1);
      CHECK_THROWS_WITH_AS(model(idx), doctest::Contains("parameter 'wte.weight' is tied to 'lm_head.weight'"), Error);
    }
    {  // twice on one module; after the first forward; bad reshard size; 3-D mesh
      nn::GPT model(kAwkward, kMeta);
      fully_shard(model.block(0), {.mesh = mesh});
      CHECK_THROWS_WITH_AS(fully_shard(model.block(0), {.mesh = mesh}), doctest::Contains("already an FSDP module"),
                           Error);
      CHECK_THROWS_WITH_AS(
          fully_shard(model.block(1), {.mesh = mesh, .reshard_after_forward = ReshardAfterForward::to_group_of(3)}),
          doctest::Contains("fully_shard(TransformerBlock): reshard_after_forward = 3 must divide the shard group size "
                            "2 (1 = false, 2 = true)"),
          Error);
      fully_shard(model, {.mesh = mesh});
      // Still on meta: the first forward says what to do.
      CHECK_THROWS_WITH_AS(model(idx), doctest::Contains("call to_empty(device) and reset_parameters()"), Error);
    }
    {
      nn::GPT model(kAwkward, kMeta);
      const dist::DeviceMesh cube(group, kCPU, {2, 1, 1});
      CHECK_THROWS_WITH_AS(fully_shard(model, {.mesh = cube}), doctest::Contains("must be 1-D (shard) or 2-D"), Error);
    }
    {
      nn::GPT model(kAwkward, kMeta);
      fully_shard(model.block(0), {.mesh = mesh});
      fully_shard(model, {.mesh = mesh});
      model.to_empty(kCPU);
      model.reset_parameters(1);
      model(idx);
      CHECK_THROWS_WITH_AS(fully_shard(model.block(1), {.mesh = mesh}), doctest::Contains("already been sharded"),
                           Error);
    }
  });
}

TEST_CASE("fsdp: a released unsharded tensor cannot be read") {
  Tensor tensor = ops::zeros({4, 4});
  tensor.storage()->release_data();
  CHECK_THROWS_WITH_AS(tensor.to_vector<float>(), doctest::Contains("storage released"), Error);
  tensor.storage()->restore_data();
  CHECK(tensor.to_vector<float>().size() == 16);
}

TEST_CASE("fsdp: ignored parameters stay whole and unreduced") {
  std::vector<std::vector<float>> ignored_grads(2), ignored_values(2);
  dist::run_local(2, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    nn::GPT model(kAwkward, kMeta);
    const auto ln_f_weight = model.ln_f().parameter("weight");
    for (const auto& block : model.blocks()) fully_shard(*block, {.mesh = mesh});
    FSDPModule root = fully_shard(model, {.mesh = mesh, .ignored_params = {ln_f_weight}});
    model.to_empty(kCPU);
    model.reset_parameters(5);
    CHECK_FALSE(ln_f_weight->is_sharded());
    // Not in the root's reduce-scatter: its slot holds wte and wpe and
    // ln_f.bias (and their presence flags) only.
    std::vector<std::shared_ptr<nn::Parameter>> reduced;
    for (const auto& param : group_parameters(model)) {
      if (param != ln_f_weight) reduced.push_back(param);
    }
    train_step(model, group->rank());
    const int64_t reduced_bytes = (slot_numel(reduced, 2) + static_cast<int64_t>(reduced.size())) * 4;
    CHECK(root.communication_stats(/*recurse=*/false)[dist::CollectiveKind::reduce_scatter].bytes_sent ==
          dist::collective_volume(dist::CollectiveKind::reduce_scatter, reduced_bytes, 2, false).sent);
    CHECK(ln_f_weight->grad().sizes() == Shape{kAwkward.n_embd});
    CHECK(model.wte().weight().is_sharded());
    ignored_grads[static_cast<size_t>(group->rank())] = ln_f_weight->grad().to_vector<float>();
    ignored_values[static_cast<size_t>(group->rank())] = ln_f_weight->tensor().to_vector<float>();
  });
  // Each rank keeps its own micro-batch's gradient (the ranks saw other tokens).
  CHECK(ignored_values[0] == ignored_values[1]);
  CHECK(ignored_grads[0] != ignored_grads[1]);
}

TEST_CASE("fsdp: unshard before the root's first forward is an error, not a new root") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh);
    CHECK_THROWS_WITH_AS(sharded.blocks.front().unshard(), doctest::Contains("run a forward of the root module first"),
                         Error);
    train_step(*sharded.model, group->rank());  // the root's lazy init still works
    CHECK(holds_shards(group_parameters(*sharded.model)));
    // The GPT is the root, the block is not; now the block can unshard.
    sharded.root->set_is_last_backward(true);
    CHECK_THROWS_WITH_AS(sharded.blocks.front().set_is_last_backward(true), doctest::Contains("is not the FSDP root"),
                         Error);
    sharded.blocks.front().unshard();
    CHECK_FALSE(holds_shards(group_parameters(sharded.model->block(0))));
    sharded.blocks.front().reshard();
  });
}
