// Tracing: the event recorder and its Chrome trace writer, for one process
// and (gathered over a process group) for a job of one process per rank.
// Format: the Trace Event Format's "X" (complete) and "M" (metadata) events.
#include "dist/trace.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "dist/process_group.h"
#include "tensor/error.h"

namespace tessera::dist {

namespace {

// The process-wide epoch of now_us(), fixed on first use, with the wall-clock
// time of that same instant so that traces of several processes line up.
struct Epoch {
  std::chrono::steady_clock::time_point steady = std::chrono::steady_clock::now();
  int64_t unix_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
};

const Epoch& epoch() {
  static const Epoch instance;
  return instance;
}

// Thread ids of one rank's tracks: "compute" first, the rest by name, from 1
// (Perfetto merges tid 0 into other threads in some versions).
std::map<std::string, int> track_ids(const std::set<std::string>& tracks) {
  std::map<std::string, int> ids;
  int next = 1;
  if (tracks.count("compute") == 1) ids["compute"] = next++;
  for (const std::string& track : tracks) {
    if (track != "compute") ids[track] = next++;
  }
  return ids;
}

nlohmann::json chrome_trace_of(const std::vector<TraceEvent>& events) {
  std::map<int, std::set<std::string>> tracks_by_rank;
  for (const TraceEvent& event : events) tracks_by_rank[event.rank].insert(event.track);
  std::map<int, std::map<std::string, int>> tids;
  for (const auto& [rank, tracks] : tracks_by_rank) tids[rank] = track_ids(tracks);

  nlohmann::json trace_events = nlohmann::json::array();
  for (const auto& [rank, ids] : tids) {
    trace_events.push_back(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
    trace_events.push_back(
        {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
    for (const auto& [track, tid] : ids) {
      trace_events.push_back(
          {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", track}}}});
      trace_events.push_back(
          {{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
    }
  }
  for (const TraceEvent& event : events) {
    trace_events.push_back({{"ph", "X"},
                            {"name", event.name},
                            {"cat", event.category},
                            {"ts", event.start_us},
                            {"dur", event.duration_us},
                            {"pid", event.rank},
                            {"tid", tids[event.rank][event.track]},
                            {"args", event.args}});
  }
  return {{"traceEvents", std::move(trace_events)}, {"displayTimeUnit", "ms"}};
}

void write_json(const nlohmann::json& trace, const std::string& path) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) fail("write_chrome_trace: cannot open '{}' for writing: {}", path, std::strerror(errno));
  file << trace.dump();
  file.close();
  if (!file) fail("write_chrome_trace: writing '{}' failed: {}", path, std::strerror(errno));
}

// The wire form of one rank's events for write_chrome_trace over a group.
std::vector<uint8_t> serialise(const std::vector<TraceEvent>& events) {
  nlohmann::json rows = nlohmann::json::array();
  for (const TraceEvent& event : events) {
    rows.push_back(
        {event.rank, event.track, event.name, event.category, event.start_us, event.duration_us, event.args});
  }
  return nlohmann::json::to_cbor({{"epoch_unix_us", epoch().unix_us}, {"events", std::move(rows)}});
}

// Appends one rank's events, moved onto the receiving process's clock.
void deserialise_into(std::vector<TraceEvent>& events, const std::vector<uint8_t>& bytes) {
  const nlohmann::json message = nlohmann::json::from_cbor(bytes);
  const int64_t shift_us = message.at("epoch_unix_us").get<int64_t>() - epoch().unix_us;
  for (const nlohmann::json& row : message.at("events")) {
    events.push_back({row.at(0).get<int>(), row.at(1).get<std::string>(), row.at(2).get<std::string>(),
                      row.at(3).get<std::string>(), row.at(4).get<int64_t>() + shift_us, row.at(5).get<int64_t>(),
                      row.at(6)});
  }
}

}  // namespace

int64_t Tracer::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - epoch().steady)
      .count();
}

void Tracer::record(TraceEvent event) {
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(event));
}

std::vector<TraceEvent> Tracer::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

void Tracer::clear() {
  std::lock_guard lock(mutex_);
  events_.clear();
}

nlohmann::json Tracer::chrome_trace() const { return chrome_trace_of(events()); }

void Tracer::write_chrome_trace(const std::string& path) const { write_json(chrome_trace(), path); }

// "This rank's events" are those recorded under the caller's world rank, so a
// Tracer shared by the threads of run_local is not written once per rank.
void write_chrome_trace(const Tracer& tracer, ProcessGroup& group, const std::string& path) {
  const int world_rank = group.world_ranks()[static_cast<size_t>(group.rank())];
  std::vector<TraceEvent> mine = tracer.events();
  std::erase_if(mine, [&](const TraceEvent& event) { return event.rank != world_rank; });
  const std::vector<std::vector<uint8_t>> gathered = group.all_gather_bytes(serialise(mine));
  if (group.rank() != 0) return;
  std::vector<TraceEvent> all;
  for (const std::vector<uint8_t>& bytes : gathered) deserialise_into(all, bytes);
  write_json(chrome_trace_of(all), path);
}

TraceSpan::TraceSpan(Tracer* tracer, int rank, std::string track, std::string name, std::string category,
                     nlohmann::json args)
    : tracer_(tracer) {
  if (tracer_ == nullptr) return;
  event_ = {rank, std::move(track), std::move(name), std::move(category), Tracer::now_us(), 0, std::move(args)};
}

TraceSpan::~TraceSpan() {
  if (tracer_ == nullptr) return;
  event_.duration_us = Tracer::now_us() - event_.start_us;
  try {
    tracer_->record(std::move(event_));
  } catch (...) {
    // Out of memory while recording: a lost trace event must not end the program.
  }
}

}  // namespace tessera::dist
