// The JSON-lines step log: strict reading, the cut at a resume, appending under a lock.
#include "train/step_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "checkpoint/file_io.h"
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

namespace {

int open_device(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  TESSERA_CHECK(fd >= 0, "{}: cannot open for writing: {}", path, std::strerror(errno));
  return fd;
}

FileLock lock_log(const std::string& path) {
  std::optional<FileLock> lock = FileLock::try_lock(path);
  TESSERA_CHECK(lock, "{}: another launch is writing this log (two launches given one --log-json?); give each "
                "launch its own path, or wait for that one to end", path);
  return std::move(*lock);
}

// Cuts the file to its first `bytes` and writes on from there.
void cut_to(const FileLock& lock, int64_t bytes) {
  TESSERA_CHECK(::ftruncate(lock.fd(), bytes) == 0 && ::lseek(lock.fd(), bytes, SEEK_SET) == bytes,
                "{}: cannot cut the file to its first {} bytes: {}", lock.path(), bytes, std::strerror(errno));
}

}  // namespace

StepLog::StepLog(std::string path, std::optional<FileLock> lock, int device_fd, StepLogCut cut)
    : path_(std::move(path)), lock_(std::move(lock)), device_fd_(device_fd), cut_(cut) {}

StepLog::StepLog(StepLog&& other) noexcept
    : path_(std::move(other.path_)),
      lock_(std::move(other.lock_)),
      device_fd_(std::exchange(other.device_fd_, -1)),
      cut_(other.cut_) {}

StepLog::~StepLog() {
  if (device_fd_ >= 0) ::close(device_fd_);
}

StepLog StepLog::create(const std::string& path, bool replace) {
  if (is_special_file(path)) return StepLog(path, std::nullopt, open_device(path), {});  // /dev/null
  FileLock lock = lock_log(path);
  struct stat info {};
  TESSERA_CHECK(::fstat(lock.fd(), &info) == 0, "{}: cannot examine: {}", path, std::strerror(errno));
  // The launch checked before its start that the file held nothing; lines
  // now are another launch's, written since.
  TESSERA_CHECK(info.st_size == 0 || replace, "{}: another launch wrote this log since this one started (two "
                "launches given one --log-json?); give each launch its own path", path);
  cut_to(lock, 0);
  return StepLog(path, std::move(lock), -1, {});
}

StepLog StepLog::resume(const std::string& path, int64_t keep_through) {
  if (is_special_file(path)) return StepLog(path, std::nullopt, open_device(path), {});
  FileLock lock = lock_log(path);
  const StepLogCut cut = scan_step_log(path, keep_through);
  cut_to(lock, cut.keep_bytes);
  return StepLog(path, std::move(lock), -1, cut);
}

void StepLog::write(const nlohmann::ordered_json& record) {
  const std::string line = record.dump() + '\n';
  checkpoint::write_all(fd(), line.data(), static_cast<int64_t>(line.size()), path_);
}

}  // namespace tessera::train
