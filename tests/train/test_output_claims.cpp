// Two launches, one output (issue 48): of launches given the same output,
// however close together they start, exactly one writes it and every other
// is refused with an error naming the file. The pieces (FileLock, StepLog,
// OutputClaim, checkpoint::publish) are raced by threads released together
// at a barrier, many times, fresh and resumed logs in every pairing, and in
// both orders of an interleaving the old check-then-truncate lost; then
// `train` itself, two processes exec'd together, with one --log-json and
// with one --export.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "tensor/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/train/text_file.h"
#include "train/file_lock.h"
#include "train/output_claim.h"
#include "train/step_log.h"

namespace fs = std::filesystem;
using tessera::checkpoint::Publish;
using tessera::checkpoint::testing::TempDir;
using tessera::train::FileLock;
using tessera::train::OutputClaim;
using tessera::train::StepLog;

using tessera::testing::contains;

namespace {

constexpr int kTries = 40;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Runs claim(i) on `contenders` threads released together at a barrier; a
// winner holds what it claimed until every contender has tried, as a
// launch holds its outputs for its run. Returns each one's error ("" = won).
template <typename Claim>
std::vector<std::string> race(int contenders, const std::function<Claim(int)>& claim) {
  std::barrier start(contenders), tried(contenders);
  std::vector<std::string> errors(static_cast<size_t>(contenders));
  std::vector<std::thread> threads;
  for (int i = 0; i < contenders; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      std::optional<Claim> held;
      try {
        held.emplace(claim(i));
      } catch (const tessera::Error& error) {
        errors[static_cast<size_t>(i)] = error.what();
      }
      tried.arrive_and_wait();
    });
  }
  for (std::thread& thread : threads) thread.join();
  return errors;
}

// Exactly one winner; every loser's error names `path` and says `why`.
void check_one_winner(const std::vector<std::string>& errors, const std::string& path, const std::string& why) {
  int winners = 0;
  for (const std::string& error : errors) {
    if (error.empty()) {
      ++winners;
      continue;
    }
    INFO(error);
    CHECK(contains(error, path));
    CHECK(contains(error, why));
  }
  CHECK(winners == 1);
}

const std::string kThreeSteps = "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n";

}  // namespace

TEST_CASE("output claims: a file lock is held by one opener, across threads, until released") {
  TempDir tmp;
  const std::string path = tmp / "x.lock";
  std::optional<FileLock> first = FileLock::try_lock(path);
  REQUIRE(first);
  CHECK_FALSE(FileLock::try_lock(path).has_value());
  // A holder that renames its file leaves the name free: whoever comes next
  // locks the new file at the path, not the renamed one.
  fs::rename(path, tmp / "moved");
  std::optional<FileLock> second = FileLock::try_lock(path);
  REQUIRE(second);
  CHECK(second->still_at_path());
  CHECK_FALSE(first->still_at_path());
  first.reset();
  CHECK_FALSE(FileLock::try_lock(path).has_value());  // still the second's
  second.reset();
  CHECK(FileLock::try_lock(path).has_value());
  // Not a regular file: refused by type (a FIFO is never waited on).
  REQUIRE(::mkfifo((tmp / "fifo").c_str(), 0644) == 0);
  CHECK_THROWS_WITH_AS(FileLock::try_lock(tmp / "fifo"), doctest::Contains("fifo: not a regular file"),
                       tessera::Error);
  CHECK(FileLock::try_lock(tmp / "dir", FileLock::Kind::directory).has_value());
  CHECK(fs::is_directory(tmp / "dir"));
}

TEST_CASE("output claims: a log raced by fresh and resumed launches has exactly one writer") {
  TempDir tmp;
  const std::string refused = "another launch is writing this log";
  for (int attempt = 0; attempt < kTries; ++attempt) {
    INFO("try " << attempt);
    const std::string fresh = tmp / fmt::format("fresh-{}.jsonl", attempt);
    check_one_winner(race<StepLog>(3, [&](int) { return StepLog::create(fresh, false); }), fresh, refused);

    const std::string resumed = tmp / fmt::format("resumed-{}.jsonl", attempt);
    write_bytes(resumed, kThreeSteps);
    check_one_winner(race<StepLog>(3, [&](int) { return StepLog::resume(resumed, 2); }), resumed, refused);
    CHECK(read_bytes(resumed) == "{\"step\":1}\n{\"step\":2}\n");  // cut once, by the one writer

    const std::string mixed = tmp / fmt::format("mixed-{}.jsonl", attempt);
    write_bytes(mixed, "");  // mktemp's: taken by a fresh run and continued by a resume alike
    check_one_winner(race<StepLog>(2,
                                   [&](int i) {
                                     return i == 0 ? StepLog::create(mixed, false) : StepLog::resume(mixed, 0);
                                   }),
                     mixed, refused);
  }
}

TEST_CASE("output claims: both launches checked the log before either opened it; the second to open is refused") {
  // The interleaving the issue hit: both checks pass (the file is absent),
  // then both open. Whichever opens first wins, in either order, and a log
  // written by a launch that has since ended is never emptied by a fresh one.
  TempDir tmp;
  for (const bool fresh_first : {true, false}) {
    INFO("fresh first: " << fresh_first);
    const std::string path = tmp / fmt::format("log-{}.jsonl", fresh_first);
    const auto open_fresh = [&] { return StepLog::create(path, false); };
    const auto open_resumed = [&] { return StepLog::resume(path, 5); };
    std::optional<StepLog> first;
    first.emplace(fresh_first ? open_fresh() : open_resumed());
    CHECK_THROWS_WITH_AS(fresh_first ? open_resumed() : open_fresh(),
                         doctest::Contains((path + ": another launch is writing this log").c_str()), tessera::Error);
    first->write({{"step", 1}});
    first.reset();  // that launch ends
    CHECK_THROWS_WITH_AS(open_fresh(),
                         doctest::Contains((path + ": another launch wrote this log since this one started").c_str()),
                         tessera::Error);
    CHECK(read_bytes(path) == "{\"step\":1}\n");
    StepLog replacing = StepLog::create(path, /*replace=*/true);  // --overwrite
    CHECK(read_bytes(path).empty());
  }
}

TEST_CASE("output claims: an output written whole is claimed by one launch; the others are refused at the start") {
  TempDir tmp;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    INFO("try " << attempt);
    const std::string file = tmp / fmt::format("m-{}.safetensors", attempt);
    check_one_winner(race<OutputClaim>(3,
                                       [&](int) {
                                         return OutputClaim("--export", file, file + ".tmp", Publish::no_clobber);
                                       }),
                     "--export " + file, "another launch is writing this output (it holds " + file + ".tmp)");
    CHECK_FALSE(fs::exists(file + ".tmp"));  // nothing written: no trace of the claims stays

    const std::string directory = tmp / fmt::format("hf-{}", attempt);
    check_one_winner(race<OutputClaim>(2,
                                       [&](int) {
                                         return OutputClaim("--export", directory, directory + ".tmp",
                                                            Publish::no_clobber, FileLock::Kind::directory);
                                       }),
                     "--export " + directory, "another launch is writing this output");
    CHECK_FALSE(fs::exists(directory + ".tmp"));
  }
}

TEST_CASE("output claims: a claim made after another launch published is refused; --overwrite replaces") {
  TempDir tmp;
  const std::string plot = tmp / "loss.svg";
  {
    const OutputClaim first("--loss-plot", plot, tessera::train::partial_path(plot), Publish::no_clobber);
    first.write("<svg>first</svg>\n");
  }
  CHECK(read_bytes(plot) == "<svg>first</svg>\n");
  CHECK_FALSE(fs::exists(tessera::train::partial_path(plot)));
  CHECK_THROWS_WITH_AS(OutputClaim("--loss-plot", plot, tessera::train::partial_path(plot), Publish::no_clobber),
                       doctest::Contains(("--loss-plot " + plot + " already exists: written since this launch "
                                          "checked it").c_str()),
                       tessera::Error);
  CHECK_FALSE(fs::exists(tessera::train::partial_path(plot)));
  OutputClaim("--loss-plot", plot, tessera::train::partial_path(plot), Publish::replace).write("<svg>second</svg>\n");
  CHECK(read_bytes(plot) == "<svg>second</svg>\n");
  // An empty file (mktemp's) is a placeholder, not a written output.
  write_bytes(tmp / "empty.svg", "");
  OutputClaim("--loss-plot", tmp / "empty.svg", tmp / "empty.svg.partial", Publish::no_clobber).write("<svg/>");
  CHECK(read_bytes(tmp / "empty.svg") == "<svg/>");
  // A link where the temporary goes would be written through.
  fs::create_symlink("elsewhere", tmp / "linked.svg.partial");
  CHECK_THROWS_WITH_AS(OutputClaim("--loss-plot", tmp / "linked.svg", tmp / "linked.svg.partial", Publish::no_clobber),
                       doctest::Contains("linked.svg.partial exists and is not a regular file"), tessera::Error);
}

TEST_CASE("output claims: of writers publishing one path at once without replacing, exactly one lands") {
  // The last guard, for a writer that took no claim: the rename never replaces.
  TempDir tmp;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    INFO("try " << attempt);
    const std::string path = tmp / fmt::format("out-{}.json", attempt);
    std::vector<std::string> temporaries;
    for (int i = 0; i < 3; ++i) {
      temporaries.push_back(fmt::format("{}.writer-{}", path, i));
      write_bytes(temporaries.back(), fmt::format("written whole by writer {}", i));
    }
    const std::vector<std::string> errors = race<bool>(3, [&](int i) {
      tessera::checkpoint::publish(temporaries[static_cast<size_t>(i)], path, Publish::no_clobber);
      return true;
    });
    check_one_winner(errors, path, "it was not replaced, and this launch's is left at");
    for (int i = 0; i < 3; ++i) {
      const bool won = errors[static_cast<size_t>(i)].empty();
      CHECK(fs::exists(temporaries[static_cast<size_t>(i)]) == !won);  // a loser's file is kept, named
      if (won) CHECK(read_bytes(path) == fmt::format("written whole by writer {}", i));
    }
  }
}

namespace {

// `train` run as processes that all start at once: each child blocks on a
// pipe until the parent closes it, then execs (only async-signal-safe calls
// between fork and exec). Returns each one's exit status (-1: killed) and
// writes its stdout and stderr to outputs[i].
std::vector<int> launch_together(const std::vector<std::vector<std::string>>& commands,
                                 const std::vector<std::string>& outputs) {
  std::vector<std::vector<char*>> argvs;
  for (const std::vector<std::string>& command : commands) {
    std::vector<char*> argv;
    for (const std::string& word : command) argv.push_back(const_cast<char*>(word.c_str()));
    argv.push_back(nullptr);
    argvs.push_back(std::move(argv));
  }
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> children;
  for (size_t i = 0; i < commands.size(); ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(gate[1]);
      const int out = ::open(outputs[i].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0) ::_exit(126);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
      char released = 0;
      while (::read(gate[0], &released, 1) < 0) {
      }
      ::execv(argvs[i][0], argvs[i].data());
      ::_exit(127);
    }
    children.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);  // every child's read returns: they start together
  std::vector<int> statuses;
  for (const pid_t child : children) {
    int status = 0;
    while (::waitpid(child, &status, 0) < 0) {
    }
    statuses.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  return statuses;
}

std::vector<std::string> quick_train(const std::string& train, const std::string& root) {
  return {train,   "--preset", "nano",  "--data",   "synthetic", "--steps", "4",          "--batch", "2",
          "--seq-len", "16",  "--threads", "1", "--eval-every", "0",   "--ckpt-dir", root};
}

}  // namespace

TEST_CASE("output claims: two train launches started together with one --log-json, or one --export: one runs") {
  const char* train = std::getenv("TESSERA_TRAIN_PROGRAM");
  REQUIRE_MESSAGE(train != nullptr, "TESSERA_TRAIN_PROGRAM names the train program");
  TempDir tmp;
  constexpr int kLaunchTries = 5;
  for (const std::string flag : {"--log-json", "--export"}) {
    for (int attempt = 0; attempt < kLaunchTries; ++attempt) {
      INFO(flag << ", try " << attempt);
      const std::string shared = tmp / fmt::format("shared-{}-{}", flag.substr(2), attempt);
      std::vector<std::vector<std::string>> commands;
      std::vector<std::string> outputs;
      for (int launch = 0; launch < 2; ++launch) {
        commands.push_back(quick_train(train, tmp / fmt::format("root-{}-{}-{}", flag.substr(2), attempt, launch)));
        commands.back().insert(commands.back().end(), {flag, shared});
        outputs.push_back(tmp / fmt::format("out-{}-{}-{}.txt", flag.substr(2), attempt, launch));
      }
      const std::vector<int> statuses = launch_together(commands, outputs);
      int winners = 0;
      for (size_t launch = 0; launch < statuses.size(); ++launch) {
        const std::string printed = read_bytes(outputs[launch]);
        INFO(printed);
        if (statuses[launch] == 0) {
          ++winners;
          continue;
        }
        CHECK(statuses[launch] != -1);  // refused, not crashed
        CHECK(contains(printed, flag + " " + shared));
      }
      CHECK(winners == 1);
      if (flag == "--log-json") {
        CHECK(read_bytes(shared).find("\"step\":4") != std::string::npos);
        int lines = 0;
        for (const char c : read_bytes(shared)) lines += c == '\n';
        CHECK(lines == 4);  // one run's steps, never two interleaved
      } else {
        CHECK(tessera::checkpoint::read_safetensors_header(shared).entries.size() > 0);
        CHECK_FALSE(fs::exists(shared + ".tmp"));
      }
    }
  }
}
