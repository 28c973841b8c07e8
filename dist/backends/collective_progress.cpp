// Posting and reading each rank's latest issued collective in the store.
#include "dist/backends/collective_progress.h"

#include <exception>

#include "tensor/error.h"

namespace tessera::dist {

CollectiveProgress::CollectiveProgress(std::shared_ptr<TcpStore> store, std::string prefix, int rank, int size)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {
  TESSERA_CHECK(store_ != nullptr, "CollectiveProgress '{}': no store", prefix_);
  TESSERA_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "CollectiveProgress '{}': rank {} is outside [0, {})",
                prefix_, rank_, size_);
}

std::string CollectiveProgress::key_of(int rank) const { return prefix_ + "/issued/" + std::to_string(rank); }

void CollectiveProgress::post(int64_t sequence) {
  if (sequence == posted_) return;
  try {
    store_->set(key_of(rank_), std::to_string(sequence));
    posted_ = sequence;
  } catch (const std::exception&) {
    // The next post tries again; a failing store shows in describe_missing.
  }
}

std::vector<CollectiveProgress::Peer> CollectiveProgress::ranks_behind(int64_t sequence) const {
  std::vector<Peer> behind;
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;
    Peer peer{.rank = rank, .issued = std::nullopt};
    if (store_->check(key_of(rank))) peer.issued = std::stoll(store_->get_string(key_of(rank)));
    if (!peer.issued || *peer.issued < sequence) behind.push_back(peer);
  }
  return behind;
}

std::string CollectiveProgress::describe_missing(int64_t sequence) const {
  std::vector<Peer> behind;
  try {
    behind = ranks_behind(sequence);
  } catch (const std::exception& error) {
    return fmt::format("which ranks issued it is unknown: the store at {} cannot be read ({})", store_->endpoint(),
                       error.what());
  }
  if (behind.empty()) {
    return "every rank issued it: a rank may have died or stalled inside it, or a link between GPUs failed";
  }
  std::string text =
      sequence < 0 ? "ranks that never arrived: " : fmt::format("ranks that never issued #{}: ", sequence);
  for (size_t i = 0; i < behind.size(); ++i) {
    const Peer& peer = behind[i];
    if (i > 0) text += ", ";
    if (!peer.issued) {
      text += fmt::format("{} (never arrived)", peer.rank);
    } else if (*peer.issued < 0) {
      text += fmt::format("{} (none issued yet)", peer.rank);
    } else {
      text += fmt::format("{} (its latest: #{})", peer.rank, *peer.issued);
    }
  }
  return text;
}

}  // namespace tessera::dist
