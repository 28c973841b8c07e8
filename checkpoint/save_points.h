// Named moments of a save, in order, for tests that kill a process in the
// middle of one and check that the previous checkpoint survives:
//   "rank_file_written"   this rank's data file is written (and synced)
//   "metadata_written"    rank 0: metadata.json is written in DIR.tmp
//   "committed"           rank 0: DIR.tmp has been renamed to DIR
//   "pruning"             CheckpointManager, rank 0: an old checkpoint has
//                         been renamed aside and is about to be deleted
// The observer runs on the thread that saves (the background one for an
// async save). Production code never sets one.
#pragma once

#include <functional>
#include <string_view>

namespace tessera::checkpoint {

using SavePointObserver = std::function<void(std::string_view point)>;

// Replaces the process-wide observer (an empty function removes it).
void set_save_point_observer(SavePointObserver observer);
// Calls the observer, if any, with `point`.
void reach_save_point(std::string_view point);

}  // namespace tessera::checkpoint
