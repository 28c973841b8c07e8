// bench/simulator: what the SIMT simulator costs and what it counts. For each
// kernel shape (a thread per element; a block tree with barriers; warp
// shuffles) it prints the time per simulated thread, and the device bytes
// the simulator counted against the ideal (each input read once, each output
// written once). The simulator's speed decides how long the cuda suite and a
// simulated training step take; its counts feed the GPU roofline.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "bench/machine_context.h"
#include "bench/simulator_kernels.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/launch.h"

namespace sim = tessera::cuda::sim;

namespace {

struct DeviceFloats {
  explicit DeviceFloats(int64_t count) : data(static_cast<float*>(sim::device_malloc(0, count * 4))) {
    for (int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(i % 7);
    sim::mark_device_written(data, count * 4);  // the host filled it, as a copy to the device would
  }
  ~DeviceFloats() { sim::device_free(data); }
  float* data;
};

void run(const std::string& name, const std::string& kernel, int64_t threads, int64_t ideal_bytes,
         const std::function<void()>& launch) {
  launch();  // warm-up: fiber stacks and shadow memory
  sim::reset_kernel_counters();
  const auto start = std::chrono::steady_clock::now();
  launch();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const sim::KernelCounters counters = sim::kernel_counters().at(kernel);
  const int64_t moved = counters.device_bytes_read + counters.device_bytes_written;
  fmt::print("{:<34} {:>10} {:>9.1f} {:>8.1f} {:>12} {:>12} {:>6.3f} {:>12}\n", name, threads, seconds * 1e3,
             seconds / static_cast<double>(threads) * 1e9, moved, ideal_bytes,
             static_cast<double>(moved) / static_cast<double>(ideal_bytes), counters.shared_bytes_accessed);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera SIMT simulator: time per simulated thread, and counted bytes against the ideal"};
  int64_t elements = 1 << 20;
  app.add_option("--elements", elements, "elements per kernel (a multiple of 256)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  elements = (elements + 255) / 256 * 256;

  fmt::print("# simulator bench: cpu={} ({} cores online, load average {}), one OS thread per launch\n",
             bench::cpu_model(), std::thread::hardware_concurrency(), bench::load_average());
  fmt::print("{:<34} {:>10} {:>9} {:>8} {:>12} {:>12} {:>6} {:>12}\n", "kernel", "threads", "ms", "ns/thr",
             "bytes moved", "ideal", "ratio", "shared bytes");
  DeviceFloats in(elements), out(elements);
  run("scale (thread per element)", "scale_kernel", elements, elements * 8,
      [&] { simulator_bench::scale(in.data, out.data, static_cast<int>(elements)); });
  run("block tree sum (8 barriers)", "block_tree_sum_kernel", elements, elements * 4 + elements / 256 * 4,
      [&] { simulator_bench::block_tree_sum(in.data, out.data, static_cast<int>(elements / 256)); });
  run("warp shuffle sum (5 shuffles)", "warp_shuffle_sum_kernel", elements, elements * 4 + elements / 32 * 4,
      [&] { simulator_bench::warp_shuffle_sum(in.data, out.data, static_cast<int>(elements / 32)); });
  return 0;
}
