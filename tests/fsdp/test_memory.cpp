// FSDP's memory promises, read from the allocator statistics of each rank:
// persistent state falls as 1/N, unsharded parameters never exceed the
// current group plus the prefetched one, and a meta-built GPT-2 124M is
// sharded and initialised without any rank holding more than its shards plus
// one group. Also: shard-aware init is bitwise the unsharded init.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "nn/linear.h"
#include "nn/models/gpt.h"
#include "nn/optim/adamw.h"
#include "tensor/ops.h"
#include "tests/fsdp/layer_stack.h"
#include "tests/fsdp/sharded_gpt.h"

using namespace tessera;
using namespace tessera::fsdp;
using namespace tessera::fsdp::testing;

namespace {

// The FSDP2 flow on a meta-built GPT: blocks, then the root; allocate; init.
void shard_and_init(nn::GPT& model, const dist::DeviceMesh& mesh, uint64_t seed) {
  for (const auto& block : model.blocks()) fully_shard(*block, {.mesh = mesh});
  fully_shard(model, {.mesh = mesh});
  model.to_empty(kCPU);
  model.reset_parameters(seed);
}

int64_t row_numel(const Shape& shape) {
  int64_t numel = 1;
  for (size_t d = 1; d < shape.size(); ++d) numel *= shape[d];
  return numel;
}

}  // namespace

TEST_CASE("fsdp memory: persistent bytes per rank (shards, grads, AdamW state) are 1/N of unsharded plus padding") {
  const nn::GPTConfig config{.vocab_size = 97, .block_size = 16, .n_layer = 2, .n_head = 3, .n_embd = 72};
  int64_t unsharded_persistent = 0;
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    std::vector<int64_t> persistent(static_cast<size_t>(world));
    std::vector<int64_t> allowed(static_cast<size_t>(world));
    dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
      const int64_t baseline = dist::rank_memory_stats().live_bytes;
      {
        nn::GPT model(config, kMeta);
        shard_and_init(model, dist::DeviceMesh(group, kCPU, {world}), 3);
        optim::AdamW optimizer(model.named_parameters());
        const Tensor idx = ops::from_vector(std::vector<int64_t>(2 * 16, 5), {2, 16});
        autograd::backward(model.loss(idx, idx));
        optimizer.step();

        const int64_t live = dist::rank_memory_stats().live_bytes - baseline;
        persistent[static_cast<size_t>(group->rank())] = live;
        // param + grad + exp_avg + exp_avg_sq in f32 per element, an 8-byte
        // step counter per parameter; padding is at most one row per parameter.
        int64_t numel = 0, padding = 0, count = 0;
        for (const auto& param : model.parameters()) {
          numel += shape_numel(param->global_shape());
          padding += row_numel(param->global_shape());
          ++count;
        }
        const int64_t unsharded = 16 * numel + 8 * count;
        if (world == 1) unsharded_persistent = unsharded;
        allowed[static_cast<size_t>(group->rank())] = unsharded / world + 16 * padding + 8 * count;
      }
    });
    for (int rank = 0; rank < world; ++rank) {
      INFO("rank " << rank << ": " << persistent[static_cast<size_t>(rank)] << " bytes, allowed "
                   << allowed[static_cast<size_t>(rank)]);
      CHECK(persistent[static_cast<size_t>(rank)] <= allowed[static_cast<size_t>(rank)]);
      CHECK(persistent[static_cast<size_t>(rank)] >= unsharded_persistent / world / 2);  // it is really there
    }
  }
}

// At any moment a rank holds at most two groups' worth of unsharded memory:
// the current group's unsharded tensors plus the prefetched group's
// all-gather buffer, or, during copy-out, the current group's buffer plus its
// unsharded tensors. The second makes the bound twice the largest group
// (equal to the two largest when groups are alike, as transformer blocks are).
TEST_CASE("fsdp memory: unsharded parameters never exceed two groups (current + prefetched)") {
  const std::vector<int64_t> widths{24, 96, 40, 120, 32, 64};
  for (int world : {2, 3}) {
    CAPTURE(world);
    dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
      LayerStack model(widths);
      const dist::DeviceMesh mesh(group, kCPU, {world});
      std::vector<FSDPModule> layers;
      for (const auto& layer : model.layers()) layers.push_back(fully_shard(*layer, {.mesh = mesh}));
      FSDPModule root = fully_shard(model, {.mesh = mesh});
      model.to_empty(kCPU);
      model.reset_parameters(11);
      // One all-gather output per layer: every rank's slot, f32.
      std::vector<int64_t> group_bytes;
      for (const auto& layer : model.layers()) group_bytes.push_back(world * slot_numel(layer->parameters(), world) * 4);
      std::sort(group_bytes.rbegin(), group_bytes.rend());
      CHECK(root.unsharded_memory().peak_bytes == 0);  // nothing is set up before the first forward

      const Tensor x = ops::randn({4, widths.front()}, PhiloxKey{1, 2});
      for (int iteration = 0; iteration < 3; ++iteration) {  // the first records the prefetch order
        autograd::backward(model(x));
        const MemoryStats unsharded = root.unsharded_memory();
        INFO("iteration " << iteration << ": peak " << unsharded.peak_bytes << " bytes; largest group "
                          << group_bytes[0]);
        CHECK(unsharded.live_bytes == 0);  // everything resharded after backward
        CHECK(unsharded.peak_bytes <= 2 * group_bytes[0]);
        CHECK(unsharded.peak_bytes >= group_bytes[0]);  // the largest group was gathered
        // Each layer alone: its buffer and its unsharded parameters (twice its
        // bytes, less the padding) at the most; the tree's peak is at least
        // the largest of them and at most their sum.
        int64_t sum_of_peaks = 0, largest_peak = 0;
        for (size_t index = 0; index < layers.size(); ++index) {
          const MemoryStats own = layers[index].unsharded_memory(/*recurse=*/false);
          const int64_t bytes = world * slot_numel(model.layers()[static_cast<int64_t>(index)].parameters(), world) * 4;
          CAPTURE(index);
          CHECK(own.live_bytes == 0);
          CHECK(own.peak_bytes >= bytes);
          CHECK(own.peak_bytes <= 2 * bytes);
          CHECK(layers[index].unsharded_memory(/*recurse=*/true).peak_bytes == own.peak_bytes);  // nothing below
          sum_of_peaks += own.peak_bytes;
          largest_peak = std::max(largest_peak, own.peak_bytes);
        }
        CHECK(unsharded.peak_bytes >= largest_peak);
        CHECK(unsharded.peak_bytes <= sum_of_peaks);
        CHECK(root.unsharded_memory(/*recurse=*/false).peak_bytes == 0);  // the root owns no parameters
        root.reset_unsharded_memory_peak();
        CHECK(root.unsharded_memory().peak_bytes == 0);
        CHECK(layers.front().unsharded_memory(/*recurse=*/false).peak_bytes == 0);
      }
    });
  }
}

TEST_CASE("fsdp memory: a meta-built GPT-2 124M on 8 ranks never holds more than its shards plus one group") {
  const nn::GPTConfig config = nn::GPTConfig::preset("gpt2-124m");
  dist::run_local(8, [&](const dist::ProcessGroupPtr& group) {
    dist::reset_rank_peak_memory();
    const int64_t baseline = dist::rank_memory_stats().live_bytes;
    nn::GPT model(config, kMeta);
    CHECK(dist::rank_memory_stats().live_bytes == baseline);  // meta: no bytes
    const dist::DeviceMesh mesh(group, kCPU, {8});
    for (const auto& block : model.blocks()) fully_shard(*block, {.mesh = mesh});
    fully_shard(model, {.mesh = mesh});
    model.to_empty(kCPU);
    model.reset_parameters(1);

    int64_t shard_bytes = 0;
    for (const auto& param : model.parameters()) {
      shard_bytes += param->sharding()->padded_rows * row_numel(param->global_shape()) * 4;
    }
    int64_t largest_group = 8 * slot_numel(group_parameters(model), 8) * 4;
    for (const auto& block : model.blocks()) largest_group = std::max(largest_group, 8 * slot_numel(block->parameters(), 8) * 4);
    const MemoryStats stats = dist::rank_memory_stats();
    INFO("rank " << group->rank() << ": peak " << stats.peak_bytes - baseline << ", shards " << shard_bytes
                 << ", largest group " << largest_group);
    CHECK(stats.live_bytes - baseline == shard_bytes);
    CHECK(stats.peak_bytes - baseline <= shard_bytes + largest_group);
    CHECK(shard_bytes * 8 < config.num_parameters() * 4 + 8 * 4 * 768 * 40);  // 1/8 of the model plus padding
  });
}

TEST_CASE("fsdp init: shards put together are bitwise the unsharded init, for every world size") {
  const nn::GPTConfig config{.vocab_size = 97, .block_size = 16, .n_layer = 2, .n_head = 3, .n_embd = 72};
  nn::GPT reference(config, kMeta);
  reference.to_empty(kCPU);
  reference.reset_parameters(42);
  for (int world = 1; world <= 8; ++world) {
    CAPTURE(world);
    std::atomic<int> mismatches{0};
    dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
      nn::GPT model(config, kMeta);
      shard_and_init(model, dist::DeviceMesh(group, kCPU, {world}), 42);
      const auto expected = reference.named_parameters();
      const auto actual = model.named_parameters();
      for (size_t i = 0; i < actual.size(); ++i) {
        if (actual[i].second->dtensor().full_tensor().to_vector<float>() !=
            expected[i].second->tensor().to_vector<float>()) {
          ++mismatches;
        }
      }
    });
    CHECK(mismatches == 0);
  }
}
