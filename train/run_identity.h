// What a checkpoint pins down about a run. The identity (run.json of the
// checkpoint root) says which launches are the same run; the resume
// settings say which flags a resume takes from the checkpoint instead of the
// command line, so that the resumed steps are the uninterrupted run's.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/data_loader.h"
#include "train/train_config.h"

namespace tessera::train {

// The model, the seed, the data (where from, and a CRC-32C of its tokens)
// and the batch geometry (sequences per micro-batch, tokens per sequence,
// micro-batches per step over all ranks: the world size may change on
// resume, the global batch may not).
nlohmann::json run_identity(const TrainConfig& config, const DataLoader& data);

// The identity key that --allow-data-change lets a resume change.
inline constexpr const char* kDataIdentityKey = "data";

// The lr schedule (lr, min_lr_ratio, warmup, steps), weight decay and
// clipping of the checkpoint's run, on top of `config`; `overridden` lists
// each flag whose value differed ("--lr 0.01 -> 0.003"). Errors name `source`.
struct ResumeSettings {
  TrainConfig config;
  std::vector<std::string> overridden;
};
ResumeSettings settings_from_checkpoint(const TrainConfig& config, const nlohmann::json& training_state,
                                        const std::string& source);

}  // namespace tessera::train
