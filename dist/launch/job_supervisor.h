// dist::JobSupervisor: the launcher's side of the ranks' lifelines
// (dist/launch/lifeline.h). It listens for them, keeps one record per rank (where
// it runs, when it was last heard, how it ended) and turns what it hears
// into events a person can act on:
//   - a rank whose line closes with no result was killed, or its host died;
//   - a rank that reports a failure ended the job with that error;
//   - ranks that say they are stopping (a graceful stop on request) and
//     then end cleanly stopped: no failure;
//   - a rank silent past the heartbeat timeout is stopped, or its host or
//     link is down (silence alone never ends a job: a busy machine can
//     delay a heartbeat; it is reported, and cleared when the rank speaks);
//   - a host whose every rank is lost or silent, and where the trouble
//     began, is named as lost.
// The first failure by time is the job's root cause: the errors that follow
// it (other ranks' watchdogs, MPI's teardown) are its consequences.
// tools/launch runs one around mpirun or srun; tests drive it directly.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "dist/launch/tcp_socket.h"

namespace tessera::dist {

enum class RankState {
  running,  // said hello, no result yet
  silent,   // running, but not heard for longer than the heartbeat timeout
  done,     // dist::init returned
  stopped,  // said it was stopping on request, then dist::init returned
  exited,   // the process exited on its own before that
  failed,   // reported the error it ends the job with
  lost,     // its line closed with no result: killed, or its host went down
};
std::string_view rank_state_name(RankState state);

struct RankRecord {
  int rank = 0;
  int pid = 0;
  std::string host;
  RankState state = RankState::running;
  Clock::time_point last_heard;
  Clock::time_point ended;  // when its result came or its line closed
  std::string failure;      // a failed rank's message
  bool stopping = false;    // said "stopping": its graceful stop began
  // Its first silence: from its last beat before it, until it spoke again
  // (OpenMPI wakes a stopped rank with SIGCONT before it kills it).
  std::optional<Clock::time_point> silent_from, silent_until;
};

class JobSupervisor {
 public:
  // Listens on `port` (0: one the system picks); a rank not heard for
  // `heartbeat_timeout` turns silent.
  JobSupervisor(int port, std::chrono::milliseconds heartbeat_timeout);
  ~JobSupervisor();
  JobSupervisor(const JobSupervisor&) = delete;
  JobSupervisor& operator=(const JobSupervisor&) = delete;

  int port() const { return port_; }

  // Accepts lifelines and reads them for up to `wait`; returns the events
  // of that time, one line each ("rank 2 on host-b (pid 41): ...").
  std::vector<std::string> poll(std::chrono::milliseconds wait);

  // The world size the ranks announced (0 before any hello).
  int world_size() const { return world_size_; }
  const std::vector<RankRecord>& ranks() const { return ranks_; }
  // Lifelines open with no result yet (the ranks still running or silent).
  int open_lifelines() const;
  // Once the job has ended: reads what has arrived, then every rank still
  // open and not heard within
  // `quiet` turns silent (a cut link closes nothing), and hosts are checked
  // again; returns the events. Ranks heard within it stay running: their
  // processes may still be alive.
  std::vector<std::string> settle(std::chrono::milliseconds quiet);

  // Whether a rank failed or was lost: the job is over and must end.
  bool job_failed() const;
  // Whether every rank of the world has ended (each said hello, and its line
  // has a result or closed): what is left of the job is its launcher.
  bool every_rank_ended() const;
  // Whether every rank of the world stopped on request (RankState::stopped).
  bool job_stopped() const;
  // The earliest failure, loss or silence, as a sentence; empty when none.
  // A silence counts only while it lasted up to the first failure or loss:
  // one a busy machine caused and that ended before is no cause.
  std::string root_cause() const;
  // One line per host: its ranks and how each ended or stands.
  std::vector<std::string> summary() const;

 private:
  struct Connection;
  RankRecord* record_of(int rank);
  void accept_waiting(std::vector<std::string>& events);
  // Reads what a connection has; false once it has closed.
  bool read_from(Connection& connection, std::vector<std::string>& events);
  void handle_line(Connection& connection, const std::string& line, std::vector<std::string>& events);
  void end_connection(Connection& connection, std::vector<std::string>& events);
  // Running ranks not heard for `limit` turn silent.
  void check_silence(std::chrono::milliseconds limit, std::vector<std::string>& events);
  void check_hosts(std::vector<std::string>& events);
  // The job's earliest trouble: a failure, a loss or a silence that lasted
  // up to the first failure or loss (root_cause's rule).
  struct Trouble {
    const RankRecord* record;
    Clock::time_point when;
    bool silence;
  };
  std::optional<Trouble> first_trouble() const;
  std::string describe(const RankRecord& record) const;
  double seconds_since_start(Clock::time_point when) const;

  Socket listener_;
  int port_ = 0;
  std::chrono::milliseconds heartbeat_timeout_;
  Clock::time_point start_;
  std::vector<Connection> connections_;
  std::vector<RankRecord> ranks_;  // by hello order
  int world_size_ = 0;
  std::vector<std::string> hosts_named_lost_;
};

}  // namespace tessera::dist
