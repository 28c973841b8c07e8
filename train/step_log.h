// train's --log-json file: one JSON object per optimizer step, one per line,
// each flushed as it is written, so a run that crashes keeps what it logged.
// A resumed run continues the file instead of replacing it: the lines of the
// steps up to the checkpoint it resumes from stay, the lines of later steps
// (which it trains again) are cut, and its own lines follow, so the file
// reads as one uninterrupted run. The file is read strictly first: one that
// is not such a log is never cut.
//
// A log is written over the whole run, so it is claimed for the whole run:
// locked (file_lock.h) from the moment it is opened until the StepLog is
// destroyed, and checked (empty, or scanned and cut) only once the lock is
// held. Of two launches given one log, however close together they start,
// exactly one writes it; the other is refused, naming the file. (Creating
// the file with O_EXCL would settle only a fresh run's race: a resume
// continues an existing file, and an empty file, as mktemp makes, is taken.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "train/file_lock.h"

namespace tessera::train {

// What continuing a log after step `keep_through` keeps and cuts.
struct StepLogCut {
  int64_t keep_bytes = 0;      // the file's first bytes that stay
  int64_t kept_lines = 0;
  int64_t last_kept_step = 0;  // 0: no line stays
  int64_t cut_lines = 0;       // lines of steps after keep_through
  bool cut_partial_line = false;  // a last line without its newline: a write the crash interrupted
};

// Reads the log at `path` (absent: an empty log) strictly: every complete
// line a JSON object with an integer "step" >= 1, the steps increasing.
// Throws tessera::Error naming the file and the first line that breaks the
// rule.
StepLogCut scan_step_log(const std::string& path, int64_t keep_through);

// Each throws tessera::Error naming the file when another launch holds it.
// A device such as /dev/null is only written to, never locked or cut.
class StepLog {
 public:
  // A new log at `path` (created when absent). A file with lines in it is an
  // earlier launch's log: replaced only when `replace` (--overwrite).
  static StepLog create(const std::string& path, bool replace);
  // Continues the log at `path` (created when absent) after step
  // `keep_through` (scan_step_log's rules and cut).
  static StepLog resume(const std::string& path, int64_t keep_through);

  StepLog(StepLog&& other) noexcept;
  StepLog& operator=(StepLog&&) = delete;
  ~StepLog();

  void write(const nlohmann::ordered_json& record);
  const std::string& path() const { return path_; }
  const StepLogCut& cut() const { return cut_; }

 private:
  StepLog(std::string path, std::optional<FileLock> lock, int device_fd, StepLogCut cut);
  int fd() const { return lock_ ? lock_->fd() : device_fd_; }

  std::string path_;
  std::optional<FileLock> lock_;  // a regular file's
  int device_fd_ = -1;            // a device's (no lock)
  StepLogCut cut_;
};

}  // namespace tessera::train
