// train/progress_output.h: lines reach the descriptor whole and in order; a
// reader that stops reading never blocks the writer's caller (the lines
// beyond the queue are dropped and counted, and the output says so once
// read again); closing waits for every line, except after a stop, when it
// waits only its grace period.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <csignal>
#include <string>
#include <thread>

#include "tensor/error.h"
#include "train/progress_output.h"

using tessera::train::ProgressOutput;

namespace {

struct ProgressPipe {
  int read_end = -1, write_end = -1;
  ProgressPipe() {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    read_end = fds[0];
    write_end = fds[1];
  }
  ~ProgressPipe() {
    if (read_end >= 0) ::close(read_end);
    if (write_end >= 0) ::close(write_end);
  }
  // Everything written so far, without blocking.
  std::string drain() const {
    const int flags = ::fcntl(read_end, F_GETFL);
    ::fcntl(read_end, F_SETFL, flags | O_NONBLOCK);
    std::string text;
    char chunk[65536];
    for (;;) {
      const ssize_t n = ::read(read_end, chunk, sizeof chunk);
      if (n <= 0) break;
      text.append(chunk, static_cast<size_t>(n));
    }
    ::fcntl(read_end, F_SETFL, flags);
    return text;
  }
};

double progress_seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_SUITE("progress output") {

TEST_CASE("lines arrive whole and in order, a line without its newline too") {
  ProgressPipe pipe;
  {
    ProgressOutput out(pipe.write_end, {.give_up_waiting = [] { return false; }});
    for (int i = 0; i < 100; ++i) out.stream() << "step " << i << " | loss " << 1.5 << '\n';
    out.stream() << "done";
    out.close();
    CHECK(out.dropped_lines() == 0);
  }
  std::string expected;
  for (int i = 0; i < 100; ++i) expected += "step " + std::to_string(i) + " | loss 1.5\n";
  CHECK(pipe.drain() == expected + "done");
}

TEST_CASE("a reader that stops reading never blocks the caller; what was dropped is said once it reads again") {
  ProgressPipe pipe;
  ProgressOutput out(pipe.write_end, {.capacity_bytes = 4096, .give_up_waiting = [] { return false; }});
  const std::string line(99, 'x');
  // 10 MiB against a 64 KiB pipe and a 4 KiB queue: a blocking write would never return.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100'000; ++i) out.stream() << line << '\n';
  CHECK(progress_seconds_since(start) < 60);  // a bound a loaded machine meets: a blocked call would not return at all
  const int64_t dropped = out.dropped_lines();
  CHECK(dropped > 90'000);
  // The reader catches up. Every line is either written, in order, or
  // counted by a note where it would have been.
  std::string text;
  std::thread reader([&] {
    char chunk[65536];
    while (text.size() < 4 || text.compare(text.size() - 4, 4, "end\n") != 0) {
      const ssize_t n = ::read(pipe.read_end, chunk, sizeof chunk);
      if (n <= 0) return;
      text.append(chunk, static_cast<size_t>(n));
    }
  });
  int ends = 0;
  for (int64_t before = -1; before != out.dropped_lines(); ++ends) {
    before = out.dropped_lines();
    out.stream() << "end\n";  // dropped while the queue is still full
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  out.close();
  reader.join();
  const std::regex drop_note("progress ([0-9]+) line(s?) dropped here: the output was not being read");
  int64_t written = 0, noted = 0;
  size_t start_of_line = 0;
  while (start_of_line < text.size()) {
    const size_t end_of_line = text.find('\n', start_of_line);
    REQUIRE(end_of_line != std::string::npos);
    const std::string one = text.substr(start_of_line, end_of_line - start_of_line);
    if (one == line || one == "end") {
      ++written;
    } else {
      std::smatch note;
      REQUIRE_MESSAGE(std::regex_match(one, note, drop_note), one);
      CHECK((note[2].length() == 0) == (note[1] == "1"));  // "1 line", "2 lines"
      noted += std::stoll(note[1]);
    }
    start_of_line = end_of_line + 1;
  }
  CHECK(noted == out.dropped_lines());
  CHECK(written + noted == 100'000 + ends);
}

TEST_CASE("closing after a stop waits only the grace period for a reader that never reads") {
  ProgressPipe pipe;
  ProgressOutput out(pipe.write_end,
                     {.capacity_bytes = size_t{1} << 20, .give_up_waiting = [] { return true; },
                      .grace = std::chrono::milliseconds(200)});
  const std::string line(1000, 'y');
  for (int i = 0; i < 200; ++i) out.stream() << line << '\n';  // 200 KB: more than the pipe holds
  const auto start = std::chrono::steady_clock::now();
  out.close();
  const double waited = progress_seconds_since(start);
  CHECK(waited >= 0.19);
  CHECK(waited < 30);
  CHECK(out.dropped_lines() == 0);
}

TEST_CASE("a stop that arrives while closing waits starts the grace period") {
  ProgressPipe pipe;
  std::atomic<bool> stopped{false};
  ProgressOutput out(pipe.write_end, {.give_up_waiting = [&] { return stopped.load(); },
                                      .grace = std::chrono::milliseconds(100)});
  const std::string line(1000, 'z');
  for (int i = 0; i < 200; ++i) out.stream() << line << '\n';
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stopped = true;
  });
  const auto start = std::chrono::steady_clock::now();
  out.close();
  stopper.join();
  CHECK(progress_seconds_since(start) >= 0.39);
}

TEST_CASE("a reader that closes its end ends the writing, not the caller nor the process") {
  ProgressPipe pipe;
  ::close(pipe.read_end);
  pipe.read_end = -1;
  // SIGPIPE keeps its default (death): the writer thread must take EPIPE instead.
  const bool default_action = std::signal(SIGPIPE, SIG_DFL) != SIG_ERR;
  REQUIRE(default_action);
  ProgressOutput out(pipe.write_end, {.give_up_waiting = [] { return false; }});
  for (int i = 0; i < 1000; ++i) out.stream() << "step " << i << '\n';
  out.close();  // EPIPE ends the thread's writing; close returns
  CHECK(out.dropped_lines() == 0);
}

TEST_CASE("the writer keeps a descriptor of its own: the caller may close theirs, and a bad one is refused") {
  ProgressPipe pipe;
  {
    ProgressOutput out(pipe.write_end, {.give_up_waiting = [] { return false; }});
    ::close(pipe.write_end);  // the lines still go out, through the writer's duplicate
    pipe.write_end = -1;
    for (int i = 0; i < 3; ++i) out.stream() << "step " << i << '\n';
    out.close();
  }
  CHECK(pipe.drain() == "step 0\nstep 1\nstep 2\n");
  CHECK_THROWS_WITH_AS(ProgressOutput(-1), doctest::Contains("cannot duplicate descriptor -1"), tessera::Error);
}

}  // TEST_SUITE
