// Path resolution, file identity and the clash rules between a launch's files.
#include "train/file_roles.h"

#include <sys/stat.h>

#include <algorithm>
#include <deque>
#include <filesystem>

#include <fmt/format.h>

#include "tensor/error.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// The kernel's own limit on links followed in one lookup (Linux's MAXSYMLINKS).
constexpr int kMaxLinksFollowed = 40;

std::optional<std::pair<uint64_t, uint64_t>> device_inode_of(const struct stat& info) {
  return std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(info.st_dev), static_cast<uint64_t>(info.st_ino)};
}

bool special_mode(mode_t mode) { return S_ISCHR(mode) || S_ISBLK(mode) || S_ISFIFO(mode) || S_ISSOCK(mode); }

// The spelling a user would recognise: absolute and normalised, links kept.
std::string spelled(const std::string& path) { return fs::absolute(path).lexically_normal().string(); }

}  // namespace

std::string resolve_path(const std::string& path) {
  TESSERA_CHECK(!path.empty(), "resolve_path: an empty path");
  std::deque<fs::path> pending;
  const fs::path relative = fs::absolute(path).relative_path();
  for (const fs::path& part : relative) pending.push_back(part);
  fs::path resolved = "/";
  int links = 0;
  while (!pending.empty()) {
    const fs::path part = pending.front();
    pending.pop_front();
    if (part.empty() || part == ".") continue;
    // `resolved` holds no link, so its parent is the real parent.
    if (part == "..") {
      resolved = resolved.parent_path();
      continue;
    }
    const fs::path candidate = resolved / part;
    struct stat info {};
    if (::lstat(candidate.c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) {
      resolved = candidate;
      continue;
    }
    TESSERA_CHECK(++links <= kMaxLinksFollowed, "{}: more than {} symbolic links along the path (a cycle?)", path,
                  kMaxLinksFollowed);
    const fs::path target = fs::read_symlink(candidate);
    if (target.is_absolute()) resolved = "/";
    const fs::path relative = target.relative_path();
    pending.insert(pending.begin(), relative.begin(), relative.end());
  }
  return resolved.string();
}

bool FileIdentity::same_file(const FileIdentity& other) const {
  if (device_inode && other.device_inode) return *device_inode == *other.device_inode;
  return resolved == other.resolved;
}

bool FileIdentity::inside(const FileIdentity& directory, std::string* entry) const {
  const fs::path mine(resolved);
  const fs::path theirs(directory.resolved);
  // By name: the directory's resolved components are a proper prefix of ours.
  auto [stop, rest] = std::mismatch(theirs.begin(), theirs.end(), mine.begin(), mine.end());
  if (stop == theirs.end() && rest != mine.end()) {
    if (entry) *entry = rest->string();
    return true;
  }
  // By inode: one of our existing ancestors is the directory (a bind mount
  // shows one directory under two names).
  if (!directory.device_inode) return false;
  for (fs::path child = mine, parent = mine.parent_path(); child != parent; child = parent, parent = parent.parent_path()) {
    struct stat info {};
    if (::stat(parent.c_str(), &info) == 0 && device_inode_of(info) == directory.device_inode) {
      if (entry) *entry = child.filename().string();
      return true;
    }
  }
  return false;
}

FileIdentity identify(const std::string& path) {
  FileIdentity identity{resolve_path(path), std::nullopt};
  struct stat info {};
  if (::stat(identity.resolved.c_str(), &info) == 0) {
    identity.device_inode = device_inode_of(info);
    identity.special = special_mode(info.st_mode);
  }
  return identity;
}

bool is_special_file(const std::string& path) {
  struct stat info {};
  return !path.empty() && ::stat(path.c_str(), &info) == 0 && special_mode(info.st_mode);
}

bool exists_no_follow(const std::string& path) {
  std::error_code error;
  return std::filesystem::symlink_status(path, error).type() != std::filesystem::file_type::not_found;
}

std::optional<FileIdentity> identify_descriptor(int fd) {
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) return std::nullopt;
  std::error_code error;
  const fs::path link = fs::read_symlink(fmt::format("/proc/self/fd/{}", fd), error);
  return FileIdentity{error ? std::string() : link.string(), device_inode_of(info), false};
}

void refuse_existing_output(const std::string& flag, const std::string& path, const std::string& how) {
  std::error_code error;
  if (path.empty() || fs::symlink_status(path, error).type() == fs::file_type::not_found) return;
  if (is_special_file(path)) return;  // /dev/null: written to, not replaced
  TESSERA_CHECK(!fs::is_directory(path, error), "{} {}: is a directory, not a file name", flag, path);
  if (fs::is_regular_file(fs::symlink_status(path, error)) && fs::file_size(path, error) == 0) return;  // mktemp's
  fail("{} {} already exists (an earlier launch's?); {}", flag, path, how);
}

// ---- the roles --------------------------------------------------------------------------------

void FileRoles::add_input(std::string flag, const std::string& path) {
  roles_.push_back({Kind::input, std::move(flag), path, identify(path), {}});
}

void FileRoles::add_output(std::string flag, const std::string& path) {
  roles_.push_back({Kind::output, std::move(flag), path, identify(path), {}});
}

void FileRoles::add_output_stream(std::string name, int fd) {
  if (std::optional<FileIdentity> identity = identify_descriptor(fd)) {
    roles_.push_back({Kind::stream, name, identity->resolved, *identity, {}});
  }
}

void FileRoles::add_output_directory(std::string flag, const std::string& path,
                                     std::function<bool(const std::string& entry)> manages) {
  roles_.push_back({Kind::directory, std::move(flag), path, identify(path), std::move(manages)});
}

void FileRoles::check() const {
  for (size_t first = 0; first < roles_.size(); ++first) {
    for (size_t second = first + 1; second < roles_.size(); ++second) check_pair(roles_[first], roles_[second]);
  }
}

void FileRoles::check_pair(const Role& a, const Role& b) const {
  const auto writes = [](const Role& role) { return role.kind != Kind::input; };
  if (!writes(a) && !writes(b)) return;                             // reading a file twice is fine
  if (a.kind == Kind::stream && b.kind == Kind::stream) return;     // `> log 2>&1`
  const auto named = [](const Role& role) { return fmt::format("{} {}", role.flag, role.path); };
  // Spelled differently but one file: say how, or the message reads as nonsense.
  const auto linked = [](const Role& x, const Role& y) {
    return x.kind != Kind::stream && y.kind != Kind::stream && spelled(x.path) != spelled(y.path)
               ? std::string(" (one file under two names: a symbolic or hard link)")
               : std::string();
  };

  for (const auto& [directory, other] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    if (directory->kind != Kind::directory) continue;
    TESSERA_CHECK(!other->identity.same_file(directory->identity), "{} is {}{}: {} is the directory this run owns; give "
                  "each its own path",
                  named(*other), named(*directory), linked(*other, *directory), directory->flag);
    std::string entry;
    if (!other->identity.inside(directory->identity, &entry)) continue;
    TESSERA_CHECK(other->kind == Kind::input,
                  "{} lies inside {}, which this run owns (its checkpoints, run.json and what it prunes); choose a "
                  "path for {} outside it",
                  named(*other), named(*directory), other->flag);
    TESSERA_CHECK(directory->manages && !directory->manages(entry),
                  "{} lies inside {}, in its entry '{}', which the run writes, prunes and deletes; copy the input "
                  "elsewhere first",
                  named(*other), named(*directory), entry);
  }
  if (!a.identity.same_file(b.identity)) return;
  if (writes(a) && writes(b)) {
    if (a.identity.special) return;  // `--log-json /dev/null --trace /dev/null`
    fail("{} and {} are the same file{}: one would overwrite the other; give each its own path", named(a), named(b),
         linked(a, b));
  }
  const Role& output = writes(a) ? a : b;
  const Role& input = writes(a) ? b : a;
  fail("{} is the input {}{}: writing it would destroy the input; choose another path for {}", named(output),
       named(input), linked(output, input), output.flag);
}

}  // namespace tessera::train
