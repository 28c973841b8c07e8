// The `mpi` backend (contract in mpi_backend.h): a ProcessGroup over an MPI
// communicator. Every collective is a nonblocking MPI call polled against the
// group's timeout, so a rank that never arrives ends the job with a message
// instead of a silent hang. Built only when meson finds OpenMPI.
#include "dist/backends/mpi_backend.h"

#include "tensor/error.h"

#if TESSERA_HAVE_MPI

// The C API only: OpenMPI's deprecated C++ bindings warn under -Wextra.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "dist/launch/lifeline.h"
#include "dist/reduction.h"

namespace tessera::dist {
namespace {

// Floating-point reductions MPI cannot do our way run as user-defined ops,
// one per (dtype, op), built on the shared kernel: bf16/f16 have no MPI type
// (they travel as 16-bit words), and MPI's own MAX/MIN drop a NaN or keep it
// depending on operand order where ours propagate it. A 16-bit SUM or AVG
// through a user op would round at every combine step of MPI's tree (up to
// N-1 times, and an f16 AVG could overflow where the mean does not), so those
// take the rank-order path instead: all-to-all of the 16-bit chunks, f32
// accumulation, one rounding; the same bytes on the wire as a ring.
bool sums_16_bit(DType dtype, ReduceOp op) {
  return (dtype == DType::bf16 || dtype == DType::f16) && (op == ReduceOp::sum || op == ReduceOp::avg);
}

template <DType dtype, ReduceOp op>
void combine_with_kernel(void* in, void* inout, int* count, MPI_Datatype*) {
  combine_into(inout, in, *count, dtype, op);
}

struct UserOp {
  DType dtype;
  ReduceOp op;
  MPI_User_function* function;
};
constexpr std::array<UserOp, 8> kUserOps = {{
    {DType::bf16, ReduceOp::max, combine_with_kernel<DType::bf16, ReduceOp::max>},
    {DType::bf16, ReduceOp::min, combine_with_kernel<DType::bf16, ReduceOp::min>},
    {DType::f16, ReduceOp::max, combine_with_kernel<DType::f16, ReduceOp::max>},
    {DType::f16, ReduceOp::min, combine_with_kernel<DType::f16, ReduceOp::min>},
    {DType::f32, ReduceOp::max, combine_with_kernel<DType::f32, ReduceOp::max>},
    {DType::f32, ReduceOp::min, combine_with_kernel<DType::f32, ReduceOp::min>},
    {DType::f64, ReduceOp::max, combine_with_kernel<DType::f64, ReduceOp::max>},
    {DType::f64, ReduceOp::min, combine_with_kernel<DType::f64, ReduceOp::min>},
}};

// What the process shares between all groups.
struct MpiRuntime {
  std::mutex init_mutex;
  bool started = false;    // MPI is up and our ops exist
  bool owns_mpi = false;   // MPI_Init was ours, so MPI_Finalize is too
  // Below MPI_THREAD_MULTIPLE, every MPI call of every group's comm thread
  // goes through call_mutex (held per call, released between polls).
  bool serialise_calls = false;
  std::mutex call_mutex;
  std::array<MPI_Op, kUserOps.size()> user_ops{};  // created from kUserOps, same order
};

MpiRuntime& runtime() {
  static MpiRuntime state;
  return state;
}

// Held around each MPI call; a no-op when MPI is fully thread-safe.
class MpiCallGuard {
 public:
  MpiCallGuard() {
    if (runtime().serialise_calls) lock_ = std::unique_lock(runtime().call_mutex);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail("mpi backend: {} failed: {}", call, std::string_view(text, static_cast<size_t>(length)));
}

MPI_Datatype element_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8:
    case DType::f8e4m3:
    case DType::f8e5m2: return MPI_UINT8_T;  // moved as bytes, never reduced
    case DType::boolean: break;
  }
  fail("mpi backend: no reduction for dtype {}", dtype_name(dtype));
}

// AVG is SUM here; the caller divides once afterwards (finish_average).
MPI_Op reduction_op(DType dtype, ReduceOp op) {
  const ReduceOp combine = op == ReduceOp::avg ? ReduceOp::sum : op;
  for (size_t i = 0; i < kUserOps.size(); ++i) {
    if (kUserOps[i].dtype == dtype && kUserOps[i].op == combine) return runtime().user_ops[i];
  }
  switch (combine) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts are ints: a call moving more elements than that is refused with
// a message rather than truncated.
int mpi_count(int64_t count, const CollectiveSignature& signature) {
  if (count > INT_MAX) {
    fail("mpi backend: {} needs a count of {} elements, more than MPI's int counts allow ({}); split the buffer",
         signature.to_string(), count, INT_MAX);
  }
  return static_cast<int>(count);
}

// Raw bytes travel in the widest word that divides them, so a chunk of up to
// 16 GiB still fits MPI's int count.
struct WireCount {
  MPI_Datatype type;
  int count;
};
WireCount byte_wire(int64_t bytes, const CollectiveSignature& signature) {
  if (bytes % 8 == 0) return {MPI_UINT64_T, mpi_count(bytes / 8, signature)};
  if (bytes % 4 == 0) return {MPI_UINT32_T, mpi_count(bytes / 4, signature)};
  if (bytes % 2 == 0) return {MPI_UINT16_T, mpi_count(bytes / 2, signature)};
  return {MPI_BYTE, mpi_count(bytes, signature)};
}

bool mpi_finalised() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  return finalised != 0;
}

void start_mpi(MpiRuntime& mpi) {
  TESSERA_CHECK(!mpi_finalised(), "init_mpi_world: MPI was finalised in this process; it cannot start again");
  int already = 0;
  MPI_Initialized(&already);
  int provided = MPI_THREAD_SINGLE;
  if (already) {
    MPI_Query_thread(&provided);
  } else {
    // Every group's comm thread calls MPI, concurrently.
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    mpi.owns_mpi = true;
  }
  mpi.serialise_calls = provided < MPI_THREAD_MULTIPLE;
  for (size_t i = 0; i < kUserOps.size(); ++i) {
    check_mpi(MPI_Op_create(kUserOps[i].function, /*commute=*/1, &mpi.user_ops[i]), "MPI_Op_create");
  }
  mpi.started = true;
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  // A group over `comm` (taken over: freed with the group); rank and size are the communicator's.
  static std::shared_ptr<MpiProcessGroup> create(MPI_Comm comm, std::string name, std::vector<int> world_ranks,
                                                 int local_rank, int local_size, const ProcessGroupOptions& options) {
    int rank = 0;
    int size = 0;
    {
      MpiCallGuard guard;
      // Errors come back as codes and become tessera::Error, not an abort.
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      MPI_Comm_rank(comm, &rank);
      MPI_Comm_size(comm, &size);
    }
    return std::make_shared<MpiProcessGroup>(comm, rank, size, std::move(name), std::move(world_ranks), local_rank,
                                             local_size, options);
  }

  MpiProcessGroup(MPI_Comm comm, int rank, int size, std::string name, std::vector<int> world_ranks, int local_rank,
                  int local_size, const ProcessGroupOptions& options)
      : ProcessGroup(rank, size, std::move(name), std::move(world_ranks), local_rank, local_size, options),
        comm_(comm) {}

  ~MpiProcessGroup() override {
    stop_communication();  // no queued collective may reach comm_ once it is freed
    if (!mpi_finalised()) {
      MpiCallGuard guard;
      MPI_Comm_free(&comm_);
    }
  }

  std::string backend_name() const override { return "mpi"; }

 protected:
  void run_all_gather(const CollectiveSignature& signature, void* out, const void* in,
                      int64_t bytes_per_rank) override {
    WireCount wire = byte_wire(bytes_per_rank, signature);
    const bool in_place = in == static_cast<const std::byte*>(out) + rank() * bytes_per_rank;
    const void* send = in_place ? MPI_IN_PLACE : in;
    run_and_wait(signature, "MPI_Iallgather", [&](MPI_Request* request) {
      return MPI_Iallgather(send, wire.count, wire.type, out, wire.count, wire.type, comm_, request);
    });
  }

  void run_reduce_scatter(const CollectiveSignature& signature, void* out, const void* in, int64_t count_per_rank,
                          DType dtype, ReduceOp op) override {
    if (options().deterministic || sums_16_bit(dtype, op)) {
      return reduce_scatter_in_rank_order(signature, out, in, count_per_rank, dtype, op);
    }
    if (dtype == DType::i32 && op == ReduceOp::avg) {
      return reduce_scatter_i32_average(signature, out, in, count_per_rank);
    }
    const int64_t element = static_cast<int64_t>(element_size(dtype));
    // MPI forbids overlapping send and receive buffers, and its MPI_IN_PLACE
    // form wants the result at the front of `in`: reduce into staging instead.
    const bool in_place = out == static_cast<const std::byte*>(in) + rank() * count_per_rank * element;
    void* result = in_place ? staging(count_per_rank * element) : out;
    int count = mpi_count(count_per_rank, signature);
    run_and_wait(signature, "MPI_Ireduce_scatter_block", [&](MPI_Request* request) {
      return MPI_Ireduce_scatter_block(in, result, count, element_type(dtype), reduction_op(dtype, op), comm_, request);
    });
    if (in_place) std::memcpy(out, result, static_cast<size_t>(count_per_rank * element));
    if (op == ReduceOp::avg) finish_average(out, count_per_rank, dtype, size());
  }

  void run_all_reduce(const CollectiveSignature& signature, void* data, int64_t count, DType dtype,
                      ReduceOp op) override {
    if (options().deterministic || sums_16_bit(dtype, op)) {
      return all_reduce_in_rank_order(signature, data, count, dtype, op);
    }
    if (dtype == DType::i32 && op == ReduceOp::avg) return all_reduce_i32_average(signature, data, count);
    int mpi_elements = mpi_count(count, signature);
    run_and_wait(signature, "MPI_Iallreduce", [&](MPI_Request* request) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, mpi_elements, element_type(dtype), reduction_op(dtype, op), comm_,
                            request);
    });
    if (op == ReduceOp::avg) finish_average(data, count, dtype, size());
  }

  void run_broadcast(const CollectiveSignature& signature, void* data, int64_t bytes, int root) override {
    WireCount wire = byte_wire(bytes, signature);
    run_and_wait(signature, "MPI_Ibcast",
                 [&](MPI_Request* request) { return MPI_Ibcast(data, wire.count, wire.type, root, comm_, request); });
  }

  void run_barrier(const CollectiveSignature& signature) override {
    run_and_wait(signature, "MPI_Ibarrier", [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
  }

  // Sub-group ranks follow `members`: color = the smallest member (the same on
  // every member), key = the caller's index in the list.
  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, const std::string& name) override {
    // ProcessGroup::split has just run a blocking all-gather of the member
    // lists: every rank arrived (so this cannot hang) and the comm thread is
    // idle (so no other collective is in flight on comm_).
    const int color = *std::min_element(members.begin(), members.end());
    const int key = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    MPI_Comm sub;
    {
      MpiCallGuard guard;
      check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    }
    std::vector<int> sub_world_ranks;
    for (int member : members) sub_world_ranks.push_back(world_ranks()[static_cast<size_t>(member)]);
    return create(sub, name, std::move(sub_world_ranks), local_rank(), local_size(), options());
  }

 private:
  // Starts one nonblocking MPI call and polls it to completion.
  template <typename Start>
  void run_and_wait(const CollectiveSignature& signature, const char* call, Start start) {
    MPI_Request request;
    {
      MpiCallGuard guard;
      check_mpi(start(&request), call);
    }
    wait_for(request, signature);
  }

  // Polls `request` until it completes or options().timeout passes; then the
  // watchdog reports and aborts the job. MPI progresses only inside MPI calls
  // (a large nonblocking reduction advances one step per MPI_Test), so polling
  // spins, then yields the core between tests for as long as a large
  // collective takes, and only a wait longer than that (a slow peer) sleeps
  // between tests so that ranks oversubscribing cores can compute.
  void wait_for(MPI_Request& request, const CollectiveSignature& signature) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    Clock::time_point answered = start;
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      {
        MpiCallGuard guard;
        check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      }
      if (done) return;
      if (polls < 100) continue;
      const Clock::time_point now = Clock::now();
      if (now - answered > std::chrono::milliseconds(1)) {
        answer_roll_calls(signature.sequence);
        answered = now;
      }
      const Clock::duration waited = now - start;
      if (waited > options().timeout) abort_job_on_timeout(signature);
      if (waited < std::chrono::milliseconds(200)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // The roll call: a rank whose collective timed out asks every other member
  // of the group which collective it is waiting in. A member answers while it
  // waits in one of this group's collectives (wait_for), with its sequence
  // number; one that does not answer never joined: it is stalled, dead, or
  // busy outside this group's collectives. Point-to-point messages on comm_
  // never match its collectives, so this runs beside the stuck one.
  static constexpr int kRollCallQuery = 0x7e55;
  static constexpr int kRollCallAnswer = 0x7e56;

  // Answers every roll call that has arrived with `sequence`, the collective this rank waits in.
  void answer_roll_calls(int64_t sequence) {
    for (;;) {
      MpiCallGuard guard;
      int arrived = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kRollCallQuery, comm_, &arrived, &status) != MPI_SUCCESS || !arrived) return;
      int64_t asker_sequence = 0;
      MPI_Recv(&asker_sequence, 1, MPI_INT64_T, status.MPI_SOURCE, kRollCallQuery, comm_, MPI_STATUS_IGNORE);
      MPI_Send(&sequence, 1, MPI_INT64_T, status.MPI_SOURCE, kRollCallAnswer, comm_);  // 8 bytes: sent eagerly
    }
  }

  // Asks every other member and waits up to a quarter of the timeout (0.1 to
  // 2 s) for the answers, answering the others' roll calls meanwhile (their
  // watchdogs fire at about the same time). Returns each member's sequence,
  // or nothing for those that did not answer (this rank's is its own).
  std::vector<std::optional<int64_t>> roll_call(int64_t sequence) {
    using Clock = std::chrono::steady_clock;
    std::vector<std::optional<int64_t>> answers(static_cast<size_t>(size()));
    answers[static_cast<size_t>(rank())] = sequence;
    std::vector<MPI_Request> queries;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank()) continue;
      MpiCallGuard guard;
      MPI_Request query;
      if (MPI_Isend(&sequence, 1, MPI_INT64_T, peer, kRollCallQuery, comm_, &query) == MPI_SUCCESS) {
        queries.push_back(query);
      }
    }
    const Clock::duration grace = std::clamp<Clock::duration>(
        std::chrono::duration_cast<Clock::duration>(options().timeout / 4), std::chrono::milliseconds(100),
        std::chrono::seconds(2));
    const Clock::time_point deadline = Clock::now() + grace;
    int missing = size() - 1;
    while (missing > 0 && Clock::now() < deadline) {
      answer_roll_calls(sequence);
      {
        MpiCallGuard guard;
        int arrived = 0;
        MPI_Status status;
        if (MPI_Iprobe(MPI_ANY_SOURCE, kRollCallAnswer, comm_, &arrived, &status) == MPI_SUCCESS && arrived) {
          int64_t answer = 0;
          MPI_Recv(&answer, 1, MPI_INT64_T, status.MPI_SOURCE, kRollCallAnswer, comm_, MPI_STATUS_IGNORE);
          if (!answers[static_cast<size_t>(status.MPI_SOURCE)]) --missing;
          answers[static_cast<size_t>(status.MPI_SOURCE)] = answer;
          continue;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return answers;  // the queries to silent members stay posted: the job is about to end
  }

  // "rank 1 (world rank 1) never answered (stalled, dead, or outside this
  // group's collectives); rank 3 (world rank 3) waits in #58": every member
  // that is not in collective `sequence` with this one.
  std::string absent_members(const std::vector<std::optional<int64_t>>& answers, int64_t sequence) const {
    std::vector<std::string> silent, elsewhere;
    for (int peer = 0; peer < size(); ++peer) {
      const std::optional<int64_t>& answer = answers[static_cast<size_t>(peer)];
      const std::string who = fmt::format("{} (world rank {})", peer, world_ranks()[static_cast<size_t>(peer)]);
      if (!answer) {
        silent.push_back(who);
      } else if (*answer != sequence) {
        elsewhere.push_back(fmt::format("{} waits in #{}", who, *answer));
      }
    }
    std::string text;
    if (!silent.empty()) {
      text += fmt::format("rank{} {} never answered the roll call (stalled, dead, or outside this group's collectives)",
                          silent.size() == 1 ? "" : "s", fmt::join(silent, ", "));
    }
    if (!elsewhere.empty()) text += fmt::format("{}rank {}", text.empty() ? "" : "; ", fmt::join(elsewhere, ", rank "));
    return text.empty() ? "every member answered from this collective, so it is the transport that stalled" : text;
  }

  // Under MPI a blocked peer cannot be woken: report who never joined (the
  // roll call), then end the whole job.
  [[noreturn]] void abort_job_on_timeout(const CollectiveSignature& signature) {
    const std::string absent = absent_members(roll_call(signature.sequence), signature.sequence);
    std::string message = fmt::format(
        "tessera mpi watchdog: {} on group '{}' did not complete within the {:.3g} s timeout on rank {} of {} (world "
        "rank {}); {}. Aborting the job (MPI_Abort). Timeout: ProcessGroupOptions::timeout or "
        "TESSERA_DIST_TIMEOUT_S.\n",
        signature.to_string(), name(), std::chrono::duration<double>(options().timeout).count(), rank(), size(),
        world_ranks()[static_cast<size_t>(rank())], absent);
    std::fputs(message.c_str(), stderr);
    std::fflush(stderr);
    report_failure_to_launcher(message);
    MPI_Abort(MPI_COMM_WORLD, kWatchdogExitCode);
    std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

  // Deterministic reduce-scatter: every rank receives the N contributions to
  // its own chunk (all-to-all), then adds them in rank order 0..N-1.
  //   in: [N * count] on every rank -> staging: [N][count] (row k from rank k) -> out: [count]
  void reduce_scatter_in_rank_order(const CollectiveSignature& signature, void* out, const void* in, int64_t count,
                                    DType dtype, ReduceOp op) {
    const int64_t element = static_cast<int64_t>(element_size(dtype));
    auto* received = static_cast<std::byte*>(staging(size() * count * element));
    int mpi_elements = mpi_count(count, signature);
    run_and_wait(signature, "MPI_Ialltoall", [&](MPI_Request* request) {
      return MPI_Ialltoall(in, mpi_elements, element_type(dtype), received, mpi_elements, element_type(dtype), comm_,
                           request);
    });
    reduce_rows_in_rank_order(out, received, count, dtype, op);
  }

  // Deterministic all-reduce: a rank-order reduce-scatter over ceil-sized
  // chunks (the last ones short or empty), then an all-gather of the chunks.
  void all_reduce_in_rank_order(const CollectiveSignature& signature, void* data, int64_t count, DType dtype,
                                ReduceOp op) {
    const int n = size();
    const int64_t element = static_cast<int64_t>(element_size(dtype));
    const int64_t chunk = (count + n - 1) / n;
    std::vector<int> counts(static_cast<size_t>(n)), offsets(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) {
      int64_t begin = std::min<int64_t>(k * chunk, count);
      offsets[static_cast<size_t>(k)] = mpi_count(begin, signature);
      counts[static_cast<size_t>(k)] = mpi_count(std::min<int64_t>(chunk, count - begin), signature);
    }
    const int mine = counts[static_cast<size_t>(rank())];
    auto* received = static_cast<std::byte*>(staging(n * static_cast<int64_t>(mine) * element));
    std::vector<int> receive_counts(static_cast<size_t>(n), mine), receive_offsets(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) receive_offsets[static_cast<size_t>(k)] = k * mine;
    const MPI_Datatype type = element_type(dtype);
    run_and_wait(signature, "MPI_Ialltoallv", [&](MPI_Request* request) {
      return MPI_Ialltoallv(data, counts.data(), offsets.data(), type, received, receive_counts.data(),
                            receive_offsets.data(), type, comm_, request);
    });
    std::byte* my_chunk = static_cast<std::byte*>(data) + offsets[static_cast<size_t>(rank())] * element;
    reduce_rows_in_rank_order(my_chunk, received, mine, dtype, op);
    run_and_wait(signature, "MPI_Iallgatherv", [&](MPI_Request* request) {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, type, data, counts.data(), offsets.data(), type, comm_, request);
    });
  }

  // out[i] = op over k = 0..N-1 of rows[k][i], the shared kernel of every backend.
  void reduce_rows_in_rank_order(void* out, const std::byte* rows, int64_t count, DType dtype, ReduceOp op) {
    const int64_t row_bytes = count * static_cast<int64_t>(element_size(dtype));
    std::vector<const void*> inputs(static_cast<size_t>(size()));
    for (int k = 0; k < size(); ++k) inputs[static_cast<size_t>(k)] = rows + k * row_bytes;
    reduce_in_order(out, inputs, count, dtype, op, size());
  }

  // i32 AVG sums in i64 (the ReduceOp contract), so a mean of large values
  // cannot overflow on the way: widen, reduce as i64, divide once, narrow.
  void all_reduce_i32_average(const CollectiveSignature& signature, void* data, int64_t count) {
    auto* wide = static_cast<int64_t*>(staging(count * 8));
    auto* values = static_cast<int32_t*>(data);
    std::copy(values, values + count, wide);
    int mpi_elements = mpi_count(count, signature);
    run_and_wait(signature, "MPI_Iallreduce", [&](MPI_Request* request) {
      return MPI_Iallreduce(MPI_IN_PLACE, wide, mpi_elements, MPI_INT64_T, MPI_SUM, comm_, request);
    });
    finish_average(wide, count, DType::i64, size());
    std::copy(wide, wide + count, values);
  }

  void reduce_scatter_i32_average(const CollectiveSignature& signature, void* out, const void* in, int64_t count) {
    const int64_t total = size() * count;
    auto* wide = static_cast<int64_t*>(staging((total + count) * 8));  // [N * count] inputs, then [count] result
    const auto* values = static_cast<const int32_t*>(in);
    std::copy(values, values + total, wide);
    int mpi_elements = mpi_count(count, signature);
    run_and_wait(signature, "MPI_Ireduce_scatter_block", [&](MPI_Request* request) {
      return MPI_Ireduce_scatter_block(wide, wide + total, mpi_elements, MPI_INT64_T, MPI_SUM, comm_, request);
    });
    finish_average(wide + total, count, DType::i64, size());
    std::copy(wide + total, wide + total + count, static_cast<int32_t*>(out));
  }

  // Scratch for the collectives that need it (deterministic all-to-all rows,
  // in-place reduce-scatter, widened i32 averages); comm thread only, grows
  // to the largest request and stays.
  void* staging(int64_t bytes) {
    const size_t words = static_cast<size_t>((bytes + 7) / 8);
    if (staging_.size() < words) staging_.resize(words);
    return staging_.data();
  }

  static constexpr int kWatchdogExitCode = 124;  // the exit status of timeout(1)

  MPI_Comm comm_;
  std::vector<int64_t> staging_;  // int64_t elements keep every dtype aligned
};

}  // namespace

bool mpi_backend_built() { return true; }

ProcessGroupPtr init_mpi_world(const ProcessGroupOptions& options) {
  MpiRuntime& mpi = runtime();
  {
    std::lock_guard lock(mpi.init_mutex);
    if (!mpi.started) start_mpi(mpi);
  }
  // Each world group gets its own communicator: groups run collectives on
  // their own threads, and MPI orders collectives per communicator.
  MPI_Comm comm;
  int size = 0;
  int local_rank = 0;
  int local_size = 0;
  {
    MpiCallGuard guard;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
    MPI_Comm_size(comm, &size);
    MPI_Comm node;  // the ranks on this machine
    check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
  }
  std::vector<int> world_ranks(static_cast<size_t>(size));
  std::iota(world_ranks.begin(), world_ranks.end(), 0);
  return MpiProcessGroup::create(comm, "world", std::move(world_ranks), local_rank, local_size, options);
}

void finalize_mpi() {
  MpiRuntime& mpi = runtime();
  std::lock_guard lock(mpi.init_mutex);
  if (!mpi.started) return;
  for (MPI_Op& op : mpi.user_ops) MPI_Op_free(&op);
  mpi.started = false;
  // An MPI the application started stays up for it (and for a later init).
  if (mpi.owns_mpi) MPI_Finalize();
}

}  // namespace tessera::dist

#else  // no MPI in this build

namespace tessera::dist {

bool mpi_backend_built() { return false; }

ProcessGroupPtr init_mpi_world(const ProcessGroupOptions&) {
  fail(
      "init_mpi_world: this build of tessera has no MPI backend; install OpenMPI (libopenmpi-dev) and configure "
      "with -Dmpi=enabled");
}

void finalize_mpi() {}

}  // namespace tessera::dist

#endif
