// Two launches never share an output. A file a launch writes whole at the end
// (--export, --trace, --loss-plot; --sweep-out and --sweep-svg of a plan) is
// claimed before its first step and held until the launch ends:
//   - it is written to a temporary beside it (PATH.tmp or PATH.partial: one
//     directory, so that the rename which publishes it is atomic), and that
//     temporary is locked for the whole run (file_lock.h), so a second launch
//     given the same output is refused at its start, naming the file, however
//     close together the two started;
//   - with the claim held, the output must still not exist (unless
//     --overwrite): what the launch checked before its start may have been
//     written since by a launch that has ended;
//   - the finished file is published by a rename that never replaces
//     (checkpoint::Publish::no_clobber; --overwrite replaces), which also
//     stops a writer that took no claim (another program, a copy).
// The log (--log-json), written over the whole run, is locked itself
// (step_log.h); a checkpoint root by its .lock (root_lock.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "checkpoint/file_io.h"
#include "train/file_lock.h"

namespace tessera::train {

// PATH.partial: where --trace, --loss-plot and a plan's sweep files are
// written before they are published (the export's is PATH.tmp:
// checkpoint::export_temporary_path).
std::string partial_path(const std::string& path);

class OutputClaim {
 public:
  // Claims the output `path` (named by `flag` in messages) through its
  // `temporary`: a regular file, or a directory for Kind::directory (an
  // export in Hugging Face's layout). Throws tessera::Error naming the flag
  // and the path when another launch holds it, when `path` holds a written
  // file and `mode` is no_clobber, or when the temporary is something else (a
  // link, say) or cannot be created.
  OutputClaim(std::string flag, std::string path, std::string temporary, checkpoint::Publish mode,
              FileLock::Kind kind = FileLock::Kind::file);
  // Removes the temporary when it is still this claim's and empty: the run
  // ended before writing the output (a stop, an error), so no trace of the
  // claim stays.
  ~OutputClaim();
  OutputClaim(OutputClaim&&) = default;  // the moved-from claim holds no lock and discards nothing
  OutputClaim& operator=(OutputClaim&&) = delete;
  OutputClaim(const OutputClaim&) = delete;
  OutputClaim& operator=(const OutputClaim&) = delete;

  const std::string& path() const { return path_; }
  const std::string& temporary() const { return temporary_; }
  checkpoint::Publish mode() const { return mode_; }

  // Writes `bytes` to the temporary (synced), then publishes it.
  void write(std::string_view bytes) const;
  // Publishes the temporary, once something else wrote it (the trace).
  void publish() const;

 private:
  void discard_if_unwritten() noexcept;

  std::string flag_;
  std::string path_;
  std::string temporary_;
  checkpoint::Publish mode_;
  FileLock::Kind kind_;
  std::optional<FileLock> lock_;
};

}  // namespace tessera::train
