#include "train/progress_output.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <streambuf>
#include <string>
#include <thread>

#include "tensor/error.h"
#include "train/graceful_stop.h"

namespace tessera::train {

struct ProgressOutput::State {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> lines;
  size_t queued_bytes = 0;
  int64_t dropped = 0;         // in total
  int64_t unreported_drops = 0;  // not yet said in the output
  bool closing = false;
  bool writing = false;  // the thread holds a line it has not finished writing
  int fd = 1;
  size_t capacity = 0;

  void push(std::string line) {
    std::lock_guard lock(mutex);
    if (unreported_drops > 0) {
      std::string note = fmt::format("progress {} line{} dropped here: the output was not being read\n",
                                     unreported_drops, unreported_drops == 1 ? "" : "s");
      if (queued_bytes + note.size() + line.size() > capacity) {
        ++dropped;
        ++unreported_drops;
        return;
      }
      queued_bytes += note.size();
      lines.push_back(std::move(note));
      unreported_drops = 0;
    }
    if (queued_bytes + line.size() > capacity) {
      ++dropped;
      ++unreported_drops;
      return;
    }
    queued_bytes += line.size();
    lines.push_back(std::move(line));
    changed.notify_all();
  }

  // The thread: writes each line whole; a reader that closed the pipe ends it.
  void write_lines() {
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [&] { return closing || !lines.empty(); });
      if (lines.empty()) return;  // closing, and everything written
      std::string line = std::move(lines.front());
      lines.pop_front();
      writing = true;
      lock.unlock();
      const bool open = write_all(line);
      lock.lock();
      writing = false;
      queued_bytes -= line.size();
      changed.notify_all();
      if (!open) {
        lines.clear();
        queued_bytes = 0;
        fd = -1;
        changed.notify_all();
        return;
      }
    }
  }

  bool write_all(const std::string& line) const {
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;  // a stop signal: the line still goes out
      if (n <= 0) return false;               // EPIPE and the like: nobody reads any more
      done += static_cast<size_t>(n);
    }
    return true;
  }
};

// Collects characters until a line ends, then queues the line.
class ProgressOutput::Buffer : public std::streambuf {
 public:
  explicit Buffer(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Queues what is held (a line without its '\n' goes as it is).
  void flush_pending() {
    if (pending_.empty()) return;
    state_->push(std::move(pending_));
    pending_.clear();
  }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    put(traits_type::to_char_type(c));
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n; ++i) put(s[i]);
    return n;
  }
  int sync() override {
    flush_pending();
    return 0;
  }

 private:
  void put(char c) {
    pending_.push_back(c);
    if (c == '\n') flush_pending();
  }

  std::shared_ptr<State> state_;
  std::string pending_;
};

ProgressOutput::ProgressOutput(int fd) : ProgressOutput(fd, Options{}) {}

ProgressOutput::ProgressOutput(int fd, Options options) : state_(std::make_shared<State>()) {
  // The thread writes to a descriptor of its own: whoever closes `fd` then
  // never races a write still under way, and a number reused by a later
  // open() (a checkpoint's file) can never receive progress lines.
  const int own_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  TESSERA_CHECK(own_fd >= 0, "progress output: cannot duplicate descriptor {}: {}", fd, std::strerror(errno));
  state_->fd = own_fd;
  state_->capacity = options.capacity_bytes;
  buffer_ = std::make_unique<Buffer>(state_);
  stream_ = std::make_unique<std::ostream>(buffer_.get());
  give_up_waiting_ = options.give_up_waiting ? std::move(options.give_up_waiting)
                                             : std::function<bool()>([] { return GracefulStop::requested() != 0; });
  grace_ = options.grace;
  // Detached from the start: close() waits for it through the state, so
  // that it can also leave it blocked in a write nobody will read.
  std::thread([state = state_, own_fd] {
    // A reader that closed its end makes write(2) fail with EPIPE here
    // instead of raising SIGPIPE, whose default kills the whole process.
    sigset_t pipe_signal;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
    state->write_lines();
    ::close(own_fd);
  }).detach();
}

ProgressOutput::~ProgressOutput() { close(); }

std::ostream& ProgressOutput::stream() { return *stream_; }

void ProgressOutput::close() {
  if (closed_) return;
  closed_ = true;
  buffer_->flush_pending();
  std::unique_lock lock(state_->mutex);
  state_->closing = true;
  state_->changed.notify_all();
  const auto written = [&] { return state_->fd < 0 || (state_->lines.empty() && !state_->writing); };
  std::optional<std::chrono::steady_clock::time_point> deadline;
  while (!written()) {
    const auto now = std::chrono::steady_clock::now();
    if (!deadline && give_up_waiting_()) deadline = now + grace_;
    if (deadline && now >= *deadline) return;  // the thread stays in its write; the exit ends it
    state_->changed.wait_for(lock, std::chrono::milliseconds(50));
  }
}

int64_t ProgressOutput::dropped_lines() const {
  std::lock_guard lock(state_->mutex);
  return state_->dropped;
}

}  // namespace tessera::train
