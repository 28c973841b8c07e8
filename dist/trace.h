// Tracing: a thread-safe recorder of timed events per rank, written as a
// Chrome/Perfetto trace (JSON, open it in ui.perfetto.dev or chrome://tracing).
// Each rank is a process in the viewer and each track (the rank's compute
// thread, the communication thread of each group) a thread, so overlap of
// communication and computation is visible at a glance. Process groups record
// every collective; FSDP adds its phases with TraceSpan.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::dist {

class ProcessGroup;

struct TraceEvent {
  int rank = 0;
  std::string track;     // "compute", "comm:world", ...
  std::string name;      // "all_gather_into", "forward", ...
  std::string category;  // "collective", "fsdp", ...
  int64_t start_us = 0;  // Tracer::now_us() clock
  int64_t duration_us = 0;
  nlohmann::json args = nlohmann::json::object();
};

class Tracer {
 public:
  // Microseconds on a steady clock shared by every thread of the process.
  static int64_t now_us();

  void record(TraceEvent event);
  std::vector<TraceEvent> events() const;  // in recording order
  void clear();

  // The Chrome trace of every recorded event: {"traceEvents": [...]} with
  // "X" (complete) events, pid = rank, tid per track, and metadata events
  // naming each process "rank N" and each thread after its track.
  nlohmann::json chrome_trace() const;
  void write_chrome_trace(const std::string& path) const;

 private:
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

// Under one process per rank each rank holds its own Tracer: gathers every
// rank's events over `group` and writes one file on group rank 0 (collective).
void write_chrome_trace(const Tracer& tracer, ProcessGroup& group, const std::string& path);

// Records one event from construction to destruction; does nothing when
// `tracer` is null, so call sites need no branches.
class TraceSpan {
 public:
  TraceSpan(Tracer* tracer, int rank, std::string track, std::string name, std::string category,
            nlohmann::json args = nlohmann::json::object());
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  nlohmann::json& args() { return event_.args; }

 private:
  Tracer* tracer_;
  TraceEvent event_;
};

}  // namespace tessera::dist
