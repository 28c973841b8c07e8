// One block of a simulated launch. Every CUDA thread of the block is a fiber
// on the OS thread running the launch; the scheduler resumes each runnable
// thread until it waits (at __syncthreads or a warp-level operation), polls
// memory (a volatile or atomic access: the spin-waits sm_70's independent
// thread scheduling allows) or exits. So threads run concurrently up to
// their barriers, warps of 32 meet at their shuffles and votes, and a
// barrier, warp operation or spin that can never finish is found and named
// instead of hanging.
#pragma once

#include <boost/context/fiber.hpp>
#include <vector_types.h>

#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

#include "tensor/cuda/sim/fiber_stacks.h"
#include "tensor/cuda/sim/intrinsics.h"
#include "tensor/cuda/sim/launch_state.h"
#include "tensor/cuda/sim/shared_memory_racecheck.h"

namespace tessera::cuda::sim {

struct KernelThread {
  enum class State : uint8_t { runnable, at_barrier, at_warp_operation, exited, faulted };

  uint3 index;
  int32_t linear;  // x + y * blockDim.x + z * blockDim.x * blockDim.y
  int32_t warp;
  int32_t lane;
  State state = State::runnable;
  boost::context::fiber suspended;  // resumes this thread; held by the scheduler
  boost::context::fiber scheduler;  // resumes the scheduler; held while this thread runs
  std::source_location wait_site;
  int32_t barrier_predicate = 0;  // what it brought to __syncthreads_count/_and/_or
  bool spinning = false;  // yielded at a memory poll, not a wait
  CodeSite spin_site;
  // What this thread brought to the warp operation it waits at, and its result.
  WarpOp op = WarpOp::syncwarp;
  unsigned mask = 0;
  uint64_t value = 0;
  int32_t argument = 0;
  int32_t width = 32;
  uint64_t result = 0;
};

struct WarpState {
  unsigned lanes = 0;    // lanes that exist (the last warp of a block may be partial)
  unsigned waiting = 0;  // lanes waiting at a warp operation
  unsigned exited = 0;   // lanes that have exited
  WarpOrder order;       // completed __syncwarp calls, for racecheck's ordering
};

class ThreadBlock {
 public:
  ThreadBlock(LaunchState& launch, uint3 index, FiberStacks& stacks);
  ~ThreadBlock();
  ThreadBlock(const ThreadBlock&) = delete;
  ThreadBlock& operator=(const ThreadBlock&) = delete;

  // Runs every thread to its end; a fault throws tessera::Error naming the
  // kernel, the block and the threads (the block's fibers are abandoned).
  void run();

  uint3 index() const { return index_; }
  KernelThread& running() { return *running_; }
  int32_t running_linear() const { return running_->linear; }
  Accessor accessor(const CodeSite& site) const {
    return Accessor{running_->linear, running_->warp, running_->lane, &warps_[running_->warp].order, site};
  }

  // Called by the running thread.
  void sync_threads(std::source_location site);
  // __syncthreads_count: the barrier, then how many threads brought a non-zero predicate.
  int32_t sync_threads_count(int predicate, std::source_location site);
  // The simulated clock: advances at every call and every scheduling point.
  int64_t tick() { return ++ticks_; }
  uint64_t warp_operation(WarpOp op, unsigned mask, uint64_t value, int argument, int width,
                          std::source_location site);
  unsigned active_mask() const;
  // A memory poll (volatile or atomic): lets the other threads run, so a
  // spin-wait sees their stores; spinning with no thread left to store is
  // reported as a deadlock.
  void spin_point(const CodeSite& site);
  // A store to device or shared memory: what spinning threads wait for.
  void note_progress() { ++progress_; }
  // Ends the launch with `message`: the running thread never resumes.
  [[noreturn]] void fault(const std::string& message);

  // "kernel `name` block (1,0,0)", and a thread's "(3,0,0)".
  std::string where() const;
  std::string describe_thread(int32_t linear) const;

 private:
  void start(KernelThread& thread, FiberStacks& stacks);
  void resume(KernelThread& thread);
  void yield();
  void release_barrier_or_fail();
  // Completes the operation the lanes of `mask` wait at, `reference` among them.
  void complete_warp_operation(WarpState& warp, int32_t warp_index, unsigned mask, const KernelThread& reference);
  // After a lane exits: completes what its warp's other lanes wait at, when
  // every lane of the mask has now arrived or exited.
  void settle_warp_after_exit(const KernelThread& exited_thread);
  [[noreturn]] void fail_spinning() const;
  std::string describe_waiting() const;

  LaunchState& launch_;
  uint3 index_;
  std::vector<KernelThread> threads_;
  std::vector<WarpState> warps_;
  KernelThread* running_ = nullptr;
  std::string fault_;
  bool faulted_ = false;
  bool in_fiber_ = false;  // a kernel thread runs, not the scheduler
  uint64_t progress_ = 0;
  int64_t ticks_ = 0;
  int32_t barrier_count_ = 0;  // the last barrier's count of non-zero predicates
};

// Scheduler passes in which every thread that ran only polled memory and no
// thread stored anything, before a spin-wait is called a deadlock: far more
// than any bounded poll in a kernel needs to see a store that is coming.
constexpr int32_t kFruitlessSpinPasses = 4096;

}  // namespace tessera::cuda::sim
