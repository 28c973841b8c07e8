// The local backend: each collective is planned as a list of independent
// pieces of work (copy one piece of a source to every destination, or reduce
// one piece of every rank's input), which the member threads take from a
// shared counter (see local_job.h). Each source piece is read from memory once
// and written everywhere while it sits in cache; large collectives write with
// streaming stores. Reductions always add in rank order 0..N-1, so this
// backend is deterministic whatever the options say.
#include "dist/backends/local_backend.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include "dist/backends/local_job.h"
#include "dist/backends/streaming_copy.h"
#include "dist/init.h"
#include "dist/launch/fault_injection.h"
#include "dist/reduction.h"
#include "tensor/parallel.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/launch.h"
#endif

namespace tessera::dist {

namespace {

// The unit of work: small enough that a source piece read from memory stays
// in L2 while it is written to every destination.
constexpr int64_t kPieceBytes = int64_t{64} << 10;

int64_t pieces_of(int64_t bytes) { return (bytes + kPieceBytes - 1) / kPieceBytes; }

void copy_piece(void* dst, const void* src, int64_t bytes, bool streaming) {
  if (dst == src) return;  // the in-place forms: a rank's own chunk is already there
  if (streaming) {
    copy_streaming(dst, src, bytes);
  } else {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
}

char* at(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }
const char* at(const void* base, int64_t offset) { return static_cast<const char*>(base) + offset; }

// Per-thread buffers of a reduction task: the peers' input pieces and the
// reduced piece (which stays in cache until it is written out).
struct ReductionScratch {
  std::vector<const void*> inputs;
  std::vector<std::byte> result = std::vector<std::byte>(static_cast<size_t>(kPieceBytes));
};
thread_local ReductionScratch reduction_scratch;

// all-gather: out_q[p*c, (p+1)*c) = in_p for every pair of ranks (p, q).
// Task (piece k, source p) reads piece k of in_p once and writes it to every out_q.
CollectivePlan plan_all_gather(std::span<const Contribution> ranks, int64_t chunk_bytes) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  const bool streaming = should_stream(n * n * chunk_bytes);
  return {n * pieces_of(chunk_bytes), [=](int64_t task) {
            const int64_t source = task % n;
            const int64_t offset = task / n * kPieceBytes;
            const int64_t bytes = std::min(kPieceBytes, chunk_bytes - offset);
            const char* src = at(ranks[source].in, offset);
            for (const Contribution& destination : ranks) {
              copy_piece(at(destination.out, source * chunk_bytes + offset), src, bytes, streaming);
            }
          }};
}

// Reduces piece [offset, offset + count) elements of the chunk starting at
// element `chunk_begin` of every rank's input, in rank order, into the scratch.
const void* reduce_piece(std::span<const Contribution> ranks, int64_t chunk_begin, int64_t offset, int64_t count,
                         DType dtype, ReduceOp op) {
  const int64_t element = static_cast<int64_t>(element_size(dtype));
  ReductionScratch& scratch = reduction_scratch;
  scratch.inputs.clear();
  for (const Contribution& rank : ranks) scratch.inputs.push_back(at(rank.in, (chunk_begin + offset) * element));
  reduce_in_order(scratch.result.data(), scratch.inputs, count, dtype, op, static_cast<int>(ranks.size()));
  return scratch.result.data();
}

// reduce-scatter: out_r = op over p of in_p[r*c, (r+1)*c), in rank order.
// Task (piece k, destination r) reduces piece k of chunk r of every input.
CollectivePlan plan_reduce_scatter(std::span<const Contribution> ranks, int64_t count_per_rank, DType dtype,
                                   ReduceOp op) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  const int64_t element = static_cast<int64_t>(element_size(dtype));
  const int64_t piece = kPieceBytes / element;
  const bool streaming = should_stream(n * count_per_rank * element);
  return {n * pieces_of(count_per_rank * element), [=](int64_t task) {
            const int64_t destination = task % n;
            const int64_t offset = task / n * piece;
            const int64_t count = std::min(piece, count_per_rank - offset);
            const void* reduced = reduce_piece(ranks, destination * count_per_rank, offset, count, dtype, op);
            copy_piece(at(ranks[destination].out, offset * element), reduced, count * element, streaming);
          }};
}

// all-reduce: data_q = op over p of data_p for every q. Task k reduces piece k
// of every rank's data and writes the result back to all of them.
CollectivePlan plan_all_reduce(std::span<const Contribution> ranks, int64_t count, DType dtype, ReduceOp op) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  const int64_t element = static_cast<int64_t>(element_size(dtype));
  const int64_t piece = kPieceBytes / element;
  const bool streaming = should_stream(n * count * element);
  return {pieces_of(count * element), [=](int64_t task) {
            const int64_t offset = task * piece;
            const int64_t piece_count = std::min(piece, count - offset);
            const void* reduced = reduce_piece(ranks, 0, offset, piece_count, dtype, op);
            for (const Contribution& rank : ranks) {
              copy_piece(at(rank.out, offset * element), reduced, piece_count * element, streaming);
            }
          }};
}

// broadcast: data_q = data_root for every q. Task k copies piece k of the root's data.
CollectivePlan plan_broadcast(std::span<const Contribution> ranks, int64_t bytes, int root) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  const bool streaming = should_stream(n * bytes);
  return {pieces_of(bytes), [=](int64_t task) {
            const int64_t offset = task * kPieceBytes;
            const int64_t piece_bytes = std::min(kPieceBytes, bytes - offset);
            const char* src = at(ranks[static_cast<size_t>(root)].in, offset);
            for (const Contribution& rank : ranks) copy_piece(at(rank.out, offset), src, piece_bytes, streaming);
          }};
}

class LocalProcessGroup final : public ProcessGroup {
 public:
  LocalProcessGroup(std::shared_ptr<LocalJob> job, std::shared_ptr<GroupRendezvous> rendezvous, int rank, int size,
                    std::string name, std::vector<int> world_ranks, int local_rank, int local_size,
                    ProcessGroupOptions options)
      : ProcessGroup(rank, size, std::move(name), std::move(world_ranks), local_rank, local_size, options),
        job_(std::move(job)),
        rendezvous_(std::move(rendezvous)) {}
  ~LocalProcessGroup() override { stop_communication(); }

  std::string backend_name() const override { return "local"; }

 protected:
  void run_all_gather(const CollectiveSignature& signature, void* out, const void* in,
                      int64_t bytes_per_rank) override {
    run(signature, in, out,
        [=](std::span<const Contribution> ranks) { return plan_all_gather(ranks, bytes_per_rank); });
  }

  void run_reduce_scatter(const CollectiveSignature& signature, void* out, const void* in, int64_t count_per_rank,
                          DType dtype, ReduceOp op) override {
    run(signature, in, out, [=](std::span<const Contribution> ranks) {
      return plan_reduce_scatter(ranks, count_per_rank, dtype, op);
    });
  }

  void run_all_reduce(const CollectiveSignature& signature, void* data, int64_t count, DType dtype,
                      ReduceOp op) override {
    run(signature, data, data,
        [=](std::span<const Contribution> ranks) { return plan_all_reduce(ranks, count, dtype, op); });
  }

  void run_broadcast(const CollectiveSignature& signature, void* data, int64_t bytes, int root) override {
    run(signature, data, data, [=](std::span<const Contribution> ranks) { return plan_broadcast(ranks, bytes, root); });
  }

  void run_barrier(const CollectiveSignature& signature) override {
    run(signature, nullptr, nullptr, [](std::span<const Contribution>) { return CollectivePlan{}; });
  }

#if TESSERA_HAVE_CUDA_SIM
  // The simulated NCCL: each member's part runs on its stream of its own
  // device, and the parts meet at the group's device rendezvous, where the
  // members share out the copying and reducing exactly as on the host (rank
  // order, so bitwise equal to the host collectives). The rendezvous returns
  // once every part is done, so no member reuses a buffer a peer still reads.
  bool moves_device_tensors() const override { return true; }

  void enqueue_device_collective(const CollectiveSignature& signature, const Tensor& out, const Tensor& in,
                                 const std::shared_ptr<Stream>& stream, DeviceFinished finished) override {
    using cuda::BufferAccess;
    using cuda::BufferUse;
    const void* in_data = in.cuda_data();
    void* out_data = out.cuda_data();
    // The flat collectives read `in` and write `out`; all-reduce and
    // broadcast work on one tensor, set below.
    std::vector<BufferUse> buffers = {{"in", in_data, in.nbytes(), BufferAccess::read},
                                      {"out", out_data, out.nbytes(), BufferAccess::write}};
    Planner planner;
    switch (signature.kind) {
      case CollectiveKind::all_gather: {
        const int64_t bytes_per_rank = in.nbytes();
        planner = [=](std::span<const Contribution> ranks) { return plan_all_gather(ranks, bytes_per_rank); };
        break;
      }
      case CollectiveKind::reduce_scatter: {
        const int64_t count_per_rank = out.numel();
        const DType dtype = out.dtype();
        const ReduceOp op = signature.op;
        planner = [=](std::span<const Contribution> ranks) {
          return plan_reduce_scatter(ranks, count_per_rank, dtype, op);
        };
        break;
      }
      case CollectiveKind::all_reduce: {
        const int64_t count = out.numel();
        const DType dtype = out.dtype();
        const ReduceOp op = signature.op;
        planner = [=](std::span<const Contribution> ranks) { return plan_all_reduce(ranks, count, dtype, op); };
        buffers = {{"tensor", out_data, out.nbytes(), BufferAccess::read_write}};
        break;
      }
      case CollectiveKind::broadcast: {
        const int64_t bytes = out.nbytes();
        const int root = signature.root;
        planner = [=](std::span<const Contribution> ranks) { return plan_broadcast(ranks, bytes, root); };
        buffers = {{"tensor", out_data, out.nbytes(), rank() == root ? BufferAccess::read : BufferAccess::write}};
        break;
      }
      default: fail("{}: not a device collective", signature.to_string());
    }
    job_->claim_device(rendezvous_.get(), rank(), out.device().index);
    std::shared_ptr<GroupRendezvous> rendezvous = job_->device_rendezvous(rendezvous_.get());
    const int64_t round = next_device_round_++;
    const int member = rank();
    const std::chrono::milliseconds timeout = options().timeout;
    // The bytes a ring moves are set by the whole buffer: the all-gather's
    // output, the reduce-scatter's input, the all-reduced or broadcast tensor.
    const cuda::sim::CollectiveShape shape{
        .kind = std::string(collective_name(signature.kind)),
        .bytes = signature.kind == CollectiveKind::reduce_scatter ? in.nbytes() : out.nbytes(),
        .ranks = size(),
        .group = name()};
    cuda::sim::launch_collective(
        fmt::format("{} on group '{}'", signature.to_string(), name()), shape, *stream, buffers,
        [=, finished = std::move(finished)](const std::string& refusal) {
          try {
            if (!refusal.empty()) {
              rendezvous->refuse(round, member, refusal);  // its peers must not wait for a part that never comes
              fail("{}", refusal);
            }
            rendezvous->run(round, member, Contribution{signature, in_data, out_data}, timeout, planner);
          } catch (...) {
            finished(std::current_exception());
            throw;
          }
          finished(nullptr);
        });
  }
#endif

  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, const std::string& name) override {
    // ProcessGroup::split has checked that the lists partition the group and hold this rank.
    const auto me = std::find(members.begin(), members.end(), rank());
    std::vector<int> member_world_ranks;
    for (int member : members) member_world_ranks.push_back(world_ranks()[static_cast<size_t>(member)]);
    auto rendezvous = job_->subgroup_rendezvous(rendezvous_.get(), splits_++, members, name, member_world_ranks);
    return std::make_shared<LocalProcessGroup>(job_, std::move(rendezvous), static_cast<int>(me - members.begin()),
                                               static_cast<int>(members.size()), name, std::move(member_world_ranks),
                                               local_rank(), local_size(), options());
  }

 private:
  // Called on the communication thread, one collective at a time, so the
  // k-th call of every member meets in round k.
  void run(const CollectiveSignature& signature, const void* in, void* out, const Planner& planner) {
    rendezvous_->run(next_round_++, rank(), Contribution{signature, in, out}, options().timeout, planner);
  }

  std::shared_ptr<LocalJob> job_;
  std::shared_ptr<GroupRendezvous> rendezvous_;
  int64_t next_round_ = 0;  // communication thread only
  int64_t next_device_round_ = 0;  // issuing thread only
  int64_t splits_ = 0;      // caller thread only
};

// The memory counters of the rank running on this thread (null outside run_local).
thread_local std::shared_ptr<MemoryCounters> rank_memory;

int default_threads_per_rank(int world_size) {
  // The caller's thread budget (all cores unless OMP_NUM_THREADS or
  // set_num_threads says less), shared among the ranks.
  const int cores = num_threads();
  return std::max(1, cores / world_size);
}

void run_rank(const std::shared_ptr<LocalJob>& job, int rank, int threads,
              const std::function<void(const ProcessGroupPtr& world)>& fn, const ProcessGroupOptions& options) {
  set_num_threads(threads);
  rank_memory = std::make_shared<MemoryCounters>();
  MemoryScope scope(rank_memory);
  std::vector<int> world_ranks(static_cast<size_t>(job->world_size()));
  std::iota(world_ranks.begin(), world_ranks.end(), 0);
  ProcessGroupPtr world = std::make_shared<LocalProcessGroup>(job, job->world_rendezvous(), rank, job->world_size(),
                                                              "world", std::move(world_ranks), rank,
                                                              job->world_size(), options);
  set_world(world);
  try {
    fn(world);
  } catch (...) {
    job->record_failure(rank, std::current_exception());
  }
  set_world(nullptr);
  world.reset();
  rank_memory.reset();
}

}  // namespace

void run_local(int world_size, const std::function<void(const ProcessGroupPtr& world)>& fn,
               const LocalOptions& options) {
  TESSERA_CHECK(world_size >= 1, "run_local: world_size must be at least 1, got {}", world_size);
  TESSERA_CHECK(options.threads_per_rank >= 0,
                "run_local: threads_per_rank must be >= 0 (0: cores / world size), got {}", options.threads_per_rank);
  check_faults_fit_world(world_size);
  const int threads = options.threads_per_rank > 0 ? options.threads_per_rank : default_threads_per_rank(world_size);
  const auto job = std::make_shared<LocalJob>(world_size);
  std::vector<std::thread> ranks;
  ranks.reserve(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    ranks.emplace_back([&, rank] { run_rank(job, rank, threads, fn, options.group); });
  }
  for (std::thread& thread : ranks) thread.join();
  if (std::exception_ptr error = job->root_cause()) std::rethrow_exception(error);
}

MemoryStats rank_memory_stats() { return rank_memory ? rank_memory->snapshot() : memory_stats(kCPU); }

void reset_rank_peak_memory() {
  if (rank_memory) {
    rank_memory->reset_peak();
  } else {
    reset_peak_memory(kCPU);
  }
}

}  // namespace tessera::dist
