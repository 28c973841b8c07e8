// ProcessGroup: the ranks that take part in collectives together, and the
// collectives themselves. One interface over every backend (local threads,
// MPI processes, NCCL on GPUs: dist/backends/); the base class does everything that is the same
// for all of them, so a backend only moves bytes:
//   - checks every call before any rank blocks (sizes, dtypes, contiguity);
//   - numbers collectives (per group, from 0) and runs them in issue order on
//     the group's communication thread, so async work overlaps the caller;
//   - in debug mode, exchanges a signature of each collective first and
//     reports the first mismatch instead of hanging or corrupting data;
//   - counts calls, bytes and time, and records trace events.
//
// Every collective is flat over contiguous buffers:
//   all_gather_into(out, in):          out = in_0 ++ in_1 ++ ... ++ in_{N-1}
//   reduce_scatter_into(out, in, op):  out_r = op_k(in_k[r*c, (r+1)*c))
// so FSDP's flat parameter buffers map onto them directly. `in` may be the
// rank's own chunk of `out` (all-gather) or `out` may be the rank's own chunk
// of `in` (reduce-scatter): the in-place forms need no extra copy.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dist/comm_stats.h"
#include "dist/reduce_op.h"
#include "dist/work.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace tessera::dist {

class Tracer;

struct ProcessGroupOptions {
  // Bound on every blocking wait inside a collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // Reductions add contributions in rank order 0..N-1 whatever the backend's
  // algorithm, so results are bitwise reproducible and equal across backends.
  bool deterministic = false;
  // Debug mode: ranks compare a signature of every collective before running it.
  bool check_collectives = false;

  // Defaults overridden by TESSERA_DIST_TIMEOUT_S (seconds as a plain
  // decimal number, "30" or "0.5", in [kMinTimeoutSeconds, kMaxTimeoutSeconds]),
  // TESSERA_DIST_DETERMINISTIC=1 and TESSERA_DIST_DEBUG=1; any other value
  // throws tessera::Error naming the variable, the value and the range.
  static ProcessGroupOptions from_environment();
  static constexpr double kMinTimeoutSeconds = 0.001;
  static constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;
};

// What one rank asked for; equal on every rank for a well-formed program.
struct CollectiveSignature {
  int64_t sequence = 0;
  CollectiveKind kind = CollectiveKind::barrier;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;  // reductions only
  int root = -1;                // broadcast only
  Shape in_shape;
  Shape out_shape;

  bool operator==(const CollectiveSignature&) const = default;
  // "#7 reduce_scatter_into(bf16, avg, in [8, 4], out [2, 4])"
  std::string to_string() const;
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  // The world rank of each member, in group-rank order.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // This rank's index among the ranks on its machine (GPU binding) and their count.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const ProcessGroupOptions& options() const { return options_; }
  virtual std::string backend_name() const = 0;  // "local", "mpi"

  // Collectives. Each returns at once with a Work when async_op is true;
  // otherwise it returns a completed Work after the collective has finished
  // (and rethrows its error). Misuse throws before anything is issued.
  Work all_gather_into(const Tensor& out, const Tensor& in, bool async_op = false);
  Work reduce_scatter_into(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum, bool async_op = false);
  Work all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum, bool async_op = false);
  Work broadcast(const Tensor& tensor, int root, bool async_op = false);
  Work barrier(bool async_op = false);
  // Several collectives of one kind issued as one batch, in list order: on
  // device tensors one NCCL group (ncclGroupStart/End: the transfers launch
  // together and one event follows them all); on host tensors one after
  // another on the communication thread. outs[i] and ins[i] are as for the
  // single call; the lists must be as long, not empty, and on one device, and
  // every check is made before anything is issued. The Work covers them all
  // (its wait rethrows the first error). A group's collectives are issued
  // from one thread.
  Work all_gather_into_coalesced(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                                 bool async_op = false);
  Work reduce_scatter_into_coalesced(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                                     ReduceOp op = ReduceOp::sum, bool async_op = false);
  Work all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum, bool async_op = false);
  // Metadata exchange: every rank's bytes (lengths may differ), in rank order.
  std::vector<std::vector<uint8_t>> all_gather_bytes(std::span<const uint8_t> bytes);

  // Splits this group into disjoint sub-groups (collective over this group).
  // `members` are the group ranks of the caller's own sub-group, in the
  // order that becomes their sub-group ranks; the caller must be among them,
  // and the lists of all callers must partition the group.
  std::shared_ptr<ProcessGroup> split(const std::vector<int>& members, const std::string& name);

  // Waits for every collective issued so far (as a barrier-free local flush),
  // device collectives included; rethrows a device collective's error.
  void synchronize();

  CommStats stats() const;
  void reset_stats();
  // Records each collective's run on track "comm:<name>" of this rank.
  void set_tracer(std::shared_ptr<Tracer> tracer);
  std::shared_ptr<Tracer> tracer() const;

  // The device protocol's two orderings (issue_on_device): the group's
  // stream starts a collective after an event of the caller's stream (its
  // input is written), and Work::wait makes the caller's stream wait for an
  // event after it (its output is written).
  enum class DeviceOrdering { input_written, output_written };
  // Test only: this group's later device collectives go without `ordering`
  // (the output's event is recorded before the collective), so a test can
  // prove that the stream-order checker stops a run lacking it. Never set
  // outside such a test.
  void drop_device_ordering_for_testing(DeviceOrdering ordering);

 protected:
  ProcessGroup(int rank, int size, std::string name, std::vector<int> world_ranks, int local_rank, int local_size,
               ProcessGroupOptions options);

  // The transport. Called on the communication thread, one at a time, in
  // issue order, with arguments already checked on this rank; must return
  // within options().timeout or throw CollectiveTimeout / RankFailed /
  // CollectiveMismatch. Reductions follow the ReduceOp contract (f32
  // accumulation for 16-bit types, one division for AVG, rank order when
  // options().deterministic). A sequence number may cover more than one
  // transport call (the debug-mode signature exchange, the two steps of
  // all_gather_bytes), so backends pair ranks up by their own count of calls,
  // which is the same on every rank, not by signature.sequence.
  virtual void run_all_gather(const CollectiveSignature& signature, void* out, const void* in,
                              int64_t bytes_per_rank) = 0;
  virtual void run_reduce_scatter(const CollectiveSignature& signature, void* out, const void* in,
                                  int64_t count_per_rank, DType dtype, ReduceOp op) = 0;
  virtual void run_all_reduce(const CollectiveSignature& signature, void* data, int64_t count, DType dtype,
                              ReduceOp op) = 0;
  virtual void run_broadcast(const CollectiveSignature& signature, void* data, int64_t bytes, int root) = 0;
  virtual void run_barrier(const CollectiveSignature& signature) = 0;
  // Creates the sub-group (collective over this group, called on the caller's thread).
  virtual std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, const std::string& name) = 0;

  // Device collectives: whether this backend moves cuda tensors between
  // ranks (the local backend on the simulator, NCCL). Without them, cuda
  // tensors are taken by a group of one rank only.
  virtual bool moves_device_tensors() const { return false; }
  // Whether a group of one rank still runs device collectives through
  // enqueue_device_collective (NCCL: the same stream protocol and watchdog
  // at every size) rather than as a copy on the caller's stream.
  virtual bool one_rank_uses_device_collectives() const { return false; }
  // Enqueues this rank's part of a device collective on `stream`, the
  // group's stream of the tensors' device, already ordered after the
  // caller's current stream. Called on the issuing thread, in issue order.
  // `out` and `in` are checked as for the host collectives (the same tensor
  // for all_reduce and broadcast); the reduction op and root are in the
  // signature. `finished` must be called on the stream once the collective
  // has run, with its error or null.
  using DeviceFinished = std::function<void(std::exception_ptr error)>;
  virtual void enqueue_device_collective(const CollectiveSignature& signature, const Tensor& out, const Tensor& in,
                                         const std::shared_ptr<Stream>& stream, DeviceFinished finished);

  // A batch of device collectives (the coalesced calls): every
  // enqueue_device_collective between these two calls belongs to it, and
  // end_device_batch leaves them all launched on `stream` (NCCL: between
  // ncclGroupStart and ncclGroupEnd). By default each is enqueued as it
  // comes, which is already in order on the group's one stream.
  virtual void begin_device_batch() {}
  virtual void end_device_batch([[maybe_unused]] const std::shared_ptr<Stream>& stream) {}

  // Runs what is queued and stops the communication thread. Every backend's
  // destructor calls it first, so no queued collective reaches a half-destroyed
  // backend.
  void stop_communication();

 private:
  // Numbers the collective, queues it on the communication thread (which
  // checks signatures in debug mode, runs `run`, accounts and traces it) and
  // waits for it unless async_op.
  Work issue(CollectiveSignature signature, std::shared_ptr<void> keep_alive, int64_t bytes, bool async_op,
             std::function<void(const CollectiveSignature&)> run);
  void account(const CollectiveSignature& signature, int64_t bytes, int64_t start_us, int64_t end_us);
  // Gives the collective its sequence number and its Work's description,
  // and carries out a fault planned for it (dist/launch/fault_injection.h).
  std::shared_ptr<Work::State> number_collective(CollectiveSignature& signature);
  // Numbers a device collective, orders the group's stream of the device
  // after the caller's current stream, enqueues it there, and returns a Work
  // holding the event after it (waited for at once unless async_op).
  Work issue_on_device(CollectiveSignature signature, int64_t bytes, const Tensor& out, const Tensor& in,
                       bool async_op);
  // The coalesced calls: `count` collectives issued by issue_one(i), as
  // one device batch when `tensors` are device tensors moved by device
  // collectives (one event after the batch completes every one's Work).
  Work coalesce(std::string_view name, size_t count, const std::vector<Tensor>& tensors, bool async_op,
                const std::function<Work(size_t)>& issue_one);
  // coalesce for the paired calls: every (out, in) checked as the single
  // call checks it, then issued by issue_pair.
  Work coalesce_pairs(std::string_view name, const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                      bool out_is_whole, bool async_op,
                      const std::function<Work(const Tensor& out, const Tensor& in)>& issue_pair);
  // Whether device tensors go through enqueue_device_collective: across
  // ranks always, on one rank where the backend asks (see above).
  bool uses_device_collectives() const;
  // A collective over one rank on device tensors: nothing crosses a wire, so
  // it is a copy of `in` into `out` (none when `out` is undefined or is `in`),
  // queued on the caller's current stream where the tensors' users run, and
  // complete as far as the host is concerned. Every reduction of one value is
  // that value, AVG's division by 1 included.
  Work run_on_one_device(CollectiveSignature signature, int64_t bytes, const Tensor& out, const Tensor& in);
  // Every rank's bytes through two all-gathers (lengths, then padded data).
  std::vector<std::vector<uint8_t>> exchange_bytes(const CollectiveSignature& signature,
                                                   std::span<const uint8_t> bytes);
  void check_signatures(const CollectiveSignature& mine);

  int rank_;
  int size_;
  std::string name_;
  std::vector<int> world_ranks_;
  int local_rank_;
  int local_size_;
  ProcessGroupOptions options_;
  int64_t next_sequence_ = 0;  // the issuing thread's
  std::mutex stream_mutex_;
  std::shared_ptr<Stream> comm_stream_;  // created at the first collective
  std::map<int, std::shared_ptr<Stream>> device_streams_;  // by cuda index, at the first device collective
  std::exception_ptr device_error_;  // the first device collective that failed
  std::optional<DeviceOrdering> dropped_ordering_;  // drop_device_ordering_for_testing
  // An open device batch (coalesce, on the issuing thread): its collectives'
  // states, which get the event after the batch, and their stream.
  bool batching_ = false;
  std::vector<std::shared_ptr<Work::State>> batched_;
  std::shared_ptr<Stream> batch_stream_;
  mutable std::mutex stats_mutex_;
  CommStats stats_;
  std::shared_ptr<Tracer> tracer_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace tessera::dist
