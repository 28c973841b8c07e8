// A run's identity, and the settings a resume takes from its checkpoint.
#include "train/run_identity.h"

#include <fmt/format.h>

#include "checkpoint/checksum.h"
#include "tensor/error.h"
#include "train/config_json.h"

namespace tessera::train {

namespace {

nlohmann::json data_identity(const DataLoader& data) {
  if (data.is_synthetic()) return {{"source", data.description()}, {"tokens", nullptr}, {"crc32c", nullptr}};
  // A narrow stream's bytes are those runs before wide streams existed checksummed.
  const std::span<const std::byte> tokens = data.token_data()->tokens.bytes();
  return {{"source", data.description()},
          {"tokens", data.token_data()->tokens.size()},
          {"crc32c", tessera::checkpoint::crc32c(tokens.data(), tokens.size())}};
}

}  // namespace

nlohmann::json run_identity(const TrainConfig& config, const DataLoader& data) {
  return {{"model", model_config_to_json(config.model_config())},
          {"seed", config.seed},
          {kDataIdentityKey, data_identity(data)},
          {"batch",
           {{"sequences", config.batch},
            {"seq_len", config.seq_len},
            {"micro_batches_per_step", config.grad_accum * config.nproc}}}};
}

ResumeSettings settings_from_checkpoint(const TrainConfig& config, const nlohmann::json& training_state,
                                        const std::string& source) {
  ResumeSettings settings{config, {}};
  try {
    const nlohmann::json& saved = training_state.at("config").at("train");
    auto take = [&](const char* flag, const char* key, auto& field) {
      using Field = std::remove_reference_t<decltype(field)>;
      const nlohmann::json& value = saved.at(key);
      TESSERA_CHECK(value.is_number(), "{}: training_state.config.train.{} is not a number: {}", source, key,
                    value.dump());
      const Field checkpoint_value = value.get<Field>();
      if (checkpoint_value == field) return;
      settings.overridden.push_back(fmt::format("{} {} -> {}", flag, field, checkpoint_value));
      field = checkpoint_value;
    };
    TrainConfig& c = settings.config;
    take("--lr", "lr", c.lr);
    take("min_lr_ratio", "min_lr_ratio", c.min_lr_ratio);
    take("--warmup", "warmup", c.warmup);
    take("--steps", "steps", c.steps);
    take("--weight-decay", "weight_decay", c.weight_decay);
    take("--clip", "clip", c.clip);
  } catch (const nlohmann::json::exception& error) {
    tessera::fail("{}: the training state lacks the run's settings: {}", source, error.what());
  }
  try {
    settings.config.validate();
  } catch (const tessera::Error& error) {
    tessera::fail("{}: the checkpoint's settings are invalid: {}", source, error.what());
  }
  return settings;
}

}  // namespace tessera::train
