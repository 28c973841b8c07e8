#include "tensor/cuda/sim/intrinsics.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "tensor/cuda/sim/code_site.h"
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

// A compare-and-swap loop on the word as an unsigned integer of its size.
template <typename Bits>
void update_bits(void* address, const void* operands, AtomicUpdate update, void* old_value) {
  std::atomic_ref<Bits> target(*static_cast<Bits*>(address));
  Bits old = target.load(), updated;
  do {
    update(&old, operands, &updated);
  } while (!target.compare_exchange_weak(old, updated));
  std::memcpy(old_value, &old, sizeof(Bits));
}

// What one lane brought to a warp exchange and takes from it. One slot per
// thread of the block this OS thread runs, by linear index; a slot's
// registers are only read while its lane waits in the exchange.
struct ExchangeSlot {
  bool waiting = false;
  const WarpExchange* exchange = nullptr;
  std::source_location site;
  alignas(16) unsigned char input[kWarpExchangeBytes];
  alignas(16) unsigned char output[kWarpExchangeBytes];
};
thread_local std::vector<ExchangeSlot> exchange_slots;

// Run by the first lane to go on after the warp met, while the other 31
// still wait inside warp_exchange: checks that all 32 are at the same
// instruction and site, then combines their registers.
void combine_warp(ThreadBlock& block, int32_t warp, const ExchangeSlot& first, int32_t first_lane) {
  ExchangeSlot* lanes = &exchange_slots[static_cast<size_t>(warp) * 32];
  const auto disagree = [&](int32_t lane, const std::string& there) {
    for (int32_t other = 0; other < 32; ++other) lanes[other].waiting = false;
    block.fault(fmt::format("cuda sim: {}: lanes of warp {} disagree: lane {} executes {} at {}, lane {} {} (every "
                            "lane of the warp must execute the same instruction: .aligned)",
                            block.where(), warp, first_lane, first.exchange->instruction, site_name(first.site), lane,
                            there));
  };
  const void* inputs[32];
  void* outputs[32];
  for (int32_t lane = 0; lane < 32; ++lane) {
    ExchangeSlot& slot = lanes[lane];
    if (!slot.waiting) {
      disagree(lane, "is at another warp operation");
    } else if (slot.exchange != first.exchange || !same_site(slot.site, first.site)) {
      disagree(lane, fmt::format("executes {} at {}", slot.exchange->instruction, site_name(slot.site)));
    }
    inputs[lane] = slot.input;
    outputs[lane] = slot.output;
  }
  first.exchange->combine(inputs, outputs);
  current_launch()->counters.flops += first.exchange->flops;
  for (int32_t lane = 0; lane < 32; ++lane) lanes[lane].waiting = false;
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

void warp_exchange(const WarpExchange& exchange, const void* input, void* output, std::source_location site) {
  LaunchState& launch = launch_of_caller(exchange.instruction);
  ThreadBlock& block = *launch.block;
  const KernelThread& thread = block.running();
  const dim3 dims = launch.config->block;
  const size_t threads = static_cast<size_t>(dims.x) * dims.y * dims.z;
  const unsigned present = block.active_mask();
  if (present != 0xffffffffu) {
    block.fault(fmt::format("cuda sim: {}: {} at {} needs all 32 lanes of warp {}, but only lanes 0x{:08x} are there "
                            "(the others exited, or lie past the block's {} threads)",
                            block.where(), exchange.instruction, site_name(site), thread.warp, present, threads));
  }
  if (exchange_slots.size() < threads) exchange_slots.resize(threads);
  ExchangeSlot& mine = exchange_slots[thread.linear];
  mine.waiting = true;
  mine.exchange = &exchange;
  mine.site = site;
  std::memcpy(mine.input, input, exchange.input_bytes);
  block.warp_operation(WarpOp::exchange, 0xffffffffu, reinterpret_cast<uintptr_t>(exchange.instruction), 0, 32, site);
  if (mine.waiting) combine_warp(block, thread.warp, mine, thread.lane);
  std::memcpy(output, mine.output, exchange.output_bytes);
}

void check_shared_operand(const char* instruction, const void* address, int64_t bytes, int64_t alignment,
                          std::source_location site) {
  LaunchState& launch = launch_of_caller(instruction);
  const auto begin = reinterpret_cast<uintptr_t>(address);
  const bool in_dynamic = launch.dynamic_shared.contains(begin) &&
                          begin + bytes <= launch.dynamic_shared.begin + launch.dynamic_shared_bytes;
  const bool in_static = launch.static_shared.contains(begin) && launch.static_shared.contains(begin + bytes - 1);
  ThreadBlock& block = *launch.block;
  const auto refuse = [&](const std::string& reason) {
    block.fault(fmt::format("cuda sim: {} thread {}: {} at {}: {}", block.where(),
                            block.describe_thread(block.running().linear), instruction, site_name(site), reason));
  };
  if (!in_dynamic && !in_static) {
    refuse(fmt::format("its address {} is not {} bytes of the block's shared memory (the instruction reads .shared "
                       "only)",
                       address, bytes));
  }
  if (begin % static_cast<uint64_t>(alignment) != 0) {
    refuse(fmt::format("its address {} is not {}-byte aligned", address, alignment));
  }
}

void atomic_update(void* address, int32_t bytes, const void* operands, AtomicUpdate update, void* old_value,
                   std::source_location site) {
  LaunchState& launch = launch_of_caller("an atomic");
  const CodeSite code_site{nullptr, site};
  if (reinterpret_cast<uintptr_t>(address) % static_cast<uint64_t>(bytes) != 0) {
    launch.block->fault(fmt::format("cuda sim: {} thread {}: misaligned atomic at {} on {} ({}-byte operand)",
                                    launch.block->where(), launch.block->describe_thread(launch.block->running_linear()),
                                    describe(code_site), address, bytes));
  }
  check_access(address, bytes, AccessKind::atomic, code_site);
  switch (bytes) {
    case 2: update_bits<uint16_t>(address, operands, update, old_value); break;
    case 4: update_bits<uint32_t>(address, operands, update, old_value); break;
    case 8: update_bits<uint64_t>(address, operands, update, old_value); break;
    default: fail("cuda sim: a {}-byte atomic", bytes);
  }
  const bool stored = std::memcmp(old_value, address, static_cast<size_t>(bytes)) != 0;
  memory_poll(code_site, stored);
}

int32_t sync_threads_count(int predicate, std::source_location site) {
  return launch_of_caller("__syncthreads_count").block->sync_threads_count(predicate, site);
}

int64_t clock_ticks() { return launch_of_caller("clock64").block->tick(); }

void nano_sleep(std::source_location site) {
  launch_of_caller("__nanosleep");
  memory_poll(CodeSite{nullptr, site}, false);
}

}  // namespace tessera::cuda::sim
