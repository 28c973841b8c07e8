// Loading a model of either family from a checkpoint directory or an exported .safetensors file.
#include "train/model_loader.h"

#include <charconv>
#include <filesystem>
#include <map>

#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint/state_dict.h"
#include "tensor/error.h"
#include "train/checkpoint_manager.h"
#include "train/config_json.h"
#include "train/huggingface/hf_checkpoint.h"

namespace tessera::train {

namespace fs = std::filesystem;
namespace checkpoint = tessera::checkpoint;

namespace {

// training_state.config.model, checked step by step so a checkpoint written
// without a config (by another program) gets a message saying so.
const nlohmann::json& model_config_json(const nlohmann::json& training_state, const std::string& source) {
  const auto config = training_state.find("config");
  TESSERA_CHECK(config != training_state.end() && config->is_object(),
                "{}: training_state has no \"config\" object: this checkpoint does not record its model (was it "
                "saved by gpt's train?)",
                source);
  const auto model = config->find("model");
  TESSERA_CHECK(model != config->end(), "{}: training_state.config has no \"model\" entry", source);
  return *model;
}

std::optional<int64_t> step_from_training_state(const nlohmann::json& training_state, const std::string& source) {
  const auto step = training_state.find("step");
  if (step == training_state.end()) return std::nullopt;
  TESSERA_CHECK(step->is_number_integer() && step->get<int64_t>() >= 0,
                "{}: training_state.step must be a non-negative integer, got {}", source, step->dump());
  return step->get<int64_t>();
}

// __metadata__ "tessera.step", when the exporter wrote it.
std::optional<int64_t> step_from_metadata(const std::map<std::string, std::string>& metadata,
                                          const std::string& source) {
  const auto step = metadata.find(kStepMetadataKey);
  if (step == metadata.end()) return std::nullopt;
  int64_t value = 0;
  const std::string& text = step->second;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  TESSERA_CHECK(error == std::errc() && end == text.data() + text.size() && value >= 0,
                "{}: __metadata__ {} must be a non-negative integer, got '{}'", source, kStepMetadataKey, text);
  return value;
}

// The model the file's config describes, built only once the file is known
// to hold every parameter of it at its shape: checked on meta (nothing
// allocated), so that a config edited or crafted to describe a far larger
// model than the weights is refused instead of allocated. `stored` maps the
// file's names (with `prefix`) to shapes; `holder` names the file in messages.
std::unique_ptr<tessera::nn::CausalLM> build_eval_model(const ModelConfig& config,
                                                        const std::map<std::string, tessera::Shape>& stored,
                                                        const std::string& prefix, const std::string& holder) {
  std::vector<std::string> missing, reshaped;
  for (const auto& [name, parameter] : build_model(config, tessera::kMeta)->named_parameters()) {
    const auto found = stored.find(prefix + name);
    if (found == stored.end()) {
      missing.push_back(prefix + name);
    } else if (found->second != parameter->tensor().sizes()) {
      reshaped.push_back(fmt::format("{}: shape {} in the file, {} in its model config", prefix + name, found->second,
                                     parameter->tensor().sizes()));
    }
  }
  TESSERA_CHECK(missing.empty(), "{} lacks parameters of the model its config describes: {}", holder, missing);
  TESSERA_CHECK(reshaped.empty(), "{} does not hold the model its config describes: {}", holder,
                fmt::join(reshaped, "; "));
  std::unique_ptr<tessera::nn::CausalLM> model = build_model(config, tessera::kCPU);
  model->eval();
  return model;
}

}  // namespace

std::string resolve_checkpoint_dir(const std::string& path) {
  std::error_code error;
  TESSERA_CHECK(fs::is_directory(path, error), "checkpoint path {}: not a directory", path);
  if (fs::exists(fs::path(path) / checkpoint::kMetadataFile, error)) return path;
  const std::optional<CheckpointEntry> latest = latest_checkpoint(path);
  TESSERA_CHECK(latest.has_value(),
                "checkpoint path {}: neither a checkpoint (no {}) nor a directory holding a complete step-N checkpoint",
                path, checkpoint::kMetadataFile);
  return latest->path;
}

LoadedModel load_model_from_checkpoint(const std::string& path) {
  const std::string dir = resolve_checkpoint_dir(path);
  const std::string metadata_path = (fs::path(dir) / checkpoint::kMetadataFile).string();
  const checkpoint::CheckpointMetadata metadata = checkpoint::read_metadata(dir);
  const std::string renamed = step_name_disagreement(dir, metadata.step);
  TESSERA_CHECK(renamed.empty(), "{}: {}: not the checkpoint its name says (copied or renamed?); train refuses to "
                "resume from it too",
                dir, renamed);
  const ModelConfig config = model_config_from_json(model_config_json(metadata.training_state, metadata_path),
                                                    metadata_path + " training_state.config.model");

  std::map<std::string, tessera::Shape> stored;
  for (const auto& [name, info] : metadata.tensors) stored[name] = info.global_shape;
  LoadedModel loaded{build_eval_model(config, stored, checkpoint::kModelPrefix, dir + ": the checkpoint"), config, dir,
                     step_from_training_state(metadata.training_state, metadata_path), {}};
  // Not strict: the checkpoint also holds the optimizer's "optim.*" state.
  const checkpoint::LoadReport report =
      checkpoint::load(dir, checkpoint::model_state(*loaded.model), {.strict = false});
  std::vector<std::string> unknown_model_keys;
  for (const std::string& key : report.unexpected_keys) {
    if (key.starts_with(checkpoint::kModelPrefix)) unknown_model_keys.push_back(key);
  }
  TESSERA_CHECK(unknown_model_keys.empty(), "{}: the checkpoint holds parameters its model config does not have: {}",
                dir, unknown_model_keys);
  return loaded;
}

LoadedModel load_model_from_safetensors(const std::string& path) {
  const checkpoint::SafetensorsHeader header = checkpoint::read_safetensors_header(path);
  const auto config_text = header.metadata.find(kGptConfigMetadataKey);
  TESSERA_CHECK(config_text != header.metadata.end(),
                "{}: __metadata__ has no \"{}\" key: the file does not record its model config", path,
                kGptConfigMetadataKey);
  const std::string source = fmt::format("{} __metadata__ {}", path, kGptConfigMetadataKey);
  nlohmann::json config_json;
  try {
    config_json = nlohmann::json::parse(config_text->second);
  } catch (const nlohmann::json::parse_error& error) {
    tessera::fail("{}: not valid JSON: {}", source, error.what());
  }
  const ModelConfig config = model_config_from_json(config_json, source);

  std::map<std::string, tessera::Shape> stored;
  for (const checkpoint::SafetensorsEntry& entry : header.entries) stored[entry.name] = entry.shape;
  LoadedModel loaded{build_eval_model(config, stored, "", path + ": the file"), config, path,
                     step_from_metadata(header.metadata, path), {}};
  // The file names parameters plainly ("wte.weight", "tok_embeddings.weight"), without "model.".
  checkpoint::import_safetensors(path, checkpoint::model_state(*loaded.model, ""), {.strict = true});
  return loaded;
}

LoadedModel load_model_from_hf_dir(const std::string& dir) {
  const HfModelInfo info = read_hf_model_info(dir);
  std::unique_ptr<tessera::nn::CausalLM> model = build_model(info.config, tessera::kCPU);
  model->eval();
  load_hf_weights(dir, info, checkpoint::model_state(*model, ""));
  return {std::move(model), info.config, dir, std::nullopt, hf_end_of_text_ids(dir, vocab_size(info.config))};
}

LoadedModel load_model_from_export(const std::string& path) {
  return is_hf_model_dir(path) ? load_model_from_hf_dir(path) : load_model_from_safetensors(path);
}

}  // namespace tessera::train
