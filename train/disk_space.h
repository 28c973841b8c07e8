// The disk space a run will need, checked before its first step against what
// each filesystem has free (statvfs), so that a full disk stops a run before
// it trains rather than at its first save or at its export. The sizes are
// upper bounds computed from the model's parameters alone; a test holds them
// to real checkpoints and exports.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "train/train_config.h"

namespace tessera::train {

// One checkpoint of this run: the model, AdamW's two moments and step
// counts, every rank's file header, metadata.json, and filesystem blocks.
int64_t checkpoint_bytes_bound(const TrainConfig& config);
// The exported .safetensors file: the model and its header.
int64_t export_bytes_bound(const TrainConfig& config);

// The checkpoints this launch saves from step resume_step + 1 to --steps:
// every --ckpt-every steps and at the last.
int64_t checkpoints_saved(const TrainConfig& config, int64_t resume_step);
// The most checkpoints this launch adds on top of the `existing` ones of
// its run at any moment: each save holds one more until the prune to --keep
// that follows its commit.
int64_t checkpoints_added_at_peak(const TrainConfig& config, int64_t resume_step, int64_t existing);

struct FilesystemSpace {
  uint64_t device = 0;     // which filesystem (st_dev)
  int64_t free_bytes = 0;  // what an unprivileged writer may still use (f_bavail)
};
// The filesystem that would hold `path` (read at its nearest existing
// ancestor); nullopt when it cannot be read.
std::optional<FilesystemSpace> filesystem_space(const std::string& path);
using FreeSpaceLookup = std::function<std::optional<FilesystemSpace>(const std::string& path)>;

// Throws tessera::Error naming the flags, what they need and what their
// filesystem has free, when the checkpoints that coexist at the peak
// (--ckpt-dir) and the export (--export) do not fit; needs on one
// filesystem add up.
void check_disk_space(const TrainConfig& config, int64_t resume_step, int64_t existing_checkpoints,
                      const FreeSpaceLookup& lookup = filesystem_space);

}  // namespace tessera::train
