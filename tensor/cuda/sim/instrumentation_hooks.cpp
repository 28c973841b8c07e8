// The entry points GCC's -fsanitize=thread instrumentation calls from the
// simulator's kernel sources, implemented here instead of by the TSan
// runtime (which is never linked): loads and stores go to check_access with
// the hook's return address (the access's place in the kernel), and atomic
// builtins are performed for real (host code in a .cu file uses them, e.g. in
// std::shared_ptr) and checked like atomics. Volatile loads and atomics are
// memory polls, where a spinning thread lets the others run.
#include <cstddef>
#include <cstdint>

#include "tensor/cuda/sim/memory_access.h"

using tessera::cuda::sim::AccessKind;
using tessera::cuda::sim::check_access;
using tessera::cuda::sim::CodeSite;
using tessera::cuda::sim::memory_poll;

// Where the instrumented access is: the caller of the hook.
#define TESSERA_CALLER (CodeSite{__builtin_return_address(0)})

#define TESSERA_ACCESS_HOOKS(size)                                                                           \
  void __tsan_read##size(void* address) { check_access(address, size, AccessKind::read, TESSERA_CALLER); }  \
  void __tsan_write##size(void* address) { check_access(address, size, AccessKind::write, TESSERA_CALLER); } \
  void __tsan_unaligned_read##size(void* address) {                                                          \
    check_access(address, size, AccessKind::read, TESSERA_CALLER, false);                                    \
  }                                                                                                           \
  void __tsan_unaligned_write##size(void* address) {                                                         \
    check_access(address, size, AccessKind::write, TESSERA_CALLER, false);                                   \
  }                                                                                                           \
  void __tsan_volatile_read##size(void* address) {                                                           \
    const CodeSite site = TESSERA_CALLER;                                                                     \
    check_access(address, size, AccessKind::read, site);                                                     \
    memory_poll(site, false);                                                                                 \
  }                                                                                                           \
  void __tsan_volatile_write##size(void* address) {                                                          \
    check_access(address, size, AccessKind::write, TESSERA_CALLER);                                          \
  }                                                                                                           \
  void __tsan_unaligned_volatile_read##size(void* address) {                                                 \
    const CodeSite site = TESSERA_CALLER;                                                                     \
    check_access(address, size, AccessKind::read, site, false);                                              \
    memory_poll(site, false);                                                                                 \
  }                                                                                                           \
  void __tsan_unaligned_volatile_write##size(void* address) {                                                \
    check_access(address, size, AccessKind::write, TESSERA_CALLER, false);                                   \
  }

// Atomic builtins on `type`, at sequential consistency whatever was asked
// (never weaker than the caller needs).
#define TESSERA_ATOMIC_HOOKS(bits, type)                                                                      \
  type __tsan_atomic##bits##_load(const volatile type* address, int) {                                       \
    const CodeSite site = TESSERA_CALLER;                                                                     \
    check_access(const_cast<const type*>(address), sizeof(type), AccessKind::read, site);                    \
    const type value = __atomic_load_n(address, __ATOMIC_SEQ_CST);                                            \
    memory_poll(site, false);                                                                                 \
    return value;                                                                                             \
  }                                                                                                           \
  void __tsan_atomic##bits##_store(volatile type* address, type value, int) {                                \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    __atomic_store_n(address, value, __ATOMIC_SEQ_CST);                                                       \
  }                                                                                                           \
  type __tsan_atomic##bits##_exchange(volatile type* address, type value, int) {                             \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_exchange_n(address, value, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                           \
  type __tsan_atomic##bits##_fetch_add(volatile type* address, type value, int) {                            \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);                                              \
  }                                                                                                           \
  type __tsan_atomic##bits##_fetch_sub(volatile type* address, type value, int) {                            \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_fetch_sub(address, value, __ATOMIC_SEQ_CST);                                              \
  }                                                                                                           \
  type __tsan_atomic##bits##_fetch_and(volatile type* address, type value, int) {                            \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_fetch_and(address, value, __ATOMIC_SEQ_CST);                                              \
  }                                                                                                           \
  type __tsan_atomic##bits##_fetch_or(volatile type* address, type value, int) {                             \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_fetch_or(address, value, __ATOMIC_SEQ_CST);                                               \
  }                                                                                                           \
  type __tsan_atomic##bits##_fetch_xor(volatile type* address, type value, int) {                            \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_fetch_xor(address, value, __ATOMIC_SEQ_CST);                                              \
  }                                                                                                           \
  type __tsan_atomic##bits##_fetch_nand(volatile type* address, type value, int) {                           \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_fetch_nand(address, value, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                           \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile type* address, type* expected, type desired, int,  \
                                                     int) {                                                   \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_compare_exchange_n(address, expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
  }                                                                                                           \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile type* address, type* expected, type desired, int,    \
                                                   int) {                                                     \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    return __atomic_compare_exchange_n(address, expected, desired, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);  \
  }                                                                                                           \
  type __tsan_atomic##bits##_compare_exchange_val(volatile type* address, type expected, type desired, int,     \
                                                  int) {                                                      \
    check_access(const_cast<type*>(address), sizeof(type), AccessKind::atomic, TESSERA_CALLER);                              \
    __atomic_compare_exchange_n(address, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
    return expected;                                                                                          \
  }

extern "C" {

void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read_range(void* address, size_t bytes) {
  check_access(address, static_cast<int64_t>(bytes), AccessKind::read, TESSERA_CALLER, false);
}
void __tsan_write_range(void* address, size_t bytes) {
  check_access(address, static_cast<int64_t>(bytes), AccessKind::write, TESSERA_CALLER, false);
}

TESSERA_ACCESS_HOOKS(1)
TESSERA_ACCESS_HOOKS(2)
TESSERA_ACCESS_HOOKS(4)
TESSERA_ACCESS_HOOKS(8)
TESSERA_ACCESS_HOOKS(16)

TESSERA_ATOMIC_HOOKS(8, int8_t)
TESSERA_ATOMIC_HOOKS(16, int16_t)
TESSERA_ATOMIC_HOOKS(32, int32_t)
TESSERA_ATOMIC_HOOKS(64, int64_t)

void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#if TESSERA_SIM_ALIGNMENT_HOOK
// UBSan's alignment check (-fsanitize=alignment on the kernel units), in the
// layout GCC passes it: the access's source location, its type and the
// type's alignment. Only misalignment reaches here (no other UBSan check is on).
struct UbsanSourceLocation {
  const char* file;
  uint32_t line;
  uint32_t column;
};
struct UbsanTypeDescriptor {
  uint16_t kind;
  uint16_t info;
  char name[1];
};
struct UbsanTypeMismatchData {
  UbsanSourceLocation location;
  const UbsanTypeDescriptor* type;
  unsigned char log_alignment;
  unsigned char check_kind;
};

void __ubsan_handle_type_mismatch_v1(UbsanTypeMismatchData* data, uintptr_t pointer) {
  tessera::cuda::sim::check_typed_alignment(reinterpret_cast<const void*>(pointer), int64_t{1} << data->log_alignment,
                                            data->type->name, data->check_kind, data->location.file,
                                            data->location.line);
}
void __ubsan_handle_type_mismatch_v1_abort(UbsanTypeMismatchData* data, uintptr_t pointer) {
  __ubsan_handle_type_mismatch_v1(data, pointer);
}
#endif
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

}  // extern "C"
