// Checkpoint throughput: GPT-2 124M's model and AdamW state (params, exp_avg,
// exp_avg_sq: 12 bytes per parameter, plus the step counters) sharded with
// FSDP over 1 and 4 local ranks, saved sync and async and loaded back, beside
// the disk's own sequential write (fsync'd) and cold read bandwidth measured
// in the same run. Cold reads: every file is dropped from the page cache
// (posix_fadvise DONTNEED after fsync) before it is read.
// Per world size: save GB/s, how long training is blocked by a sync save and
// by an async one (the snapshot copy: the first into new buffers, then into
// reused ones, as CheckpointManager does), the async save's total time, load GB/s,
// and the largest rank's extra peak memory while saving or loading.
// Not a test: it prints figures with the machine's context.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <vector>

#include "bench/machine_context.h"
#include "checkpoint/async_save.h"
#include "checkpoint/file_io.h"
#include "checkpoint/state_dict.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "nn/models/gpt.h"
#include "nn/optim/adamw.h"
#include "tensor/ops.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

constexpr double kGB = 1e9;
constexpr double kMiB = 1 << 20;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Drops a synced file's pages from the page cache, so the next read comes from the disk.
void drop_from_cache(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_tree_from_cache(const fs::path& dir) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) drop_from_cache(entry.path());
  }
}

struct DiskBandwidth {
  double write_gbps = 0.0;
  double read_gbps = 0.0;
};

// One stream of 8 MiB writes then fsync; then a cold read of the same file.
// The bytes are random and every 4 KiB page is stamped with its position, so
// a disk that compresses or deduplicates cannot make the probe look faster
// than a checkpoint's float data.
DiskBandwidth measure_disk(const fs::path& dir, int64_t bytes) {
  const fs::path path = dir / "disk-probe.bin";
  constexpr size_t kBlock = 8 << 20, kPage = 4096;
  std::vector<uint64_t> random_words(kBlock / sizeof(uint64_t));
  std::mt19937_64 generator(42);
  for (uint64_t& word : random_words) word = generator();
  std::vector<char> block(kBlock);
  std::memcpy(block.data(), random_words.data(), kBlock);
  DiskBandwidth bandwidth;
  auto start = std::chrono::steady_clock::now();
  {
    checkpoint::WriteFile file(path.string());
    for (int64_t written = 0; written < bytes; written += static_cast<int64_t>(kBlock)) {
      for (size_t page = 0; page < kBlock; page += kPage) {
        const int64_t position = written + static_cast<int64_t>(page);
        std::memcpy(block.data() + page, &position, sizeof(position));
      }
      file.write(block.data(), std::min<int64_t>(static_cast<int64_t>(kBlock), bytes - written));
    }
    file.close(true);
  }
  bandwidth.write_gbps = static_cast<double>(bytes) / seconds_since(start) / kGB;
  drop_from_cache(path);
  start = std::chrono::steady_clock::now();
  {
    checkpoint::ReadFile file(path.string());
    for (int64_t read = 0; read < bytes; read += static_cast<int64_t>(block.size())) {
      file.read_at(read, block.data(), std::min<int64_t>(static_cast<int64_t>(block.size()), bytes - read));
    }
  }
  bandwidth.read_gbps = static_cast<double>(bytes) / seconds_since(start) / kGB;
  fs::remove(path);
  return bandwidth;
}

struct Figures {
  int ranks = 0;
  int64_t bytes = 0;  // the checkpoint's tensor bytes
  double sync_save_s = 0.0;
  double async_first_blocked_s = 0.0;  // the first async save: its snapshot buffers are new
  double async_blocked_s = 0.0;        // later ones reuse them
  double async_first_total_s = 0.0;
  double async_total_s = 0.0;
  double load_s = 0.0;
  double save_extra_mib = 0.0;  // the largest rank's peak above its live state during a sync save
  double load_extra_mib = 0.0;
  double snapshot_mib = 0.0;    // the largest rank's snapshot copy (async)
};

int64_t state_bytes(const checkpoint::DistributedStateDict& state) {
  int64_t bytes = 0;
  for (const auto& [name, entry] : state) {
    const Shape& shape = std::holds_alternative<Tensor>(entry) ? std::get<Tensor>(entry).sizes()
                                                                : std::get<dist::DTensor>(entry).global_shape();
    const DType dtype = std::holds_alternative<Tensor>(entry) ? std::get<Tensor>(entry).dtype()
                                                               : std::get<dist::DTensor>(entry).local().dtype();
    int64_t numel = 1;
    for (int64_t size : shape) numel *= size;
    bytes += numel * static_cast<int64_t>(element_size(dtype));
  }
  return bytes;
}

Figures measure(const nn::GPTConfig& config, int ranks, const fs::path& dir) {
  Figures figures;
  figures.ranks = ranks;
  std::mutex mutex;
  auto keep_max = [&mutex](double& slot, double value) {
    std::lock_guard lock(mutex);
    slot = std::max(slot, value);
  };
  dist::run_local(ranks, [&](const dist::ProcessGroupPtr& world) {
    nn::GPT model(config, kMeta);
    const dist::DeviceMesh mesh(world, kCPU, {ranks});
    for (const auto& block : model.blocks()) fsdp::fully_shard(*block, {.mesh = mesh});
    fsdp::fully_shard(model, {.mesh = mesh});
    model.to_empty(kCPU);
    model.reset_parameters(1234);
    optim::AdamW optimizer(optim::weight_decay_groups(model.named_parameters(), 0.1), {});
    const checkpoint::DistributedStateDict state = checkpoint::training_state_dict(model, optimizer);
    const std::vector<int> everyone = [&] {
      std::vector<int> all(static_cast<size_t>(ranks));
      for (int r = 0; r < ranks; ++r) all[static_cast<size_t>(r)] = r;
      return all;
    }();
    const dist::ProcessGroupPtr async_group = world->split(everyone, "checkpoint");
    const bool leader = world->rank() == 0;
    if (leader) figures.bytes = state_bytes(state);
    const std::string sync_dir = (dir / fmt::format("sync-{}", ranks)).string();
    const std::string async_dir = (dir / fmt::format("async-{}", ranks)).string();

    // Sync save: training waits for all of it.
    world->barrier();
    int64_t live = dist::rank_memory_stats().live_bytes;
    dist::reset_rank_peak_memory();
    auto start = std::chrono::steady_clock::now();
    checkpoint::save(sync_dir, state, {.group = world});
    world->barrier();
    if (leader) figures.sync_save_s = seconds_since(start);
    keep_max(figures.save_extra_mib, static_cast<double>(dist::rank_memory_stats().peak_bytes - live) / kMiB);

    // Cold load.
    if (leader) drop_tree_from_cache(sync_dir);
    world->barrier();
    live = dist::rank_memory_stats().live_bytes;
    dist::reset_rank_peak_memory();
    start = std::chrono::steady_clock::now();
    checkpoint::load(sync_dir, state, {.group = world});
    world->barrier();
    if (leader) figures.load_s = seconds_since(start);
    keep_max(figures.load_extra_mib, static_cast<double>(dist::rank_memory_stats().peak_bytes - live) / kMiB);

    // Async saves: training is blocked only while the snapshot is copied.
    // The first one allocates its buffers (page faults); later ones reuse
    // them, as CheckpointManager does, and pay only the copy.
    checkpoint::SnapshotBuffers buffers;
    for (int round = 0; round < 2; ++round) {
      world->barrier();
      live = dist::rank_memory_stats().live_bytes;
      dist::reset_rank_peak_memory();
      start = std::chrono::steady_clock::now();
      const checkpoint::SaveHandle handle =
          checkpoint::async_save(fmt::format("{}-{}", async_dir, round), state, {.group = async_group}, {}, &buffers);
      keep_max(round == 0 ? figures.async_first_blocked_s : figures.async_blocked_s, seconds_since(start));
      if (round == 0) {
        keep_max(figures.snapshot_mib, static_cast<double>(dist::rank_memory_stats().peak_bytes - live) / kMiB);
      }
      handle.wait();
      world->barrier();
      if (leader) (round == 0 ? figures.async_first_total_s : figures.async_total_s) = seconds_since(start);
    }
  });
  fs::remove_all(dir / fmt::format("sync-{}", ranks));
  for (int round = 0; round < 2; ++round) fs::remove_all(dir / fmt::format("async-{}-{}", ranks, round));
  return figures;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint save/load throughput for a sharded GPT and its AdamW state", "checkpoint_io"};
  std::string preset = "gpt2-124m";
  std::vector<int> world_sizes = {1, 4};
  std::string parent = fs::temp_directory_path().string();
  app.add_option("--preset", preset, "Model shape preset")->capture_default_str();
  app.add_option("--ranks", world_sizes, "World sizes to measure")->capture_default_str()->delimiter(',');
  app.add_option("--dir", parent,
                 "Where to write (the disk being measured): a folder of this run's own is made inside and removed")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const nn::GPTConfig config = nn::GPTConfig::preset(preset);
  // Only a folder this run made is ever removed: --dir may hold anything.
  TESSERA_CHECK(fs::is_directory(parent), "checkpoint_io: --dir {} is not a directory", parent);
  const fs::path dir = fs::path(parent) / fmt::format("tessera-checkpoint-bench-{}", ::getpid());
  TESSERA_CHECK(fs::create_directory(dir), "checkpoint_io: {} already exists", dir.string());
  fmt::print("checkpoint_io: {} ({:.1f} M parameters) + AdamW state, under {}\n", preset,
             static_cast<double>(config.num_parameters()) / 1e6, dir.string());
  fmt::print("machine: {}, vector ISA {}, {} hardware threads, load {}\n", bench::cpu_model(), bench::vector_isa(),
             std::thread::hardware_concurrency(), bench::load_average());

  // Virtual disks often absorb a burst at a high rate and then sustain a
  // lower one: the probe writes twice back to back and the checkpoints are
  // compared with the second (sustained) figure.
  const int64_t probe_bytes = 12 * config.num_parameters();  // about the checkpoint: params + AdamW moments, f32
  const DiskBandwidth burst = measure_disk(dir, probe_bytes);
  const DiskBandwidth disk = measure_disk(dir, probe_bytes);
  fmt::print("disk: sequential write {:.3f} GB/s sustained ({:.3f} GB/s first burst), fsync'd; cold read {:.3f} GB/s; "
             "{:.2f} GB each\n\n",
             disk.write_gbps, burst.write_gbps, disk.read_gbps, static_cast<double>(probe_bytes) / kGB);
  std::vector<Figures> all;
  for (int ranks : world_sizes) all.push_back(measure(config, ranks, dir));

  fmt::print("| ranks | GB | sync save GB/s | of disk write | sync blocked s | async blocked s (first) | async blocked s "
             "| async total s (first, then) | load GB/s | of disk read | save extra MiB | load extra MiB | snapshot MiB |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Figures& f : all) {
    const double gb = static_cast<double>(f.bytes) / kGB;
    fmt::print("| {} | {:.2f} | {:.3f} | {:.0f}% | {:.2f} | {:.3f} | {:.3f} | {:.2f}, {:.2f} | {:.3f} | {:.0f}% | {:.1f} | "
               "{:.1f} | {:.1f} |\n",
               f.ranks, gb, gb / f.sync_save_s, 100.0 * gb / f.sync_save_s / disk.write_gbps, f.sync_save_s,
               f.async_first_blocked_s, f.async_blocked_s, f.async_first_total_s, f.async_total_s, gb / f.load_s, 100.0 * gb / f.load_s / disk.read_gbps,
               f.save_extra_mib, f.load_extra_mib, f.snapshot_mib);
  }
  fs::remove_all(dir);
  return 0;
}
