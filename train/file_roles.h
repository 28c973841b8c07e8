// The files one launch of a program reads and writes, each named by the flag
// that gave it, checked against each other before anything is written: an
// output must not be an input, another output, or lie inside an output
// directory (a checkpoint root), and no input may be one of the entries such
// a directory manages. Paths are compared by identity, not by spelling: fully
// resolved (every symbolic link followed, a dangling one too, since writing
// through it creates its target) and by device and inode where the file
// exists, so symbolic links and hard links to one file are the same file.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera::train {

// Where a path really leads: absolute, with every symbolic link along it
// followed (dangling ones included) and "." and ".." applied after the links
// they follow. Throws tessera::Error on a cycle of links.
std::string resolve_path(const std::string& path);

// A file as the kernel knows it: the resolved path, and the device and inode
// when it exists.
struct FileIdentity {
  std::string resolved;
  std::optional<std::pair<uint64_t, uint64_t>> device_inode;
  // A device, a FIFO or a socket (/dev/null, /dev/stdout): written to, never
  // replaced, so two outputs may share one.
  bool special = false;

  bool same_file(const FileIdentity& other) const;
  // Whether this path lies strictly inside the directory `directory`; the
  // first component below it in `entry`.
  bool inside(const FileIdentity& directory, std::string* entry = nullptr) const;
};

FileIdentity identify(const std::string& path);
// The identity of an open descriptor (standard output, say); nullopt when it
// is not a regular file (a terminal, a pipe), which cannot clash.
std::optional<FileIdentity> identify_descriptor(int fd);

// Whether `path` leads to a device, a FIFO or a socket (FileIdentity::special).
bool is_special_file(const std::string& path);
// Whether anything is at `path` itself, a dangling symbolic link included.
bool exists_no_follow(const std::string& path);

// Throws tessera::Error, "FLAG PATH already exists (an earlier launch's?); HOW",
// when `path` exists (a link counts, a dangling one too) and is not an empty
// regular file or a special file: no program replaces an earlier launch's
// output silently.
void refuse_existing_output(const std::string& flag, const std::string& path, const std::string& how);

class FileRoles {
 public:
  // A file or directory the launch reads.
  void add_input(std::string flag, const std::string& path);
  // A file the launch creates or replaces.
  void add_output(std::string flag, const std::string& path);
  // A stream the launch writes to (standard output, standard error) when it
  // is a regular file: compared with files, never with other streams (`> log
  // 2>&1` is one file on purpose).
  void add_output_stream(std::string name, int fd);
  // A directory the launch owns: no other output may lie inside it, and no
  // input inside it may be an entry `manages` claims (every entry, when empty).
  void add_output_directory(std::string flag, const std::string& path,
                            std::function<bool(const std::string& entry)> manages = {});

  // Throws tessera::Error naming both flags and paths of the first clash,
  // saying which would destroy which.
  void check() const;

 private:
  enum class Kind { input, output, stream, directory };
  struct Role {
    Kind kind;
    std::string flag;
    std::string path;
    FileIdentity identity;
    std::function<bool(const std::string&)> manages;
  };
  void check_pair(const Role& a, const Role& b) const;

  std::vector<Role> roles_;
};

}  // namespace tessera::train
