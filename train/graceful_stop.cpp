// The stop signals' handler: a flag on the first; an immediate exit on a SIGINT after it.
#include "train/graceful_stop.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iterator>

#include "tensor/error.h"

namespace tessera::train {

namespace {

std::atomic<int> g_requested{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");
std::atomic<bool> g_installed{false};
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
struct sigaction g_previous[std::size(kStopSignals)] {};
struct sigaction g_previous_pipe {};

// Only async-signal-safe calls here: write(2) and _exit(2).
void write_message(const char* text) {
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text, std::strlen(text));
}

void on_signal(int signal) {
  int expected = 0;
  if (g_requested.compare_exchange_strong(expected, signal)) {
    write_message("\ntrain: ");
    write_message(signal_name(signal));
    write_message(": stopping after the current micro-batch, saving the last finished step (SIGINT, Ctrl-C, exits "
                  "at once)\n");
    return;
  }
  if (signal == SIGINT) {
    write_message("train: SIGINT while stopping: exiting now\n");
    ::_exit(128 + signal);
  }
  write_message("train: ");
  write_message(signal_name(signal));
  write_message(": already stopping (SIGINT exits at once)\n");
}

}  // namespace

GracefulStop::GracefulStop() {
  TESSERA_CHECK(!g_installed.exchange(true), "GracefulStop: already installed in this process");
  g_requested = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight carry on
  for (size_t index = 0; index < std::size(kStopSignals); ++index) {
    ::sigaction(kStopSignals[index], &action, &g_previous[index]);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &g_previous_pipe);
}

GracefulStop::~GracefulStop() {
  for (size_t index = 0; index < std::size(kStopSignals); ++index) {
    ::sigaction(kStopSignals[index], &g_previous[index], nullptr);
  }
  ::sigaction(SIGPIPE, &g_previous_pipe, nullptr);
  g_requested = 0;
  g_installed = false;
}

int GracefulStop::requested() { return g_requested.load(); }

// Async-signal-safe: the handler calls it.
const char* signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGHUP) return "SIGHUP";
  if (signal == SIGUSR1) return "SIGUSR1";
  return "a signal";
}

}  // namespace tessera::train
