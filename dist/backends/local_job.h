// The shared state of one run_local job: for each group, the rendezvous where
// its rank threads meet collective after collective (publish their buffers,
// check they agree, share out the work), and the job's failure, which every
// waiting rank of every group must hear about at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "dist/process_group.h"

namespace tessera::dist {

// What one rank brings to a collective: what it asked for and its buffers.
struct Contribution {
  CollectiveSignature signature;
  const void* in = nullptr;
  void* out = nullptr;
};

// The work of one collective as independent tasks 0..task_count-1. Every rank
// derives the same plan from the same contributions, and the ranks take tasks
// from one shared counter, so the work spreads over whichever threads are
// running and any rank may write any rank's output.
struct CollectivePlan {
  int64_t task_count = 0;
  // Must not throw: peers wait for every task. (ProcessGroup has checked the
  // arguments, dtypes included, before the collective was issued.)
  std::function<void(int64_t task)> run_task;
};
using Planner = std::function<CollectivePlan(std::span<const Contribution> contributions)>;

class LocalJob;

// Where the ranks of one group meet. Collective number k of every member (its
// k-th transport call on this group) meets in the round of index k.
class GroupRendezvous {
 public:
  GroupRendezvous(const LocalJob& job, std::string name, std::vector<int> world_ranks);

  // Runs one collective for group rank `rank`: publishes `mine`, waits until
  // every member has (throwing CollectiveTimeout naming the ranks that never
  // came, or RankFailed once the job has failed), checks that all asked for
  // the same collective: number, kind, dtype, op, root and sizes; shapes only
  // in debug mode, in ProcessGroup (CollectiveMismatch otherwise, on every rank), runs
  // tasks of the plan until none are left, and returns once all tasks are done,
  // so no rank reuses its buffers while a peer still reads them.
  void run(int64_t index, int rank, const Contribution& mine, std::chrono::milliseconds timeout,
           const Planner& planner);

  // Group rank `rank` cannot take part in round `index` (its device refused
  // the collective): the round never starts, and every member waiting for it,
  // or arriving later, throws RankFailed naming `rank` and `reason`.
  void refuse(int64_t index, int rank, const std::string& reason);

  // Wakes every waiting member so it sees the job's failure.
  void wake_all();

  const std::string& name() const { return name_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }

 private:
  struct Round;
  std::shared_ptr<Round> meet(int64_t index, int rank, const Contribution& mine, std::chrono::milliseconds timeout);
  void share_work(Round& round, const CollectivePlan& plan);
  void leave(int64_t index, Round& round);  // mutex held
  void check_signatures(const Round& round) const;
  std::string describe(const CollectiveSignature& signature) const;
  std::string missing_ranks(const Round& round) const;

  const LocalJob& job_;
  const std::string name_;
  const std::vector<int> world_ranks_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, std::shared_ptr<Round>> rounds_;  // open rounds by index
};

// One run_local job: its size, its groups' rendezvous and its failure.
class LocalJob {
 public:
  explicit LocalJob(int world_size);

  int world_size() const { return world_size_; }
  const std::shared_ptr<GroupRendezvous>& world_rendezvous() const { return world_rendezvous_; }

  // The rendezvous of a sub-group made by the `split_index`-th split of the
  // group met at `parent`: every member asking with the same key gets the same one.
  std::shared_ptr<GroupRendezvous> subgroup_rendezvous(const GroupRendezvous* parent, int64_t split_index,
                                                       const std::vector<int>& members, const std::string& name,
                                                       const std::vector<int>& world_ranks);

  // Where the members of the group met at `group` meet for their device
  // collectives: a rendezvous of its own, as those run on each member's
  // stream of its device (in the order the streams reach them), not on the
  // communication threads.
  std::shared_ptr<GroupRendezvous> device_rendezvous(const GroupRendezvous* group);

  // Group rank `rank` of the group met at `group` does device collectives
  // on cuda:`device`; a second member on the same device is an Error naming
  // both (NCCL refuses two ranks on one GPU).
  void claim_device(const GroupRendezvous* group, int rank, int device);

  // Records that a rank's function threw. The first failure is the job's root
  // cause; every waiting rank of every group is woken to see it.
  void record_failure(int world_rank, std::exception_ptr error);
  bool failed() const { return failed_.load(); }
  // "rank 2 failed: <its message>" once a rank has failed.
  std::optional<std::string> failure() const;
  std::exception_ptr root_cause() const;

 private:
  const int world_size_;
  std::shared_ptr<GroupRendezvous> world_rendezvous_;
  mutable std::mutex mutex_;
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::exception_ptr root_cause_;
  using SubgroupKey = std::tuple<const GroupRendezvous*, int64_t, std::vector<int>>;
  std::map<SubgroupKey, std::shared_ptr<GroupRendezvous>> subgroups_;
  std::map<const GroupRendezvous*, std::shared_ptr<GroupRendezvous>> device_rendezvous_;
  std::map<const GroupRendezvous*, std::map<int, int>> devices_;  // group -> rank -> cuda index
};

}  // namespace tessera::dist
