// LoRA and QLoRA fine-tuning of a Hugging Face Llama (train/lora_fine_tuning.h),
// on 1 and 3 FSDP ranks (3: uneven row shards): what is frozen and what
// trains; the golden weights load through dense stand-ins that each rank packs
// into exactly the rows of the whole weight packed; and the export holds the
// merged weights, dequantised base + (alpha / r) B A, under the base's names,
// the other weights as loaded and no adapter, read back by the Hugging Face
// loader into a dense model.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <string>

#include "checkpoint/state_dict.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "nn/init.h"
#include "tensor/ops.h"
#include "tests/checkpoint/temp_dir.h"
#include "train/huggingface/hf_checkpoint.h"
#include "train/lora_fine_tuning.h"
#include "train/model_loader.h"

namespace fs = std::filesystem;
using tessera::Tensor;
namespace ops = tessera::ops;

namespace {

const fs::path kLoRAGolden = TESSERA_HF_GOLDEN_DIR;

// The golden Llama's weights, whole, as a dense model holds them.
std::map<std::string, Tensor> golden_weights(const std::string& dir) {
  const tessera::train::HfModelInfo info = tessera::train::read_hf_model_info(dir);
  auto dense = tessera::train::build_model(info.config, tessera::kMeta);
  dense->to_empty(tessera::kCPU);
  tessera::train::load_hf_weights(dir, info, tessera::checkpoint::model_state(*dense, ""));
  std::map<std::string, Tensor> weights;
  for (const auto& [name, parameter] : dense->named_parameters()) weights[name] = parameter->tensor().detach();
  return weights;
}

Tensor whole_tensor(const tessera::nn::Parameter& parameter) {
  return parameter.is_sharded() ? parameter.dtensor().full_tensor() : parameter.tensor().detach();
}

}  // namespace

TEST_CASE("QLoRA on a Hugging Face Llama, 1 and 3 ranks: frozen base packed by rows, merged export read back dense") {
  const std::string dir = (kLoRAGolden / "llama").string();
  const std::map<std::string, Tensor> golden = golden_weights(dir);
  tessera::checkpoint::testing::TempDir temp;
  for (const int world : {1, 3}) {
    CAPTURE(world);
    const std::string export_dir = temp / ("merged-" + std::to_string(world));
    std::map<std::string, Tensor> expected_merged;  // rank 0's, from whole tensors
    std::atomic<int> failures{0};
    tessera::dist::run_local(world, [&](const tessera::dist::ProcessGroupPtr& group) {
      tessera::train::TrainConfig config;
      config.lora_rank = 2;
      config.lora_alpha = 6.0;
      config.nf4 = true;
      const tessera::train::HfModelInfo info = tessera::train::read_hf_model_info(dir);
      auto model = tessera::train::build_model(info.config, tessera::kMeta);
      tessera::train::prepare_fine_tuning(*model, config);
      const tessera::dist::DeviceMesh mesh(group, tessera::kCPU, {world});
      for (auto& block : model->blocks()) tessera::fsdp::fully_shard(*block, {.mesh = mesh});
      tessera::fsdp::fully_shard(*model, {.mesh = mesh});
      model->to_empty(tessera::kCPU);
      model->reset_parameters(config.seed);

      // Only the adapters train.
      int trainable = 0;
      for (const auto& [name, parameter] : model->named_parameters()) {
        const bool adapter = name.find(".lora_") != std::string::npos;
        if (parameter->requires_grad() != adapter) ++failures;
        trainable += parameter->requires_grad() ? 1 : 0;
      }
      if (trainable != 2 * 7 * 2) ++failures;

      tessera::train::PretrainedWeightsTarget target(*model);
      tessera::train::load_hf_weights(dir, info, target.state());
      target.quantize_loaded();
      const std::vector<tessera::train::NamedLinear> projections = tessera::train::block_linears(*model);
      if (projections.size() != 14) ++failures;
      for (const tessera::train::NamedLinear& projection : projections) {
        // B drawn (it starts at zero), the same values at any world size.
        tessera::nn::init::normal_(projection.linear->lora_b(), tessera::PhiloxKey{5, 0}, 0.0, 0.3);
        // This rank's packed rows are the whole golden weight's, packed.
        const Tensor packed = whole_tensor(projection.linear->weight());
        const Tensor whole = ops::nf4_quantize(golden.at(projection.name + ".weight"));
        if (packed.to_vector<int64_t>() != whole.to_vector<int64_t>()) ++failures;
        const Tensor a = whole_tensor(projection.linear->lora_a()), b = whole_tensor(projection.linear->lora_b());
        if (group->rank() == 0) {
          expected_merged[projection.name + ".weight"] =
              ops::add(ops::nf4_dequantize(whole, projection.linear->in_features(), tessera::DType::f32),
                       ops::mul(ops::matmul(b, a), 3.0));
        }
      }
      tessera::train::export_hf(export_dir, info.config, tessera::train::merged_model_state(*model),
                                {.group = group, .sync = false});
    });
    CHECK(failures == 0);

    // The export, read by the Hugging Face loader into a dense Llama.
    const std::map<std::string, Tensor> exported = golden_weights(export_dir);
    CHECK(exported.size() == golden.size());
    int merged = 0;
    for (const auto& [name, values] : exported) {
      CAPTURE(name);
      const auto found = expected_merged.find(name);
      if (found == expected_merged.end()) {
        CHECK(values.to_vector<float>() == golden.at(name).to_vector<float>());  // loaded and frozen: as it was
        continue;
      }
      ++merged;
      const std::vector<float> actual = values.to_vector<float>(), expected = found->second.to_vector<float>();
      REQUIRE(actual.size() == expected.size());
      for (size_t i = 0; i < actual.size(); ++i) CHECK(actual[i] == doctest::Approx(expected[i]).epsilon(1e-6));
      CHECK(values.to_vector<float>() != golden.at(name).to_vector<float>());  // quantised, and B is not zero
    }
    CHECK(merged == 14);
  }
}
