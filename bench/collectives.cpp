// Collectives benchmark in the manner of nccl-tests: time, algorithm bandwidth
// and bus bandwidth of all-gather, reduce-scatter, all-reduce and broadcast
// (f32, sum) over message sizes, out-of-place and in-place, on the local
// backend (ranks as threads) or under mpirun on the MPI backend, beside a
// single-thread memcpy measured in the same run as the limit to compare with.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/machine_context.h"
#include "dist/backends/local_backend.h"
#include "dist/init.h"
#include "dist/launch/launch_environment.h"
#include "dist/process_group.h"
#include "tensor/ops.h"

using namespace tessera;
using namespace tessera::dist;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

using bench::cpu_model;
using bench::load_average;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// "4 KiB", "64 MiB".
std::string size_label(int64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return fmt::format("{} MiB", bytes / kMiB);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes / 1024);
  return fmt::format("{} B", bytes);
}

// The limit the collectives are held against: one thread copying 64 MiB
// between two buffers already faulted in (median of 10 copies after one).
double memcpy_gbps() {
  const size_t bytes = static_cast<size_t>(64 * kMiB);
  std::vector<char> source(bytes, 1), destination(bytes, 0);
  std::memcpy(destination.data(), source.data(), bytes);
  std::vector<double> seconds;
  for (int rep = 0; rep < 10; ++rep) {
    const double start = now_seconds();
    std::memcpy(destination.data(), source.data(), bytes);
    seconds.push_back(now_seconds() - start);
    source[static_cast<size_t>(rep)] = destination[bytes - 1 - static_cast<size_t>(rep)];  // keep both live
  }
  return static_cast<double>(bytes) / median(seconds) * 1e-9;
}

enum class Op { all_gather, reduce_scatter, all_reduce, broadcast };
constexpr Op kAllOps[] = {Op::all_gather, Op::reduce_scatter, Op::all_reduce, Op::broadcast};

std::string_view op_name(Op op) {
  switch (op) {
    case Op::all_gather: return "all_gather_into";
    case Op::reduce_scatter: return "reduce_scatter_into";
    case Op::all_reduce: return "all_reduce";
    case Op::broadcast: return "broadcast";
  }
  return "?";
}

// nccl-tests' bus bandwidth: the algorithm bandwidth times the fraction of
// the message each rank must move on the busiest link of an optimal algorithm.
double bus_factor(Op op, int n) {
  switch (op) {
    case Op::all_gather:
    case Op::reduce_scatter: return static_cast<double>(n - 1) / n;
    case Op::all_reduce: return 2.0 * (n - 1) / n;
    case Op::broadcast: return 1.0;
  }
  return 1.0;
}

// all_reduce and broadcast work on one tensor in place: they have no out-of-place form.
bool has_out_of_place(Op op) { return op == Op::all_gather || op == Op::reduce_scatter; }

struct Settings {
  int64_t min_bytes = 4 * 1024;
  int64_t max_bytes = 64 * kMiB;
  int iters = 20;
  std::vector<Op> ops;
  double memcpy_gbps = 0;  // the limit, measured at the start of each table
  std::string backend;
  std::ofstream* json = nullptr;
};

// Timed iterations for a message: --iters for 8 MiB and up, more for smaller
// ones (up to 50x) where a single call is short and noisy.
int iterations_for(int64_t bytes, int iters) {
  const int64_t scale = std::clamp<int64_t>(8 * kMiB / bytes, 1, 50);
  return static_cast<int>(iters * scale);
}

// Elements of `t` (f32) that differ from `expected`.
int64_t count_mismatches(const Tensor& t, float expected) {
  const float* data = t.data_ptr<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < t.numel(); ++i) wrong += data[i] != expected ? 1 : 0;
  return wrong;
}

// The buffers of one (op, size, placement) case and the call that runs it.
// Sizes follow nccl-tests: `bytes` is the output of all-gather, the input of
// reduce-scatter and the tensor of all-reduce and broadcast. Inputs hold small
// integers, so every correct result is exact in f32.
struct Case {
  Tensor in, out;  // all_reduce and broadcast use `out` only
  std::function<void()> run;
  std::function<int64_t()> count_wrong;  // after one run on the initial values
};

Case make_case(ProcessGroup& group, Op op, int64_t count, bool in_place) {
  const int n = group.size(), rank = group.rank();
  const int64_t chunk = count / n;
  Case c;
  switch (op) {
    case Op::all_gather: {
      // in [c] = rank + 1; out [N c]: chunk j = j + 1.
      c.out = ops::zeros({chunk * n});
      c.in = in_place ? ops::narrow(c.out, 0, rank * chunk, chunk) : ops::empty({chunk});
      ops::fill_(c.in, rank + 1);
      c.run = [&group, out = c.out, in = c.in] { group.all_gather_into(out, in); };
      c.count_wrong = [out = c.out, chunk, n] {
        int64_t wrong = 0;
        for (int j = 0; j < n; ++j) wrong += count_mismatches(ops::narrow(out, 0, j * chunk, chunk), j + 1.0f);
        return wrong;
      };
      break;
    }
    case Op::reduce_scatter: {
      // in [N c]: chunk j = (rank + 1)(j + 1); out [c] = sum over ranks of chunk `rank` = (rank + 1) N(N+1)/2.
      c.in = ops::empty({chunk * n});
      for (int64_t j = 0; j < n; ++j) {
        Tensor part = ops::narrow(c.in, 0, j * chunk, chunk);
        ops::fill_(part, static_cast<double>((rank + 1) * (j + 1)));
      }
      c.out = in_place ? ops::narrow(c.in, 0, rank * chunk, chunk) : ops::empty({chunk});
      c.run = [&group, out = c.out, in = c.in] { group.reduce_scatter_into(out, in, ReduceOp::sum); };
      const float expected = static_cast<float>((rank + 1) * n * (n + 1) / 2);
      c.count_wrong = [out = c.out, expected] { return count_mismatches(out, expected); };
      break;
    }
    case Op::all_reduce: {
      // [N c] = rank + 1, summed: N(N+1)/2.
      c.out = ops::full({chunk * n}, rank + 1);
      c.run = [&group, out = c.out] { group.all_reduce(out, ReduceOp::sum); };
      const float expected = static_cast<float>(n * (n + 1) / 2);
      c.count_wrong = [out = c.out, expected] { return count_mismatches(out, expected); };
      break;
    }
    case Op::broadcast: {
      // [N c] = rank + 1, from root 0: 1.
      c.out = ops::full({chunk * n}, rank + 1);
      c.run = [&group, out = c.out] { group.broadcast(out, 0); };
      c.count_wrong = [out = c.out] { return count_mismatches(out, 1.0f); };
      break;
    }
  }
  return c;
}

struct Timing {
  double seconds = 0;  // median over iterations of the slowest rank's time
  int64_t wrong = 0;   // elements wrong after the checked run, summed over ranks
};

// Checks one run, then times `iterations` runs, each after a barrier so that
// ranks start together. Collective over the group; every rank gets the result.
Timing time_case(ProcessGroup& group, Case& c, int iterations) {
  c.run();
  Tensor wrong = ops::from_vector(std::vector<int64_t>{c.count_wrong()}, {1});
  group.all_reduce(wrong, ReduceOp::sum);
  // Reductions repeated in place would grow the values without bound; zeros stay zeros.
  ops::zero_(c.out);
  if (c.in.defined()) ops::zero_(c.in);
  for (int warmup = 0; warmup < std::max(2, iterations / 10); ++warmup) c.run();

  Tensor seconds = ops::empty({iterations}, {.dtype = DType::f64});
  double* mine = seconds.data_ptr<double>();
  for (int i = 0; i < iterations; ++i) {
    group.barrier();
    const double start = now_seconds();
    c.run();
    mine[i] = now_seconds() - start;
  }
  Tensor everyone = ops::empty({iterations * group.size()}, {.dtype = DType::f64});
  group.all_gather_into(everyone, seconds);
  const double* all = everyone.data_ptr<double>();
  std::vector<double> slowest(static_cast<size_t>(iterations), 0.0);
  for (int r = 0; r < group.size(); ++r) {
    for (int i = 0; i < iterations; ++i)
      slowest[static_cast<size_t>(i)] = std::max(slowest[static_cast<size_t>(i)], all[r * iterations + i]);
  }
  return {median(slowest), wrong.item<int64_t>()};
}

struct Row {
  Op op;
  int64_t bytes = 0;
  std::optional<Timing> out_of_place;
  Timing in_place;
};

void print_header(const Settings& settings, const ProcessGroup& group) {
  fmt::print("\n# backend {}, {} ranks, f32, sum; memcpy limit {:.2f} GB/s\n", settings.backend, group.size(),
             settings.memcpy_gbps);
  fmt::print("{:<40} | {:^35} | {:^35} |\n", "", "out-of-place", "in-place");
  fmt::print("{:<20} {:>8} {:>10} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6} | {:>6}\n", "op", "size",
             "count", "time(us)", "algbw", "busbw", "#wrong", "time(us)", "algbw", "busbw", "#wrong", "bus/mc");
}

void print_row(const Settings& settings, int n, const Row& row) {
  const auto algbw = [&](const Timing& t) { return static_cast<double>(row.bytes) / t.seconds * 1e-9; };
  const auto busbw = [&](const Timing& t) { return algbw(t) * bus_factor(row.op, n); };
  const auto columns = [&](const std::optional<Timing>& t) {
    if (!t) return fmt::format("{:>10} {:>8} {:>8} {:>6}", "n/a", "", "", "");
    return fmt::format("{:>10.1f} {:>8.2f} {:>8.2f} {:>6}", t->seconds * 1e6, algbw(*t), busbw(*t), t->wrong);
  };
  const double best_busbw = std::max(busbw(row.in_place), row.out_of_place ? busbw(*row.out_of_place) : 0.0);
  fmt::print("{:<20} {:>8} {:>10} | {} | {} | {:>6.2f}\n", op_name(row.op), size_label(row.bytes), row.bytes / 4,
             columns(row.out_of_place), columns(row.in_place), best_busbw / settings.memcpy_gbps);
  std::fflush(stdout);
  if (settings.json == nullptr) return;
  const auto write = [&](const std::string& placement, const Timing& t) {
    const nlohmann::json line = {{"backend", settings.backend},
                                 {"ranks", n},
                                 {"op", op_name(row.op)},
                                 {"bytes", row.bytes},
                                 {"dtype", "f32"},
                                 {"placement", placement},
                                 {"time_us", t.seconds * 1e6},
                                 {"algbw_gbps", algbw(t)},
                                 {"busbw_gbps", busbw(t)},
                                 {"memcpy_gbps", settings.memcpy_gbps},
                                 {"wrong", t.wrong}};
    *settings.json << line.dump() << '\n';
  };
  if (row.out_of_place) write("out_of_place", *row.out_of_place);
  write("in_place", row.in_place);
}

// Every op and size on one group; rank 0 prints. Collective over the group.
// Rank 0 measures memcpy while the other ranks wait at a barrier, so the limit
// and the collectives share the run's conditions (other load on the machine
// included); a second measurement after the table shows how much they drifted.
void run_sizes(const Settings& common, ProcessGroup& group) {
  const int n = group.size();
  Settings settings = common;
  group.barrier();
  if (group.rank() == 0) {
    settings.memcpy_gbps = memcpy_gbps();
    print_header(settings, group);
  }
  group.barrier();
  std::vector<Row> largest;
  for (Op op : settings.ops) {
    for (int64_t bytes = settings.min_bytes; bytes <= settings.max_bytes; bytes *= 2) {
      const int64_t count = bytes / 4 / n * n;  // f32 elements, a whole number of chunks
      if (count == 0) continue;
      const int iterations = iterations_for(bytes, settings.iters);
      Row row{op, count * 4, std::nullopt, {}};
      if (has_out_of_place(op)) {
        Case c = make_case(group, op, count, false);
        row.out_of_place = time_case(group, c, iterations);
      }
      Case c = make_case(group, op, count, true);
      row.in_place = time_case(group, c, iterations);
      if (group.rank() == 0) print_row(settings, n, row);
      if (bytes * 2 > settings.max_bytes) largest.push_back(row);
    }
  }
  group.barrier();
  if (group.rank() != 0) return;
  fmt::print("# memcpy again after the table: {:.2f} GB/s (bus/mc uses the first, {:.2f} GB/s)\n", memcpy_gbps(),
             settings.memcpy_gbps);
  for (const Row& row : largest) {
    const auto ratio = [&](const Timing& t) {
      return static_cast<double>(row.bytes) / t.seconds * 1e-9 * bus_factor(row.op, n) / settings.memcpy_gbps;
    };
    fmt::print("# {} ranks, {} {}: busbw / memcpy = {}in-place {:.2f}\n", n, op_name(row.op), size_label(row.bytes),
               row.out_of_place ? fmt::format("out-of-place {:.2f}, ", ratio(*row.out_of_place)) : std::string(),
               ratio(row.in_place));
  }
}

std::vector<Op> parse_ops(const std::vector<std::string>& names) {
  std::vector<Op> ops;
  for (const std::string& name : names) {
    const auto found = std::find_if(std::begin(kAllOps), std::end(kAllOps),
                                    [&](Op op) { return op_name(op) == name || op_name(op) == name + "_into"; });
    if (found == std::end(kAllOps)) {
      fail("--ops: unknown collective '{}'; expected all_gather, reduce_scatter, all_reduce or broadcast", name);
    }
    ops.push_back(*found);
  }
  return ops;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera collectives benchmark (nccl-tests style): time, algbw, busbw vs memcpy"};
  const LaunchInfo launch = detect_launch();
  std::string backend = launch.launcher == Launcher::local ? "local" : "mpi";
  std::vector<int> ranks = {2, 4};
  std::vector<std::string> op_names = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  std::string json_path;
  Settings settings;
  app.add_option("--backend", backend, "local (ranks as threads) or mpi (under mpirun); default: mpi under a launcher")
      ->check(CLI::IsMember({"local", "mpi"}));
  app.add_option("--ranks", ranks, "world sizes to run on the local backend")->delimiter(',')->check(CLI::Range(1, 64));
  app.add_option("--min-bytes", settings.min_bytes, "smallest message")->check(CLI::PositiveNumber);
  app.add_option("--max-bytes", settings.max_bytes, "largest message (sizes double from --min-bytes)")
      ->check(CLI::Range(int64_t{1}, int64_t{16} << 30));
  app.add_option("--iters", settings.iters, "timed iterations at 8 MiB and up (more for smaller messages)")
      ->check(CLI::PositiveNumber);
  app.add_option("--ops", op_names, "collectives to run")->delimiter(',');
  app.add_option("--json", json_path, "also append one JSON line per measurement to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    settings.ops = parse_ops(op_names);
    settings.backend = backend;
    TESSERA_CHECK(settings.min_bytes <= settings.max_bytes, "--min-bytes {} is larger than --max-bytes {}",
                  settings.min_bytes, settings.max_bytes);
    TESSERA_CHECK(backend == "local" || launch.launcher != Launcher::local,
                  "--backend mpi needs a launcher: mpirun -np N {} --backend mpi", argv[0]);
    TESSERA_CHECK(backend == "mpi" || launch.launcher == Launcher::local,
                  "--backend local runs its ranks as threads of one process; launch it without {}",
                  launcher_name(launch.launcher));
    std::ofstream json_file;
    if (!json_path.empty() && launch.rank == 0) {
      json_file.open(json_path, std::ios::app);  // JSON lines: a later run's lines follow an earlier run's
      TESSERA_CHECK(json_file.good(), "--json: cannot open '{}' for appending", json_path);
      settings.json = &json_file;
    }
    if (launch.rank == 0) {
      fmt::print("# collectives bench: cpu={} ({} cores online, load average {}), vector ISA {}\n", cpu_model(),
                 std::thread::hardware_concurrency(), load_average(), bench::vector_isa());
      fmt::print("# memcpy limit: one thread copying 64 MiB, median of 10 (GB = 1e9 B)\n");
      fmt::print(
          "# time: median over iterations of the slowest rank, each iteration after a barrier;\n"
          "# algbw = size / time, busbw = algbw x (n-1)/n (all-gather, reduce-scatter), x 2(n-1)/n\n"
          "# (all-reduce), x 1 (broadcast); size = output of all-gather, input of reduce-scatter;\n"
          "# bus/mc = best busbw / memcpy\n");
    }
    if (backend == "local") {
      for (int n : ranks) run_local(n, [&](const ProcessGroupPtr& world) { run_sizes(settings, *world); });
    } else {
      init({}, [&](const ProcessGroupPtr& world) { run_sizes(settings, *world); });
    }
  } catch (const Error& error) {
    fmt::print(stderr, "collectives: {}\n", error.what());
    return 1;
  }
  return 0;
}
