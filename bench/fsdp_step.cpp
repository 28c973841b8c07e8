// FSDP training-step benchmark: a GPT (GPT-2 124M by default, B=4, T=64 per
// rank) built the FSDP2 way and trained with AdamW on 1, 2, 4, ... local ranks
// (threads). Per world size: ms/step, persistent and peak memory per rank,
// communication bytes per rank and step, and the share of FSDP's all-gather and
// reduce-scatter time hidden behind computation, read from the trace.
// Not a test: it prints figures with the machine's context.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "bench/machine_context.h"
#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "dist/trace.h"
#include "fsdp/fully_shard.h"
#include "nn/models/gpt.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"
#include "train/file_roles.h"

using namespace tessera;

namespace {

constexpr double kMiB = 1 << 20;
constexpr uint64_t kSeed = 1234;
constexpr double kClip = 1.0;

using bench::cpu_model;
using bench::load_average;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

struct Settings {
  std::string preset = "gpt2-124m";
  nn::GPTConfig model;
  int64_t batch = 4;
  int64_t seq_len = 64;
  int steps = 3;
  int warmup = 1;
  bool reshard_after_forward = true;
  int threads_per_rank = 0;  // 0: run_local's default, max(1, cores / ranks)
  DType param_dtype = DType::f32;
  std::string trace_prefix;
};

// What one rank measured; each rank fills its own slot (ranks are threads).
struct RankResult {
  std::vector<double> step_ms;
  std::vector<double> losses;
  int64_t persistent_bytes = 0;  // live after optimizer.step(), gradients still held
  int64_t shard_state_bytes = 0;  // what that should be: local param + grad + AdamW m, v tensors
  int64_t peak_bytes = 0;         // highest over the timed steps
  int64_t comm_bytes_sent = 0;    // per step, highest over the timed steps
  int threads = 0;
};

// B sequences of T + 1 random tokens for (rank, step): inputs and the next-token targets [B, T].
std::pair<Tensor, Tensor> random_batch(const Settings& settings, int rank, int step) {
  std::mt19937_64 generator(kSeed * 1000003ULL + static_cast<uint64_t>(rank) * 4099ULL + static_cast<uint64_t>(step));
  std::uniform_int_distribution<int64_t> token(0, settings.model.vocab_size - 1);
  std::vector<int64_t> inputs, targets;
  for (int64_t b = 0; b < settings.batch; ++b) {
    std::vector<int64_t> sequence(static_cast<size_t>(settings.seq_len + 1));
    for (auto& value : sequence) value = token(generator);
    inputs.insert(inputs.end(), sequence.begin(), sequence.end() - 1);
    targets.insert(targets.end(), sequence.begin() + 1, sequence.end());
  }
  return {ops::from_vector(inputs, {settings.batch, settings.seq_len}),
          ops::from_vector(targets, {settings.batch, settings.seq_len})};
}

int64_t tensor_bytes(const Tensor& tensor) {
  return tensor.defined() ? tensor.numel() * static_cast<int64_t>(element_size(tensor.dtype())) : 0;
}

// Bytes of the local parameter shards, their gradients and the AdamW moments.
int64_t shard_state_bytes(const nn::Module& model, optim::AdamW& optimizer) {
  int64_t bytes = 0;
  for (const auto& [name, param] : model.named_parameters()) {
    bytes += tensor_bytes(param->tensor()) + tensor_bytes(param->grad());
    const optim::ParamState& state = optimizer.state(name);
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      if (auto found = state.find(key); found != state.end()) bytes += tensor_bytes(found->second);
    }
  }
  return bytes;
}

int64_t bytes_sent(const std::vector<dist::ProcessGroupPtr>& groups) {
  int64_t sent = 0;
  for (const auto& group : groups) sent += group->stats().total().bytes_sent;
  return sent;
}

// One rank: build, shard, materialise, then warm-up and timed steps. The
// tracer is on the mesh's groups during the timed steps only.
void run_rank(const Settings& settings, const dist::ProcessGroupPtr& world, const std::shared_ptr<dist::Tracer>& tracer,
              RankResult& result) {
  const dist::DeviceMesh mesh(world, kCPU, {world->size()}, {"shard"});
  // FSDP records its spans and collectives through the shard dim's group; the
  // mesh's group (the world) carries the step barriers.
  const std::vector<dist::ProcessGroupPtr> groups = {mesh.group(), mesh.group("shard")};
  fsdp::MixedPrecisionPolicy policy;
  if (settings.param_dtype != DType::f32) policy.param_dtype = settings.param_dtype;

  fsdp::FullyShardOptions root_options;
  root_options.mesh = mesh;
  root_options.mp_policy = policy;
  fsdp::FullyShardOptions block_options = root_options;
  block_options.reshard_after_forward = settings.reshard_after_forward;

  nn::GPT model(settings.model, kMeta);
  for (const auto& block : model.blocks()) fsdp::fully_shard(*block, block_options);
  fsdp::fully_shard(model, root_options);
  model.to_empty(kCPU);
  model.reset_parameters(kSeed);
  optim::AdamW optimizer(model.named_parameters(), {.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
  const std::vector<std::shared_ptr<nn::Parameter>> params = model.parameters();
  result.threads = num_threads();

  for (int step = 0; step < settings.warmup + settings.steps; ++step) {
    const bool timed = step >= settings.warmup;
    if (step == settings.warmup) {
      for (const auto& group : groups) group->set_tracer(tracer);
    }
    const auto [inputs, targets] = random_batch(settings, world->rank(), step);
    world->barrier();  // ranks start each step together
    for (const auto& group : groups) group->reset_stats();
    dist::reset_rank_peak_memory();
    const double start = now_ms();

    optimizer.zero_grad();
    Tensor loss = model.loss(inputs, targets);
    autograd::backward(loss);
    optim::clip_grad_norm_(params, kClip);
    optimizer.step();

    const double elapsed = now_ms() - start;
    if (!timed) continue;
    result.step_ms.push_back(elapsed);
    result.losses.push_back(loss.item());
    result.persistent_bytes = dist::rank_memory_stats().live_bytes;
    result.shard_state_bytes = shard_state_bytes(model, optimizer);
    result.peak_bytes = std::max(result.peak_bytes, dist::rank_memory_stats().peak_bytes);
    result.comm_bytes_sent = std::max(result.comm_bytes_sent, bytes_sent(groups));
  }
  for (const auto& group : groups) group->set_tracer(nullptr);
}

// ---- overlap from the trace ---------------------------------------------------------------------

using Interval = std::pair<int64_t, int64_t>;  // [start, end) in microseconds

// Sorted, disjoint intervals covering the same time as `intervals`.
std::vector<Interval> merged(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> out;
  for (const Interval& interval : intervals) {
    if (!out.empty() && interval.first <= out.back().second) {
      out.back().second = std::max(out.back().second, interval.second);
    } else {
      out.push_back(interval);
    }
  }
  return out;
}

int64_t total_length(const std::vector<Interval>& disjoint) {
  int64_t total = 0;
  for (const auto& [start, end] : disjoint) total += end - start;
  return total;
}

// Time covered by both of two sorted, disjoint interval lists.
int64_t intersection_length(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  int64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t start = std::max(a[i].first, b[j].first);
    const int64_t end = std::min(a[i].second, b[j].second);
    if (end > start) total += end - start;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return total;
}

// Per rank, summed over the timed steps (microseconds).
struct Overlap {
  int64_t fsdp_comm_us = 0;     // union of FSDP's all-gathers and reduce-scatters on the comm threads
  int64_t exposed_us = 0;       // the part of it the compute thread spent in all_gather_wait / reduce_scatter_wait
  int64_t wait_us = 0;          // the wait spans themselves (exposed_us plus wait overhead)
  int64_t other_comm_us = 0;    // blocking collectives outside FSDP: clip_grad_norm_'s all-reduce, step barriers
};

// Collective events run on the group's communication thread; the wait spans
// are recorded on the rank's compute thread, one after another, so neither
// list double counts once merged. Exposed time is the intersection: the part
// of a wait with no collective running (the comm thread not yet scheduled on
// an oversubscribed CPU, bookkeeping around work.wait()) is not collective
// time; the notes under the table give the whole wait spans.
std::vector<Overlap> overlap_per_rank(const dist::Tracer& tracer, int world_size) {
  std::vector<std::vector<Interval>> collectives(static_cast<size_t>(world_size));
  std::vector<std::vector<Interval>> waits(static_cast<size_t>(world_size));
  std::vector<std::vector<Interval>> others(static_cast<size_t>(world_size));
  for (const dist::TraceEvent& event : tracer.events()) {
    const Interval interval{event.start_us, event.start_us + event.duration_us};
    const auto rank = static_cast<size_t>(event.rank);
    if (event.category == "collective" && event.track.rfind("comm:", 0) == 0) {
      const bool fsdp = event.name == "all_gather_into" || event.name == "reduce_scatter_into";
      (fsdp ? collectives : others)[rank].push_back(interval);
    } else if (event.category == "fsdp" && event.track == "fsdp" &&
               (event.name == "all_gather_wait" || event.name == "reduce_scatter_wait")) {
      waits[rank].push_back(interval);
    }
  }
  std::vector<Overlap> result(static_cast<size_t>(world_size));
  for (size_t rank = 0; rank < result.size(); ++rank) {
    const std::vector<Interval> comm = merged(collectives[rank]);
    const std::vector<Interval> wait = merged(waits[rank]);
    result[rank] = {total_length(comm), intersection_length(comm, wait), total_length(wait),
                    total_length(merged(others[rank]))};
  }
  return result;
}

// ---- one world size ---------------------------------------------------------------------------------

struct Row {
  int ranks = 0;
  int threads_per_rank = 0;
  double ms_per_step = 0;
  double tokens_per_s = 0;
  double persistent_mib = 0;    // highest over ranks
  double shard_state_mib = 0;   // highest over ranks
  double unsharded_over_n_mib = 0;
  double peak_mib = 0;          // highest over ranks
  double comm_mib = 0;          // highest over ranks
  double comm_ms = 0;           // per rank and step, mean over ranks
  double exposed_ms = 0;
  double wait_ms = 0;
  double other_comm_ms = 0;
  double hidden = 0;            // 1 - exposed / comm over all ranks
  std::vector<double> step_ms;  // slowest rank per step
  double first_loss = 0, last_loss = 0;  // mean over ranks
};

Row run_world(const Settings& settings, int world_size) {
  std::vector<RankResult> results(static_cast<size_t>(world_size));
  auto tracer = std::make_shared<dist::Tracer>();
  dist::LocalOptions options;
  options.threads_per_rank = settings.threads_per_rank;
  dist::run_local(world_size, [&](const dist::ProcessGroupPtr& world) {
    run_rank(settings, world, tracer, results[static_cast<size_t>(world->rank())]);
  }, options);
  if (!settings.trace_prefix.empty()) {
    tracer->write_chrome_trace(fmt::format("{}-{}ranks.json", settings.trace_prefix, world_size));
  }

  Row row;
  row.ranks = world_size;
  row.threads_per_rank = results.front().threads;
  row.step_ms.assign(static_cast<size_t>(settings.steps), 0.0);
  for (const RankResult& rank : results) {
    for (size_t step = 0; step < row.step_ms.size(); ++step) row.step_ms[step] = std::max(row.step_ms[step], rank.step_ms[step]);
    row.persistent_mib = std::max(row.persistent_mib, static_cast<double>(rank.persistent_bytes) / kMiB);
    row.shard_state_mib = std::max(row.shard_state_mib, static_cast<double>(rank.shard_state_bytes) / kMiB);
    row.peak_mib = std::max(row.peak_mib, static_cast<double>(rank.peak_bytes) / kMiB);
    row.comm_mib = std::max(row.comm_mib, static_cast<double>(rank.comm_bytes_sent) / kMiB);
    row.first_loss += rank.losses.front() / world_size;
    row.last_loss += rank.losses.back() / world_size;
  }
  row.ms_per_step = median(row.step_ms);
  row.tokens_per_s = static_cast<double>(world_size * settings.batch * settings.seq_len) / (row.ms_per_step / 1e3);
  // param + grad + AdamW m and v, f32, over N ranks.
  row.unsharded_over_n_mib = 4.0 * static_cast<double>(settings.model.num_parameters()) * 4.0 / kMiB / world_size;

  int64_t comm_us = 0, exposed_us = 0, wait_us = 0, other_us = 0;
  for (const Overlap& rank : overlap_per_rank(*tracer, world_size)) {
    comm_us += rank.fsdp_comm_us;
    exposed_us += rank.exposed_us;
    wait_us += rank.wait_us;
    other_us += rank.other_comm_us;
  }
  const double per_rank_step_ms = 1e-3 / (static_cast<double>(world_size) * settings.steps);
  row.comm_ms = static_cast<double>(comm_us) * per_rank_step_ms;
  row.exposed_ms = static_cast<double>(exposed_us) * per_rank_step_ms;
  row.wait_ms = static_cast<double>(wait_us) * per_rank_step_ms;
  row.other_comm_ms = static_cast<double>(other_us) * per_rank_step_ms;
  row.hidden = comm_us > 0 ? 1.0 - static_cast<double>(exposed_us) / static_cast<double>(comm_us) : 0.0;
  return row;
}

void print_table_header() {
  fmt::print("{:>5} | {:>9} | {:>8} | {:>10} | {:>10} | {:>9} | {:>10} | {:>9} | {:>8} | {:>7}\n", "ranks", "ms/step",
             "tokens/s", "persist", "unshard/N", "peak", "comm", "comm time", "exposed", "hidden");
  fmt::print("{:>5} | {:>9} | {:>8} | {:>10} | {:>10} | {:>9} | {:>10} | {:>9} | {:>8} | {:>7}\n", "", "", "",
             "MiB/rank", "MiB", "MiB/rank", "MiB/rk/stp", "ms", "ms", "%");
}

void print_row(const Row& row) {
  fmt::print("{:>5} | {:>9.1f} | {:>8.1f} | {:>10.1f} | {:>10.1f} | {:>9.1f} | {:>10.1f} | {:>9.1f} | {:>8.1f} | {:>6.1f}%\n",
             row.ranks, row.ms_per_step, row.tokens_per_s, row.persistent_mib, row.unsharded_over_n_mib, row.peak_mib,
             row.comm_mib, row.comm_ms, row.exposed_ms, 100.0 * row.hidden);
}

// The details behind a row, printed under the table.
void print_notes(const Row& row) {
  fmt::print("# {} ranks ({} threads/rank): steps {:.0f} ms (slowest rank each); loss {:.4f} -> {:.4f}; local shards "
             "param+grad+m+v {:.1f} MiB; wait spans {:.1f} ms/step; other blocking collectives (clip all-reduce, "
             "barrier) {:.1f} ms/step\n",
             row.ranks, row.threads_per_rank, fmt::join(row.step_ms, " "), row.first_loss, row.last_loss, row.shard_state_mib, row.wait_ms, row.other_comm_ms);
}

nlohmann::json row_json(const Settings& settings, const Row& row) {
  return {{"preset", settings.preset},
          {"params", settings.model.num_parameters()},
          {"batch", settings.batch},
          {"seq_len", settings.seq_len},
          {"param_dtype", std::string(dtype_name(settings.param_dtype))},
          {"reshard_after_forward", settings.reshard_after_forward},
          {"ranks", row.ranks},
          {"threads_per_rank", row.threads_per_rank},
          {"cores", std::thread::hardware_concurrency()},
          {"ms_per_step", row.ms_per_step},
          {"step_ms", row.step_ms},
          {"tokens_per_s", row.tokens_per_s},
          {"persistent_mib_per_rank", row.persistent_mib},
          {"shard_state_mib_per_rank", row.shard_state_mib},
          {"unsharded_over_n_mib", row.unsharded_over_n_mib},
          {"peak_mib_per_rank", row.peak_mib},
          {"comm_mib_per_rank_per_step", row.comm_mib},
          {"fsdp_comm_ms_per_step", row.comm_ms},
          {"exposed_ms_per_step", row.exposed_ms},
          {"wait_span_ms_per_step", row.wait_ms},
          {"other_comm_ms_per_step", row.other_comm_ms},
          {"hidden_fraction", row.hidden},
          {"first_loss", row.first_loss},
          {"last_loss", row.last_loss}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"FSDP training step (GPT, AdamW) on local ranks: time, memory, communication and overlap", "fsdp_step"};
  Settings settings;
  std::vector<int> ranks = {1, 2, 4};
  std::string param_dtype = "f32";
  std::string json_path;
  app.add_option("--preset", settings.preset, "model shape")->check(CLI::IsMember(nn::GPTConfig::preset_names()))
      ->capture_default_str();
  app.add_option("--batch", settings.batch, "sequences per rank")->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  app.add_option("--seq-len", settings.seq_len, "tokens per sequence (at most the preset's context)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  app.add_option("--ranks", ranks, "world sizes (local ranks as threads)")->delimiter(',')->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--steps", settings.steps, "timed steps")->check(CLI::Range(1, 10000))->capture_default_str();
  app.add_option("--warmup", settings.warmup, "untimed steps first")->check(CLI::Range(0, 10000))->capture_default_str();
  app.add_option("--reshard-after-forward", settings.reshard_after_forward,
                 "blocks reshard after forward (true) or stay unsharded until backward (false)")
      ->capture_default_str();
  app.add_option("--param-dtype", param_dtype, "unsharded parameter (and gradient-reduction) dtype")
      ->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  app.add_option("--threads-per-rank", settings.threads_per_rank, "intra-op threads per rank (0: max(1, cores / ranks))")
      ->check(CLI::Range(0, 4096))->capture_default_str();
  app.add_option("--json", json_path, "also append one JSON line per world size to this file");
  app.add_option("--trace", settings.trace_prefix, "write each world size's Chrome trace to PREFIX-<N>ranks.json");
  CLI11_PARSE(app, argc, argv);

  try {
    settings.model = nn::GPTConfig::preset(settings.preset);
    settings.param_dtype = param_dtype == "bf16" ? DType::bf16 : DType::f32;
    TESSERA_CHECK(settings.seq_len <= settings.model.block_size, "--seq-len {} is longer than {}'s context of {}",
                  settings.seq_len, settings.preset, settings.model.block_size);
    // The files, checked now rather than after the first world size has run
    // for minutes: no trace replaces an earlier one, no output is another.
    tessera::train::FileRoles roles;
    if (!json_path.empty()) roles.add_output("--json", json_path);
    if (!settings.trace_prefix.empty()) {
      const std::filesystem::path folder = std::filesystem::absolute(settings.trace_prefix).parent_path();
      TESSERA_CHECK(std::filesystem::is_directory(folder), "--trace: folder '{}' does not exist", folder.string());
      for (const int world_size : ranks) {
        const std::string trace = fmt::format("{}-{}ranks.json", settings.trace_prefix, world_size);
        tessera::train::refuse_existing_output("--trace", trace, "remove it or choose another prefix");
        roles.add_output("--trace", trace);
      }
    }
    roles.check();
    // JSON lines: a later run's lines follow an earlier run's.
    std::ofstream json_file;
    if (!json_path.empty()) {
      json_file.open(json_path, std::ios::app);
      TESSERA_CHECK(json_file.good(), "--json: cannot open '{}' for appending", json_path);
    }

    const auto& m = settings.model;
    fmt::print("# fsdp_step bench: cpu={} ({} cores online, load average {}), vector ISA {}\n", cpu_model(),
               std::thread::hardware_concurrency(), load_average(), bench::vector_isa());
    fmt::print("# {} ({} layers, {} heads, {} dims, vocab {}): {} parameters; B={} T={} per rank, random tokens\n",
               settings.preset, m.n_layer, m.n_head, m.n_embd, m.vocab_size, m.num_parameters(), settings.batch,
               settings.seq_len);
    fmt::print("# fully_shard per block + root, reshard_after_forward={} (blocks), param/reduce dtype {}; AdamW, "
               "clip {}; {} warm-up + {} timed steps; threads/rank {}\n",
               settings.reshard_after_forward, dtype_name(settings.param_dtype), kClip, settings.warmup,
               settings.steps,
               settings.threads_per_rank > 0 ? std::to_string(settings.threads_per_rank) : "max(1, cores / ranks)");
    fmt::print(
        "# ms/step: median over timed steps of the slowest rank (steps start at a barrier); tokens/s: all ranks\n"
        "# persist: live bytes after optimizer.step() with gradients held (param + grad shards + AdamW m, v, +\n"
        "#   whatever else is live); unshard/N: (param + grad + m + v) x 4 bytes x params / N;\n"
        "# peak: highest live bytes during a step; comm: bytes sent per rank and step, all groups (ProcessGroup::stats)\n"
        "# comm time: FSDP all-gathers + reduce-scatters on the comm threads (trace, union per rank);\n"
        "# exposed: the part of it the compute thread spent in all_gather_wait / reduce_scatter_wait;\n"
        "# hidden = 1 - exposed / comm time; comm time and exposed are per rank and step, mean over ranks\n");
    print_table_header();
    std::fflush(stdout);
    std::vector<Row> rows;
    for (int n : ranks) {
      rows.push_back(run_world(settings, n));
      print_row(rows.back());
      std::fflush(stdout);
      if (json_file.is_open()) json_file << row_json(settings, rows.back()).dump() << '\n';
    }
    for (const Row& row : rows) print_notes(row);
  } catch (const Error& error) {
    fmt::print(stderr, "fsdp_step: {}\n", error.what());
    return 1;
  }
  return 0;
}
