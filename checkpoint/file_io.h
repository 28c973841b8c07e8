// POSIX file access for checkpoints: positioned reads (each rank reads only
// its byte ranges), streamed writes, fsync of files and directories (a
// rename is durable only once its directory is synced), and the rename that
// publishes a finished file. Every failure is a tessera::Error naming the
// path and the system's reason.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::checkpoint {

// Every file tessera reads goes through ReadFile, which opens only regular
// files: a FIFO, a device, a socket or a directory is refused by name, and
// never waited on (opening a FIFO waits for a writer, forever, past SIGTERM).
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

// Writes all of `bytes` to the open `fd` at its offset, through short writes
// and interruptions; errors name `path`.
void write_all(int fd, const void* data, int64_t bytes, const std::string& path);

// The whole file as text (metadata.json, run.json).
std::string read_file_text(const std::string& path);

// fsync on a directory, so that renames and new entries in it are durable.
void sync_directory(const std::string& path);

// How a finished temporary file (or directory) takes its place at the path it
// was written for, in the same directory so that the rename is atomic.
enum class Publish {
  replace,     // whatever is at the path is replaced
  no_clobber,  // only where nothing is, or an empty regular file (a
               // placeholder, as mktemp makes): a file written there since is
               // never replaced, so of two writers of one path exactly one wins
};

// Renames `temporary` to `path` as `mode` says (no_clobber: renameat2's
// RENAME_NOREPLACE, or link then unlink where the file system lacks it).
// Throws tessera::Error naming both when `path` is taken; `temporary` is
// then left as it is.
void publish(const std::string& temporary, const std::string& path, Publish mode);

// Proves now that a file can be created where `path` names one, without
// touching `path` itself: its directory must exist, `path` must not be a
// directory, and a sibling probe file is created, written and removed. A run
// calls it before its first step for everything it writes at the end.
void check_can_create(const std::string& path);

}  // namespace tessera::checkpoint
