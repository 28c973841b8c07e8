// Accounting and tracing: the per-kind volumes and their summary, the Chrome
// trace a Tracer writes (structure, pid/tid mapping, metadata), and what a
// process group records on the local backend: one event and the right byte
// counts per collective, and async collectives that overlap compute.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "dist/backends/local_backend.h"
#include "dist/comm_stats.h"
#include "dist/trace.h"
#include "tensor/ops.h"

using namespace tessera;
using namespace tessera::dist;
using nlohmann::json;

namespace {

TraceEvent event_of(int rank, std::string track, std::string name, int64_t start_us, int64_t duration_us) {
  return {rank, std::move(track), std::move(name), "test", start_us, duration_us, json::object()};
}

std::vector<json> events_with_phase(const json& trace, const std::string& phase) {
  std::vector<json> found;
  for (const json& event : trace.at("traceEvents")) {
    if (event.at("ph") == phase) found.push_back(event);
  }
  return found;
}

// The metadata value of `name` ("thread_name", "thread_sort_index", ...) for (pid, tid).
json metadata(const json& trace, const std::string& name, int pid, int tid = -1) {
  for (const json& event : events_with_phase(trace, "M")) {
    if (event.at("name") != name || event.at("pid") != pid) continue;
    if (tid >= 0 && event.at("tid") != tid) continue;
    return event.at("args");
  }
  return nullptr;
}

std::filesystem::path temporary_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         fmt::format("tessera_{}_{}_{}", name, ::getpid(), std::chrono::steady_clock::now().time_since_epoch().count());
}

json read_json(const std::filesystem::path& path) {
  std::ifstream file(path);
  return json::parse(file);
}

LocalOptions traced_options() {
  LocalOptions options;
  options.group.timeout = std::chrono::seconds(2);
  return options;
}

// Waits (bounded) until `flag` is set by another rank thread.
bool wait_for(const std::atomic<bool>& flag) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace

TEST_CASE("collective names") {
  CHECK(collective_name(CollectiveKind::all_gather) == "all_gather_into");
  CHECK(collective_name(CollectiveKind::reduce_scatter) == "reduce_scatter_into");
  CHECK(collective_name(CollectiveKind::all_reduce) == "all_reduce");
  CHECK(collective_name(CollectiveKind::broadcast) == "broadcast");
  CHECK(collective_name(CollectiveKind::barrier) == "barrier");
  CHECK(collective_name(CollectiveKind::all_gather_bytes) == "all_gather_bytes");
}

TEST_CASE("collective volumes follow the bandwidth-optimal formulas") {
  // All-gather and reduce-scatter of a 100-byte chunk over 4 ranks: 3 chunks each way.
  CHECK(collective_volume(CollectiveKind::all_gather, 100, 4, false).sent == 300);
  CHECK(collective_volume(CollectiveKind::all_gather, 100, 4, false).received == 300);
  CHECK(collective_volume(CollectiveKind::reduce_scatter, 100, 4, false).sent == 300);
  CHECK(collective_volume(CollectiveKind::reduce_scatter, 100, 4, false).received == 300);
  CHECK(collective_volume(CollectiveKind::all_gather_bytes, 16, 3, false).sent == 32);
  // All-reduce of 400 bytes over 4 ranks: 2 * 3/4 * 400 = 600 each way.
  CHECK(collective_volume(CollectiveKind::all_reduce, 400, 4, false).sent == 600);
  CHECK(collective_volume(CollectiveKind::all_reduce, 400, 4, false).received == 600);
  // Broadcast: the root sends the tensor once, every other rank receives it.
  CHECK(collective_volume(CollectiveKind::broadcast, 400, 4, true).sent == 400);
  CHECK(collective_volume(CollectiveKind::broadcast, 400, 4, true).received == 0);
  CHECK(collective_volume(CollectiveKind::broadcast, 400, 4, false).sent == 0);
  CHECK(collective_volume(CollectiveKind::broadcast, 400, 4, false).received == 400);
  CHECK(collective_volume(CollectiveKind::barrier, 0, 4, false).sent == 0);
  // A group of one moves nothing.
  for (CollectiveKind kind : {CollectiveKind::all_gather, CollectiveKind::all_reduce, CollectiveKind::broadcast}) {
    CHECK(collective_volume(kind, 400, 1, true).sent == 0);
    CHECK(collective_volume(kind, 400, 1, true).received == 0);
  }
  CHECK_THROWS_WITH_AS(collective_volume(CollectiveKind::all_gather, -1, 4, false),
                       "collective_volume: bytes must be >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(collective_volume(CollectiveKind::all_gather, 8, 0, false),
                       "collective_volume: group size must be >= 1, got 0", Error);
}

TEST_CASE("CommStats: total sums every kind; to_string has one line per kind called") {
  CommStats stats;
  CHECK(stats.to_string().empty());
  stats[CollectiveKind::all_gather] = {12, 3 * 1024 * 1024, 3 * 1024 * 1024, 0.0041};
  stats[CollectiveKind::barrier] = {1, 0, 0, 0.00025};
  stats[CollectiveKind::broadcast] = {2, 512, 1536, 0.5};
  const CollectiveStats total = stats.total();
  CHECK(total.calls == 15);
  CHECK(total.bytes_sent == 3 * 1024 * 1024 + 512);
  CHECK(total.bytes_received == 3 * 1024 * 1024 + 1536);
  CHECK(total.seconds == doctest::Approx(0.50435));  // a sum of three doubles: rounding only
  CHECK(stats.to_string() ==
        "all_gather_into: 12 calls, 3.0 MiB sent, 3.0 MiB received, 4.1 ms\n"
        "broadcast: 2 calls, 512 B sent, 1.5 KiB received, 500.0 ms\n"
        "barrier: 1 call, 0 B sent, 0 B received, 0.250 ms\n");
  stats[CollectiveKind::all_reduce] = {1, int64_t{5} << 30, int64_t{5} << 30, 2.0};
  CHECK(stats.to_string().find("all_reduce: 1 call, 5.0 GiB sent, 5.0 GiB received, 2000.0 ms\n") != std::string::npos);
}

TEST_CASE("Tracer: now_us is steady, record keeps order, clear empties") {
  const int64_t first = Tracer::now_us();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const int64_t second = Tracer::now_us();
  CHECK(second - first >= 2000);
  CHECK(first >= 0);

  Tracer tracer;
  tracer.record(event_of(0, "compute", "forward", 10, 5));
  tracer.record(event_of(1, "comm:world", "all_gather_into", 12, 3));
  const std::vector<TraceEvent> events = tracer.events();
  REQUIRE(events.size() == 2);
  CHECK(events[0].name == "forward");
  CHECK(events[1].rank == 1);
  CHECK(events[1].start_us == 12);
  CHECK(events[1].duration_us == 3);
  tracer.clear();
  CHECK(tracer.events().empty());
  CHECK(events_with_phase(tracer.chrome_trace(), "X").empty());
}

TEST_CASE("Tracer: Chrome trace structure, pid = rank, tids per track with compute first, metadata") {
  Tracer tracer;
  tracer.record(event_of(0, "comm:world", "all_gather_into", 100, 40));
  tracer.record(event_of(0, "compute", "forward", 90, 200));
  tracer.record(event_of(0, "comm:world", "reduce_scatter_into", 300, 50));
  tracer.record(event_of(2, "fsdp", "unshard", 5, 1));
  tracer.record(event_of(2, "comm:shard", "all_gather_into", 7, 2));
  TraceEvent with_args = event_of(2, "compute", "backward", 400, 30);
  with_args.category = "fsdp";
  with_args.args = {{"bytes", 4096}, {"group", "world"}};
  tracer.record(with_args);

  const json trace = tracer.chrome_trace();
  CHECK(trace.at("displayTimeUnit") == "ms");
  const std::vector<json> complete = events_with_phase(trace, "X");
  REQUIRE(complete.size() == 6);
  // In recording order, with the fields a viewer needs.
  CHECK(complete[0] == json{{"ph", "X"},
                            {"name", "all_gather_into"},
                            {"cat", "test"},
                            {"ts", 100},
                            {"dur", 40},
                            {"pid", 0},
                            {"tid", 2},
                            {"args", json::object()}});
  CHECK(complete[5].at("cat") == "fsdp");
  CHECK(complete[5].at("args") == json{{"bytes", 4096}, {"group", "world"}});

  // Rank 0: compute = 1, comm:world = 2. Rank 2: compute = 1, then by name: comm:shard = 2, fsdp = 3.
  std::map<std::pair<int, std::string>, int> tid_of;
  for (const json& event : complete) {
    tid_of[{event.at("pid").get<int>(), event.at("name").get<std::string>()}] = event.at("tid").get<int>();
  }
  CHECK(tid_of[{0, "forward"}] == 1);
  CHECK(tid_of[{0, "reduce_scatter_into"}] == 2);
  CHECK(tid_of[{2, "backward"}] == 1);
  CHECK(tid_of[{2, "all_gather_into"}] == 2);
  CHECK(tid_of[{2, "unshard"}] == 3);

  CHECK(metadata(trace, "process_name", 0) == json{{"name", "rank 0"}});
  CHECK(metadata(trace, "process_name", 2) == json{{"name", "rank 2"}});
  CHECK(metadata(trace, "process_name", 1).is_null());  // rank 1 recorded nothing
  CHECK(metadata(trace, "process_sort_index", 2) == json{{"sort_index", 2}});
  CHECK(metadata(trace, "thread_name", 0, 1) == json{{"name", "compute"}});
  CHECK(metadata(trace, "thread_name", 0, 2) == json{{"name", "comm:world"}});
  CHECK(metadata(trace, "thread_name", 2, 2) == json{{"name", "comm:shard"}});
  CHECK(metadata(trace, "thread_name", 2, 3) == json{{"name", "fsdp"}});
  CHECK(metadata(trace, "thread_sort_index", 2, 3) == json{{"sort_index", 3}});
  CHECK(events_with_phase(trace, "M").size() == 2 * 2 + 2 * (2 + 3));
}

TEST_CASE("Tracer: threads recording at once lose nothing and keep each thread's order") {
  Tracer tracer;
  constexpr int kThreads = 8, kEvents = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&tracer, t] {
      for (int i = 0; i < kEvents; ++i) tracer.record(event_of(t, "compute", "step", i, 1));
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::vector<TraceEvent> events = tracer.events();
  REQUIRE(events.size() == size_t{kThreads} * kEvents);
  std::vector<int64_t> next(kThreads, 0);
  bool in_order = true;
  for (const TraceEvent& event : events) in_order = in_order && event.start_us == next[event.rank]++;
  CHECK(in_order);
  CHECK(next == std::vector<int64_t>(kThreads, kEvents));
  CHECK(events_with_phase(tracer.chrome_trace(), "X").size() == size_t{kThreads} * kEvents);
}

TEST_CASE("Tracer: write_chrome_trace writes the trace; an unwritable path is named in the error") {
  Tracer tracer;
  tracer.record(event_of(3, "compute", "forward \"quoted\"", 1, 2));
  const std::filesystem::path path = temporary_path("trace.json");
  tracer.write_chrome_trace(path.string());
  CHECK(read_json(path) == tracer.chrome_trace());
  std::filesystem::remove(path);

  const std::string bad = "/nonexistent-tessera-dir/trace.json";
  CHECK_THROWS_WITH_AS(tracer.write_chrome_trace(bad),
                       doctest::Contains("write_chrome_trace: cannot open '/nonexistent-tessera-dir/trace.json'"),
                       Error);
}

TEST_CASE("TraceSpan records its lifetime with args; a null tracer records nothing") {
  Tracer tracer;
  const int64_t before = Tracer::now_us();
  {
    TraceSpan span(&tracer, 1, "compute", "forward", "fsdp", {{"layer", 3}});
    span.args()["tokens"] = 256;
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  const int64_t after = Tracer::now_us();
  const std::vector<TraceEvent> events = tracer.events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].rank == 1);
  CHECK(events[0].track == "compute");
  CHECK(events[0].name == "forward");
  CHECK(events[0].category == "fsdp");
  CHECK(events[0].args == json{{"layer", 3}, {"tokens", 256}});
  CHECK(events[0].start_us >= before);
  CHECK(events[0].duration_us >= 3000);
  CHECK(events[0].start_us + events[0].duration_us <= after);

  TraceSpan nothing(nullptr, 0, "compute", "forward", "fsdp");
  nothing.args()["ignored"] = true;  // still a valid object to write into
  CHECK(nothing.args().at("ignored") == true);
}

TEST_CASE("local: a traced group records one event per collective on its comm track, with sizes") {
  auto tracer = std::make_shared<Tracer>();
  run_local(
      3,
      [&](const ProcessGroupPtr& world) {
        world->set_tracer(tracer);
        const Tensor in = ops::full({8}, world->rank());
        const Tensor out = ops::empty({24});
        world->all_gather_into(out, in);
        Tensor sum = ops::ones({6});
        world->all_reduce(sum);
        world->barrier();
      },
      traced_options());
  const std::vector<TraceEvent> events = tracer->events();
  REQUIRE(events.size() == 9);
  std::map<int, std::vector<TraceEvent>> by_rank;
  for (const TraceEvent& event : events) by_rank[event.rank].push_back(event);
  REQUIRE(by_rank.size() == 3);
  for (const auto& [rank, mine] : by_rank) {
    CAPTURE(rank);
    REQUIRE(mine.size() == 3);
    CHECK(mine[0].name == "all_gather_into");
    CHECK(mine[1].name == "all_reduce");
    CHECK(mine[2].name == "barrier");
    for (const TraceEvent& event : mine) {
      CHECK(event.track == "comm:world");
      CHECK(event.category == "collective");
      CHECK(event.duration_us >= 0);
    }
    // all-gather of a 32-byte chunk over 3 ranks: 64 bytes each way.
    CHECK(mine[0].args.at("bytes") == 32);
    CHECK(mine[0].args.at("bytes_sent") == 64);
    CHECK(mine[0].args.at("bytes_received") == 64);
    CHECK(mine[0].args.at("dtype") == "f32");
    CHECK(mine[0].args.at("group") == "world");
    CHECK(mine[0].args.at("sequence") == 0);
    // all-reduce of 24 bytes over 3 ranks: 2 * 2/3 * 24 = 32 each way.
    CHECK(mine[1].args.at("bytes") == 24);
    CHECK(mine[1].args.at("bytes_sent") == 32);
    CHECK(mine[1].args.at("sequence") == 1);
    CHECK(mine[2].args.at("sequence") == 2);
    // Collectives of one rank run one after the other on its comm thread.
    CHECK(mine[0].start_us + mine[0].duration_us <= mine[1].start_us);
  }
}

TEST_CASE("local: stats count calls and bytes per kind; reset_stats zeroes them") {
  std::vector<CommStats> stats(4), after_reset(4);
  run_local(
      4,
      [&](const ProcessGroupPtr& world) {
        const int rank = world->rank();
        // All-gather: chunk 8 f32 = 32 B. Reduce-scatter: chunk 4 f64 = 32 B.
        // All-reduce: 10 f32 = 40 B. Broadcast from rank 1: 12 i64 = 96 B. Metadata: 16 B.
        world->all_gather_into(ops::empty({32}), ops::ones({8}));
        world->all_gather_into(ops::empty({32}), ops::ones({8}));
        world->reduce_scatter_into(ops::empty({4}, {.dtype = DType::f64}), ops::ones({16}, {.dtype = DType::f64}));
        world->all_reduce(ops::ones({10}));
        world->broadcast(ops::zeros({12}, {.dtype = DType::i64}), 1);
        world->barrier();
        world->all_gather_bytes(std::vector<uint8_t>(16, static_cast<uint8_t>(rank)));
        stats[static_cast<size_t>(rank)] = world->stats();
        world->reset_stats();
        after_reset[static_cast<size_t>(rank)] = world->stats();
      },
      traced_options());
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    const CommStats& mine = stats[static_cast<size_t>(rank)];
    CHECK(mine[CollectiveKind::all_gather].calls == 2);
    CHECK(mine[CollectiveKind::all_gather].bytes_sent == 2 * 3 * 32);
    CHECK(mine[CollectiveKind::all_gather].bytes_received == 2 * 3 * 32);
    CHECK(mine[CollectiveKind::reduce_scatter].calls == 1);
    CHECK(mine[CollectiveKind::reduce_scatter].bytes_sent == 3 * 32);
    CHECK(mine[CollectiveKind::reduce_scatter].bytes_received == 3 * 32);
    CHECK(mine[CollectiveKind::all_reduce].calls == 1);
    CHECK(mine[CollectiveKind::all_reduce].bytes_sent == 60);
    CHECK(mine[CollectiveKind::all_reduce].bytes_received == 60);
    CHECK(mine[CollectiveKind::broadcast].calls == 1);
    CHECK(mine[CollectiveKind::broadcast].bytes_sent == (rank == 1 ? 96 : 0));
    CHECK(mine[CollectiveKind::broadcast].bytes_received == (rank == 1 ? 0 : 96));
    CHECK(mine[CollectiveKind::barrier].calls == 1);
    CHECK(mine[CollectiveKind::barrier].bytes_sent == 0);
    CHECK(mine[CollectiveKind::all_gather_bytes].calls == 1);
    CHECK(mine[CollectiveKind::all_gather_bytes].bytes_sent == 3 * 16);
    CHECK(mine.total().calls == 7);
    CHECK(mine.total().seconds > 0);
    CHECK(mine.to_string().find("all_gather_into: 2 calls, 192 B sent, 192 B received") == 0);
    CHECK(after_reset[static_cast<size_t>(rank)].total().calls == 0);
    CHECK(after_reset[static_cast<size_t>(rank)].total().bytes_sent == 0);
    CHECK(after_reset[static_cast<size_t>(rank)].total().seconds == 0);
  }
}

TEST_CASE("local: an async all-gather issued before a compute span overlaps it in the trace") {
  // Rank 0 issues the all-gather, then computes; rank 1 joins the all-gather
  // only once rank 0 is inside its compute span, and rank 0 ends the span only
  // after rank 1 has finished. So the collective must have started before the
  // span ended (rank 1 cannot finish without rank 0's part) and ended after
  // the span began (it cannot finish without rank 1).
  auto tracer = std::make_shared<Tracer>();
  std::atomic<bool> computing{false}, peer_done{false};
  bool waits_ok[2] = {false, false};
  run_local(
      2,
      [&](const ProcessGroupPtr& world) {
        world->set_tracer(tracer);
        const Tensor in = ops::full({1024}, world->rank() + 1);
        const Tensor out = ops::empty({2048});
        if (world->rank() == 0) {
          Work gather = world->all_gather_into(out, in, /*async_op=*/true);
          {
            TraceSpan compute(tracer.get(), 0, "compute", "forward", "fsdp");
            computing = true;
            waits_ok[0] = wait_for(peer_done);
          }
          gather.wait();
        } else {
          waits_ok[1] = wait_for(computing);
          world->all_gather_into(out, in);
          peer_done = true;
        }
      },
      traced_options());
  CHECK(waits_ok[0]);
  CHECK(waits_ok[1]);
  const TraceEvent* collective = nullptr;
  const TraceEvent* compute = nullptr;
  const std::vector<TraceEvent> events = tracer->events();
  for (const TraceEvent& event : events) {
    if (event.rank != 0) continue;
    if (event.name == "all_gather_into") collective = &event;
    if (event.name == "forward") compute = &event;
  }
  REQUIRE(collective != nullptr);
  REQUIRE(compute != nullptr);
  CHECK(collective->start_us < compute->start_us + compute->duration_us);
  CHECK(compute->start_us < collective->start_us + collective->duration_us);

  const json trace = tracer->chrome_trace();
  CHECK(metadata(trace, "thread_name", 0, 1) == json{{"name", "compute"}});
  CHECK(metadata(trace, "thread_name", 0, 2) == json{{"name", "comm:world"}});
}

TEST_CASE("local: write_chrome_trace over a group merges every rank's events once, on rank 0") {
  SUBCASE("one tracer per rank") {
    const std::filesystem::path path = temporary_path("merged.json");
    std::vector<std::shared_ptr<Tracer>> tracers;
    for (int r = 0; r < 3; ++r) tracers.push_back(std::make_shared<Tracer>());
    run_local(
        3,
        [&](const ProcessGroupPtr& world) {
          Tracer& mine = *tracers[static_cast<size_t>(world->rank())];
          world->set_tracer(tracers[static_cast<size_t>(world->rank())]);
          { TraceSpan step(&mine, world->rank(), "compute", "step", "test", {{"rank", world->rank()}}); }
          world->barrier();
          write_chrome_trace(mine, *world, path.string());
        },
        traced_options());
    const json trace = read_json(path);
    std::filesystem::remove(path);
    std::map<int, std::vector<std::string>> names_by_pid;
    for (const json& event : events_with_phase(trace, "X")) {
      names_by_pid[event.at("pid").get<int>()].push_back(event.at("name").get<std::string>());
      if (event.at("name") == "step") CHECK(event.at("args").at("rank") == event.at("pid"));
    }
    REQUIRE(names_by_pid.size() == 3);
    for (int rank = 0; rank < 3; ++rank) {
      CAPTURE(rank);
      CHECK(names_by_pid[rank] == std::vector<std::string>{"step", "barrier"});
      CHECK(metadata(trace, "process_name", rank) == json{{"name", fmt::format("rank {}", rank)}});
    }
  }
  SUBCASE("one tracer shared by every rank thread") {
    const std::filesystem::path path = temporary_path("shared.json");
    auto tracer = std::make_shared<Tracer>();
    run_local(
        2,
        [&](const ProcessGroupPtr& world) {
          { TraceSpan step(tracer.get(), world->rank(), "compute", "step", "test"); }
          world->barrier();
          write_chrome_trace(*tracer, *world, path.string());
        },
        traced_options());
    const json trace = read_json(path);
    std::filesystem::remove(path);
    const std::vector<json> complete = events_with_phase(trace, "X");
    REQUIRE(complete.size() == 2);
    CHECK(complete[0].at("pid") == 0);
    CHECK(complete[1].at("pid") == 1);
  }
  SUBCASE("rank 0 cannot write: the error names the path") {
    const std::string bad = "/nonexistent-tessera-dir/merged.json";
    Tracer tracer;
    CHECK_THROWS_WITH_AS(
        run_local(
            2, [&](const ProcessGroupPtr& world) { write_chrome_trace(tracer, *world, bad); }, traced_options()),
        doctest::Contains("cannot open '/nonexistent-tessera-dir/merged.json'"), Error);
  }
}
