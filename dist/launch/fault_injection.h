// Failures injected at named points of a run, so that tests and the soak can
// prove what each one ends in: a rank that dies or stalls in a collective, a
// checkpoint write that fails, a save that dies before its commit, a shard
// whose bytes rot after they were checksummed. Planned by TESSERA_FAULT (read
// once) or set_faults; a run without faults pays one branch per point.
//
//   TESSERA_FAULT="FAULT[;FAULT...]"   FAULT = ACTION@POINT[,KEY=VALUE...]
//
//   kill@collective,rank=2,at=57       world rank 2 dies as it issues its 57th collective
//   delay@collective,rank=1,at=12,seconds=5
//                                      rank 1 issues its 12th collective 5 s late
//   disconnect@collective,rank=2,at=30 rank 2's network drops as it issues its 30th collective:
//                                      every TCP connection of its process is shut down
//   fail@checkpoint_write,rank=1,at=3,errno=ENOSPC
//                                      rank 1's 3rd checkpoint shard fails to write
//   corrupt@checkpoint_write,rank=0    one byte of rank 0's 1st shard flips after it is checksummed
//   kill@checkpoint_commit,at=2        rank 0 dies as it is about to commit the 2nd checkpoint
//   fail@data,rank=3,at=10,errno=EIO   rank 3's 10th training micro-batch fails to load
//
// `rank` is a world rank (any rank when left out; one outside the world is
// refused as the world starts); `at` counts that rank's arrivals at the
// point from 1 (default 1; a fault with no rank counts each rank's arrivals
// separately). Collectives count every call a rank makes on
// any of its groups. A kill ends the process as a crash would (SIGKILL) when
// each rank is a process; among thread ranks (the local backend) it throws
// InjectedFault on the rank's thread, which ends the run like a failed rank.
// A disconnect is what a host's peers see when its network resets: the
// connections close, the process lives on (a silent cut, where nothing
// closes, is the multi-host check's `ip link set down`). Thread ranks have no
// connections to drop: there it is a kill.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/error.h"

namespace tessera::dist {

enum class FaultPoint : uint8_t { collective, checkpoint_write, checkpoint_commit, data };
enum class FaultAction : uint8_t { kill, delay, fail, corrupt, disconnect };

struct Fault {
  FaultAction action = FaultAction::kill;
  FaultPoint point = FaultPoint::collective;
  std::optional<int> rank;  // world rank; every rank when empty
  int64_t at = 1;           // the rank's arrival at the point that fails, from 1
  double seconds = 0.0;     // delay
  int error_number = 0;     // fail: the errno the operation reports
  // "kill@collective,rank=2,at=57"
  std::string to_string() const;
};

// What an injected kill throws among thread ranks.
class InjectedFault : public Error {
 public:
  using Error::Error;
};

// The faults of a TESSERA_FAULT value ("" = none). Throws tessera::Error
// naming the fault and what is wrong with it: an unknown action or point, an
// action the point does not take, an unknown key or one given twice, a bad
// number, a rank below 0 or `at` below 1, a delay without seconds, a fail
// without an errno name (ENOSPC, EIO, EDQUOT, EROFS, ENOMEM).
std::vector<Fault> parse_faults(std::string_view text);

// Checks the plan (TESSERA_FAULT, read now if it was not yet, or
// set_faults') against a world of `world_size` ranks: a fault for a rank
// outside it would never fire, so it is a tessera::Error naming the fault.
// Called where a world starts (dist::init, run_local).
void check_faults_fit_world(int world_size);

// Replaces the planned faults and restarts the counts (tests); the plan is
// otherwise TESSERA_FAULT's, read at the first point reached.
void set_faults(std::vector<Fault> faults);

// Counts this arrival of world rank `rank` at `point`; returns the fault
// planned for it, if any.
std::optional<Fault> fault_at(FaultPoint point, int rank);

// Carries out a kill, delay or disconnect reached at `where` ("rank 2's
// collective #57: all_reduce on group 'shard'"): a delay sleeps; a kill
// raises SIGKILL when `rank_is_process`, a disconnect shuts down the
// process's TCP sockets; among thread ranks both throw InjectedFault naming
// the fault and `where`.
void carry_out(const Fault& fault, std::string_view where, bool rank_is_process);

// The text a failed write reports for `error_number` ("No space left on device (ENOSPC)").
std::string describe_errno(int error_number);

}  // namespace tessera::dist
