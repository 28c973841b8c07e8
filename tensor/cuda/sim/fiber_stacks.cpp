#include "tensor/cuda/sim/fiber_stacks.h"

#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "tensor/error.h"

namespace tessera::cuda::sim {

size_t FiberStacks::slot_bytes() const { return kStackBytes + static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

FiberStacks::~FiberStacks() {
  if (base_ != nullptr) munmap(base_, slot_bytes() * count_);
}

void FiberStacks::reserve(int count) {
  if (count <= count_) return;
  if (base_ != nullptr) munmap(base_, slot_bytes() * count_);
  const size_t bytes = slot_bytes() * count;
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                       -1, 0);
  TESSERA_CHECK(mapping != MAP_FAILED, "cuda sim: cannot map {} fiber stacks", count);
  base_ = static_cast<unsigned char*>(mapping);
  count_ = count;
  const size_t guard = slot_bytes() - kStackBytes;
  for (int index = 0; index < count; ++index) mprotect(base_ + slot_bytes() * index, guard, PROT_NONE);
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
