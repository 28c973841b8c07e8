// Rendezvous and failure of a run_local job. A round goes: arrive (publish a
// Contribution), wait for all, compare signatures, share out the tasks, wait
// until all tasks are done, leave. A rank that gives up before everyone has
// arrived (timeout, failed job) makes sure the round can never start, so no
// peer ever reads the buffers it is about to release.
#include "dist/backends/local_job.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/backends/streaming_copy.h"
#include "dist/errors.h"

namespace tessera::dist {

struct GroupRendezvous::Round {
  explicit Round(int size) : contributions(static_cast<size_t>(size)), arrived(static_cast<size_t>(size), false) {}

  // Guarded by the rendezvous mutex.
  std::vector<Contribution> contributions;  // by group rank; read-only once all arrived
  std::vector<bool> arrived;
  int arrivals = 0;
  int departures = 0;
  std::string timed_out;  // set when a rank gave up waiting: the round never starts
  std::string refused;    // set when a rank could not take part (refuse): the round never starts

  // Task sharing, once all arrived.
  std::atomic<int64_t> next_task{0};
  std::atomic<int64_t> finished_tasks{0};
};

GroupRendezvous::GroupRendezvous(const LocalJob& job, std::string name, std::vector<int> world_ranks)
    : job_(job), name_(std::move(name)), world_ranks_(std::move(world_ranks)) {}

void GroupRendezvous::run(int64_t index, int rank, const Contribution& mine, std::chrono::milliseconds timeout,
                          const Planner& planner) {
  const std::shared_ptr<Round> round = meet(index, rank, mine, timeout);
  share_work(*round, planner(round->contributions));
  std::lock_guard lock(mutex_);
  leave(index, *round);
}

std::shared_ptr<GroupRendezvous::Round> GroupRendezvous::meet(int64_t index, int rank, const Contribution& mine,
                                                              std::chrono::milliseconds timeout) {
  const int size = static_cast<int>(world_ranks_.size());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(mutex_);
  std::shared_ptr<Round>& slot = rounds_[index];
  if (!slot) slot = std::make_shared<Round>(size);
  const std::shared_ptr<Round> round = slot;

  // Once the job has failed, no rank arrives any more, so a round that is
  // still short of ranks can never start: waiting peers may leave safely.
  if (const auto failure = job_.failure()) {
    leave(index, *round);
    throw RankFailed(fmt::format("{}: {}", describe(mine.signature), *failure));
  }
  if (!round->timed_out.empty()) {
    leave(index, *round);
    throw CollectiveTimeout(
        fmt::format("{}: arrived after a peer gave up waiting ({})", describe(mine.signature), round->timed_out));
  }
  if (!round->refused.empty()) {
    leave(index, *round);
    throw RankFailed(fmt::format("{}: {}", describe(mine.signature), round->refused));
  }
  round->contributions[static_cast<size_t>(rank)] = mine;
  round->arrived[static_cast<size_t>(rank)] = true;
  if (++round->arrivals == size) changed_.notify_all();

  while (round->arrivals < size) {
    if (const auto failure = job_.failure()) {
      leave(index, *round);
      throw RankFailed(fmt::format("{}: {}", describe(mine.signature), *failure));
    }
    if (!round->timed_out.empty()) {
      leave(index, *round);
      throw CollectiveTimeout(round->timed_out);
    }
    if (!round->refused.empty()) {
      leave(index, *round);
      throw RankFailed(fmt::format("{}: {}", describe(mine.signature), round->refused));
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && round->arrivals < size &&
        round->timed_out.empty() && !job_.failed()) {
      round->timed_out = fmt::format("{} timed out after {:g} s: {}", describe(mine.signature),
                                     std::chrono::duration<double>(timeout).count(), missing_ranks(*round));
      changed_.notify_all();
    }
  }
  try {
    check_signatures(*round);
  } catch (...) {
    leave(index, *round);
    throw;
  }
  return round;
}

void GroupRendezvous::refuse(int64_t index, int rank, const std::string& reason) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<Round>& slot = rounds_[index];
  if (!slot) slot = std::make_shared<Round>(static_cast<int>(world_ranks_.size()));
  const std::shared_ptr<Round> round = slot;
  if (round->refused.empty()) {
    round->refused = fmt::format("group rank {} (world rank {}) could not take part: {}", rank,
                                 world_ranks_[static_cast<size_t>(rank)], reason);
  }
  leave(index, *round);
  changed_.notify_all();
}

void GroupRendezvous::share_work(Round& round, const CollectivePlan& plan) {
  int64_t done = 0;
  for (int64_t task = round.next_task.fetch_add(1); task < plan.task_count; task = round.next_task.fetch_add(1)) {
    plan.run_task(task);
    ++done;
  }
  if (done > 0) {
    // Streamed stores are weakly ordered: fence them before announcing them.
    streaming_fence();
    if (round.finished_tasks.fetch_add(done) + done == plan.task_count) {
      std::lock_guard lock(mutex_);
      changed_.notify_all();
    }
  }
  // No timeout here: every task left was taken by a running peer that will
  // finish it, and leaving early would free buffers that peer still writes.
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return round.finished_tasks.load() == plan.task_count; });
}

void GroupRendezvous::leave(int64_t index, Round& round) {
  if (++round.departures == static_cast<int>(world_ranks_.size())) rounds_.erase(index);
}

void GroupRendezvous::wake_all() {
  std::lock_guard lock(mutex_);
  changed_.notify_all();
}

void GroupRendezvous::check_signatures(const Round& round) const {
  // Shapes may differ as long as the sizes agree: the transport is flat.
  const auto agree = [](const CollectiveSignature& a, const CollectiveSignature& b) {
    return a.sequence == b.sequence && a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.root == b.root &&
           shape_numel(a.in_shape) == shape_numel(b.in_shape) && shape_numel(a.out_shape) == shape_numel(b.out_shape);
  };
  const CollectiveSignature& first = round.contributions[0].signature;
  for (size_t rank = 1; rank < round.contributions.size(); ++rank) {
    const CollectiveSignature& other = round.contributions[rank].signature;
    if (!agree(first, other)) {
      throw CollectiveMismatch(fmt::format("collective mismatch on group '{}': rank 0 issued {}, rank {} issued {}",
                                           name_, first.to_string(), rank, other.to_string()));
    }
  }
}

std::string GroupRendezvous::describe(const CollectiveSignature& signature) const {
  return fmt::format("{} on group '{}'", signature.to_string(), name_);
}

std::string GroupRendezvous::missing_ranks(const Round& round) const {
  std::vector<int> ranks;
  std::vector<int> world_ranks;
  for (size_t rank = 0; rank < round.arrived.size(); ++rank) {
    if (round.arrived[rank]) continue;
    ranks.push_back(static_cast<int>(rank));
    world_ranks.push_back(world_ranks_[rank]);
  }
  if (ranks == world_ranks) return fmt::format("ranks {} never arrived", ranks);
  return fmt::format("ranks {} (world ranks {}) never arrived", ranks, world_ranks);
}

LocalJob::LocalJob(int world_size) : world_size_(world_size) {
  std::vector<int> world_ranks(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) world_ranks[static_cast<size_t>(rank)] = rank;
  world_rendezvous_ = std::make_shared<GroupRendezvous>(*this, "world", std::move(world_ranks));
}

std::shared_ptr<GroupRendezvous> LocalJob::subgroup_rendezvous(const GroupRendezvous* parent, int64_t split_index,
                                                               const std::vector<int>& members,
                                                               const std::string& name,
                                                               const std::vector<int>& world_ranks) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<GroupRendezvous>& rendezvous = subgroups_[SubgroupKey{parent, split_index, members}];
  if (!rendezvous) rendezvous = std::make_shared<GroupRendezvous>(*this, name, world_ranks);
  return rendezvous;
}

std::shared_ptr<GroupRendezvous> LocalJob::device_rendezvous(const GroupRendezvous* group) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<GroupRendezvous>& rendezvous = device_rendezvous_[group];
  if (!rendezvous) rendezvous = std::make_shared<GroupRendezvous>(*this, group->name(), group->world_ranks());
  return rendezvous;
}

void LocalJob::claim_device(const GroupRendezvous* group, int rank, int device) {
  std::lock_guard lock(mutex_);
  std::map<int, int>& devices = devices_[group];
  for (const auto& [other, other_device] : devices) {
    TESSERA_CHECK(other == rank || other_device != device,
                  "device collectives on group '{}': ranks {} and {} are both on cuda:{}; each rank needs a device of "
                  "its own, as NCCL refuses two ranks on one GPU (cuda:<rank> for ranks as threads)",
                  group->name(), std::min(other, rank), std::max(other, rank), device);
  }
  devices[rank] = device;
}

void LocalJob::record_failure(int world_rank, std::exception_ptr error) {
  std::vector<std::shared_ptr<GroupRendezvous>> to_wake{world_rendezvous_};
  {
    std::lock_guard lock(mutex_);
    if (failed_.load()) return;  // an echo of the first failure, or a later one
    std::string message = "unknown exception";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    failure_ = fmt::format("rank {} failed: {}", world_rank, message);
    root_cause_ = error;
    failed_.store(true);
    for (const auto& entry : subgroups_) to_wake.push_back(entry.second);
    for (const auto& entry : device_rendezvous_) to_wake.push_back(entry.second);
  }
  for (const auto& rendezvous : to_wake) rendezvous->wake_all();
}

std::optional<std::string> LocalJob::failure() const {
  if (!failed_.load()) return std::nullopt;
  std::lock_guard lock(mutex_);
  return failure_;
}

std::exception_ptr LocalJob::root_cause() const {
  std::lock_guard lock(mutex_);
  return root_cause_;
}

}  // namespace tessera::dist
