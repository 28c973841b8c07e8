// CollectiveProgress: which collectives each rank of a group has issued, kept
// in the job's TcpStore, so that a rank whose collective timed out can name
// the ranks that never issued it. NCCL says only that a collective did not
// finish; this says who is behind, as the MPI watchdog's roll call does.
//
// Each rank posts the sequence number of the latest collective it issued on
// the group under "<prefix>/issued/<rank>" (-1: it reached the group's
// creation), at most once per `post` call; its watchdog calls post when the
// number has changed, so the store sees a few writes a second at most.
// Reading is for the failure path: it uses its own connection, bounded by a
// short timeout, so a store that went away with its rank is reported rather
// than waited for.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/launch/tcp_store.h"

namespace tessera::dist {

class CollectiveProgress {
 public:
  // `store` is the rank's connection to the job's store; `prefix` names the
  // group uniquely in it (e.g. "nccl/world").
  CollectiveProgress(std::shared_ptr<TcpStore> store, std::string prefix, int rank, int size);

  // Records that this rank has issued collective `sequence` (-1: it arrived
  // at the group's creation). Store errors are kept, not thrown: progress is
  // advisory, and the collective's own failure is what ends the job.
  void post(int64_t sequence);

  struct Peer {
    int rank = 0;
    std::optional<int64_t> issued;  // nullopt: never posted
  };
  // The other ranks whose latest posted collective comes before `sequence`,
  // in rank order. Throws tessera::Error when the store cannot be read.
  std::vector<Peer> ranks_behind(int64_t sequence) const;

  // "ranks that never issued #7: 1 (its latest: #5), 3 (never arrived)", or
  // what was learnt when nothing could be (every rank issued it; the store
  // is unreachable), for a timeout's message.
  std::string describe_missing(int64_t sequence) const;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string key_of(int rank) const;

  std::shared_ptr<TcpStore> store_;
  std::string prefix_;
  int rank_;
  int size_;
  int64_t posted_ = -2;  // nothing posted yet
};

}  // namespace tessera::dist
