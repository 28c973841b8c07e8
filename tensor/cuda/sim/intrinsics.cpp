#include "tensor/cuda/sim/intrinsics.h"

#include <atomic>

#include "tensor/cuda/sim/launch_state.h"
#include "tensor/cuda/sim/memory_access.h"
#include "tensor/cuda/sim/thread_block.h"
#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

LaunchState& launch_of_caller(const char* what) {
  LaunchState* launch = current_launch();
  TESSERA_CHECK(launch != nullptr && launch->block != nullptr, "cuda sim: {} called outside a kernel", what);
  return *launch;
}

// A read-modify-write, atomic against every thread of the process (blocks of
// kernels on other streams run on other OS threads).
template <typename T, typename Update>
T atomic_update(T* address, Update update) {
  LaunchState& launch = launch_of_caller("an atomic");
  if (reinterpret_cast<uintptr_t>(address) % sizeof(T) != 0) {
    launch.block->fault(fmt::format("cuda sim: {}: misaligned atomic on {} ({}-byte operand)", launch.block->where(),
                                    static_cast<const void*>(address), sizeof(T)));
  }
  check_access(address, sizeof(T), AccessKind::atomic);
  std::atomic_ref<T> target(*address);
  T old = target.load();
  while (!target.compare_exchange_weak(old, update(old))) {
  }
  return old;
}

}  // namespace

thread_local LaunchState* running_launch = nullptr;
LaunchState* current_launch() { return running_launch; }
void set_current_launch(LaunchState* launch) { running_launch = launch; }

uint3 thread_index() { return launch_of_caller("threadIdx").block->running().index; }
uint3 block_index() { return launch_of_caller("blockIdx").block->index(); }
dim3 block_dim() { return launch_of_caller("blockDim").config->block; }
dim3 grid_dim() { return launch_of_caller("gridDim").config->grid; }

void sync_threads(std::source_location site) { launch_of_caller("__syncthreads").block->sync_threads(site); }

uint64_t warp_operation(WarpOp op, unsigned mask, uint64_t value, int argument, int width,
                        std::source_location site) {
  return launch_of_caller(warp_op_name(op)).block->warp_operation(op, mask, value, argument, width, site);
}

unsigned active_mask() { return launch_of_caller("__activemask").block->active_mask(); }

void* dynamic_shared_memory() {
  return reinterpret_cast<void*>(launch_of_caller("dynamic_shared_memory").dynamic_shared.begin);
}

int atomic_add(int* address, int value) {
  return atomic_update(address, [value](int old) { return static_cast<int>(static_cast<unsigned>(old) + value); });
}
unsigned atomic_add(unsigned* address, unsigned value) {
  return atomic_update(address, [value](unsigned old) { return old + value; });
}
unsigned long long atomic_add(unsigned long long* address, unsigned long long value) {
  return atomic_update(address, [value](unsigned long long old) { return old + value; });
}
float atomic_add(float* address, float value) {
  return atomic_update(address, [value](float old) { return old + value; });
}
double atomic_add(double* address, double value) {
  return atomic_update(address, [value](double old) { return old + value; });
}
int atomic_max(int* address, int value) {
  return atomic_update(address, [value](int old) { return std::max(old, value); });
}
unsigned atomic_max(unsigned* address, unsigned value) {
  return atomic_update(address, [value](unsigned old) { return std::max(old, value); });
}
int atomic_min(int* address, int value) {
  return atomic_update(address, [value](int old) { return std::min(old, value); });
}
unsigned atomic_min(unsigned* address, unsigned value) {
  return atomic_update(address, [value](unsigned old) { return std::min(old, value); });
}
int atomic_exchange(int* address, int value) {
  return atomic_update(address, [value](int) { return value; });
}
unsigned atomic_exchange(unsigned* address, unsigned value) {
  return atomic_update(address, [value](unsigned) { return value; });
}
float atomic_exchange(float* address, float value) {
  return atomic_update(address, [value](float) { return value; });
}
int atomic_compare_and_swap(int* address, int expected, int desired) {
  return atomic_update(address, [=](int old) { return old == expected ? desired : old; });
}
unsigned atomic_compare_and_swap(unsigned* address, unsigned expected, unsigned desired) {
  return atomic_update(address, [=](unsigned old) { return old == expected ? desired : old; });
}
unsigned long long atomic_compare_and_swap(unsigned long long* address, unsigned long long expected,
                                           unsigned long long desired) {
  return atomic_update(address, [=](unsigned long long old) { return old == expected ? desired : old; });
}

}  // namespace tessera::cuda::sim
