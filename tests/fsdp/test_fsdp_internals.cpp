// The machinery behind FSDPModule, read through its internal headers (the
// one test file that may: users cannot): the flat layout against the
// parameters' shapes, the group's shard states and resolved
// reshard_after_forward, the settings FSDPModule's setters land in, the
// post-forward group and FSDP's count of its traffic, the state tree.
#include <doctest/doctest.h>

#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "fsdp/param_group.h"
#include "fsdp/state.h"
#include "tensor/error.h"
#include "tests/fsdp/sharded_gpt.h"

using namespace tessera;
using namespace tessera::fsdp;
using namespace tessera::fsdp::testing;

namespace {

FSDPState& state_of(nn::Module& module) {
  FSDPState* state = module.extension<FSDPState>();
  REQUIRE(state != nullptr);
  return *state;
}

FSDPParamGroup& group_of(nn::Module& module) {
  FSDPParamGroup* group = state_of(module).group();
  REQUIRE(group != nullptr);
  return *group;
}

}  // namespace

TEST_CASE("fsdp internals: the flat layout is ceil(rows / W) rows per parameter, one slot per rank") {
  dist::run_local(3, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {3});
    ShardedGPT sharded = build_sharded_gpt(mesh, {.mp_policy = {.param_dtype = DType::bf16}});
    for (nn::Module* module : {static_cast<nn::Module*>(&sharded.model->block(0)),
                               static_cast<nn::Module*>(sharded.model.get())}) {
      const FSDPParamGroup& fsdp_group = group_of(*module);
      const FlatLayout& layout = fsdp_group.layout();
      CHECK(layout.world == 3);
      REQUIRE(layout.chunk_rows.size() == fsdp_group.params().size());
      int64_t offset = 0;
      for (size_t index = 0; index < fsdp_group.params().size(); ++index) {
        const FSDPParam& param = *fsdp_group.params()[index];
        CAPTURE(param.fqn());
        CHECK(layout.chunk_rows[index] == (param.rows() + 2) / 3);
        CHECK(layout.offsets[index] == offset);
        offset += layout.chunk_rows[index] * param.row_numel();
      }
      CHECK(layout.slot_numel == offset);
      CHECK(layout.slot_numel == slot_numel(group_parameters(*module), 3));
      CHECK(fsdp_group.unsharded_bytes() == 3 * layout.slot_numel * 2);  // bf16
      CHECK(fsdp_group.param_dtype() == DType::bf16);
      CHECK(fsdp_group.reduce_dtype() == DType::bf16);  // unset: param_dtype
    }
  });
}

TEST_CASE("fsdp internals: shard states, reshard targets and the resolved reshard_after_forward") {
  dist::run_local(4, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {4});
    ShardedGPT sharded = build_sharded_gpt(mesh, {.reshard_after_forward = ReshardAfterForward::to_group_of(2)});
    FSDPParamGroup& block = group_of(sharded.model->block(0));
    FSDPParamGroup& root = group_of(*sharded.model);
    CHECK(block.reshard_after_forward() == ReshardAfterForward::to_group_of(2));
    REQUIRE(block.comm().post_forward != nullptr);
    CHECK(block.comm().post_forward->size() == 2);
    CHECK(block.comm().post_forward == group_of(sharded.model->block(2)).comm().post_forward);  // one split, shared
    CHECK(root.comm().post_forward == nullptr);
    CHECK(root.reshard_after_forward() == ReshardAfterForward::always());  // until the root is known
    train_step(*sharded.model, group->rank());
    CHECK(root.reshard_after_forward() == ReshardAfterForward::never());

    CHECK(block.state() == ShardState::sharded);
    CHECK_FALSE(block.pending_all_gather().has_value());
    block.unshard(/*async_op=*/true);
    const std::optional<int64_t> first = block.pending_all_gather();
    REQUIRE(first.has_value());
    block.wait_for_unshard();
    CHECK(block.state() == ShardState::unsharded);
    CHECK_FALSE(block.pending_all_gather().has_value());
    CHECK_THROWS_WITH_AS(block.reshard(ShardState::unsharded), doctest::Contains("reshard to unsharded"), Error);
    block.reshard(ShardState::sharded_post_forward);
    CHECK(block.state() == ShardState::sharded_post_forward);
    block.comm().post_forward->reset_stats();
    block.reset_comm_stats();
    block.unshard(/*async_op=*/true);  // from the post-forward rows: over the pair
    CHECK(*block.pending_all_gather() == *first + 1);
    block.wait_for_unshard();
    CHECK(block.state() == ShardState::unsharded);
    // FSDP's count of that all-gather is the group's.
    const dist::CommStats counted = block.comm_stats();
    const dist::CommStats pair = block.comm().post_forward->stats();
    CHECK(counted[dist::CollectiveKind::all_gather].calls == 1);
    CHECK(counted[dist::CollectiveKind::all_gather].bytes_sent == pair[dist::CollectiveKind::all_gather].bytes_sent);
    CHECK(counted[dist::CollectiveKind::all_gather].bytes_received ==
          pair[dist::CollectiveKind::all_gather].bytes_received);
    block.reshard();
    CHECK(block.state() == ShardState::sharded);

    // A group told to keep group-of-N rows needs a post-forward group of N.
    CHECK_THROWS_WITH_AS(root.set_reshard_after_forward(ReshardAfterForward::to_group_of(2)),
                         doctest::Contains("reshard_after_forward 2 on 4 shard ranks needs a post-forward group of "
                                           "that size, got 0 ranks"),
                         Error);
    root.set_reshard_after_forward(ReshardAfterForward::to_group_of(4));
    CHECK(root.reshard_after_forward() == ReshardAfterForward::always());
    root.set_reshard_after_forward(ReshardAfterForward::never());
  });
}

TEST_CASE("fsdp internals: FSDPModule's setters land in the state and the group; the state tree") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh);
    FSDPState& root = state_of(*sharded.model);
    CHECK_THROWS_WITH_AS(root.tree(), doctest::Contains("known after the root's first forward"), Error);
    CHECK_FALSE(root.initialized());

    sharded.blocks[1].set_requires_gradient_sync(false, /*recurse=*/false);
    sharded.blocks[2].set_reshard_after_backward(false, /*recurse=*/false);
    CHECK_FALSE(group_of(sharded.model->block(1)).requires_gradient_sync());
    CHECK(group_of(sharded.model->block(1)).reshard_after_backward());
    CHECK(group_of(sharded.model->block(2)).requires_gradient_sync());
    CHECK_FALSE(group_of(sharded.model->block(2)).reshard_after_backward());
    sharded.root->set_requires_gradient_sync(true);
    sharded.root->set_reshard_after_backward(true);
    for (int index = 0; index < 3; ++index) {
      CHECK(group_of(sharded.model->block(index)).requires_gradient_sync());
      CHECK(group_of(sharded.model->block(index)).reshard_after_backward());
    }
    sharded.root->set_is_last_backward(false);
    CHECK_FALSE(root.is_last_backward());
    sharded.root->set_is_last_backward(true);
    CHECK(root.is_last_backward());

    train_step(*sharded.model, group->rank());
    REQUIRE(root.initialized());
    CHECK(root.is_root());
    const std::vector<FSDPState*>& tree = root.tree();
    REQUIRE(tree.size() == 4u);
    CHECK(tree[0] == &root);  // pre-order, the root first
    for (int index = 0; index < 3; ++index) {
      CHECK(tree[static_cast<size_t>(index) + 1] == &state_of(sharded.model->block(index)));
      CHECK(tree[static_cast<size_t>(index) + 1]->fqn() == "blocks." + std::to_string(index));
      CHECK_FALSE(tree[static_cast<size_t>(index) + 1]->is_root());
    }
    CHECK(managing_state(sharded.model->wte().weight()) == &root);
    CHECK(managing_state(*sharded.model->block(1).parameters().front()) == &state_of(sharded.model->block(1)));
    // The memory counters nest: a block's own is in the root's tree-wide one.
    CHECK(root.unsharded_memory(/*recurse=*/true).allocation_count >=
          root.unsharded_memory(/*recurse=*/false).allocation_count +
              state_of(sharded.model->block(0)).unsharded_memory(/*recurse=*/false).allocation_count);
  });
}

TEST_CASE("fsdp internals: an ignored parameter has no managing state and is in no group") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    nn::GPT model(kAwkward, kMeta);
    const auto ln_f_weight = model.ln_f().parameter("weight");
    for (const auto& block : model.blocks()) fully_shard(*block, {.mesh = mesh});
    fully_shard(model, {.mesh = mesh, .ignored_params = {ln_f_weight}});
    CHECK(managing_state(*ln_f_weight) == nullptr);
    for (const auto& param : group_of(model).params()) CHECK(param->param_ptr() != ln_f_weight);
    CHECK(group_of(model).params().size() + 1 == group_parameters(model).size());
  });
}
