#include "tensor/cuda/sim/launch.h"

#include <elf.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

#include "tensor/cuda/sim/architecture.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/fiber_stacks.h"
#include "tensor/cuda/sim/launch_state.h"
#include "tensor/cuda/sim/schedule_recorder.h"
#include "tensor/cuda/sim/sim_stream.h"
#include "tensor/cuda/sim/stream_order_checker.h"
#include "tensor/cuda/sim/thread_block.h"
#include "tensor/error.h"
#include "tensor/stream.h"

namespace tessera::cuda::sim {

namespace {

std::atomic<uint64_t> block_order_seed{0x7e55e7a};
std::atomic<uint64_t> launches_so_far{0};

std::mutex counters_mutex;
std::map<std::string, KernelCounters>& all_counters() {
  static auto* counters = new std::map<std::string, KernelCounters>;
  return *counters;
}

// Extra bytes past the configured dynamic shared memory, so an overrun lands
// in the window and is reported instead of touching the heap.
constexpr int64_t kSharedRedZone = 1024;

// The GPU accepts grids of 2^31 blocks; simulating one would take hours and
// the block order alone gigabytes, so the simulator stops well before.
constexpr int64_t kMaxSimulatedBlocks = int64_t{1} << 24;

// Whether kernels' accesses reach the simulator (memcheck, initcheck): not
// in an AddressSanitizer build (meson.build).
constexpr bool kSimChecks = TESSERA_SIM_CHECKS != 0;

void validate(const char* kernel, const LaunchConfig& config) {
  const Architecture& arch = target_architecture();
  const dim3 grid = config.grid, block = config.block;
  const int64_t block_dims[3] = {block.x, block.y, block.z}, grid_dims[3] = {grid.x, grid.y, grid.z};
  for (int axis = 0; axis < 3; ++axis) {
    TESSERA_CHECK(block_dims[axis] >= 1 && block_dims[axis] <= arch.max_block_dim[axis],
                  "cuda sim: launch of `{}`: block ({},{},{}) is outside {}'s limits ({},{},{})", kernel, block.x,
                  block.y, block.z, arch.name, arch.max_block_dim[0], arch.max_block_dim[1], arch.max_block_dim[2]);
    TESSERA_CHECK(grid_dims[axis] >= 1 && grid_dims[axis] <= arch.max_grid_dim[axis],
                  "cuda sim: launch of `{}`: grid ({},{},{}) is outside {}'s limits ({},{},{})", kernel, grid.x, grid.y,
                  grid.z, arch.name, arch.max_grid_dim[0], arch.max_grid_dim[1], arch.max_grid_dim[2]);
  }
  const int64_t blocks = grid_dims[0] * grid_dims[1] * grid_dims[2];
  TESSERA_CHECK(blocks <= kMaxSimulatedBlocks,
                "cuda sim: launch of `{}`: grid ({},{},{}) has {} blocks; the simulator runs at most {} per launch",
                kernel, grid.x, grid.y, grid.z, blocks, kMaxSimulatedBlocks);
  const int64_t threads = block_dims[0] * block_dims[1] * block_dims[2];
  TESSERA_CHECK(threads <= arch.max_threads_per_block,
                "cuda sim: launch of `{}`: {} threads per block, above {}'s {}", kernel, threads, arch.name,
                arch.max_threads_per_block);
  const int64_t shared = config.dynamic_shared_bytes;
  const int64_t limit = config.shared_memory_opt_in ? arch.max_shared_bytes_per_block : arch.default_shared_bytes;
  TESSERA_CHECK(shared >= 0 && shared <= limit,
                "cuda sim: launch of `{}`: {} bytes of dynamic shared memory, above the {} bytes a block may have on "
                "{}{}",
                kernel, shared, limit, arch.name,
                config.shared_memory_opt_in ? "" : " without opting in (LaunchConfig::shared_memory_opt_in)");
  check_device_buffers(fmt::format("launch of `{}`", kernel), config.stream->device().index, config.buffers);
}

// This OS thread's copy of the TLS segment of the module holding `code`:
// where the kernel's __shared__ (thread_local) variables live.
Window static_shared_window(const void* code) {
  struct Search {
    uintptr_t code;
    Window window;
  } search{reinterpret_cast<uintptr_t>(code), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto& search = *static_cast<Search*>(data);
        bool holds_code = false;
        const ElfW(Phdr)* tls = nullptr;
        for (int index = 0; index < info->dlpi_phnum; ++index) {
          const ElfW(Phdr)& header = info->dlpi_phdr[index];
          const uintptr_t begin = info->dlpi_addr + header.p_vaddr;
          if (header.p_type == PT_LOAD && search.code - begin < header.p_memsz) holds_code = true;
          if (header.p_type == PT_TLS) tls = &header;
        }
        if (!holds_code) return 0;
        if (tls != nullptr && info->dlpi_tls_data != nullptr) {
          search.window = Window{reinterpret_cast<uintptr_t>(info->dlpi_tls_data), static_cast<int64_t>(tls->p_memsz)};
        }
        return 1;
      },
      &search);
  return search.window;
}

// The dynamic shared memory of the blocks this OS thread runs, with its red
// zone; filled with all-ones bytes (NaN in every float type) before each
// block, as shared memory starts with garbage on the GPU.
std::vector<unsigned char>& dynamic_shared_buffer(int64_t bytes) {
  thread_local std::vector<unsigned char> buffer;
  if (static_cast<int64_t>(buffer.size()) < bytes + kSharedRedZone) buffer.resize(bytes + kSharedRedZone);
  return buffer;
}

// The racecheck shadows of a launch: 48 bytes a byte of each window, and the
// static window is the kernels' module's whole TLS segment (about 400 KB),
// so a fresh pair per launch zeroed 20 MB each time. This OS thread keeps a
// pair between launches instead; their block and epoch stamps make a reused
// shadow start empty.
class BorrowedRacechecks {
 public:
  BorrowedRacechecks() : pair_(spare() != nullptr ? std::move(spare()) : std::make_unique<Pair>()) {}
  ~BorrowedRacechecks() { spare() = std::move(pair_); }
  BorrowedRacechecks(const BorrowedRacechecks&) = delete;
  BorrowedRacechecks& operator=(const BorrowedRacechecks&) = delete;
  SharedMemoryRacecheck& static_window() { return pair_->static_window; }
  SharedMemoryRacecheck& dynamic_window() { return pair_->dynamic_window; }

 private:
  struct Pair {
    SharedMemoryRacecheck static_window{true};  // tracks the bytes touched: the footprint, and what to poison
    SharedMemoryRacecheck dynamic_window{false};
  };
  static std::unique_ptr<Pair>& spare() {
    thread_local std::unique_ptr<Pair> pair;
    return pair;
  }
  std::unique_ptr<Pair> pair_;
};

std::vector<uint3> block_order(dim3 grid, uint64_t launch_number) {
  std::vector<uint3> blocks;
  blocks.reserve(static_cast<size_t>(grid.x) * grid.y * grid.z);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back(uint3{x, y, z});
    }
  }
  std::mt19937_64 random(block_order_seed.load() ^ (launch_number * 0x9e3779b97f4a7c15ull));
  std::shuffle(blocks.begin(), blocks.end(), random);
  return blocks;
}

void run_launch(const std::string& kernel_name, const void* kernel_address, const LaunchConfig& config,
                const std::function<void()>& thread_body, uint64_t launch_number, int64_t scheduled) {
  LaunchState launch;
  launch.kernel_name = kernel_name;
  launch.config = &config;
  launch.thread_body = &thread_body;
  launch.static_shared = static_shared_window(kernel_address);
  std::vector<unsigned char>& dynamic = dynamic_shared_buffer(config.dynamic_shared_bytes);
  launch.dynamic_shared = Window{reinterpret_cast<uintptr_t>(dynamic.data()), static_cast<int64_t>(dynamic.size())};
  launch.dynamic_shared_bytes = config.dynamic_shared_bytes;
  BorrowedRacechecks racechecks;
  launch.static_racecheck = &racechecks.static_window();
  launch.dynamic_racecheck = &racechecks.dynamic_window();
  thread_local FiberStacks stacks;

  struct Restore {
    LaunchState* previous = current_launch();
    ~Restore() { set_current_launch(previous); }
  } restore;
  set_current_launch(&launch);
  const std::vector<uint3> blocks = block_order(config.grid, launch_number);
  for (const uint3& index : blocks) {
    std::memset(dynamic.data(), 0xff, static_cast<size_t>(config.dynamic_shared_bytes + kSharedRedZone));
    launch.static_racecheck->reset(launch.static_shared.bytes);
    launch.dynamic_racecheck->reset(launch.dynamic_shared.bytes);
    ThreadBlock block(launch, index, stacks);
    block.run();
    stacks.check_canaries(static_cast<int>(config.block.x * config.block.y * config.block.z), kernel_name.c_str());
    launch.block = nullptr;
    launch.static_racecheck->poison_touched(reinterpret_cast<unsigned char*>(launch.static_shared.begin));
  }
  {
    const dim3 block = config.block;
    std::lock_guard lock(counters_mutex);
    KernelCounters& total = all_counters()[kernel_name];
    total.launches += 1;
    total.blocks += static_cast<int64_t>(blocks.size());
    total.threads += static_cast<int64_t>(blocks.size()) * block.x * block.y * block.z;
    total.device_bytes_read += launch.counters.device_bytes_read;
    total.device_bytes_written += launch.counters.device_bytes_written;
    total.shared_bytes_accessed += launch.counters.shared_bytes_accessed;
    total.flops += launch.counters.flops;
  }
  schedule_counts(scheduled, launch.counters.device_bytes_read + launch.counters.device_bytes_written,
                  launch.counters.shared_bytes_accessed, launch.counters.flops);
  if (!launch.reports.empty()) throw Error(launch.reports.text());
}

}  // namespace

void launch(const char* kernel_name, const void* kernel_address, const LaunchConfig& config,
            std::function<void()> thread_body) {
  const RuntimeCall call("cudaLaunchKernel");
  TESSERA_CHECK(config.stream != nullptr,
                "cuda sim: launch of `{}` on no stream, which is CUDA's legacy default stream: its implicit "
                "synchronisation is not modelled and the stream-ordering checker could not see the launch, so the "
                "simulator refuses it (as the nvidia runtime does); set LaunchConfig::stream "
                "(tessera::current_stream(device) is this thread's current one)",
                kernel_name);
  validate(kernel_name, config);
  const uint64_t launch_number = launches_so_far.fetch_add(1);
  const auto* stream = dynamic_cast<const SimStream*>(config.stream);
  TESSERA_CHECK(stream != nullptr, "cuda sim: launch of `{}` on a {} stream (kernels run on cuda streams)",
                kernel_name, config.stream->device().str());
  StreamOrderChecker::instance().check_and_record(stream->checker_id(), kernel_name, config.buffers);
  const int64_t scheduled = schedule_op(*config.stream, {.kind = ScheduledOp::Kind::kernel, .name = kernel_name});
  config.stream->enqueue([name = std::string(kernel_name), kernel_address, config, body = std::move(thread_body),
                          launch_number, scheduled] {
    run_launch(name, kernel_address, config, body, launch_number, scheduled);
  });
}

void launch_collective(const std::string& operation, const CollectiveShape& shape, Stream& stream,
                       const std::vector<BufferUse>& buffers, std::function<void(const std::string& refusal)> body) {
  const RuntimeCall call("ncclCollective");
  auto* sim_stream = dynamic_cast<SimStream*>(&stream);
  TESSERA_CHECK(sim_stream != nullptr, "cuda sim: {} on a {} stream (collectives run on cuda streams)", operation,
                stream.device().str());
  check_device_buffers(operation, stream.device().index, buffers);
  StreamOrderChecker::instance().check_and_record(sim_stream->checker_id(), operation, buffers);
  schedule_op(stream, {.kind = ScheduledOp::Kind::collective, .name = shape.kind, .bytes = shape.bytes,
                       .ranks = shape.ranks, .group = shape.group});
  stream.enqueue([operation, buffers, body = std::move(body)] {
    // Without the checks, kernels' writes are not tracked (an ASan build):
    // every kernel-written buffer would read as never written.
    std::string refusal;
    for (const BufferUse& buffer : buffers) {
      if (!kSimChecks || !refusal.empty() || buffer.access == BufferAccess::write || buffer.bytes == 0) continue;
      const int64_t unwritten = first_unwritten_device_byte(buffer.data, buffer.bytes);
      if (unwritten >= 0) {
        refusal = fmt::format("cuda sim initcheck: {} reads buffer `{}` ({} bytes at {}), whose byte {} was never "
                              "written", operation, buffer.name, buffer.bytes, buffer.data, unwritten);
      }
    }
    body(refusal);
    if (!refusal.empty()) fail("{}", refusal);
    for (const BufferUse& buffer : buffers) {
      if (buffer.access != BufferAccess::read && buffer.bytes > 0) mark_device_written(buffer.data, buffer.bytes);
    }
  });
}

void set_block_order_seed(uint64_t seed) {
  block_order_seed.store(seed);
  launches_so_far.store(0);
}

std::map<std::string, KernelCounters> kernel_counters() {
  std::lock_guard lock(counters_mutex);
  return all_counters();
}

void reset_kernel_counters() {
  std::lock_guard lock(counters_mutex);
  all_counters().clear();
}

void count_library_call(const std::string& name, int64_t bytes_read, int64_t bytes_written, int64_t flops) {
  std::lock_guard lock(counters_mutex);
  KernelCounters& total = all_counters()[name];
  total.launches += 1;
  total.device_bytes_read += bytes_read;
  total.device_bytes_written += bytes_written;
  total.flops += flops;
}

}  // namespace tessera::cuda::sim
