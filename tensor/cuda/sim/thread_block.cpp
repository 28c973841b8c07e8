#include "tensor/cuda/sim/thread_block.h"

#include <bit>
#include <cstring>
#include <map>
#include <new>

#include "tensor/cuda/sim/code_site.h"
#include "tensor/cuda/sim/memory_access.h"
#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

// Destroying a suspended fiber would unwind its stack through kernel code
// that the compiler's instrumentation treats as never throwing. A faulted
// block's fibers are dropped instead: their stacks belong to the pool, and a
// kernel holds nothing that needs a destructor.
void abandon(boost::context::fiber&& fiber) {
  alignas(boost::context::fiber) static thread_local unsigned char dropped[sizeof(boost::context::fiber)];
  new (dropped) boost::context::fiber(std::move(fiber));
}

bool is_shuffle(WarpOp op) {
  return op == WarpOp::shfl || op == WarpOp::shfl_up || op == WarpOp::shfl_down || op == WarpOp::shfl_xor;
}

// The lane whose value `lane` receives, CUDA's rules for a segment of `width`
// lanes: out-of-segment sources give the lane its own value.
// The lanes of `arrived` that brought `value`.
uint64_t lanes_matching(const KernelThread* lanes, unsigned arrived, uint64_t value) {
  uint64_t matching = 0;
  for (unsigned rest = arrived; rest != 0; rest &= rest - 1) {
    const int32_t lane = std::countr_zero(rest);
    if (lanes[lane].value == value) matching |= 1u << lane;
  }
  return matching;
}

// __reduce_*_sync over the 32-bit values of `arrived`.
uint64_t reduce_lanes(const KernelThread* lanes, unsigned arrived, ReduceOp op) {
  const int32_t first = std::countr_zero(arrived);
  uint32_t result = static_cast<uint32_t>(lanes[first].value);
  for (unsigned rest = arrived & (arrived - 1); rest != 0; rest &= rest - 1) {
    const uint32_t value = static_cast<uint32_t>(lanes[std::countr_zero(rest)].value);
    const auto as_signed = [](uint32_t bits) { return static_cast<int32_t>(bits); };
    switch (op) {
      case ReduceOp::add_unsigned:
      case ReduceOp::add_signed: result += value; break;
      case ReduceOp::min_unsigned: result = std::min(result, value); break;
      case ReduceOp::max_unsigned: result = std::max(result, value); break;
      case ReduceOp::min_signed: result = static_cast<uint32_t>(std::min(as_signed(result), as_signed(value))); break;
      case ReduceOp::max_signed: result = static_cast<uint32_t>(std::max(as_signed(result), as_signed(value))); break;
      case ReduceOp::bit_and: result &= value; break;
      case ReduceOp::bit_or: result |= value; break;
      case ReduceOp::bit_xor: result ^= value; break;
    }
  }
  return result;
}

int32_t shuffle_source(WarpOp op, int32_t lane, int32_t argument, int32_t width) {
  const int32_t segment = lane / width * width;
  switch (op) {
    case WarpOp::shfl: return segment + ((argument % width) + width) % width;
    case WarpOp::shfl_up: return lane - argument >= segment ? lane - argument : lane;
    case WarpOp::shfl_down: return lane + argument < segment + width ? lane + argument : lane;
    case WarpOp::shfl_xor: {
      const int32_t source = lane ^ argument;
      return source < segment + width ? source : lane;
    }
    default: return lane;
  }
}

}  // namespace

const char* warp_op_name(WarpOp op) {
  switch (op) {
    case WarpOp::syncwarp: return "__syncwarp";
    case WarpOp::shfl: return "__shfl_sync";
    case WarpOp::shfl_up: return "__shfl_up_sync";
    case WarpOp::shfl_down: return "__shfl_down_sync";
    case WarpOp::shfl_xor: return "__shfl_xor_sync";
    case WarpOp::ballot: return "__ballot_sync";
    case WarpOp::any: return "__any_sync";
    case WarpOp::all: return "__all_sync";
    case WarpOp::exchange: return "a warp-wide instruction";
    case WarpOp::match_any: return "__match_any_sync";
    case WarpOp::match_all: return "__match_all_sync";
    case WarpOp::reduce: return "__reduce_*_sync";
  }
  return "?";
}

ThreadBlock::ThreadBlock(LaunchState& launch, uint3 index, FiberStacks& stacks) : launch_(launch), index_(index) {
  const dim3 block = launch.config->block;
  const int32_t count = static_cast<int32_t>(block.x * block.y * block.z);
  threads_.resize(count);
  warps_.resize((count + 31) / 32);
  stacks.reserve(count);
  for (int32_t linear = 0; linear < count; ++linear) {
    KernelThread& thread = threads_[linear];
    thread.index = uint3{linear % block.x, linear / block.x % block.y, linear / (block.x * block.y)};
    thread.linear = linear;
    thread.warp = linear / 32;
    thread.lane = linear % 32;
    warps_[thread.warp].lanes |= 1u << thread.lane;
    start(thread, stacks);
  }
}

ThreadBlock::~ThreadBlock() {
  for (KernelThread& thread : threads_) {
    if (thread.suspended) abandon(std::move(thread.suspended));
  }
}

void ThreadBlock::start(KernelThread& thread, FiberStacks& stacks) {
  thread.suspended = boost::context::fiber(
      std::allocator_arg, PooledStack{stacks.stack(thread.linear)},
      [this, &thread](boost::context::fiber&& scheduler) {
        thread.scheduler = std::move(scheduler);
        try {
          (*launch_.thread_body)();
          settle_pending_write();
          thread.state = KernelThread::State::exited;
        } catch (const boost::context::detail::forced_unwind&) {
          throw;
        } catch (const std::exception& error) {
          thread.state = KernelThread::State::faulted;
          faulted_ = true;
          fault_ = fmt::format("cuda sim: {} thread {}: {}", where(), describe_thread(thread.linear), error.what());
        }
        return std::move(thread.scheduler);
      });
}

void ThreadBlock::resume(KernelThread& thread) {
  running_ = &thread;
  launch_.block = this;
  in_fiber_ = true;
  thread.suspended = std::move(thread.suspended).resume();
  in_fiber_ = false;
  running_ = nullptr;
}

void ThreadBlock::yield() {
  settle_pending_write();
  ++ticks_;
  KernelThread& thread = *running_;
  thread.scheduler = std::move(thread.scheduler).resume();
}

void ThreadBlock::fault(const std::string& message) {
  if (!in_fiber_) throw Error(message);  // the scheduler completing a warp operation for its lanes
  running_->state = KernelThread::State::faulted;
  faulted_ = true;
  fault_ = message;
  yield();
  std::abort();  // a faulted thread is never resumed
}

void ThreadBlock::run() {
  int32_t fruitless_passes = 0;
  for (;;) {
    bool ran = false, only_spun = true;
    const uint64_t progress_before = progress_;
    for (KernelThread& thread : threads_) {
      if (thread.state != KernelThread::State::runnable) continue;
      thread.spinning = false;
      resume(thread);
      ran = true;
      if (faulted_) throw Error(fault_);
      if (thread.state == KernelThread::State::exited) settle_warp_after_exit(thread);
      only_spun = only_spun && thread.spinning && thread.state == KernelThread::State::runnable;
    }
    if (ran && only_spun && progress_ == progress_before) {
      if (++fruitless_passes > kFruitlessSpinPasses) fail_spinning();
    } else {
      fruitless_passes = 0;
    }
    if (ran) continue;
    bool all_exited = true;
    for (const KernelThread& thread : threads_) all_exited = all_exited && thread.state == KernelThread::State::exited;
    if (all_exited) return;
    release_barrier_or_fail();
  }
}

// No thread can run: either every live thread waits at one __syncthreads,
// which then opens, or the block can never finish.
void ThreadBlock::release_barrier_or_fail() {
  const KernelThread* first_waiter = nullptr;
  int32_t waiting = 0, exited = 0;
  for (const KernelThread& thread : threads_) {
    if (thread.state == KernelThread::State::exited) ++exited;
    if (thread.state != KernelThread::State::at_barrier) continue;
    ++waiting;
    if (first_waiter == nullptr) first_waiter = &thread;
  }
  const int32_t count = static_cast<int32_t>(threads_.size());
  const bool one_site = [&] {
    for (const KernelThread& thread : threads_) {
      if (thread.state == KernelThread::State::at_barrier && !same_site(thread.wait_site, first_waiter->wait_site)) {
        return false;
      }
    }
    return true;
  }();
  if (waiting == count && one_site) {
    barrier_count_ = 0;
    for (KernelThread& thread : threads_) {
      thread.state = KernelThread::State::runnable;
      barrier_count_ += thread.barrier_predicate != 0;
      thread.barrier_predicate = 0;
    }
    launch_.static_racecheck->next_epoch();
    launch_.dynamic_racecheck->next_epoch();
    return;
  }
  if (waiting + exited == count && waiting > 0 && one_site) {
    throw Error(fmt::format(
        "cuda sim: {}: divergent barrier: __syncthreads() at {} is reached by {} of {} threads; the other {} "
        "exited without reaching it (a barrier inside a branch that not every thread of the block takes)",
        where(), site_name(first_waiter->wait_site), waiting, count, exited));
  }
  throw Error(fmt::format("cuda sim: {}: the block can never finish: {}", where(), describe_waiting()));
}

std::string ThreadBlock::describe_waiting() const {
  // Threads grouped by what they wait at, in order of first appearance.
  std::vector<std::string> keys;
  std::map<std::string, std::vector<int32_t>> groups;
  for (const KernelThread& thread : threads_) {
    std::string key;
    switch (thread.state) {
      case KernelThread::State::at_barrier: key = "wait at __syncthreads() at " + site_name(thread.wait_site); break;
      case KernelThread::State::at_warp_operation:
        key = fmt::format("wait at {}(mask 0x{:08x}) at {} for lanes that never arrive", warp_op_name(thread.op),
                          thread.mask, site_name(thread.wait_site));
        break;
      case KernelThread::State::exited: key = "exited"; break;
      default: key = thread.spinning ? "spin at " + describe(thread.spin_site) : "run"; break;
    }
    if (!groups.contains(key)) keys.push_back(key);
    groups[key].push_back(thread.linear);
  }
  std::string text;
  for (const std::string& key : keys) {
    const std::vector<int32_t>& members = groups[key];
    if (!text.empty()) text += "; ";
    text += fmt::format("{} thread{} ({}{}) {}", members.size(), members.size() == 1 ? "" : "s",
                        describe_thread(members.front()),
                        members.size() > 1 ? " to " + describe_thread(members.back()) : "", key);
  }
  return text;
}

int32_t ThreadBlock::sync_threads_count(int predicate, std::source_location site) {
  running().barrier_predicate = predicate != 0;
  sync_threads(site);
  return barrier_count_;  // no barrier opens again before every thread has left this one
}

void ThreadBlock::spin_point(const CodeSite& site) {
  KernelThread& thread = running();
  thread.spinning = true;
  thread.spin_site = site;
  yield();
}

void ThreadBlock::fail_spinning() const {
  std::vector<const KernelThread*> spinners;
  for (const KernelThread& thread : threads_) {
    if (thread.state == KernelThread::State::runnable && thread.spinning) spinners.push_back(&thread);
  }
  const KernelThread& first = *spinners.front();
  throw Error(fmt::format(
      "cuda sim: {}: a spin-wait that can never end: {} thread{} ({}{}) poll memory at {} over and over, and no "
      "thread stores anything any more ({}). A flag set by another block is never seen either: the simulator runs "
      "one block at a time, and CUDA does not promise that blocks run concurrently",
      where(), spinners.size(), spinners.size() == 1 ? "" : "s", describe_thread(first.linear),
      spinners.size() > 1 ? " to " + describe_thread(spinners.back()->linear) : "", describe(first.spin_site),
      describe_waiting()));
}

void ThreadBlock::sync_threads(std::source_location site) {
  KernelThread& thread = running();
  thread.state = KernelThread::State::at_barrier;
  thread.wait_site = site;
  yield();
}

uint64_t ThreadBlock::warp_operation(WarpOp op, unsigned mask, uint64_t value, int argument, int width,
                                     std::source_location site) {
  KernelThread& thread = running();
  WarpState& warp = warps_[thread.warp];
  const unsigned own = 1u << thread.lane;
  if ((mask & own) == 0) {
    fault(fmt::format("cuda sim: {}: thread {} (lane {}) calls {} at {} with mask 0x{:08x}, which does not include "
                      "its own lane",
                      where(), describe_thread(thread.linear), thread.lane, warp_op_name(op), site_name(site), mask));
  }
  if ((mask & ~warp.lanes) != 0) {
    fault(fmt::format("cuda sim: {}: {} at {} has mask 0x{:08x}, but warp {} only has lanes 0x{:08x} (the block has "
                      "{} threads)",
                      where(), warp_op_name(op), site_name(site), mask, thread.warp, warp.lanes, threads_.size()));
  }
  if (is_shuffle(op) && (width < 1 || width > 32 || !std::has_single_bit(static_cast<unsigned>(width)))) {
    fault(fmt::format("cuda sim: {}: {} at {} with width {} (a power of two up to 32)", where(), warp_op_name(op),
                      site_name(site), width));
  }
  thread.op = op;
  thread.mask = mask;
  thread.value = value;
  thread.argument = argument;
  thread.width = width;
  thread.wait_site = site;
  warp.waiting |= own;
  ++progress_;
  if (((warp.waiting | warp.exited) & mask) == mask) {
    complete_warp_operation(warp, thread.warp, mask, thread);
  } else {
    thread.state = KernelThread::State::at_warp_operation;
    yield();
  }
  return thread.result;
}

void ThreadBlock::settle_warp_after_exit(const KernelThread& exited_thread) {
  const int32_t warp_index = exited_thread.warp;
  WarpState& warp = warps_[warp_index];
  warp.exited |= 1u << exited_thread.lane;
  for (int32_t lane = 0; lane < 32 && warp.waiting != 0; ++lane) {
    if ((warp.waiting >> lane & 1u) == 0) continue;
    const KernelThread& waiter = threads_[warp_index * 32 + lane];
    if (((warp.waiting | warp.exited) & waiter.mask) != waiter.mask) continue;
    running_ = &threads_[warp_index * 32 + lane];  // faults below are the waiter's
    complete_warp_operation(warp, warp_index, waiter.mask, waiter);
    running_ = nullptr;
  }
}

void ThreadBlock::complete_warp_operation(WarpState& warp, int32_t warp_index, unsigned mask,
                                          const KernelThread& reference) {
  KernelThread* lanes = &threads_[warp_index * 32];
  const unsigned arrived = mask & warp.waiting;
  const auto disagree = [&](const KernelThread& other) {
    fault(fmt::format("cuda sim: {}: lanes of warp {} disagree: lane {} is at {}(mask 0x{:08x}) at {}, lane {} at "
                      "{}(mask 0x{:08x}) at {}",
                      where(), warp_index, reference.lane, warp_op_name(reference.op), reference.mask,
                      site_name(reference.wait_site), other.lane, warp_op_name(other.op), other.mask,
                      site_name(other.wait_site)));
  };
  uint64_t ballot = 0;
  for (int32_t lane = 0; lane < 32; ++lane) {
    if ((arrived >> lane & 1u) == 0) continue;
    const KernelThread& other = lanes[lane];
    if (other.op != reference.op || other.mask != reference.mask) disagree(other);
    if (other.value != 0) ballot |= uint64_t{1} << lane;
  }
  // A lane still waiting with a mask that names these lanes expected them at its own operation.
  for (int32_t lane = 0; lane < 32; ++lane) {
    const bool waits_elsewhere = (warp.waiting >> lane & 1u) != 0 && (mask >> lane & 1u) == 0;
    if (waits_elsewhere && (lanes[lane].mask & mask) != 0) disagree(lanes[lane]);
  }
  // Lanes of the mask that exited: the hardware completes the operation
  // without them, and what they would have brought is undefined.
  const unsigned exited = mask & ~arrived;
  if (exited != 0 && reference.op == WarpOp::exchange) {
    fault(fmt::format("cuda sim: {}: {} at {} needs all 32 lanes of warp {}, but lanes 0x{:08x} exited while the "
                      "others waited (.aligned: every lane of the warp executes it)",
                      where(), reinterpret_cast<const char*>(reference.value), site_name(reference.wait_site),
                      warp_index, exited));
  }
  if (exited != 0 && reference.op != WarpOp::syncwarp && !is_shuffle(reference.op)) {
    fault(fmt::format("cuda sim: {}: {}(mask 0x{:08x}) at {}: lanes 0x{:08x} of warp {} have exited, so its "
                      "result is undefined on the GPU (a lane that returned early is still in the mask)",
                      where(), warp_op_name(reference.op), mask, site_name(reference.wait_site), exited, warp_index));
  }
  if (reference.op == WarpOp::reduce || reference.op == WarpOp::match_any || reference.op == WarpOp::match_all) {
    for (unsigned rest = arrived; rest != 0; rest &= rest - 1) {
      const KernelThread& other = lanes[std::countr_zero(rest)];
      if (other.argument != reference.argument) disagree(other);  // __reduce_add_sync meets __reduce_min_sync
    }
  }
  for (int32_t lane = 0; lane < 32; ++lane) {
    if ((arrived >> lane & 1u) == 0) continue;
    KernelThread& member = lanes[lane];
    switch (member.op) {
      case WarpOp::syncwarp: member.result = 0; break;
      case WarpOp::ballot: member.result = ballot; break;
      case WarpOp::any: member.result = ballot != 0; break;
      case WarpOp::all: member.result = ballot == mask; break;
      case WarpOp::exchange: member.result = 0; break;
      case WarpOp::match_any: member.result = lanes_matching(lanes, arrived, member.value); break;
      case WarpOp::match_all:
        // The mask when every lane brought the same value, else 0.
        member.result = lanes_matching(lanes, arrived, member.value) == arrived ? arrived : 0;
        break;
      case WarpOp::reduce: member.result = reduce_lanes(lanes, arrived, static_cast<ReduceOp>(member.argument)); break;
      default: {
        const int32_t source = shuffle_source(member.op, lane, member.argument, member.width);
        if (source < 0 || source >= 32 || (mask >> source & 1u) == 0) {
          fault(fmt::format("cuda sim: {}: {} at {}: lane {} reads lane {}, which is not in mask 0x{:08x} (its value "
                            "is undefined on the GPU)",
                            where(), warp_op_name(member.op), site_name(member.wait_site), lane, source, mask));
        }
        if ((exited >> source & 1u) != 0) {
          fault(fmt::format("cuda sim: {}: {}(mask 0x{:08x}) at {}: lane {} reads lane {}, which has exited: the value "
                            "it receives is undefined on the GPU (a lane that returned early is still in the mask)",
                            where(), warp_op_name(member.op), mask, site_name(member.wait_site), lane, source));
        }
        member.result = lanes[source].value;
      }
    }
    if (member.state == KernelThread::State::at_warp_operation) member.state = KernelThread::State::runnable;
  }
  warp.waiting &= ~mask;
  if (reference.op == WarpOp::syncwarp) warp.order.sync(mask, warp.lanes);
}

unsigned ThreadBlock::active_mask() const {
  const KernelThread& thread = *running_;
  unsigned mask = 0;
  for (int32_t lane = 0; lane < 32; ++lane) {
    const int32_t linear = thread.warp * 32 + lane;
    if (linear < static_cast<int32_t>(threads_.size()) && threads_[linear].state != KernelThread::State::exited) {
      mask |= 1u << lane;
    }
  }
  return mask;
}

std::string ThreadBlock::where() const {
  return fmt::format("kernel `{}` block ({},{},{})", launch_.kernel_name, index_.x, index_.y, index_.z);
}

std::string ThreadBlock::describe_thread(int32_t linear) const {
  if (linear < 0 || linear >= static_cast<int32_t>(threads_.size())) return "(another thread)";
  const uint3 index = threads_[linear].index;
  return fmt::format("({},{},{})", index.x, index.y, index.z);
}

}  // namespace tessera::cuda::sim
