// What the OS thread running a simulated launch knows about it: the kernel,
// its configuration, the shared-memory windows and their racecheck, and the
// counters. The block scheduler, the intrinsics and the memory checks reach
// it through current_launch(); simulator-internal.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tensor/cuda/launch_config.h"
#include "tensor/cuda/sim/code_site.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/cuda/sim/shared_memory_racecheck.h"

namespace tessera::cuda::sim {

class ThreadBlock;

// [begin, begin + bytes) of this OS thread's memory.
struct Window {
  uintptr_t begin = 0;
  int64_t bytes = 0;
  bool contains(uintptr_t address) const { return address - begin < static_cast<uint64_t>(bytes); }
};

// What a launch found that does not stop it (races, reads of unwritten
// memory), as compute-sanitizer reports them: every distinct one, grouped by
// the code that made the access, raised together when the launch ends so
// that a benign first report cannot hide a real one.
class LaunchReports {
 public:
  // `describe` formats the report; it runs once per distinct (tool, site).
  template <typename Describe>
  void add(const char* tool, const CodeSite& site, Describe&& describe) {
    const Key key{tool, site.code, site.source.line() != 0 ? site.source.file_name() : nullptr,
                  site.source.line()};
    auto [it, fresh] = counts_.try_emplace(key, 0);
    if (++it->second == 1) messages_.push_back(Message{key, describe()});
  }
  bool empty() const { return messages_.empty(); }
  // Every report, with how often each site repeated it.
  std::string text() const;

 private:
  struct Key {
    const char* tool;
    const void* code;
    const char* file;
    uint32_t line;
    auto operator<=>(const Key&) const = default;
  };
  struct Message {
    Key key;
    std::string text;
  };
  std::map<Key, int64_t> counts_;
  std::vector<Message> messages_;
};

// A store that racecheck found writing over another thread's unordered
// store. Whether it is the benign same-value kind is only known once the
// store has happened (the hooks run before it), so the verdict waits for the
// thread's next access, wait or exit.
struct PendingWrite {
  bool pending = false;
  const unsigned char* bytes = nullptr;  // where the store went
  int64_t count = 0;
  unsigned char before[16] = {};  // what the other thread had written
  CodeSite site;
  // What the report needs, formatted only if it is made (symbolising is slow).
  Hazard hazard{};
  const char* window = nullptr;  // "static" or "dynamic"
};

struct LaunchState {
  std::string kernel_name;
  const LaunchConfig* config = nullptr;
  const std::function<void()>* thread_body = nullptr;
  // __shared__ variables are thread_local, so they live in this OS thread's
  // TLS block of the kernel's module.
  Window static_shared;
  // The block's dynamic shared memory is the first dynamic_shared_bytes of
  // this window; the rest is a red zone.
  Window dynamic_shared;
  int64_t dynamic_shared_bytes = 0;
  // Borrowed from this OS thread for the launch (launch.cpp says why).
  SharedMemoryRacecheck* static_racecheck = nullptr;
  SharedMemoryRacecheck* dynamic_racecheck = nullptr;
  KernelCounters counters;
  LaunchReports reports;
  PendingWrite pending_write;
  ThreadBlock* block = nullptr;  // the block running now
};

// The launch this OS thread is running, or nullptr outside kernels.
LaunchState* current_launch();
void set_current_launch(LaunchState* launch);

}  // namespace tessera::cuda::sim
