// Stacks for the fibers of a block's threads: one mapping per OS thread,
// reused by every block it runs, each stack with a guard page below it so an
// overflowing kernel faults instead of corrupting its neighbour.
//
// A guard page splits the mapping: two memory areas a stack, and Linux caps a
// process at vm.max_map_count areas (65530 by default). Sixteen simulated
// devices, each with several stream threads running blocks of up to 1024
// threads, would pass it (and then thread creation or malloc fails). So the
// process guards its first kGuardedStacks stacks; beyond them the page below
// each stack holds a canary instead, checked after every block
// (check_canaries): an overflow is still an error naming the kernel, found
// when the block ends rather than at the faulting write, and the page keeps
// it off the neighbouring stack unless one frame jumps it.
#pragma once

#include <boost/context/stack_context.hpp>

#include <cstddef>
#include <cstdint>

namespace tessera::cuda::sim {

class FiberStacks {
 public:
  static constexpr size_t kStackBytes = size_t{64} << 10;
  static constexpr int64_t kGuardedStacks = 8192;  // 16384 of the default 65530 areas

  FiberStacks() = default;
  ~FiberStacks();
  FiberStacks(const FiberStacks&) = delete;
  FiberStacks& operator=(const FiberStacks&) = delete;

  // Makes room for `count` stacks (mapping more if needed).
  void reserve(int count);
  boost::context::stack_context stack(int index) const;
  // Whether this pool's stacks have guard pages (else canaries).
  bool guarded() const { return guarded_; }
  // After a block of `count` threads: an Error naming `kernel` if a stack
  // ran over its end into the canary below it (the canary is rewritten
  // first, so the pool stays usable). Nothing for guarded stacks.
  void check_canaries(int count, const char* kernel);
  // The stacks with guard pages in the process now (for tests).
  static int64_t guarded_in_process();

 private:
  size_t slot_bytes() const;
  void release();
  unsigned char* base_ = nullptr;
  int count_ = 0;
  bool guarded_ = false;
};

// Under AddressSanitizer, clears `stack`'s shadow before a fiber runs on it.
// Stacks are reused block after block, and a fiber that faulted left the
// stack by an exception thrown across a context switch ASan never saw: the
// redzones of its frames stay poisoned and would fault the next fiber's
// frames at those addresses. Nothing without ASan.
void forget_stale_poison(const boost::context::stack_context& stack);

// A Boost.Context stack allocator handing out one of the pool's stacks; the
// pool owns the memory, so deallocation does nothing.
struct PooledStack {
  boost::context::stack_context context;
  boost::context::stack_context allocate() const {
    forget_stale_poison(context);
    return context;
  }
  void deallocate(boost::context::stack_context&) const noexcept {}
};

}  // namespace tessera::cuda::sim
