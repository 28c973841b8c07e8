// FSDP's communication, hooks and errors: bytes per step equal the FSDP
// volume (and the all-gathers halve under bf16), async unshard and explicit
// prefetch, overlap visible in the trace, and every misuse a clear error.
#include <doctest/doctest.h>

#include <algorithm>

#include "autograd/engine.h"
#include "dist/comm_stats.h"
#include "dist/local_backend.h"
#include "dist/trace.h"
#include "fsdp/fully_shard.h"
#include "nn/models/gpt.h"
#include "tensor/ops.h"

using namespace tessera;
using namespace tessera::fsdp;

namespace {

const nn::GPTConfig kAwkward{.vocab_size = 97, .block_size = 8, .n_layer = 3, .n_head = 3, .n_embd = 72};

struct ShardedGPT {
  std::unique_ptr<nn::GPT> model;
  std::vector<FSDPModule> blocks;
  std::optional<FSDPModule> root;
};

ShardedGPT build(const dist::DeviceMesh& mesh, FullyShardOptions block_options = {}, FullyShardOptions root_options = {}) {
  ShardedGPT sharded{std::make_unique<nn::GPT>(kAwkward, kMeta), {}, std::nullopt};
  block_options.mesh = mesh;
  root_options.mesh = mesh;
  root_options.mp_policy = block_options.mp_policy;
  for (const auto& block : sharded.model->blocks()) sharded.blocks.push_back(fully_shard(*block, block_options));
  sharded.root = fully_shard(*sharded.model, root_options);
  sharded.model->to_empty(kCPU);
  sharded.model->reset_parameters(5);
  return sharded;
}

void train_step(nn::GPT& model, int rank) {
  std::vector<int64_t> tokens(2 * 8);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(rank) * 3) % 97);
  const Tensor idx = ops::from_vector(tokens, {2, 8});
  autograd::backward(model.loss(idx, idx));
}

// The per-rank volume FSDP should move in one step, from the groups' layouts.
struct Expected {
  int64_t all_gather_sent = 0, reduce_scatter_sent = 0;
};
Expected expected_volume(const ShardedGPT& sharded) {
  Expected expected;
  std::vector<FSDPState*> states;
  for (const FSDPModule& block : sharded.blocks) states.push_back(&block.state());
  states.push_back(&sharded.root->state());
  for (FSDPState* state : states) {
    const FSDPParamGroup& group = *state->group();
    const int world = group.comm().shard->size();
    const int64_t param_bytes = element_size(group.param_dtype());
    const int64_t slot = group.layout().slot_numel;
    const int64_t gathers = group.post_forward_shards() == 1 ? 1 : 2;  // forward, and backward when resharded
    expected.all_gather_sent +=
        gathers * dist::collective_volume(dist::CollectiveKind::all_gather, slot * param_bytes, world, false).sent;
    const int64_t flags = static_cast<int64_t>(group.params().size());
    expected.reduce_scatter_sent +=
        dist::collective_volume(dist::CollectiveKind::reduce_scatter,
                                (slot + flags) * static_cast<int64_t>(element_size(group.reduce_dtype())), world, false)
            .sent;
  }
  return expected;
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
        ShardedGPT sharded = build(mesh, options);
        train_step(*sharded.model, group->rank());  // records the prefetch order
        mesh.group(0)->reset_stats();
        train_step(*sharded.model, group->rank());
        const dist::CommStats stats = mesh.group(0)->stats();
        const Expected expected = expected_volume(sharded);
        CHECK(stats[dist::CollectiveKind::all_gather].bytes_sent == expected.all_gather_sent);
        CHECK(stats[dist::CollectiveKind::reduce_scatter].bytes_sent == expected.reduce_scatter_sent);
        CHECK(stats[dist::CollectiveKind::all_gather].calls == 1 + 2 * kAwkward.n_layer);  // root once, blocks twice
        CHECK(stats[dist::CollectiveKind::reduce_scatter].calls == 1 + kAwkward.n_layer);
        (bf16 ? all_gather_bf16 : all_gather_f32)[static_cast<size_t>(group->rank())] =
            stats[dist::CollectiveKind::all_gather].bytes_sent;
      }
    });
    for (int rank = 0; rank < world; ++rank) {
      CHECK(all_gather_bf16[static_cast<size_t>(rank)] * 2 == all_gather_f32[static_cast<size_t>(rank)]);
    }
  }
}

TEST_CASE("fsdp comm: reshard_after_forward = 2 gathers over 2 ranks in backward; false skips the backward gather") {
  dist::run_local(4, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {4});
    for (const ReshardAfterForward mode : {ReshardAfterForward{int64_t{2}}, ReshardAfterForward{false}}) {
      ShardedGPT sharded = build(mesh, {.reshard_after_forward = mode});
      train_step(*sharded.model, group->rank());
      const FSDPParamGroup& block = *sharded.blocks.front().state().group();
      // The public view of the groups: the shard group, and the 2-rank post-forward one when resharding to 2.
      const std::vector<dist::ProcessGroupPtr> groups = sharded.root->communication_groups();
      CHECK(groups.size() == (std::holds_alternative<bool>(mode) ? 1u : 2u));
      CHECK(groups.front() == mesh.group(0));
      CHECK(sharded.blocks.front().communication_groups(/*recurse=*/false).size() == groups.size());
      if (std::holds_alternative<bool>(mode)) {
        CHECK(block.post_forward_shards() == 1);
        CHECK(block.comm().post_forward == nullptr);
      } else {
        REQUIRE(block.comm().post_forward != nullptr);
        CHECK(block.comm().post_forward->size() == 2);
        mesh.group(0)->reset_stats();
        block.comm().post_forward->reset_stats();
        train_step(*sharded.model, group->rank());
        // Every block gathers once over 2 ranks in backward; forward stays on 4.
        CHECK(block.comm().post_forward->stats()[dist::CollectiveKind::all_gather].calls == kAwkward.n_layer);
        CHECK(mesh.group(0)->stats()[dist::CollectiveKind::all_gather].calls == 1 + kAwkward.n_layer);
      }
      CHECK(block.state() == ShardState::sharded);
    }
  });
}

TEST_CASE("fsdp hooks: async unshard, explicit prefetch, reshard, and overlap in the trace") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build(mesh);
    auto tracer = std::make_shared<dist::Tracer>();
    mesh.group(0)->set_tracer(tracer);

    // Async unshard: the next forward waits on it; the parameters are whole.
    FSDPModule& first = sharded.blocks.front();
    train_step(*sharded.model, group->rank());
    UnshardHandle handle = first.unshard(/*async_op=*/true);
    handle.wait();
    CHECK(first.state().group()->state() == ShardState::unsharded);
    CHECK(sharded.model->block(0).parameters().front()->tensor().sizes() ==
          sharded.model->block(0).parameters().front()->global_shape());
    first.reshard();
    CHECK(first.state().group()->state() == ShardState::sharded);
    CHECK(sharded.model->block(0).parameters().front()->is_sharded());

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

TEST_CASE("fsdp settings: reshard_after_backward, is_last_backward and explicit backward prefetch do what they say") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    const auto state_of = [](const FSDPModule& module) { return module.state().group()->state(); };
    {  // set_reshard_after_backward(false) keeps a group unsharded after an
       // unsynced backward (accumulation); synced gradients live on the
       // shards, so a synced backward reshards regardless.
      ShardedGPT sharded = build(mesh);
      sharded.root->set_requires_gradient_sync(false);
      sharded.root->set_reshard_after_backward(false);
      train_step(*sharded.model, group->rank());
      for (const FSDPModule& block : sharded.blocks) CHECK(state_of(block) == ShardState::unsharded);
      CHECK(state_of(*sharded.root) == ShardState::unsharded);
      sharded.root->set_reshard_after_backward(true);
      sharded.blocks[1].set_reshard_after_backward(false, /*recurse=*/false);
      train_step(*sharded.model, group->rank());
      CHECK(state_of(sharded.blocks[0]) == ShardState::sharded);
      CHECK(state_of(sharded.blocks[1]) == ShardState::unsharded);
      CHECK(state_of(sharded.blocks[2]) == ShardState::sharded);
      CHECK(state_of(*sharded.root) == ShardState::sharded);
      sharded.root->set_requires_gradient_sync(true);
      train_step(*sharded.model, group->rank());
      CHECK(state_of(sharded.blocks[1]) == ShardState::sharded);
    }
    {  // set_is_last_backward(false): the last reduce-scatter stays in flight past backward
      ShardedGPT sharded = build(mesh);
      const auto pending = [&] {
        int count = sharded.root->state().group()->reduce_scatter_pending() ? 1 : 0;
        for (const FSDPModule& block : sharded.blocks) count += block.state().group()->reduce_scatter_pending() ? 1 : 0;
        return count;
      };
      sharded.root->set_is_last_backward(false);
      train_step(*sharded.model, group->rank());
      CHECK(pending() == 1);
      sharded.root->set_is_last_backward(true);
      train_step(*sharded.model, group->rank());
      CHECK(pending() == 0);
    }
    {  // backward prefetch: by default each block gathers the one before it; explicitly, block 2 gathers block 0
      const auto backward_gather_order = [&](bool explicit_prefetch) {
        ShardedGPT sharded = build(mesh);
        if (explicit_prefetch) sharded.blocks[2].set_modules_to_backward_prefetch({sharded.blocks[0]});
        auto tracer = std::make_shared<dist::Tracer>();
        mesh.group(0)->set_tracer(tracer);
        std::vector<int64_t> tokens(16);
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 5 % 97);
        const Tensor idx = ops::from_vector(tokens, {2, 8});
        const Tensor loss = sharded.model->loss(idx, idx);
        tracer->clear();  // from here on, backward's gathers only
        autograd::backward(loss);
        std::vector<dist::TraceEvent> copies;
        for (const dist::TraceEvent& event : tracer->events()) {
          if (event.name == "copy_in") copies.push_back(event);
        }
        std::sort(copies.begin(), copies.end(), [](const auto& a, const auto& b) { return a.start_us < b.start_us; });
        std::vector<std::string> order;
        for (const dist::TraceEvent& event : copies) order.push_back(event.args.value("module", ""));
        return order;
      };
      CHECK(backward_gather_order(false) == std::vector<std::string>{"blocks.2", "blocks.1", "blocks.0"});
      CHECK(backward_gather_order(true) == std::vector<std::string>{"blocks.2", "blocks.0", "blocks.1"});
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
      CHECK_THROWS_WITH_AS(fully_shard(model.block(1), {.mesh = mesh, .reshard_after_forward = int64_t{3}}),
                           doctest::Contains("must divide the shard group size 2"), Error);
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
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    nn::GPT model(kAwkward, kMeta);
    const auto ln_f_weight = model.ln_f().parameter("weight");
    for (const auto& block : model.blocks()) fully_shard(*block, {.mesh = mesh});
    FSDPModule root = fully_shard(model, {.mesh = mesh, .ignored_params = {ln_f_weight}});
    model.to_empty(kCPU);
    model.reset_parameters(5);
    CHECK_FALSE(ln_f_weight->is_sharded());
    CHECK(managing_state(*ln_f_weight) == nullptr);
    for (const auto& param : root.state().group()->params()) CHECK(param->param_ptr() != ln_f_weight);
    train_step(model, group->rank());
    CHECK(ln_f_weight->grad().sizes() == Shape{kAwkward.n_embd});
    CHECK(model.wte().weight().is_sharded());
  });
}

TEST_CASE("fsdp: unshard before the root's first forward is an error, not a new root") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build(mesh);
    CHECK_THROWS_WITH_AS(sharded.blocks.front().unshard(), doctest::Contains("run a forward of the root module first"),
                         Error);
    train_step(*sharded.model, group->rank());  // the root's lazy init still works
    CHECK(sharded.root->state().is_root());
  });
}
