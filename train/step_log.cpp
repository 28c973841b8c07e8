// The JSON-lines step log: strict reading, the cut at a resume, appending.
#include "train/step_log.h"

#include <filesystem>

#include "tensor/error.h"
#include "train/file_roles.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// The step of one complete line, or why the line is not a step record.
int64_t step_of_line(const std::string& path, int64_t line_number, const std::string& line, int64_t previous_step) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  const auto refuse = [&](const std::string& why) {
    tessera::fail("{}: line {} is not a step record of train's log ({}); train continues only its own logs, so "
                  "nothing was cut: move the file away or choose another path",
                  path, line_number, why);
  };
  if (record.is_discarded() || !record.is_object()) refuse("not a JSON object");
  const auto step = record.find("step");
  if (step == record.end() || !step->is_number_integer()) refuse("no integer \"step\"");
  const int64_t value = step->get<int64_t>();
  if (value < 1) refuse(fmt::format("step {} is below 1", value));
  if (value <= previous_step) refuse(fmt::format("step {} follows step {}", value, previous_step));
  return value;
}

}  // namespace

StepLogCut scan_step_log(const std::string& path, int64_t keep_through) {
  StepLogCut cut;
  std::error_code error;
  if (!fs::exists(path, error)) return cut;
  TESSERA_CHECK(fs::is_regular_file(path, error), "{}: not a regular file", path);
  std::ifstream file(path, std::ios::binary);
  TESSERA_CHECK(file.is_open(), "{}: cannot open for reading", path);
  std::string line;
  int64_t offset = 0, line_number = 0, previous_step = 0;
  while (std::getline(file, line)) {
    ++line_number;
    if (file.eof()) {  // no newline: the last write was cut short
      cut.cut_partial_line = true;
      break;
    }
    previous_step = step_of_line(path, line_number, line, previous_step);
    offset += static_cast<int64_t>(line.size()) + 1;
    if (previous_step <= keep_through) {
      cut.keep_bytes = offset;
      cut.kept_lines = line_number;
      cut.last_kept_step = previous_step;
    } else {
      ++cut.cut_lines;
    }
  }
  TESSERA_CHECK(!file.bad(), "{}: reading failed", path);
  return cut;
}

StepLog::StepLog(std::string path, std::ios::openmode mode, StepLogCut cut)
    : path_(std::move(path)), file_(path_, mode), cut_(cut) {
  TESSERA_CHECK(file_.is_open(), "{}: cannot open for writing", path_);
}

StepLog StepLog::create(const std::string& path) { return StepLog(path, std::ios::trunc, {}); }

StepLog StepLog::resume(const std::string& path, int64_t keep_through) {
  if (is_special_file(path)) return StepLog(path, std::ios::app, {});  // /dev/null
  const StepLogCut cut = scan_step_log(path, keep_through);
  std::error_code error;
  if (fs::exists(path, error)) {
    fs::resize_file(path, static_cast<uintmax_t>(cut.keep_bytes), error);
    TESSERA_CHECK(!error, "{}: cannot cut the lines after step {}: {}", path, keep_through, error.message());
  }
  return StepLog(path, std::ios::app, cut);
}

void StepLog::write(const nlohmann::ordered_json& record) {
  file_ << record.dump() << '\n';
  file_.flush();
  TESSERA_CHECK(file_.good(), "{}: writing the log failed", path_);
}

}  // namespace tessera::train
