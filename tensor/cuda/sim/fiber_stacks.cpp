#include "tensor/cuda/sim/fiber_stacks.h"

#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>

#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

std::atomic<int64_t> guarded_stacks{0};

// The canary: the top bytes of the page below each unguarded stack, where
// a thread that runs past its stack's end writes first.
constexpr size_t kCanaryBytes = 256;
constexpr unsigned char kCanaryByte = 0xc5;

}  // namespace

size_t FiberStacks::slot_bytes() const { return kStackBytes + static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

int64_t FiberStacks::guarded_in_process() { return guarded_stacks.load(); }

FiberStacks::~FiberStacks() { release(); }

void FiberStacks::release() {
  if (base_ == nullptr) return;
  munmap(base_, slot_bytes() * count_);
  if (guarded_) guarded_stacks -= count_;
  base_ = nullptr;
  count_ = 0;
}

void FiberStacks::reserve(int count) {
  if (count <= count_) return;
  release();
  const size_t bytes = slot_bytes() * count;
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                       -1, 0);
  TESSERA_CHECK(mapping != MAP_FAILED, "cuda sim: cannot map {} fiber stacks", count);
  base_ = static_cast<unsigned char*>(mapping);
  count_ = count;
  guarded_ = guarded_stacks.fetch_add(count) + count <= kGuardedStacks;
  if (!guarded_) guarded_stacks -= count;
  const size_t guard = slot_bytes() - kStackBytes;
  for (int index = 0; index < count; ++index) {
    unsigned char* below = base_ + slot_bytes() * index;
    if (guarded_) {
      TESSERA_CHECK(mprotect(below, guard, PROT_NONE) == 0, "cuda sim: cannot protect fiber stack {}'s guard page",
                    index);
    } else {
      std::memset(below + guard - kCanaryBytes, kCanaryByte, kCanaryBytes);
    }
  }
}

void FiberStacks::check_canaries(int count, const char* kernel) {
  if (guarded_) return;
  for (int index = 0; index < std::min(count, count_); ++index) {
    unsigned char* canary = base_ + slot_bytes() * (index + 1) - kStackBytes - kCanaryBytes;
    for (size_t byte = 0; byte < kCanaryBytes; ++byte) {
      if (canary[byte] == kCanaryByte) continue;
      std::memset(canary, kCanaryByte, kCanaryBytes);
      tessera::fail("cuda sim: a thread of kernel `{}` overran its {} KiB stack (fiber stack {}; the simulator runs "
                    "each thread on a fiber: deep recursion or large local arrays)",
                    kernel, kStackBytes >> 10, index);
    }
  }
}

void forget_stale_poison(const boost::context::stack_context& stack) {
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(static_cast<char*>(stack.sp) - stack.size, stack.size);
#else
  (void)stack;
#endif
}

boost::context::stack_context FiberStacks::stack(int index) const {
  boost::context::stack_context context;
  context.size = kStackBytes;
  context.sp = base_ + slot_bytes() * (index + 1);  // stacks grow down from the slot's end
  return context;
}

}  // namespace tessera::cuda::sim
