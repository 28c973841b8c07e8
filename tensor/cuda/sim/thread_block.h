// One block of a simulated launch. Every CUDA thread of the block is a fiber
// on the OS thread running the launch; the scheduler resumes each runnable
// thread until it waits (at __syncthreads or a warp-level operation) or
// exits. So threads run concurrently up to their barriers, warps of 32 meet
// at their shuffles and votes, and a barrier or warp operation that some
// thread can never reach is found and named instead of hanging.
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
  // What this thread brought to the warp operation it waits at, and its result.
  WarpOp op = WarpOp::syncwarp;
  unsigned mask = 0;
  uint64_t value = 0;
  int32_t argument = 0;
  int32_t width = 32;
  uint64_t result = 0;
};

struct WarpState {
  unsigned lanes = 0;        // lanes that exist (the last warp of a block may be partial)
  unsigned waiting = 0;      // lanes waiting at a warp operation
  uint32_t syncs = 0;        // completed __syncwarp, for racecheck's ordering
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
  Accessor accessor() const;

  // Called by the running thread.
  void sync_threads(std::source_location site);
  uint64_t warp_operation(WarpOp op, unsigned mask, uint64_t value, int argument, int width,
                          std::source_location site);
  unsigned active_mask() const;
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
  void complete_warp_operation(WarpState& warp, int32_t warp_index, unsigned mask);
  std::string describe_waiting() const;

  LaunchState& launch_;
  uint3 index_;
  std::vector<KernelThread> threads_;
  std::vector<WarpState> warps_;
  KernelThread* running_ = nullptr;
  std::string fault_;
  bool faulted_ = false;
};

}  // namespace tessera::cuda::sim
