// Every file a launch of `train` reads and writes, settled before anything is
// written, so that no flag, however mistyped, destroys data:
//   - no output is an input, another output, or inside the checkpoint root,
//     compared by file identity (train/file_roles.h);
//   - no file an earlier launch left is replaced without --overwrite, except
//     what a --resume continues: its log (cut after the checkpoint's step,
//     then appended: step_log.h) and its trace (a new file, named in the
//     banner, when the old one exists);
//   - the export's temporary file (PATH.tmp) is free to be written;
//   - the disks have room for the checkpoints and the export (disk_space.h).
// Every error names the flags involved and says how to choose. These checks
// come before the start; what another launch may do after them is settled by
// claiming each output for the run once it starts (output_claim.h, step_log.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/disk_space.h"
#include "train/train_config.h"

namespace tessera::train {

struct RunFiles {
  std::string trace;                 // where this launch writes its trace ("" = none)
  std::vector<std::string> notices;  // for the banner: what the launch continues or replaces
};

// Reads only, and creates only the probe files that prove the outputs
// writable (checkpoint::check_can_create). Throws tessera::Error.
RunFiles settle_run_files(const TrainConfig& config, const FreeSpaceLookup& lookup = filesystem_space);

// `path` with ".from-step-N" before its extension (and "-2", "-3", ... after
// N while that name is taken): a resumed launch's trace beside the old one.
std::string resumed_trace_path(const std::string& path, int64_t first_step);

}  // namespace tessera::train
