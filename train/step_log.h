// train's --log-json file: one JSON object per optimizer step, one per line,
// each flushed as it is written, so a run that crashes keeps what it logged.
// A resumed run continues the file instead of replacing it: the lines of the
// steps up to the checkpoint it resumes from stay, the lines of later steps
// (which it trains again) are cut, and its own lines follow, so the file
// reads as one uninterrupted run. The file is read strictly first: one that
// is not such a log is never cut.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

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

class StepLog {
 public:
  // A new log at `path`, replacing what is there.
  static StepLog create(const std::string& path);
  // Continues the log at `path` (created when absent) after step
  // `keep_through` (scan_step_log's rules and cut); a device such as
  // /dev/null is only written to.
  static StepLog resume(const std::string& path, int64_t keep_through);

  void write(const nlohmann::ordered_json& record);
  const std::string& path() const { return path_; }
  const StepLogCut& cut() const { return cut_; }

 private:
  StepLog(std::string path, std::ios::openmode mode, StepLogCut cut);

  std::string path_;
  std::ofstream file_;
  StepLogCut cut_;
};

}  // namespace tessera::train
