// The public FSDP module API, method by method, through fsdp/fully_shard.h
// alone: ReshardAfterForward, fully_shard / fsdp_module, every FSDPModule
// call and UnshardHandle::wait, with their error paths (a handle whose module
// is gone, settings made on the wrong module, prefetch across models).
#include <doctest/doctest.h>

#include <type_traits>

#include "dist/backends/local_backend.h"
#include "dist/comm_stats.h"
#include "fsdp/fully_shard.h"
#include "tensor/error.h"
#include "tests/fsdp/sharded_gpt.h"

using namespace tessera;
using namespace tessera::fsdp;
using namespace tessera::fsdp::testing;

namespace {

using Kind = dist::CollectiveKind;

int64_t calls(const FSDPModule& module, Kind kind, bool recurse = true) {
  return module.communication_stats(recurse)[kind].calls;
}

int64_t parameter_bytes(const std::vector<std::shared_ptr<nn::Parameter>>& params) {
  int64_t bytes = 0;
  for (const auto& param : params) bytes += shape_numel(param->global_shape()) * 4;
  return bytes;
}

}  // namespace

// ---- ReshardAfterForward ----------------------------------------------------------------------------

static_assert(std::is_convertible_v<bool, ReshardAfterForward>, "true / false read as in FSDP2");
static_assert(!std::is_convertible_v<int, ReshardAfterForward>, "an integer is a group size: to_group_of(N)");
static_assert(!std::is_convertible_v<int64_t, ReshardAfterForward>, "an integer is a group size: to_group_of(N)");
static_assert(!std::is_convertible_v<double, ReshardAfterForward>, "no conversion but from bool");
static_assert(!std::is_constructible_v<ReshardAfterForward, int64_t>, "a group size is spelled to_group_of(N)");

TEST_CASE("ReshardAfterForward: always, never and to_group_of, FSDP2's bools, equality and printing") {
  const ReshardAfterForward yes = true;
  const ReshardAfterForward no = false;
  const ReshardAfterForward pairs = ReshardAfterForward::to_group_of(2);
  CHECK(yes == ReshardAfterForward::always());
  CHECK(no == ReshardAfterForward::never());
  CHECK(yes != no);
  CHECK(pairs == ReshardAfterForward::to_group_of(2));
  CHECK(pairs != ReshardAfterForward::to_group_of(4));
  CHECK(pairs != yes);
  CHECK(ReshardAfterForward::to_group_of(1) == no);  // one rank keeps everything

  CHECK(yes.is_always());
  CHECK_FALSE(yes.is_never());
  CHECK_FALSE(yes.group_size().has_value());
  CHECK(no.is_never());
  CHECK_FALSE(no.is_always());
  CHECK_FALSE(no.group_size().has_value());
  CHECK_FALSE(pairs.is_always());
  CHECK_FALSE(pairs.is_never());
  CHECK(pairs.group_size() == 2);

  CHECK(yes.to_string() == "true");
  CHECK(no.to_string() == "false");
  CHECK(ReshardAfterForward::to_group_of(4).to_string() == "4");

  CHECK_THROWS_WITH_AS(ReshardAfterForward::to_group_of(0),
                       "ReshardAfterForward::to_group_of: the group size must be >= 1 rank, got 0", Error);
  CHECK_THROWS_WITH_AS(ReshardAfterForward::to_group_of(-3), doctest::Contains("got -3"), Error);
}

TEST_CASE("ReshardAfterForward: resolved against a shard group of S ranks") {
  CHECK(ReshardAfterForward::always().shards_after_forward(8) == 8);
  CHECK(ReshardAfterForward::never().shards_after_forward(8) == 1);
  CHECK(ReshardAfterForward::to_group_of(2).shards_after_forward(8) == 2);
  CHECK(ReshardAfterForward::to_group_of(8).shards_after_forward(8) == 8);
  CHECK_THROWS_WITH_AS(ReshardAfterForward::to_group_of(3).shards_after_forward(8),
                       "reshard_after_forward = 3 must divide the shard group size 8 (1 = false, 8 = true)", Error);
  CHECK_THROWS_WITH_AS(ReshardAfterForward::to_group_of(16).shards_after_forward(8),
                       doctest::Contains("= 16 must divide the shard group size 8"), Error);
  CHECK_THROWS_WITH_AS(ReshardAfterForward::always().shards_after_forward(0),
                       doctest::Contains("the shard group size must be >= 1, got 0"), Error);

  CHECK(ReshardAfterForward::to_group_of(8).resolved(8) == ReshardAfterForward::always());
  CHECK(ReshardAfterForward::to_group_of(2).resolved(8) == ReshardAfterForward::to_group_of(2));
  CHECK(ReshardAfterForward::never().resolved(8) == ReshardAfterForward::never());
  CHECK(ReshardAfterForward::always().resolved(8) == ReshardAfterForward::always());
  CHECK(ReshardAfterForward::always().resolved(1) == ReshardAfterForward::never());  // nothing to gather
  CHECK_THROWS_AS(ReshardAfterForward::to_group_of(3).resolved(4), Error);
}

// ---- fully_shard and fsdp_module ---------------------------------------------------------------------

TEST_CASE("fully_shard and fsdp_module: the handle of a module, and none for a module it was not applied to") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh);
    CHECK(&sharded.root->module() == sharded.model.get());
    CHECK(&sharded.blocks[1].module() == &sharded.model->block(1));
    CHECK_FALSE(fsdp_module(sharded.model->ln_f()).has_value());
    CHECK_FALSE(fsdp_module(sharded.model->wte()).has_value());
    std::optional<FSDPModule> found = fsdp_module(sharded.model->block(1));
    REQUIRE(found.has_value());
    CHECK(&found->module() == &sharded.model->block(1));
    // Both handles drive one module: a setting made through one shows in the other's figures.
    found->set_requires_gradient_sync(false, /*recurse=*/false);
    train_step(*sharded.model, group->rank());
    CHECK(calls(sharded.blocks[1], Kind::reduce_scatter, false) == 0);
    CHECK(calls(*found, Kind::all_gather, false) == calls(sharded.blocks[1], Kind::all_gather, false));
  });
}

TEST_CASE("a parameter is frozen before fully_shard; after, changing requires_grad is an error") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh, {}, {}, [](nn::GPT& model) {
      model.wpe().weight().set_requires_grad(false);
      CHECK_FALSE(model.wpe().weight().requires_grad());
    });
    CHECK_FALSE(sharded.model->wpe().weight().requires_grad());
    CHECK_FALSE(sharded.model->wpe().weight().tensor().requires_grad());
    CHECK_THROWS_WITH_AS(sharded.model->wpe().weight().set_requires_grad(true),
                         doctest::Contains("requires_grad cannot change once FSDP has sharded the parameter"), Error);
    CHECK_THROWS_WITH_AS(sharded.model->wte().weight().set_requires_grad(false),
                         doctest::Contains("freeze or thaw it before fully_shard"), Error);
  });
}

TEST_CASE("fully_shard: reshard_after_forward to_group_of(S) is always(), to_group_of(1) is never(), and the root's "
          "default is never()") {
  dist::run_local(4, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {4});
    struct Case {
      ReshardAfterForward blocks;
      std::optional<ReshardAfterForward> root;
      int64_t block_gathers, root_gathers;
    };
    for (const Case& c : {Case{ReshardAfterForward::to_group_of(4), std::nullopt, 2, 1},
                          Case{ReshardAfterForward::to_group_of(1), std::nullopt, 1, 1},
                          Case{true, ReshardAfterForward{true}, 2, 2}}) {
      CAPTURE(c.blocks.to_string());
      ShardedGPT sharded = build_sharded_gpt(mesh, {.reshard_after_forward = c.blocks},
                                             {.reshard_after_forward = c.root});
      mesh.group(0)->reset_stats();
      train_step(*sharded.model, group->rank());
      CHECK(calls(sharded.blocks[0], Kind::all_gather, false) == c.block_gathers);
      CHECK(calls(*sharded.root, Kind::all_gather, false) == c.root_gathers);
      // Every one of them on the 4-rank shard group: no 4-rank or 1-rank post-forward group.
      CHECK(mesh.group(0)->stats()[Kind::all_gather].calls == kAwkward.n_layer * c.block_gathers + c.root_gathers);
    }
  });
}

// ---- unshard, reshard, UnshardHandle -----------------------------------------------------------------

TEST_CASE("FSDPModule::unshard and reshard; UnshardHandle::wait completes its all-gather and nothing else") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh);
    FSDPModule& block = sharded.blocks[1];
    const auto params = group_parameters(sharded.model->block(1));
    train_step(*sharded.model, group->rank());
    block.reset_communication_stats();
    mesh.group(0)->reset_stats();

    UnshardHandle done = block.unshard();  // synchronous: whole on return
    CHECK_FALSE(holds_shards(params));
    CHECK(params.front()->tensor().sizes() == params.front()->global_shape());
    CHECK(calls(block, Kind::all_gather) == 1);
    done.wait();  // nothing left to wait for
    block.unshard(/*async_op=*/true).wait();  // already whole: no second all-gather
    CHECK(calls(block, Kind::all_gather) == 1);
    block.reshard();
    CHECK(holds_shards(params));
    block.reshard();  // already sharded: nothing to do
    CHECK(holds_shards(params));

    UnshardHandle handle = block.unshard(/*async_op=*/true);
    CHECK(holds_shards(params));  // issued, not yet copied out
    handle.wait();
    CHECK_FALSE(holds_shards(params));
    handle.wait();
    CHECK(calls(block, Kind::all_gather) == 2);

    block.reshard();
    UnshardHandle dropped = block.unshard(/*async_op=*/true);
    block.reshard();  // waits for the all-gather and drops it
    dropped.wait();   // so this is a no-op: no all-gather of this rank alone
    CHECK(holds_shards(params));
    CHECK(calls(block, Kind::all_gather) == 3);
    CHECK(mesh.group(0)->stats()[Kind::all_gather].calls == 3);  // every rank issued the same three

    UnshardHandle().wait();  // a default handle waits for nothing
    // The parameters are right after all this: a step still trains.
    train_step(*sharded.model, group->rank());
    CHECK(holds_shards(params));
  });
}

TEST_CASE("FSDPModule: every call on a handle whose module is gone is a tessera::Error") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh);
    ShardedGPT other = build_sharded_gpt(mesh);
    train_step(*sharded.model, group->rank());
    FSDPModule block = sharded.blocks[0];
    UnshardHandle handle = block.unshard(/*async_op=*/true);
    handle.wait();
    block.reshard();
    sharded.model.reset();

    const auto gone = doctest::Contains("the module this FSDP handle was made for is gone");
    CHECK_THROWS_WITH_AS(block.module(), gone, Error);
    CHECK_THROWS_WITH_AS(block.unshard(), gone, Error);
    CHECK_THROWS_WITH_AS(block.reshard(), gone, Error);
    CHECK_THROWS_WITH_AS(block.set_requires_gradient_sync(false), gone, Error);
    CHECK_THROWS_WITH_AS(block.set_reshard_after_backward(false), gone, Error);
    CHECK_THROWS_WITH_AS(block.set_is_last_backward(false), gone, Error);
    CHECK_THROWS_WITH_AS(block.set_modules_to_forward_prefetch({}), gone, Error);
    CHECK_THROWS_WITH_AS(block.set_modules_to_backward_prefetch({}), gone, Error);
    CHECK_THROWS_WITH_AS(block.communication_stats(), gone, Error);
    CHECK_THROWS_WITH_AS(block.reset_communication_stats(), gone, Error);
    CHECK_THROWS_WITH_AS(block.unsharded_memory(), gone, Error);
    CHECK_THROWS_WITH_AS(block.reset_unsharded_memory_peak(), gone, Error);
    CHECK_THROWS_WITH_AS(handle.wait(), doctest::Contains("UnshardHandle::wait: the module"), Error);
    // As a prefetch target of a live module, too.
    CHECK_THROWS_WITH_AS(other.blocks[0].set_modules_to_forward_prefetch({block}),
                         doctest::Contains("FSDPModule::set_modules_to_forward_prefetch: the module"), Error);
    CHECK_THROWS_WITH_AS(other.blocks[0].set_modules_to_backward_prefetch({other.blocks[1], block}), gone, Error);
  });
}

// ---- the settings --------------------------------------------------------------------------------------

TEST_CASE("FSDPModule::set_requires_gradient_sync: no reduce-scatter until a synced backward; one module or a tree") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh);
    nn::Parameter& wte = sharded.model->wte().weight();
    sharded.root->set_requires_gradient_sync(false);
    train_step(*sharded.model, group->rank());
    CHECK(calls(*sharded.root, Kind::reduce_scatter) == 0);
    CHECK_FALSE(wte.grad().defined());  // the gradients wait, unsharded, for a synced backward
    sharded.root->set_requires_gradient_sync(true);
    train_step(*sharded.model, group->rank());
    CHECK(calls(*sharded.root, Kind::reduce_scatter) == 1 + kAwkward.n_layer);
    CHECK(wte.grad().defined());

    sharded.root->reset_communication_stats();
    sharded.blocks[1].set_requires_gradient_sync(false, /*recurse=*/false);
    train_step(*sharded.model, group->rank());
    CHECK(calls(sharded.blocks[1], Kind::reduce_scatter, false) == 0);
    CHECK(calls(*sharded.root, Kind::reduce_scatter) == kAwkward.n_layer);  // the root and the other blocks
    sharded.blocks[1].set_requires_gradient_sync(true, /*recurse=*/false);
    train_step(*sharded.model, group->rank());
    CHECK(calls(sharded.blocks[1], Kind::reduce_scatter, false) == 1);
  });
}

TEST_CASE("FSDPModule::set_is_last_backward belongs to the root: elsewhere it is an error, before or after the first "
          "forward") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    {
      ShardedGPT sharded = build_sharded_gpt(mesh);
      sharded.blocks[0].set_is_last_backward(false);  // the root is not known yet
      CHECK_THROWS_WITH_AS(train_step(*sharded.model, group->rank()),
                           "fsdp: set_is_last_backward(false) was called on 'blocks.0' (TransformerBlock), which is "
                           "not the FSDP root; the root's backward decides, so call it on the root",
                           Error);
    }
    {
      ShardedGPT sharded = build_sharded_gpt(mesh);
      train_step(*sharded.model, group->rank());
      CHECK_THROWS_WITH_AS(sharded.blocks[2].set_is_last_backward(false),
                           doctest::Contains("'blocks.2' (TransformerBlock) is not the FSDP root"), Error);
      sharded.root->set_is_last_backward(false);  // the root may
    }
  });
}

TEST_CASE("FSDPModule::set_modules_to_*_prefetch: a module of another model is an error at the forward that uses it") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    ShardedGPT sharded = build_sharded_gpt(mesh);
    ShardedGPT other = build_sharded_gpt(mesh);
    train_step(*other.model, group->rank());
    sharded.blocks[0].set_modules_to_forward_prefetch({other.blocks[1]});
    CHECK_THROWS_WITH_AS(train_step(*sharded.model, group->rank()),
                         doctest::Contains("'blocks.0' (TransformerBlock) prefetches a TransformerBlock that is not in "
                                           "its FSDP root's tree"),
                         Error);
  });
}

// ---- statistics ----------------------------------------------------------------------------------------

TEST_CASE("FSDPModule::communication_stats: per module and per tree, FSDP's own, HSDP's all-reduces; reset") {
  dist::run_local(4, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2, 2});  // (replicate, shard)
    ShardedGPT sharded = build_sharded_gpt(mesh);
    train_step(*sharded.model, group->rank());
    sharded.root->reset_communication_stats();
    mesh.group(0)->reset_stats();
    mesh.group(1)->reset_stats();
    train_step(*sharded.model, group->rank());

    const dist::CommStats tree = sharded.root->communication_stats();
    dist::CommStats sum = sharded.root->communication_stats(/*recurse=*/false);
    CHECK(sum[Kind::all_gather].calls == 1);  // the root: forward only
    CHECK(sum[Kind::reduce_scatter].calls == 1);
    CHECK(sum[Kind::all_reduce].calls == 1);
    for (const FSDPModule& block : sharded.blocks) {
      const dist::CommStats own = block.communication_stats(/*recurse=*/false);
      CHECK(own[Kind::all_gather].calls == 2);
      CHECK(own[Kind::reduce_scatter].calls == 1);
      CHECK(own[Kind::all_reduce].calls == 1);
      CHECK(block.communication_stats(/*recurse=*/true)[Kind::all_gather].bytes_sent ==
            own[Kind::all_gather].bytes_sent);  // nothing below a block
      for (size_t kind = 0; kind < sum.by_kind.size(); ++kind) {
        sum.by_kind[kind].calls += own.by_kind[kind].calls;
        sum.by_kind[kind].bytes_sent += own.by_kind[kind].bytes_sent;
        sum.by_kind[kind].bytes_received += own.by_kind[kind].bytes_received;
      }
    }
    for (const Kind kind : {Kind::all_gather, Kind::reduce_scatter, Kind::all_reduce}) {
      CAPTURE(dist::collective_name(kind));
      CHECK(tree[kind].calls == sum[kind].calls);
      CHECK(tree[kind].bytes_sent == sum[kind].bytes_sent);
      CHECK(tree[kind].bytes_received == sum[kind].bytes_received);
      CHECK(tree[kind].seconds == 0.0);  // FSDP counts; the groups time
    }
    // The groups saw exactly FSDP's collectives: gathers and reduce-scatters
    // on the shard group, the all-reduces on the replicate group.
    CHECK(tree[Kind::all_gather].bytes_sent == mesh.group(1)->stats()[Kind::all_gather].bytes_sent);
    CHECK(tree[Kind::reduce_scatter].bytes_sent == mesh.group(1)->stats()[Kind::reduce_scatter].bytes_sent);
    CHECK(tree[Kind::all_reduce].calls == mesh.group(0)->stats()[Kind::all_reduce].calls);
    CHECK(tree[Kind::all_reduce].bytes_sent == mesh.group(0)->stats()[Kind::all_reduce].bytes_sent);
    CHECK(tree[Kind::all_reduce].bytes_sent > 0);

    sharded.blocks[0].reset_communication_stats(/*recurse=*/false);
    CHECK(calls(sharded.blocks[0], Kind::all_gather) == 0);
    CHECK(calls(*sharded.root, Kind::all_gather) == tree[Kind::all_gather].calls - 2);
    sharded.root->reset_communication_stats();
    CHECK(sharded.root->communication_stats().total().calls == 0);
  });
}

TEST_CASE("FSDPModule::unsharded_memory: zero before the first forward; what each reshard_after_forward keeps "
          "between forward and backward") {
  dist::run_local(4, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {4});
    for (const ReshardAfterForward mode :
         {ReshardAfterForward::always(), ReshardAfterForward::never(), ReshardAfterForward::to_group_of(2)}) {
      CAPTURE(mode.to_string());
      ShardedGPT sharded = build_sharded_gpt(mesh, {.reshard_after_forward = mode});
      CHECK(sharded.root->unsharded_memory().peak_bytes == 0);
      CHECK(sharded.blocks[0].unsharded_memory(/*recurse=*/false).allocation_count == 0);

      const Tensor idx = rank_tokens(group->rank());
      const Tensor loss = sharded.model->loss(idx, idx);
      // The root (never resharded after forward) holds its parameters whole; a
      // block holds nothing, all of its parameters, or its rows of a 2-way split.
      const auto block_params = group_parameters(sharded.model->block(0));
      const int64_t kept = mode.is_always() ? 0 : mode.is_never() ? parameter_bytes(block_params)
                                                                  : slot_numel(block_params, 2) * 4;
      CHECK(sharded.blocks[0].unsharded_memory(/*recurse=*/false).live_bytes == kept);
      const int64_t root_own = sharded.root->unsharded_memory(/*recurse=*/false).live_bytes;
      CHECK(root_own == parameter_bytes(group_parameters(*sharded.model)));
      CHECK(sharded.root->unsharded_memory().live_bytes == root_own + kAwkward.n_layer * kept);
      autograd::backward(loss);

      CHECK(sharded.root->unsharded_memory().live_bytes == 0);
      const MemoryStats block = sharded.blocks[0].unsharded_memory(/*recurse=*/false);
      CHECK(block.peak_bytes >= parameter_bytes(block_params));
      CHECK(block.allocation_count > 0);
      sharded.blocks[0].reset_unsharded_memory_peak(/*recurse=*/false);
      CHECK(sharded.blocks[0].unsharded_memory(/*recurse=*/false).peak_bytes == 0);
      CHECK(sharded.blocks[1].unsharded_memory(/*recurse=*/false).peak_bytes > 0);  // its own only
      CHECK(sharded.root->unsharded_memory().peak_bytes > 0);
      sharded.root->reset_unsharded_memory_peak();
      CHECK(sharded.root->unsharded_memory().peak_bytes == 0);
      CHECK(sharded.blocks[1].unsharded_memory(/*recurse=*/false).peak_bytes == 0);
    }
  });
}
