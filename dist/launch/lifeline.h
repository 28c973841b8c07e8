// dist::Lifeline: a rank process's line to the tessera launcher that
// supervises its job (tools/launch, dist/launch/job_supervisor.h). The launcher
// learns from it which rank runs where, and how each one ended:
//   hello   once: world rank, world size, pid and host name;
//   beat    every interval from a thread of its own, so that a stopped
//           process or a host that went silent shows as silence;
//   failed  the error a rank ends the job with (sent before MPI_Abort);
//   stopping  the rank is ending the job on request (train's graceful stop:
//           it saves its last finished step, then ends cleanly);
//   done    a clean end of dist::init;
//   exited  the process exited on its own before that (std::exit in a rank).
// A lifeline that closes with no result is a process that was killed, or
// whose host went down: the kernel closes a dead process's sockets, so the
// launcher hears of a death at once and can name it.
//
// The wire format is one text line per message: "hello <secret> <rank>
// <world size> <pid> <host>", "beat", "failed <text>", "stopping", "done",
// "exited". The secret (TESSERA_JOB_SECRET, dist/launch/job_secret.h) comes
// first: the launcher reads nothing else from a connection that does not
// present it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "dist/launch/launch_environment.h"
#include "dist/launch/tcp_socket.h"

namespace tessera::dist {

// The variable a launcher sets to host:port; ranks started with it open a lifeline.
inline constexpr const char* kLauncherVariable = "TESSERA_LAUNCHER";

struct LifelineIdentity {
  int rank = 0;
  int world_size = 1;
  int pid = 0;
  std::string host;
};

class Lifeline {
 public:
  // Connects to `endpoint` ("host:port", "[v6]:port") within `connect_timeout`
  // and says hello with `job_secret`; a connect that fails is an Error
  // naming the endpoint.
  Lifeline(const std::string& endpoint, const std::string& job_secret, LifelineIdentity identity,
           std::chrono::milliseconds heartbeat_interval, std::chrono::milliseconds connect_timeout);
  // Stops the heartbeat and closes the line, saying "exited" if no result
  // was sent (a killed process never gets here: its line just closes).
  ~Lifeline();
  Lifeline(const Lifeline&) = delete;
  Lifeline& operator=(const Lifeline&) = delete;

  // The rank's error (newlines become " | "); the line stays open, beating,
  // until the process ends. Only the first result is sent.
  void report_failure(std::string_view message);
  // The rank is stopping on request; sent once, and only before a result.
  void report_stopping();
  // A clean end: the heartbeat stops and the line closes.
  void report_done();

 private:
  // Sends one line within a second; false (and the line given up) on failure:
  // a launcher that went away must not stall a rank.
  bool send_line(const std::string& line);
  bool send_locked(const std::string& line);  // send_mutex_ held
  void beat_until_stopped(std::chrono::milliseconds interval);
  void stop_heartbeat();

  std::mutex send_mutex_;
  Socket socket_;
  bool result_sent_ = false;
  bool stopping_sent_ = false;
  std::mutex stop_mutex_;
  std::condition_variable stop_signal_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

// "host:port" or "[v6 address]:port" into its parts; malformed is an Error
// naming `variable` and the value.
std::pair<std::string, int> parse_endpoint(std::string_view value, std::string_view variable);

// This process's lifeline: dist::init opens it for a rank of a multi-process
// job when TESSERA_LAUNCHER is set, presenting TESSERA_JOB_SECRET (the
// launcher sets both: one without the other is an Error naming them), with
// a heartbeat every second; once, for a process that joins several jobs in
// turn. The reports below go to it; without one they do nothing. A failure is sent at once (the job is about
// to be aborted); a clean end of dist::init is sent as "done" when the
// process exits, and a later dist::init takes it back.
void open_process_lifeline(int rank, int world_size, const EnvironmentLookup& environment = process_environment);
void report_failure_to_launcher(std::string_view message);
void report_stopping_to_launcher();
void report_clean_end_to_launcher();

}  // namespace tessera::dist
