// The all-gather extension (nn/all_gather_extension.h) under fully_shard:
// payloads of mixed dtypes gathered in one byte slot and handed back per
// parameter, bitwise what a single rank computes from the same shards; the
// bytes sent; a frozen parameter unsharded into another shape and dtype from
// bytes that never pass through a float; payloads that differ between ranks
// refused on every rank before anything is issued; the refusals at
// fully_shard.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "dist/comm_stats.h"
#include "dist/init.h"
#include "fsdp/float8_scales.h"
#include "fsdp/fsdp_param.h"
#include "fsdp/fully_shard.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "tensor/ops.h"

using namespace tessera;
using fsdp::fully_shard;

namespace {

// Per-rank int8-style quantisation of a shard: codes (u8, zero point 128) and
// the rank's scale (f32), so the payloads differ in dtype. Each rank's rows
// dequantise with that rank's own scale.
class RankwiseBytes : public nn::AllGatherExtension {
 public:
  explicit RankwiseBytes(bool one_byte_more = false) : one_byte_more_(one_byte_more) {}
  std::string name() const override { return "rankwise bytes"; }

  nn::AllGatherPayloads pre_all_gather(const Tensor& padded_shard, DType) override {
    const std::vector<float> values = ops::to(padded_shard, DType::f32).to_vector<float>();
    float amax = 0.0f;
    for (const float value : values) amax = std::max(amax, std::fabs(value));
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    std::vector<uint8_t> codes;
    for (const float value : values) codes.push_back(code_of(value, scale));
    if (one_byte_more_) codes.push_back(0);  // a broken extension
    return {{ops::from_vector(codes, {static_cast<int64_t>(codes.size())}),
             ops::from_vector(std::vector<float>{scale}, {1})},
            nullptr};
  }

  void post_all_gather(const std::vector<Tensor>& gathered, const std::shared_ptr<const void>&,
                       const Tensor& unsharded) override {
    const std::vector<uint8_t> codes = gathered[0].to_vector<uint8_t>();
    const std::vector<float> scales = gathered[1].to_vector<float>();
    const auto world = static_cast<int64_t>(scales.size());
    const int64_t per_rank = static_cast<int64_t>(codes.size()) / world;
    const int64_t row_numel = unsharded.numel() / unsharded.size(0);
    std::vector<float> values;
    for (int64_t rank = 0; rank < world; ++rank) {
      const dist::ShardExtent extent = dist::shard_extent(unsharded.size(0), static_cast<int>(world),
                                                          static_cast<int>(rank));
      for (int64_t i = 0; i < extent.length * row_numel; ++i) {
        values.push_back(value_of(codes[static_cast<size_t>(rank * per_rank + i)], scales[static_cast<size_t>(rank)]));
      }
    }
    Tensor target = unsharded;
    ops::copy_(target, ops::from_vector(values, unsharded.sizes()));
  }

  static uint8_t code_of(float value, float scale) {
    return static_cast<uint8_t>(std::clamp(std::nearbyint(value / scale), -127.0f, 127.0f) + 128.0f);
  }
  static float value_of(uint8_t code, float scale) { return (static_cast<float>(code) - 128.0f) * scale; }

 private:
  bool one_byte_more_;
};

// A frozen u8 parameter [rows, B] unsharded as f32 [rows, 2B]: each byte's
// low and high nibble (what NF4's packed codes look like to FSDP).
class Nibbles : public nn::AllGatherExtension {
 public:
  std::string name() const override { return "nibbles"; }
  Shape unsharded_shape(const Shape& global_shape) const override { return {global_shape[0], 2 * global_shape[1]}; }
  DType unsharded_dtype(DType) const override { return DType::f32; }
  nn::AllGatherPayloads pre_all_gather(const Tensor& padded_shard, DType) override { return {{padded_shard}, nullptr}; }
  void post_all_gather(const std::vector<Tensor>& gathered, const std::shared_ptr<const void>&,
                       const Tensor& unsharded) override {
    const std::vector<uint8_t> bytes = gathered[0].to_vector<uint8_t>();
    std::vector<float> values;
    for (int64_t i = 0; i < unsharded.numel() / 2; ++i) {
      const uint8_t byte = bytes[static_cast<size_t>(i)];
      values.push_back(static_cast<float>(byte & 0xf));
      values.push_back(static_cast<float>(byte >> 4));
    }
    Tensor target = unsharded;
    ops::copy_(target, ops::from_vector(values, unsharded.sizes()));
  }
};

// x [B, 4] -> linear(w1 [5, 4]) -> linear(w2 [3, 5]) -> [B, 3].
class TwoProducts : public nn::Module {
 public:
  TwoProducts() : nn::Module("TwoProducts") {
    register_parameter("w1", std::make_shared<nn::Parameter>(ops::randn({5, 4})));
    register_parameter("w2", std::make_shared<nn::Parameter>(ops::randn({3, 5})));
  }
  Tensor forward(const Tensor& x) override {
    return tessera::linear(tessera::linear(x, parameter("w1")->tensor(), Tensor()), parameter("w2")->tensor(),
                           Tensor());
  }
};

// x [B, 6] times the nibbles of `packed` [7, 3] as a [7, 6] matrix.
class PackedProduct : public nn::Module {
 public:
  PackedProduct() : nn::Module("PackedProduct") {
    std::vector<uint8_t> bytes;
    for (int i = 0; i < 21; ++i) bytes.push_back(static_cast<uint8_t>(i * 37 + 11));
    register_parameter("packed", std::make_shared<nn::Parameter>(ops::from_vector(bytes, {7, 3}), false));
  }
  Tensor forward(const Tensor& x) override {
    return tessera::linear(x, parameter("packed")->tensor(), Tensor());
  }
};

// w1's values as RankwiseBytes gives them back on `world` ranks.
std::vector<float> rankwise_expected(const std::vector<float>& w1, int64_t world) {
  std::vector<float> expected;
  const int64_t rows = 5, columns = 4;
  for (int64_t rank = 0; rank < world; ++rank) {
    const dist::ShardExtent extent = dist::shard_extent(rows, static_cast<int>(world), static_cast<int>(rank));
    float amax = 0.0f;
    for (int64_t i = extent.offset * columns; i < (extent.offset + extent.length) * columns; ++i) {
      amax = std::max(amax, std::fabs(w1[static_cast<size_t>(i)]));
    }
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    for (int64_t i = extent.offset * columns; i < (extent.offset + extent.length) * columns; ++i) {
      expected.push_back(RankwiseBytes::value_of(RankwiseBytes::code_of(w1[static_cast<size_t>(i)], scale), scale));
    }
  }
  return expected;
}

}  // namespace

TEST_SUITE("fsdp all-gather extension") {

TEST_CASE("mixed payloads (u8 codes, f32 scale) gather in one byte slot: the values and bytes a single rank predicts") {
  for (int world : {1, 2, 3, 4}) {
    dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
      CAPTURE(world);
      manual_seed(3);
      TwoProducts model;
      const std::vector<float> w1 = model.parameter("w1")->tensor().to_vector<float>();
      const std::vector<float> w2 = model.parameter("w2")->tensor().to_vector<float>();
      model.parameter("w1")->set_all_gather_extension(std::make_shared<RankwiseBytes>());
      fsdp::FSDPModule sharded = fully_shard(model, {.mesh = dist::DeviceMesh(group, kCPU, {world})});
      const Tensor x = ops::randn({2, 4}, PhiloxKey{9, 0});
      {
        const autograd::NoGradGuard no_grad;  // the root's lazy init; then resharded
        model(x);
      }
      sharded.reset_communication_stats();
      sharded.unshard();
      CHECK(model.parameter("w1")->tensor().to_vector<float>() == rankwise_expected(w1, world));
      CHECK(model.parameter("w2")->tensor().to_vector<float>() == w2);
      // A slot: w1's codes (padded rows x 4 bytes) and scale (4 bytes), then
      // w2's padded rows x 5 floats, each at a 16-byte boundary.
      const auto aligned = [](int64_t bytes) { return (bytes + 15) / 16 * 16; };
      const int64_t slot = aligned(fsdp::padded_shard_rows(5, world) * 4) + aligned(4) +
                           aligned(fsdp::padded_shard_rows(3, world) * 5 * 4);
      const dist::CommStats stats = sharded.communication_stats();
      CHECK(stats[dist::CollectiveKind::all_gather].calls == 1);
      CHECK(stats[dist::CollectiveKind::all_gather].bytes_sent ==
            dist::collective_volume(dist::CollectiveKind::all_gather, slot, world, false).sent);
      sharded.reshard();
      // Training through it: w1's gradient reaches its shard (the extension
      // keeps its shape and dtype), w2's as always.
      autograd::backward(tessera::sum(model(x)));
      CHECK(model.parameter("w1")->tensor().grad().defined());
      CHECK(model.parameter("w2")->tensor().grad().defined());
    });
  }
}

TEST_CASE("a frozen u8 parameter unsharded as f32 of another shape: its bytes never pass through a float") {
  for (int world : {1, 3}) {
    dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
      PackedProduct model;
      const std::vector<uint8_t> bytes = model.parameter("packed")->tensor().to_vector<uint8_t>();
      model.parameter("packed")->set_all_gather_extension(std::make_shared<Nibbles>());
      fsdp::FSDPModule sharded = fully_shard(model, {.mesh = dist::DeviceMesh(group, kCPU, {world})});
      const Tensor x = ops::randn({2, 6}, PhiloxKey{4, 0});
      {
        const autograd::NoGradGuard no_grad;
        model(x);
      }
      sharded.unshard();
      const Tensor unsharded = model.parameter("packed")->tensor();
      CHECK(unsharded.sizes() == Shape{7, 6});
      CHECK(unsharded.dtype() == DType::f32);
      std::vector<float> expected;
      for (const uint8_t byte : bytes) {
        expected.push_back(static_cast<float>(byte & 0xf));
        expected.push_back(static_cast<float>(byte >> 4));
      }
      CHECK(unsharded.to_vector<float>() == expected);
      sharded.reshard();
      CHECK(model.parameter("packed")->tensor().dtype() == DType::u8);
      // A step: no gradient for the frozen bytes, none sent for them.
      sharded.reset_communication_stats();
      const Tensor loss = tessera::sum(model(x));
      CHECK(std::isfinite(loss.item()));
      CHECK(sharded.communication_stats()[dist::CollectiveKind::reduce_scatter].calls == 0);
    });
  }
}

TEST_CASE("payloads that differ between ranks: every rank refuses, naming the parameter and the ranks, no hang") {
  dist::run_local(3, [](const dist::ProcessGroupPtr& group) {
    manual_seed(3);
    TwoProducts model;
    model.parameter("w1")->set_all_gather_extension(std::make_shared<RankwiseBytes>(group->rank() == 1));
    fsdp::FSDPModule sharded = fully_shard(model, {.mesh = dist::DeviceMesh(group, kCPU, {3})});
    sharded.reset_communication_stats();
    const Tensor x = ops::randn({2, 4}, PhiloxKey{9, 0});
    CHECK_THROWS_WITH_AS(model(x),
                         doctest::Contains("the all-gather payloads of 'w1' (rankwise bytes) differ between ranks"),
                         Error);
    CHECK_THROWS_WITH_AS(sharded.unshard(),
                         doctest::Contains("ranks 0, 2 gave u8 [8], f32 [1]; rank 1 gave u8 [9], f32 [1]"), Error);
    CHECK(sharded.communication_stats()[dist::CollectiveKind::all_gather].calls == 0);
    group->barrier();
  });
}

TEST_CASE("refused at fully_shard: a trainable parameter unsharded into another shape; a group-of-N reshard") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    {
      manual_seed(5);
      TwoProducts model;
      auto nibbles_of_floats = std::make_shared<Nibbles>();
      model.parameter("w2")->set_all_gather_extension(nibbles_of_floats);
      CHECK_THROWS_WITH_AS(fully_shard(model, {.mesh = mesh}),
                           doctest::Contains("parameter 'w2' requires grad, but its all-gather extension (nibbles) "
                                             "unshards it as f32 [3, 10]"),
                           Error);
    }
  });
  dist::run_local(4, [](const dist::ProcessGroupPtr& group) {
    manual_seed(5);
    TwoProducts model;
    model.parameter("w1")->set_all_gather_extension(std::make_shared<RankwiseBytes>());
    CHECK_THROWS_WITH_AS(fully_shard(model, {.mesh = dist::DeviceMesh(group, kCPU, {4}),
                                             .reshard_after_forward = fsdp::ReshardAfterForward::to_group_of(2)}),
                         doctest::Contains("which all-gather extensions do not define"), Error);
  });
}

TEST_CASE("NF4 weights: quantise-then-shard is shard-then-quantise, gathered bitwise the whole, 0.52 B a weight") {
  // 13 rows of 4096: uneven shards, and on 8 ranks an empty one.
  const Tensor dense = ops::mul(ops::randn({13, 4096}, PhiloxKey{21, 0}), 0.02);
  const Tensor whole_packed = ops::nf4_quantize(dense);
  const Tensor whole_dequantised = ops::nf4_dequantize(whole_packed, 4096, DType::f32);
  for (int world : {1, 2, 3, 8}) {
    dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
      CAPTURE(world);
      nn::Linear linear(4096, 13, {.bias = false});
      Tensor weight = linear.weight().tensor();
      ops::copy_(weight, dense);
      linear.quantize_nf4();
      fsdp::FSDPModule sharded = fully_shard(linear, {.mesh = dist::DeviceMesh(group, kCPU, {world})});
      // This rank's packed rows are the whole packed weight's rows ...
      const dist::ShardExtent rows = dist::shard_extent(13, world, group->rank());
      const Tensor shard = linear.weight().tensor();
      CHECK(shard.dtype() == DType::u8);
      CHECK(shard.to_vector<int64_t>() == ops::narrow(whole_packed, 0, rows.offset, rows.length).to_vector<int64_t>());
      // ... and packing this rank's dense rows (what loading a checkpoint does) writes the same bytes.
      linear.load_dense_weight(ops::narrow(dense, 0, rows.offset, rows.length));
      CHECK(linear.weight().tensor().to_vector<int64_t>() == shard.to_vector<int64_t>());
      {
        const autograd::NoGradGuard no_grad;
        linear(ops::zeros({1, 4096}));
      }
      sharded.reset_communication_stats();
      sharded.unshard();
      CHECK(linear.weight().tensor().dtype() == DType::f32);
      CHECK(linear.weight().tensor().to_vector<float>() == whole_dequantised.to_vector<float>());
      // The packed rows travel as they are: ceil(13 / world) rows of 2120 bytes per rank.
      const int64_t slot = fsdp::padded_shard_rows(13, world) * ops::nf4_row_bytes(4096);
      const dist::CommStats stats = sharded.communication_stats();
      CHECK(stats[dist::CollectiveKind::all_gather].calls == 1);
      CHECK(stats[dist::CollectiveKind::all_gather].bytes_sent ==
            dist::collective_volume(dist::CollectiveKind::all_gather, slot, world, false).sent);
      const double bytes_per_weight =
          static_cast<double>(slot * world) / static_cast<double>(fsdp::padded_shard_rows(13, world) * world * 4096);
      CHECK(bytes_per_weight == doctest::Approx(2120.0 / 4096.0));  // 0.518, against 2 for bf16
      sharded.reshard();
      CHECK(linear.weight().tensor().dtype() == DType::u8);
    });
  }
}

TEST_CASE("float8 weights gather half the bytes of bf16, as codes at the scale of every rank's shard") {
  const Tensor dense = ops::mul(ops::randn({13, 64}, PhiloxKey{22, 0}), 0.1);
  for (int world : {2, 3}) {
    std::vector<int64_t> bytes_sent(2, 0);
    for (const bool float8 : {false, true}) {
      dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
        CAPTURE(world);
        nn::Linear linear(64, 13, {.bias = false});
        Tensor weight = linear.weight().tensor();
        ops::copy_(weight, dense);
        if (float8) linear.use_float8();
        fsdp::FSDPModule sharded = fully_shard(
            linear, {.mesh = dist::DeviceMesh(group, kCPU, {world}), .mp_policy = {.param_dtype = DType::bf16}});
        if (float8) {
          CHECK(fsdp::precompute_float8_scales(linear) == 1);
          // The whole weight's scale on every rank, from one all-reduce.
          CHECK(linear.weight().all_gather_extension() != nullptr);
        }
        {
          const autograd::NoGradGuard no_grad;
          linear(ops::zeros({1, 64}, {.dtype = DType::bf16}));
        }
        sharded.reset_communication_stats();
        sharded.unshard();
        const dist::CommStats stats = sharded.communication_stats();
        if (group->rank() == 0) bytes_sent[float8 ? 1 : 0] = stats[dist::CollectiveKind::all_gather].bytes_sent;
        if (float8) {
          // The unsharded weight: the whole weight's codes at its own scale, unscaled.
          const Tensor scale = ops::float8_scale(dense, DType::f8e4m3);
          const Tensor expected = ops::to(ops::div(ops::to(ops::to_float8(dense, scale, DType::f8e4m3), DType::f32),
                                                   scale), DType::bf16);
          CHECK(linear.weight().tensor().to_vector<float>() == expected.to_vector<float>());
        }
        sharded.reshard();
      });
    }
    CAPTURE(world);
    CHECK(bytes_sent[0] == dist::collective_volume(dist::CollectiveKind::all_gather,
                                                   fsdp::padded_shard_rows(13, world) * 64 * 2, world, false).sent);
    CHECK(2 * bytes_sent[1] == bytes_sent[0]);
  }
}

}  // TEST_SUITE
