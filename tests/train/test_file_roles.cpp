// What a launch may not do to its own files: path resolution through links
// (dangling ones and cycles too), identity by device and inode, every clash
// FileRoles refuses with both flags named (and what it allows); and the
// checkpoint root's own traps: an entry named like a checkpoint that is not
// a directory, a run.json.tmp left by a crash, a failed save's partial
// directory.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>

#include "tensor/error.h"
#include "tests/checkpoint/known_state.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/train/text_file.h"
#include "train/checkpoint_manager.h"
#include "train/file_roles.h"
#include "train/run_record.h"

using namespace tessera;
using namespace tessera::checkpoint;
using namespace tessera::train;
using tessera::checkpoint::testing::TempDir;
namespace fs = std::filesystem;

using tessera::testing::write_file;
using tessera::testing::contains;

namespace {

std::string error_of(const FileRoles& roles) {
  try {
    roles.check();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

ManagerOptions options(RootMode mode) {
  return {.group = nullptr, .keep_last = 0, .sync = false, .mode = mode, .identity = {{"seed", 1}}};
}

}  // namespace

TEST_CASE("file roles: resolve_path follows every link, dangling ones and '..' after a link, and stops a cycle") {
  TempDir tmp;
  const std::string real = fs::canonical(tmp.path).string();
  fs::create_directories(tmp / "a/b");
  write_file(tmp / "a/b/file", "x");
  fs::create_symlink("a/b", tmp / "to-b");           // relative target
  fs::create_symlink(tmp / "to-b/file", tmp / "abs");  // absolute target, through another link
  fs::create_symlink("missing/new.json", tmp / "dangling");
  CHECK(resolve_path(tmp / "to-b/file") == real + "/a/b/file");
  CHECK(resolve_path(tmp / "abs") == real + "/a/b/file");
  CHECK(resolve_path(tmp / "dangling") == real + "/missing/new.json");  // writing through it creates this
  CHECK(resolve_path(tmp / "to-b/../file2") == real + "/a/file2");     // ".." of the link's target, not lexical
  CHECK(resolve_path(tmp / "a/./b/../b/file") == real + "/a/b/file");
  fs::create_symlink("loop2", tmp / "loop1");
  fs::create_symlink("loop1", tmp / "loop2");
  CHECK_THROWS_WITH_AS(resolve_path(tmp / "loop1"), doctest::Contains("more than 40 symbolic links"), Error);
}

TEST_CASE("file roles: identity by inode joins links and hard links; by name what does not exist yet") {
  TempDir tmp;
  write_file(tmp / "data.txt", "corpus");
  fs::create_symlink("data.txt", tmp / "soft");
  fs::create_hard_link(tmp / "data.txt", tmp / "hard");
  write_file(tmp / "other.txt", "corpus");  // the same bytes, another file
  CHECK(identify(tmp / "soft").same_file(identify(tmp / "data.txt")));
  CHECK(identify(tmp / "hard").same_file(identify(tmp / "data.txt")));
  CHECK_FALSE(identify(tmp / "other.txt").same_file(identify(tmp / "data.txt")));
  CHECK(identify(tmp / "new.json").same_file(identify(tmp / "./sub/../new.json")));
  CHECK_FALSE(identify(tmp / "new.json").same_file(identify(tmp / "new2.json")));
  std::string entry;
  CHECK(identify(tmp / "root/step-00000003/rank-00000.safetensors").inside(identify(tmp / "root"), &entry));
  CHECK(entry == "step-00000003");
  CHECK_FALSE(identify(tmp / "rootless").inside(identify(tmp / "root")));  // a prefix of the name is not a parent
  CHECK_FALSE(identify(tmp / "root").inside(identify(tmp / "root")));
}

TEST_CASE("file roles: an output that is an input, another output or inside the run's root is refused, naming both") {
  TempDir tmp;
  write_file(tmp / "c.txt", "the corpus");
  fs::create_symlink("c.txt", tmp / "link.txt");
  fs::create_hard_link(tmp / "c.txt", tmp / "hard.txt");
  fs::create_symlink("nowhere.json", tmp / "dangling");

  FileRoles same_name;
  same_name.add_input("--data", tmp / "c.txt");
  same_name.add_output("--log-json", tmp / "c.txt");
  CHECK(error_of(same_name) == fmt::format("--log-json {0} is the input --data {0}: writing it would destroy the input; "
                                           "choose another path for --log-json",
                                           tmp / "c.txt"));
  for (const char* alias : {"link.txt", "hard.txt"}) {
    FileRoles aliased;
    aliased.add_input("--data", tmp / "c.txt");
    aliased.add_output("--export", tmp / alias);
    const std::string error = error_of(aliased);
    CHECK(contains(error, "--export " + (tmp / alias) + " is the input --data " + (tmp / "c.txt")));
    CHECK(contains(error, "(one file under two names: a symbolic or hard link)"));
  }
  FileRoles two_outputs;  // a dangling link and the file it would create
  two_outputs.add_output("--trace", tmp / "nowhere.json");
  two_outputs.add_output("--log-json", tmp / "dangling");
  CHECK(contains(error_of(two_outputs), "--trace " + (tmp / "nowhere.json") + " and --log-json " + (tmp / "dangling") +
                                            " are the same file"));

  FileRoles inside;
  inside.add_output_directory("--ckpt-dir", tmp / "r", is_managed_entry);
  inside.add_output("--log-json", tmp / "r/run.json");
  CHECK(contains(error_of(inside), "--log-json " + (tmp / "r/run.json") + " lies inside --ckpt-dir " + (tmp / "r")));
  FileRoles unmanaged_output;  // any output inside the root, managed name or not
  unmanaged_output.add_output_directory("--ckpt-dir", tmp / "r", is_managed_entry);
  unmanaged_output.add_output("--trace", tmp / "r/trace.json");
  CHECK(contains(error_of(unmanaged_output), "lies inside --ckpt-dir"));
  FileRoles root_is_input;
  root_is_input.add_input("--data", tmp / "c.txt");
  root_is_input.add_output_directory("--ckpt-dir", tmp / "link.txt", is_managed_entry);
  CHECK(contains(error_of(root_is_input), "is --ckpt-dir"));
}

TEST_CASE("file roles: inputs may be read together and from a root's own files, never from what it manages") {
  TempDir tmp;
  write_file(tmp / "c.txt", "the corpus");
  FileRoles readers;
  readers.add_input("--data", tmp / "c.txt");
  readers.add_input("--init-from", tmp / "c.txt");
  readers.add_output("--log-json", tmp / "log.jsonl");
  CHECK(error_of(readers).empty());

  FileRoles own_file;  // a file the user keeps in the root: the manager leaves it alone
  own_file.add_output_directory("--ckpt-dir", tmp.path.string(), is_managed_entry);
  own_file.add_input("--data", tmp / "c.txt");
  CHECK(error_of(own_file).empty());
  FileRoles managed;  // a checkpoint's file: pruned by --keep, replaced by a save
  managed.add_output_directory("--ckpt-dir", tmp / "r", is_managed_entry);
  managed.add_input("--init-from", tmp / "r/step-00000002/rank-00000.safetensors");
  CHECK(contains(error_of(managed), "in its entry 'step-00000002', which the run writes, prunes and deletes"));
}

TEST_CASE("file roles: standard output redirected into an input clashes; into the log of another stream does not") {
  TempDir tmp;
  write_file(tmp / "c.txt", "the corpus");
  const int fd = ::open((tmp / "c.txt").c_str(), O_WRONLY | O_APPEND);
  REQUIRE(fd >= 0);
  const int out = ::open((tmp / "out.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(out >= 0);
  FileRoles appended;
  appended.add_input("--data", tmp / "c.txt");
  appended.add_output_stream("standard output", fd);
  CHECK(contains(error_of(appended), "is the input --data " + (tmp / "c.txt")));
  FileRoles both_streams;  // `> out.log 2>&1`
  both_streams.add_output_stream("standard output", out);
  both_streams.add_output_stream("standard error", out);
  CHECK(error_of(both_streams).empty());
  FileRoles pipe_like;  // a descriptor that is not a regular file never clashes
  int pipe_ends[2];
  REQUIRE(::pipe(pipe_ends) == 0);
  pipe_like.add_input("--data", tmp / "c.txt");
  pipe_like.add_output_stream("standard output", pipe_ends[1]);
  CHECK(error_of(pipe_like).empty());
  for (const int descriptor : {fd, out, pipe_ends[0], pipe_ends[1]}) ::close(descriptor);
}

TEST_CASE("checkpoint root: an entry named like a checkpoint that is not a directory is refused at open") {
  TempDir tmp;
  for (const char* kind : {"file", "dangling link", "link to a directory"}) {
    const std::string root = tmp / kind;
    fs::create_directories(root);
    const std::string entry = checkpoint_path(root, 3);
    if (std::string(kind) == "file") write_file(entry, "not a checkpoint");
    if (std::string(kind) == "dangling link") fs::create_symlink("nowhere", entry);
    if (std::string(kind) == "link to a directory") {
      fs::create_directories(tmp / "elsewhere");
      fs::create_symlink(tmp / "elsewhere", entry);
    }
    for (const RootMode mode : {RootMode::new_run, RootMode::continue_run}) {
      CHECK_THROWS_WITH_AS(CheckpointManager(root, options(mode)),
                           doctest::Contains(("named like checkpoints that are not directories (a file, or a "
                                              "symbolic link): " + entry).c_str()),
                           Error);
    }
    CHECK(fs::symlink_status(entry).type() != fs::file_type::not_found);  // left where it was
  }
}

TEST_CASE("checkpoint root: a run.json.tmp left by a launch that died while claiming it is cleaned, not an error") {
  TempDir tmp;
  const std::string root = tmp / "r";
  fs::create_directories(root);
  write_file(fs::path(root) / "run.json.tmp", "{\"format\": \"tessera.run\", \"tru");  // cut mid-write
  for (const RootMode mode : {RootMode::continue_run, RootMode::new_run}) {
    CheckpointManager manager(root, options(mode));
    CHECK(fs::exists(fs::path(root) / kRunRecordFile));
    CHECK_FALSE(fs::exists(fs::path(root) / "run.json.tmp"));
    write_file(fs::path(root) / "run.json.tmp", "{");  // the same crash again, for the next mode
    CHECK(manager.notices().size() >= 1);
  }
  CheckpointManager again(root, options(RootMode::continue_run));
  bool named = false;
  for (const std::string& notice : again.notices()) named = named || contains(notice, "run.json.tmp (a launch that died");
  CHECK(named);
}

TEST_CASE("checkpoint save: a save that fails takes its partial directory with it; the previous one stays") {
  TempDir tmp;
  const std::string root = tmp / "r";
  CheckpointManager manager(root, options(RootMode::new_run));
  manager.save(2, checkpoint::testing::known_state(nullptr, 2, 10), {{"step", 2}});
  // A write that fails as a full disk makes it fail: past RLIMIT_FSIZE a
  // write returns EFBIG (with SIGXFSZ ignored), where a full disk gives ENOSPC.
  struct rlimit saved_limit {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved_limit) == 0);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tiny = saved_limit;
  tiny.rlim_cur = 64;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &tiny) == 0);
  std::string error;
  try {
    manager.save(4, checkpoint::testing::known_state(nullptr, 4, 10), {{"step", 4}});
  } catch (const Error& failure) {
    error = failure.what();
  }
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &saved_limit) == 0);
  std::signal(SIGXFSZ, previous_handler);
  CHECK(contains(error, "write failed"));
  CHECK(contains(error, "File too large"));
  CHECK_FALSE(fs::exists(checkpoint_path(root, 4) + ".tmp"));
  CHECK_FALSE(fs::exists(checkpoint_path(root, 4)));
  REQUIRE(manager.latest().has_value());
  CHECK(manager.latest()->step == 2);
  manager.save(4, checkpoint::testing::known_state(nullptr, 4, 10), {{"step", 4}});  // once the cause is gone
  CHECK(list_checkpoints(root).size() == 2);
}
