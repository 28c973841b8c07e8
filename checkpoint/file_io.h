// POSIX file access for checkpoints: positioned reads (each rank reads only
// its byte ranges), streamed writes, fsync of files and directories (a
// rename is durable only once its directory is synced). Every failure is a
// tessera::Error naming the path and the system's reason.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::checkpoint {

class ReadFile {
 public:
  explicit ReadFile(const std::string& path);
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  int64_t size() const { return size_; }
  // Exactly `bytes` bytes at `offset`; reading past the end is an error.
  void read_at(int64_t offset, void* out, int64_t bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

class WriteFile {
 public:
  // Creates (or truncates) the file.
  explicit WriteFile(const std::string& path);
  ~WriteFile();  // closes without syncing if close() was not called
  WriteFile(const WriteFile&) = delete;
  WriteFile& operator=(const WriteFile&) = delete;

  void write(const void* data, int64_t bytes);
  int64_t written() const { return written_; }
  // Flushes to the disk first when `sync`.
  void close(bool sync);

 private:
  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0;
};

// The whole file as text (metadata.json, run.json).
std::string read_file_text(const std::string& path);

// fsync on a directory, so that renames and new entries in it are durable.
void sync_directory(const std::string& path);

// Proves now that a file can be created where `path` names one, without
// touching `path` itself: its directory must exist, `path` must not be a
// directory, and a sibling probe file is created, written and removed. A run
// calls it before its first step for everything it writes at the end.
void check_can_create(const std::string& path);

}  // namespace tessera::checkpoint
