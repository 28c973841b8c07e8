// The NCCL backend (see nccl_backend.h): communicators made and split
// without blocking past the group's timeout, device collectives on the
// group's stream watched by a watchdog thread, host collectives staged
// through the GPU on a communicator of their own.
#include "dist/backends/nccl_backend.h"

#include "tensor/error.h"

#if TESSERA_HAVE_NCCL

#include <cuda_runtime.h>
#include <fmt/ranges.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "dist/backends/collective_progress.h"
#include "dist/errors.h"
#include "dist/reduction.h"
#include "tensor/cuda/nvidia/launch.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace tessera::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_error(ncclResult_t result, ncclComm_t comm) {
  std::string text = fmt::format("{} ({})", ncclGetErrorString(result), static_cast<int>(result));
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') text += fmt::format(": {}", detail);
  return text;
}

void check_cuda(cudaError_t status, std::string_view what) {
  TESSERA_CHECK(status == cudaSuccess, "nccl backend: {}: {} ({})", what, cudaGetErrorString(status),
                cudaGetErrorName(status));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8:
    case DType::f8e4m3:
    case DType::f8e5m2: return ncclUint8;  // moved as bytes, never reduced
    case DType::boolean: break;
  }
  fail("nccl backend: no NCCL type for {}", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

// What a nonblocking communicator's pending call came to.
enum class Settled { done, failed, timed_out };

// Polls `comm` until the call that returned `first` has taken effect (a
// nonblocking communicator answers ncclInProgress meanwhile), it failed, or
// `deadline` passed.
Settled settle(ncclComm_t comm, ncclResult_t first, Clock::time_point deadline, ncclResult_t& result) {
  result = first;
  auto pause = std::chrono::microseconds(20);
  while (result == ncclInProgress) {
    if (Clock::now() > deadline) return Settled::timed_out;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
    if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) break;
  }
  return result == ncclSuccess ? Settled::done : Settled::failed;
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

std::string seconds_text(std::chrono::milliseconds timeout) {
  return fmt::format("{:g} s", std::chrono::duration<double>(timeout).count());
}

// A communicator being made (init or split): waits for it within the
// timeout, or aborts it and throws naming the ranks that never arrived.
ncclComm_t finish_creation(ncclComm_t comm, ncclResult_t first, Clock::time_point deadline,
                           const CollectiveProgress& progress, const std::string& what,
                           std::chrono::milliseconds timeout) {
  ncclResult_t result = first;
  Settled settled = Settled::failed;
  if (comm != nullptr) {
    settled = settle(comm, first, deadline, result);
  } else if (first == ncclInProgress) {
    settled = Settled::timed_out;  // a split whose parent never finished it
  }
  if (settled == Settled::done) return comm;
  const std::string detail = settled == Settled::timed_out
                                 ? fmt::format("did not complete within the {} timeout; {}", seconds_text(timeout),
                                               progress.describe_missing(-1))
                                 : nccl_error(result, comm);
  if (comm != nullptr) ncclCommAbort(comm);
  if (settled == Settled::timed_out) throw CollectiveTimeout(fmt::format("{}: {}", what, detail));
  fail("{}: {}", what, detail);
}

// ncclCommSplit on a nonblocking parent: the split runs as an asynchronous
// job that stores the child's handle (atomically) when it has made it; then
// the child is settled like any new communicator. A child that never comes
// (a rank gone) is given up at the deadline by aborting the parent, which
// aborts the split with it.
ncclComm_t split_communicator(ncclComm_t parent, int color, int key, Clock::time_point deadline,
                              const CollectiveProgress& progress, const std::string& what,
                              std::chrono::milliseconds timeout, const std::function<void()>& abort_parent) {
  ncclConfig_t config = nonblocking_config();
  ncclComm_t child = nullptr;
  const ncclResult_t first = ncclCommSplit(parent, color, key, &child, &config);
  const std::atomic_ref<ncclComm_t> made(child);
  auto pause = std::chrono::microseconds(20);
  while (made.load() == nullptr) {
    ncclResult_t state = first;
    if (first != ncclInProgress && first != ncclSuccess) break;
    if (ncclCommGetAsyncError(parent, &state) != ncclSuccess ||
        (state != ncclSuccess && state != ncclInProgress) || Clock::now() > deadline) {
      break;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  if (made.load() == nullptr) {
    ncclResult_t state = first;
    if (first == ncclSuccess || first == ncclInProgress) ncclCommGetAsyncError(parent, &state);
    abort_parent();
    const bool timed_out = state == ncclSuccess || state == ncclInProgress;
    return finish_creation(nullptr, timed_out ? ncclInProgress : state, deadline, progress, what, timeout);
  }
  return finish_creation(made.load(), ncclInProgress, deadline, progress, what, timeout);
}

// A device collective the watchdog waits for.
struct InFlight {
  std::string description;  // "all_gather #12 (bf16, in [4], out [8]) on group 'world'"
  int64_t sequence = 0;
  Event done;
  Clock::time_point issued;
  std::function<void(std::exception_ptr error)> finished;  // ProcessGroup::DeviceFinished
};

void sleep_on_stream(void* milliseconds) {
  const auto* delay = static_cast<std::chrono::milliseconds*>(milliseconds);
  std::this_thread::sleep_for(*delay);
  delete delay;
}

class NcclProcessGroup final : public ProcessGroup {
 public:
  struct Communicators {
    ncclComm_t device = nullptr;
    ncclComm_t host = nullptr;
  };

  NcclProcessGroup(int rank, int size, std::string name, std::vector<int> world_ranks, int local_rank,
                   int local_size, ProcessGroupOptions options, int device, Communicators comms,
                   std::shared_ptr<TcpStore> store, std::shared_ptr<CollectiveProgress> progress)
      : ProcessGroup(rank, size, std::move(name), std::move(world_ranks), local_rank, local_size, options),
        device_(device),
        comms_(comms),
        store_(std::move(store)),
        progress_(std::move(progress)) {
    cuda::set_device(device_);
    check_cuda(cudaStreamCreateWithFlags(&host_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclProcessGroup() override {
    // The watchdog still runs while queued collectives drain, so a peer that
    // never comes ends in an abort rather than a hang here.
    stop_communication();
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    watchdog_.join();
    release_communicators();
    cudaStreamDestroy(host_stream_);
    if (staging_ != nullptr) cuda::device_free(device_, staging_);
  }

  std::string backend_name() const override { return "nccl"; }
  bool moves_device_tensors() const override { return true; }
  bool one_rank_uses_device_collectives() const override { return true; }

  void delay_next_device_collective(std::chrono::milliseconds delay) { next_delay_ = delay; }

 protected:
  // ---- host collectives: staged through the GPU on the host communicator ----

  void run_all_gather(const CollectiveSignature& signature, void* out, const void* in,
                      int64_t bytes_per_rank) override {
    note_issued(signature.sequence);
    const int64_t total = bytes_per_rank * size();
    char* staging = static_cast<char*>(staging_bytes(total));
    char* mine = staging + rank() * bytes_per_rank;
    copy_async(mine, in, bytes_per_rank, cudaMemcpyHostToDevice);
    host_call(signature, ncclAllGather(mine, staging, static_cast<size_t>(bytes_per_rank), ncclUint8, comms_.host,
                                       host_stream_));
    copy_async(out, staging, total, cudaMemcpyDeviceToHost);
    wait_for_host_stream(signature);
  }

  void run_reduce_scatter(const CollectiveSignature& signature, void* out, const void* in, int64_t count_per_rank,
                          DType dtype, ReduceOp op) override {
    // Every rank's whole input, then this rank's chunk of each in rank order.
    const int64_t element = static_cast<int64_t>(element_size(dtype));
    const int64_t input_bytes = count_per_rank * size() * element;
    std::vector<char> gathered(static_cast<size_t>(input_bytes * size()));
    run_all_gather(signature, gathered.data(), in, input_bytes);
    std::vector<const void*> chunks;
    for (int r = 0; r < size(); ++r) {
      chunks.push_back(gathered.data() + r * input_bytes + rank() * count_per_rank * element);
    }
    reduce_in_order(out, chunks, count_per_rank, dtype, op, size());
  }

  void run_all_reduce(const CollectiveSignature& signature, void* data, int64_t count, DType dtype,
                      ReduceOp op) override {
    const int64_t bytes = count * static_cast<int64_t>(element_size(dtype));
    std::vector<char> gathered(static_cast<size_t>(bytes * size()));
    run_all_gather(signature, gathered.data(), data, bytes);
    std::vector<const void*> inputs;
    for (int r = 0; r < size(); ++r) inputs.push_back(gathered.data() + r * bytes);
    reduce_in_order(data, inputs, count, dtype, op, size());
  }

  void run_broadcast(const CollectiveSignature& signature, void* data, int64_t bytes, int root) override {
    note_issued(signature.sequence);
    void* staging = staging_bytes(bytes);
    if (rank() == root) copy_async(staging, data, bytes, cudaMemcpyHostToDevice);
    host_call(signature, ncclBroadcast(staging, staging, static_cast<size_t>(bytes), ncclUint8, root, comms_.host,
                                       host_stream_));
    copy_async(data, staging, bytes, cudaMemcpyDeviceToHost);
    wait_for_host_stream(signature);
  }

  void run_barrier(const CollectiveSignature& signature) override {
    const uint8_t mine = 1;
    std::vector<uint8_t> all(static_cast<size_t>(size()));
    run_all_gather(signature, all.data(), &mine, 1);
  }

  // ---- device collectives: on the group's stream, watched ----

  void enqueue_device_collective(const CollectiveSignature& signature, const Tensor& out, const Tensor& in,
                                 const std::shared_ptr<Stream>& stream, DeviceFinished finished) override {
    refuse_if_aborted();
    TESSERA_CHECK(in.device().index == device_,
                  "{} on group '{}': the tensors are on {}, but this rank's NCCL communicator is on cuda:{}",
                  signature.to_string(), name(), in.device().str(), device_);
    note_issued(signature.sequence);
    const cudaStream_t native = cuda::nvidia::native_stream(stream.get(), "nccl collective");
    if (next_delay_.count() > 0) {
      check_cuda(cudaLaunchHostFunc(native, sleep_on_stream, new std::chrono::milliseconds(next_delay_)),
                 "cudaLaunchHostFunc");
      next_delay_ = {};
    }
    const ncclDataType_t type = nccl_type(in.dtype());
    const bool in_rank_order = options().deterministic && is_floating(in.dtype()) &&
                               (signature.op == ReduceOp::sum || signature.op == ReduceOp::avg);
    switch (signature.kind) {
      case CollectiveKind::all_gather:
        device_call(signature, ncclAllGather(in.cuda_data(), out.cuda_data(), static_cast<size_t>(in.numel()), type,
                                             comms_.device, native));
        break;
      case CollectiveKind::reduce_scatter:
        if (in_rank_order) {
          reduce_scatter_in_rank_order(signature, out, in, stream);
        } else {
          device_call(signature, ncclReduceScatter(in.cuda_data(), out.cuda_data(), static_cast<size_t>(out.numel()),
                                                   type, nccl_op(signature.op), comms_.device, native));
        }
        break;
      case CollectiveKind::all_reduce:
        if (in_rank_order) {
          all_reduce_in_rank_order(signature, out, stream);
        } else {
          device_call(signature, ncclAllReduce(in.cuda_data(), out.cuda_data(), static_cast<size_t>(out.numel()), type,
                                               nccl_op(signature.op), comms_.device, native));
        }
        break;
      case CollectiveKind::broadcast:
        device_call(signature, ncclBroadcast(in.cuda_data(), out.cuda_data(), static_cast<size_t>(out.numel()), type,
                                             signature.root, comms_.device, native));
        break;
      default: fail("{}: not a device collective", signature.to_string());
    }
    InFlight entry{.description = fmt::format("{} on group '{}'", signature.to_string(), name()),
                   .sequence = signature.sequence,
                   .done = Event(),
                   .issued = Clock::now(),
                   .finished = std::move(finished)};
    if (grouped_) {
      // Inside ncclGroupStart/End nothing has launched yet: the watchdog
      // gets it, with its event, at the group's end.
      batched_.push_back(std::move(entry));
      return;
    }
    watch(std::move(entry), *stream);
  }

  // The coalesced calls' batch as one NCCL group. The deterministic paths
  // launch kernels of their own between NCCL calls (sums in rank order),
  // which a group would run before its transfers: they stay one by one.
  void begin_device_batch() override {
    if (options().deterministic) return;
    refuse_if_aborted();
    const ncclResult_t started = ncclGroupStart();
    TESSERA_CHECK(started == ncclSuccess, "a coalesced batch on group '{}': ncclGroupStart: {}", name(),
                  nccl_error(started, comms_.device));
    grouped_ = true;
  }

  void end_device_batch(const std::shared_ptr<Stream>& stream) override {
    if (!grouped_) return;
    grouped_ = false;
    std::vector<InFlight> batch = std::move(batched_);
    batched_.clear();
    ncclResult_t result = ncclSuccess;
    const Settled settled = settle(comms_.device, ncclGroupEnd(), Clock::now() + options().timeout, result);
    TESSERA_CHECK(settled == Settled::done, "a coalesced batch of {} collectives on group '{}': NCCL refused its "
                  "ncclGroupEnd: {}", batch.size(), name(),
                  settled == Settled::timed_out ? "it was still being enqueued at the timeout"
                                                : nccl_error(result, comms_.device));
    for (InFlight& entry : batch) watch(std::move(entry), *stream);
  }

  // Hands a launched collective to the watchdog, with the event after it.
  void watch(InFlight entry, Stream& stream) {
    entry.done.record(stream);
    {
      std::lock_guard lock(mutex_);
      in_flight_.push_back(std::move(entry));
    }
    changed_.notify_all();
  }

  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, const std::string& name) override {
    refuse_if_aborted();
    // The lists partition the group (checked by split), so the smallest
    // member names a sub-group alike on all of its members.
    const int color = *std::min_element(members.begin(), members.end());
    const int key = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    const int index = split_count_++;
    std::vector<int> world_ranks;
    for (int member : members) world_ranks.push_back(this->world_ranks()[static_cast<size_t>(member)]);
    auto progress = std::make_shared<CollectiveProgress>(
        store_, fmt::format("{}/{}.{}.{}", progress_->prefix(), name, index, color), key,
        static_cast<int>(members.size()));
    progress->post(-1);
    const Clock::time_point deadline = Clock::now() + options().timeout;
    const std::string what = fmt::format("split of group '{}' into '{}' (ncclCommSplit)", this->name(), name);
    Communicators comms;
    comms.device = split_communicator(comms_.device, color, key, deadline, *progress, what, options().timeout,
                                      [&] { abort(what + " failed"); });
    comms.host = split_communicator(comms.device, 0, 0, deadline, *progress, what + " (its host communicator)",
                                    options().timeout, [&] { ncclCommAbort(comms.device); });
    return std::make_shared<NcclProcessGroup>(key, static_cast<int>(members.size()), name, std::move(world_ranks),
                                              local_rank(), local_size(), options(), device_, comms, store_,
                                              std::move(progress));
  }

 private:
  void note_issued(int64_t sequence) {
    int64_t latest = issued_.load();
    while (latest < sequence && !issued_.compare_exchange_weak(latest, sequence)) {
    }
  }

  void refuse_if_aborted() {
    std::lock_guard lock(mutex_);
    if (abort_reason_.empty()) return;
    throw RankFailed(fmt::format("group '{}' can take no more collectives: its NCCL communicators were aborted after "
                                 "{}",
                                 name(), abort_reason_));
  }

  // A device call's return: ncclInProgress is settled first (nonblocking
  // communicators), an error throws naming the collective.
  void device_call(const CollectiveSignature& signature, ncclResult_t first) {
    ncclResult_t result = first;
    const Settled settled = settle(comms_.device, first, Clock::now() + options().timeout, result);
    TESSERA_CHECK(settled == Settled::done, "{} on group '{}': NCCL refused it: {}", signature.to_string(), name(),
                  settled == Settled::timed_out ? "it was still being enqueued at the timeout"
                                                : nccl_error(result, comms_.device));
  }

  void host_call(const CollectiveSignature& signature, ncclResult_t first) {
    ncclResult_t result = first;
    const Settled settled = settle(comms_.host, first, Clock::now() + options().timeout, result);
    if (settled == Settled::done) return;
    const std::string reason = settled == Settled::timed_out ? std::string("it was still being enqueued at the timeout")
                                                             : nccl_error(result, comms_.host);
    abort(fmt::format("{} on group '{}' (host, staged through the GPU): {}", signature.to_string(), name(), reason));
    fail("{} on group '{}': NCCL refused it: {}", signature.to_string(), name(), reason);
  }

  void* staging_bytes(int64_t bytes) {
    bytes = std::max<int64_t>(bytes, 1);
    if (bytes > staging_capacity_) {
      if (staging_ != nullptr) cuda::device_free(device_, staging_);
      staging_ = cuda::device_malloc(device_, bytes);
      TESSERA_CHECK(staging_ != nullptr, "nccl backend: cuda:{} has no {} bytes left to stage a host collective",
                    device_, bytes);
      staging_capacity_ = bytes;
    }
    return staging_;
  }

  void copy_async(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, host_stream_), "cudaMemcpyAsync");
  }

  // The communication thread waits for its staged collective, bounded by the timeout.
  void wait_for_host_stream(const CollectiveSignature& signature) {
    cuda::set_device(device_);
    const Clock::time_point deadline = Clock::now() + options().timeout;
    auto pause = std::chrono::microseconds(10);
    while (true) {
      const cudaError_t status = cudaStreamQuery(host_stream_);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) check_cuda(status, "a staged host collective");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comms_.host, &async);
      const std::string what = fmt::format("{} on group '{}' (host, staged through the GPU)", signature.to_string(),
                                           name());
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string reason = fmt::format("{} failed in NCCL: {}", what, nccl_error(async, comms_.host));
        abort(reason);
        fail("{}", reason);
      }
      if (Clock::now() > deadline) {
        const std::string reason = timeout_message(what, signature.sequence);
        abort(reason);
        throw CollectiveTimeout(reason);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  std::string timeout_message(const std::string& what, int64_t sequence) const {
    return fmt::format("tessera nccl watchdog: {} did not complete within the {} timeout on rank {} of {}; {}; "
                       "ncclCommAbort ends the group",
                       what, seconds_text(options().timeout), rank(), size(), progress_->describe_missing(sequence));
  }

  // Aborts both communicators once; later collectives are refused naming `reason`.
  void abort(const std::string& reason) {
    {
      std::lock_guard lock(mutex_);
      if (!abort_reason_.empty()) return;
      abort_reason_ = reason;
    }
    abort_communicators();
  }

  // Once, by whoever set abort_reason_ first. The handles stay (the other
  // threads' pending calls hold them); nothing uses them again, as every
  // call checks abort_reason_ first.
  void abort_communicators() {
    ncclCommAbort(comms_.device);
    ncclCommAbort(comms_.host);
  }

  void release_communicators() {
    bool aborted = false;
    {
      std::lock_guard lock(mutex_);
      aborted = !abort_reason_.empty();
    }
    if (aborted) return;
    // Finalizing flushes what is queued; a peer that never comes would hold
    // it forever, so it is bounded and aborted like a collective.
    const Clock::time_point deadline = Clock::now() + options().timeout;
    for (ncclComm_t comm : {comms_.host, comms_.device}) {
      ncclResult_t result = ncclSuccess;
      if (settle(comm, ncclCommFinalize(comm), deadline, result) == Settled::done) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
  }

  // ---- the watchdog ----

  void watch() {
    cuda::set_device(device_);
    Clock::time_point last_post;
    std::unique_lock lock(mutex_);
    while (!(stopping_ && in_flight_.empty())) {
      changed_.wait_for(lock, in_flight_.empty() ? std::chrono::milliseconds(200) : std::chrono::milliseconds(1));
      if (Clock::now() - last_post > std::chrono::milliseconds(500)) {
        last_post = Clock::now();
        lock.unlock();
        progress_->post(issued_.load());
        lock.lock();
      }
      // Collectives finish in order on the group's stream: the oldest first.
      while (!in_flight_.empty() && in_flight_.front().done.query()) {
        InFlight completed = std::move(in_flight_.front());
        in_flight_.pop_front();
        ready_since_ = Clock::now();
        lock.unlock();
        completed.finished(nullptr);
        lock.lock();
      }
      if (in_flight_.empty()) continue;
      std::string reason;
      ncclResult_t async = ncclSuccess;
      if (abort_reason_.empty() && ncclCommGetAsyncError(comms_.device, &async) == ncclSuccess &&
          async != ncclSuccess && async != ncclInProgress) {
        reason = fmt::format("tessera nccl watchdog: {} failed in NCCL on rank {} of {}: {}",
                             in_flight_.front().description, rank(), size(), nccl_error(async, comms_.device));
      }
      // A collective's time starts when it could start: at its issue, or when
      // the one before it on the stream finished, whichever is later.
      const InFlight& oldest = in_flight_.front();
      const Clock::time_point started = std::max(oldest.issued, ready_since_);
      if (reason.empty() && abort_reason_.empty() && Clock::now() - started > options().timeout) {
        lock.unlock();
        reason = timeout_message(oldest.description, oldest.sequence);
        lock.lock();
      }
      if (reason.empty() && abort_reason_.empty()) continue;
      std::deque<InFlight> failed = std::move(in_flight_);
      in_flight_.clear();
      const bool first_failure = abort_reason_.empty();
      if (first_failure) abort_reason_ = reason;
      const std::exception_ptr error = std::make_exception_ptr(CollectiveTimeout(abort_reason_));
      lock.unlock();
      // The collectives fail first, so the error surfaces at the timeout
      // however long ncclCommAbort then takes to tear the kernels down.
      for (InFlight& entry : failed) entry.finished(error);
      if (first_failure) abort_communicators();
      lock.lock();
    }
  }

  // ---- deterministic reductions (see nccl_backend.h) ----

  // out = sum (or average) of `chunks`' rows in rank order, in the wide type,
  // rounded once into out's dtype, computed on `stream`.
  static void reduce_rows_in_rank_order(const Tensor& out, const Tensor& chunks, ReduceOp op,
                                        const std::shared_ptr<Stream>& stream) {
    const StreamGuard on_stream(stream);
    const DType wide = out.dtype() == DType::f64 ? DType::f64 : DType::f32;
    Tensor total = ops::to(ops::select(chunks, 0, 0), wide);
    for (int64_t r = 1; r < chunks.size(0); ++r) total = ops::add(total, ops::to(ops::select(chunks, 0, r), wide));
    if (op == ReduceOp::avg) total = ops::div(total, static_cast<double>(chunks.size(0)));
    Tensor destination = out;
    ops::copy_(destination, ops::view(ops::to(total, out.dtype()), out.sizes()));
  }

  void reduce_scatter_in_rank_order(const CollectiveSignature& signature, const Tensor& out, const Tensor& in,
                                    const std::shared_ptr<Stream>& stream) {
    const cudaStream_t native = cuda::nvidia::native_stream(stream.get(), "nccl send/recv");
    const size_t count = static_cast<size_t>(out.numel());
    const int64_t bytes = out.nbytes();
    Tensor received;
    {
      const StreamGuard on_stream(stream);
      received = ops::empty({size(), out.numel()}, {.dtype = out.dtype(), .device = out.device()});
    }
    const ncclDataType_t type = nccl_type(out.dtype());
    const char* sent = static_cast<const char*>(in.cuda_data());
    char* into = static_cast<char*>(received.cuda_data());
    ncclGroupStart();
    for (int peer = 0; peer < size(); ++peer) {
      ncclSend(sent + peer * bytes, count, type, peer, comms_.device, native);
      ncclRecv(into + peer * bytes, count, type, peer, comms_.device, native);
    }
    device_call(signature, ncclGroupEnd());
    reduce_rows_in_rank_order(out, received, signature.op, stream);
  }

  void all_reduce_in_rank_order(const CollectiveSignature& signature, const Tensor& tensor,
                                const std::shared_ptr<Stream>& stream) {
    const cudaStream_t native = cuda::nvidia::native_stream(stream.get(), "nccl all-gather");
    Tensor gathered;
    {
      const StreamGuard on_stream(stream);
      gathered = ops::empty({size(), tensor.numel()}, {.dtype = tensor.dtype(), .device = tensor.device()});
    }
    device_call(signature, ncclAllGather(tensor.cuda_data(), gathered.cuda_data(), static_cast<size_t>(tensor.numel()),
                                         nccl_type(tensor.dtype()), comms_.device, native));
    reduce_rows_in_rank_order(tensor, gathered, signature.op, stream);
  }

  int device_;
  Communicators comms_;
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<CollectiveProgress> progress_;
  cudaStream_t host_stream_ = nullptr;
  void* staging_ = nullptr;  // the communication thread's
  int64_t staging_capacity_ = 0;
  int split_count_ = 0;
  std::chrono::milliseconds next_delay_{0};
  std::atomic<int64_t> issued_{-1};
  bool grouped_ = false;          // between ncclGroupStart and ncclGroupEnd (the issuing thread's)
  std::vector<InFlight> batched_;  // the open group's collectives, not yet watched

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<InFlight> in_flight_;
  Clock::time_point ready_since_;
  std::string abort_reason_;  // empty until aborted
  bool stopping_ = false;
  std::thread watchdog_;
};

// "host h, GPU 0000:1b:00.0": what NCCL means by one GPU.
std::string gpu_identity(int device) {
  char bus[32] = {};
  check_cuda(cudaDeviceGetPCIBusId(bus, sizeof bus, device), "cudaDeviceGetPCIBusId");
  return fmt::format("host {}, GPU {}", host_name(), bus);
}

// "ranks 0 and 1 are both on host h, GPU ...: ...", from what the ranks
// posted before init, or "" when no other rank shares this one's GPU.
std::string ranks_sharing_gpu(TcpStore& store, const LaunchInfo& launch, const std::string& gpu) {
  std::vector<int> sharing;
  try {
    for (int rank = 0; rank < launch.world_size; ++rank) {
      const std::string key = fmt::format("nccl/world/gpu/{}", rank);
      if (rank == launch.rank || (store.check(key) && store.get_string(key) == gpu)) sharing.push_back(rank);
    }
  } catch (const std::exception&) {
    return "";
  }
  if (sharing.size() < 2) return "";
  return fmt::format("ranks {} are all on {}: NCCL takes one GPU per rank (one process per GPU, bound by its "
                     "local rank; check CUDA_VISIBLE_DEVICES and the launcher's ranks per node)",
                     fmt::join(sharing, ", "), gpu);
}

}  // namespace

bool nccl_backend_built() { return true; }

ProcessGroupPtr init_nccl_world(const LaunchInfo& launch, std::shared_ptr<TcpStore> store,
                                const ProcessGroupOptions& options) {
  TESSERA_CHECK(store != nullptr, "init_nccl_world: no store to meet the other ranks at");
  const int gpus = cuda::device_count();
  TESSERA_CHECK(launch.local_rank < gpus,
                "init_nccl_world: rank {} is local rank {} on its machine and so needs cuda:{}, but this process sees "
                "{} GPU(s); start one process per GPU (and check CUDA_VISIBLE_DEVICES)",
                launch.rank, launch.local_rank, launch.local_rank, gpus);
  const int device = launch.local_rank;
  cuda::set_device(device);
  auto progress = std::make_shared<CollectiveProgress>(store, "nccl/world", launch.rank, launch.world_size);
  const std::string gpu = gpu_identity(device);
  store->set(fmt::format("nccl/world/gpu/{}", launch.rank), gpu);
  progress->post(-1);
  ncclUniqueId id;
  if (launch.rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    TESSERA_CHECK(made == ncclSuccess, "init_nccl_world: ncclGetUniqueId: {}", ncclGetErrorString(made));
    store->set("nccl/world/id", std::as_bytes(std::span(id.internal)));
  } else {
    const std::vector<std::byte> bytes = store->get("nccl/world/id");
    TESSERA_CHECK(bytes.size() == sizeof id.internal, "init_nccl_world: the id in the store has {} bytes, not {}",
                  bytes.size(), sizeof id.internal);
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  const Clock::time_point deadline = Clock::now() + options.timeout;
  const std::string what = fmt::format("NCCL init of the world (rank {} of {}, cuda:{})", launch.rank,
                                       launch.world_size, device);
  ncclConfig_t config = nonblocking_config();
  NcclProcessGroup::Communicators comms;
  const ncclResult_t first = ncclCommInitRankConfig(&comms.device, launch.world_size, id, launch.rank, &config);
  try {
    comms.device = finish_creation(comms.device, first, deadline, *progress, what, options.timeout);
  } catch (const CollectiveTimeout&) {
    throw;
  } catch (const Error& error) {
    // NCCL's own reason stays in its log; two ranks on one GPU is the usual one.
    const std::string sharing = ranks_sharing_gpu(*store, launch, gpu);
    if (sharing.empty()) throw;
    fail("{}; {}", error.what(), sharing);
  }
  comms.host = split_communicator(comms.device, 0, 0, deadline, *progress, what + " (its host communicator)",
                                  options.timeout, [&] { ncclCommAbort(comms.device); });
  std::vector<int> world_ranks(static_cast<size_t>(launch.world_size));
  for (int r = 0; r < launch.world_size; ++r) world_ranks[static_cast<size_t>(r)] = r;
  return std::make_shared<NcclProcessGroup>(launch.rank, launch.world_size, "world", std::move(world_ranks),
                                            launch.local_rank, launch.local_world_size, options, device, comms,
                                            std::move(store), std::move(progress));
}

void delay_next_device_collective_for_testing(ProcessGroup& group, std::chrono::milliseconds delay) {
  auto* nccl = dynamic_cast<NcclProcessGroup*>(&group);
  TESSERA_CHECK(nccl != nullptr, "delay_next_device_collective_for_testing: group '{}' is not an NCCL group ({})",
                group.name(), group.backend_name());
  nccl->delay_next_device_collective(delay);
}

}  // namespace tessera::dist

#else  // no NCCL in this build

namespace tessera::dist {

bool nccl_backend_built() { return false; }

ProcessGroupPtr init_nccl_world(const LaunchInfo& launch, std::shared_ptr<TcpStore>, const ProcessGroupOptions&) {
  fail("init_nccl_world (rank {} of {}): this build of tessera has no NCCL backend; configure the nvidia runtime "
       "(-Dgpu_runtime=nvidia) where NCCL is found (the CUDA toolkit's, or -Dnccl_home=...)",
       launch.rank, launch.world_size);
}

void delay_next_device_collective_for_testing(ProcessGroup& group, std::chrono::milliseconds) {
  fail("delay_next_device_collective_for_testing: group '{}' is not an NCCL group: this build has no NCCL",
       group.name());
}

}  // namespace tessera::dist

#endif
