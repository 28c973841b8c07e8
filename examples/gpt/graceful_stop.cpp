// SIGINT / SIGTERM handlers: a flag on the first, an immediate exit on the second.
#include "examples/gpt/graceful_stop.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "tensor/error.h"

namespace gpt {

namespace {

std::atomic<int> g_requested{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");
std::atomic<bool> g_installed{false};
struct sigaction g_previous_int {};
struct sigaction g_previous_term {};

// Only async-signal-safe calls here: write(2) and _exit(2).
void write_message(const char* text) {
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text, std::strlen(text));
}

void on_signal(int signal) {
  int expected = 0;
  if (g_requested.compare_exchange_strong(expected, signal)) {
    write_message(signal == SIGINT ? "\ntrain: SIGINT: stopping after the current step (send it again to exit at once)\n"
                                   : "\ntrain: SIGTERM: stopping after the current step (send it again to exit at once)\n");
    return;
  }
  write_message(signal == SIGINT ? "train: second SIGINT: exiting now\n" : "train: second SIGTERM: exiting now\n");
  ::_exit(128 + signal);
}

}  // namespace

GracefulStop::GracefulStop() {
  TESSERA_CHECK(!g_installed.exchange(true), "GracefulStop: already installed in this process");
  g_requested = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight carry on
  ::sigaction(SIGINT, &action, &g_previous_int);
  ::sigaction(SIGTERM, &action, &g_previous_term);
}

GracefulStop::~GracefulStop() {
  ::sigaction(SIGINT, &g_previous_int, nullptr);
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
  g_requested = 0;
  g_installed = false;
}

int GracefulStop::requested() { return g_requested.load(); }

const char* signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  return "a signal";
}

}  // namespace gpt
