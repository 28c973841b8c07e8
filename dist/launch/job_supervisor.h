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
//
// Any process that reaches the port can connect, so nothing a connection says
// counts until its hello presents the job secret, and then only a hello that
// fits the job: a rank inside the world, the world size of the first accepted
// hello (the launcher cannot always read it from the command), one connection
// per rank. Anything else is closed without effect on the job, with one log
// line for a stranger's (a few more for what the job's own processes got wrong)
// and after that a count at most every 10 s. What a peer can make it hold is
// bounded: kMaxPendingConnections connections before their hello (the rest wait
// in the kernel's backlog) for at most the hello timeout, one per rank after
// it, a world of at most kMaxWorldSize, lines of at most kMaxHelloBytes before
// the hello and kMaxLineBytes after it; the summary walks the records it has,
// never a number a peer sent. When accept fails for want of descriptors
// (EMFILE, ENFILE) it stops accepting for a second instead of spinning.
// tools/launch runs one around mpirun or srun; tests drive it directly.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
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

struct JobSupervisorOptions {
  // Where the lifelines connect: an address of this host ("127.0.0.1" for a
  // job on this host alone, kEveryInterface for all of them) and a port (0:
  // one the system picks).
  std::string address = "127.0.0.1";
  int port = 0;
  // What every hello must present (dist/launch/job_secret.h).
  std::string job_secret;
  // A rank not heard for this long turns silent.
  std::chrono::milliseconds heartbeat_timeout{10'000};
  // A connection with no accepted hello after this long is closed.
  std::chrono::milliseconds hello_timeout{10'000};
};

class JobSupervisor {
 public:
  // The bounds on what a peer can make the supervisor hold.
  static constexpr int kMaxPendingConnections = 64;
  static constexpr int kMaxWorldSize = 1 << 16;
  static constexpr size_t kMaxHelloBytes = 1024;
  static constexpr size_t kMaxLineBytes = 64 * 1024;

  // Listens where `options` say; an address or port it cannot have, or a
  // secret that cannot travel in a hello line, is an Error naming it.
  explicit JobSupervisor(JobSupervisorOptions options);
  ~JobSupervisor();
  JobSupervisor(const JobSupervisor&) = delete;
  JobSupervisor& operator=(const JobSupervisor&) = delete;

  int port() const { return port_; }
  // Connections held now, accepted hello or not.
  int connections() const;

  // Accepts lifelines and reads them for up to `wait`; returns the events
  // of that time, one line each ("rank 2 on host-b (pid 41): ...").
  std::vector<std::string> poll(std::chrono::milliseconds wait);

  // The world size the first accepted hello announced (0 before it).
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
  // One line per host: its ranks and how each ended or stands; then the
  // ranks never heard from, and what was refused, if anything.
  std::vector<std::string> summary() const;

 private:
  struct Connection;
  // Refusals and failures of one kind, which a peer can repeat at will.
  struct Repeats {
    int64_t total = 0;
    int64_t unreported = 0;
    Clock::time_point last_report;
  };
  RankRecord& record_of(const Connection& connection);
  int pending_connections() const;
  // Whether to poll the listener: not while accepting is paused, nor with
  // the pending connections at their bound.
  bool accepting(Clock::time_point now) const;
  void accept_waiting(std::vector<std::string>& events);
  // Reads what a connection has; false once it has closed or is refused.
  bool read_from(Connection& connection, std::vector<std::string>& events);
  // Handles one line; false when the connection is refused.
  bool handle_line(Connection& connection, const std::string& line, std::vector<std::string>& events);
  bool accept_hello(Connection& connection, const std::string& line, std::vector<std::string>& events);
  void close_overdue_hellos(std::vector<std::string>& events);
  // The first `in_full` of a `kind` are reported as their `message`; later
  // ones are counted, and the count reported at most every 10 s.
  void report_repeating(const std::string& kind, const std::string& message, int in_full,
                        std::vector<std::string>& events);
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

  JobSupervisorOptions options_;
  Socket listener_;
  int port_ = 0;
  Clock::time_point start_;
  Clock::time_point accepting_paused_until_;
  std::vector<Connection> connections_;
  std::vector<RankRecord> ranks_;       // by hello order
  std::map<int, size_t> record_index_;  // rank -> its place in ranks_
  int world_size_ = 0;
  std::vector<std::string> hosts_named_lost_;
  std::map<std::string, Repeats> repeats_;  // by kind
};

}  // namespace tessera::dist
