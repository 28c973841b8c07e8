// Stacks for the fibers of a block's threads: one mapping per OS thread,
// reused by every block it runs, each stack with a guard page below it so an
// overflowing kernel faults instead of corrupting its neighbour.
#pragma once

#include <boost/context/stack_context.hpp>

#include <cstddef>
#include <cstdint>

namespace tessera::cuda::sim {

class FiberStacks {
 public:
  static constexpr size_t kStackBytes = size_t{64} << 10;

  FiberStacks() = default;
  ~FiberStacks();
  FiberStacks(const FiberStacks&) = delete;
  FiberStacks& operator=(const FiberStacks&) = delete;

  // Makes room for `count` stacks (mapping more if needed).
  void reserve(int count);
  boost::context::stack_context stack(int index) const;

 private:
  size_t slot_bytes() const;
  unsigned char* base_ = nullptr;
  int count_ = 0;
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
