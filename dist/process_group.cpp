// The backend-independent half of every process group: argument checks,
// sequence numbers, the communication thread, debug-mode signature checks,
// accounting and tracing. Backends only implement the run_* transport.
#include "dist/process_group.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include "dist/errors.h"
#include "dist/launch/fault_injection.h"
#include "dist/trace.h"
#include "tensor/ops.h"

namespace tessera::dist {

namespace {

bool environment_flag(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return false;
  const std::string text(value);
  if (text == "1" || text == "true" || text == "on") return true;
  if (text.empty() || text == "0" || text == "false" || text == "off") return false;
  fail("{}: expected 0/1, true/false or on/off, got '{}'", name, text);
}

// The value of "DIGITS" or "DIGITS.DIGITS", nothing else: no sign, space,
// exponent, hexadecimal, inf or nan, which strtod would take.
std::optional<double> plain_decimal(std::string_view text) {
  const size_t point = text.find('.');
  const std::string_view whole = text.substr(0, point);
  const std::string_view fraction = point == std::string_view::npos ? std::string_view("0") : text.substr(point + 1);
  const auto all_digits = [](std::string_view part) {
    return !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!all_digits(whole) || !all_digits(fraction)) return std::nullopt;
  double value = 0.0;
  std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::fixed);  // as the C locale reads it
  return value;
}

bool is_communicable(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::f64:
    case DType::bf16:
    case DType::f16:
    case DType::i32:
    case DType::i64:
    case DType::u8:
    case DType::f8e4m3:
    case DType::f8e5m2: return true;
    case DType::boolean: return false;
  }
  return false;
}

// A buffer a collective may read or write: materialised, contiguous, of a
// dtype the wire carries. The host transports move host memory; a group of
// one rank moves nothing, so it takes device tensors too (see
// run_on_one_device), and so does a backend with device collectives.
void check_buffer(std::string_view collective, const char* role, const Tensor& tensor, int size,
                  bool device_collectives) {
  TESSERA_CHECK(tensor.defined(), "{}: {} is an undefined tensor", collective, role);
  TESSERA_CHECK(tensor.device().is_cpu() || (tensor.device().is_cuda() && (size == 1 || device_collectives)),
                "{}: {} is on {}; collectives across {} ranks of this backend carry materialised CPU tensors (cuda "
                "tensors across ranks need device collectives: the local backend's on the simulator, or NCCL; a "
                "group of one rank takes them)",
                collective, role, tensor.device().str(), size);
  TESSERA_CHECK(tensor.is_contiguous(), "{}: {} {} is not contiguous (strides {}); pass a contiguous buffer",
                collective, role, tensor.sizes(), tensor.strides());
  TESSERA_CHECK(is_communicable(tensor.dtype()),
                "{}: {} has dtype {}; collectives carry f32, f64, bf16, f16, f8e4m3, f8e5m2, i32, i64 and u8",
                collective, role, dtype_name(tensor.dtype()));
}

// A reduction's buffer: of a dtype that can be summed. Checked before the
// collective is issued, so that every rank refuses it alike (refused midway,
// on the rank that reduces, it would leave the others waiting).
void check_reducible(std::string_view collective, const Tensor& tensor) {
  TESSERA_CHECK(element_size(tensor.dtype()) > 1,
                "{}: cannot reduce dtype {} (8-bit values are gathered, broadcast and sent, not summed: their sums "
                "would not fit them)", collective, dtype_name(tensor.dtype()));
}

const char* byte_address(const Tensor& tensor) {
  return static_cast<const char*>(tensor.device().is_cpu() ? tensor.raw_data() : tensor.cuda_data());
}

// `chunk` may be exactly the rank's own chunk of `whole` (the in-place form);
// any other overlap would read bytes while they are being written.
void check_overlap(std::string_view collective, const Tensor& whole, const Tensor& chunk, int rank) {
  if (whole.nbytes() == 0 || chunk.nbytes() == 0) return;
  const char* whole_begin = byte_address(whole);
  const char* chunk_begin = byte_address(chunk);
  const bool overlaps = chunk_begin < whole_begin + whole.nbytes() && whole_begin < chunk_begin + chunk.nbytes();
  if (!overlaps) return;
  TESSERA_CHECK(chunk_begin == whole_begin + rank * chunk.nbytes(),
                "{}: in and out overlap, but the smaller buffer is not rank {}'s chunk of the larger one "
                "(the only in-place form allowed)",
                collective, rank);
}

// The flat collectives pair a whole buffer with one rank's chunk of it:
// all-gather fills the whole (out) from chunks (in), reduce-scatter the reverse.
void check_whole_and_chunk(std::string_view collective, const Tensor& out, const Tensor& in, bool out_is_whole,
                           int size, int rank, bool device_collectives) {
  check_buffer(collective, "out", out, size, device_collectives);
  check_buffer(collective, "in", in, size, device_collectives);
  TESSERA_CHECK(out.device() == in.device(), "{}: out is on {} but in on {}", collective, out.device().str(),
                in.device().str());
  TESSERA_CHECK(out.dtype() == in.dtype(), "{}: out is {} but in is {}", collective, dtype_name(out.dtype()),
                dtype_name(in.dtype()));
  const Tensor& whole = out_is_whole ? out : in;
  const Tensor& chunk = out_is_whole ? in : out;
  const char* whole_role = out_is_whole ? "out" : "in";
  const char* chunk_role = out_is_whole ? "in" : "out";
  TESSERA_CHECK(whole.numel() == chunk.numel() * size,
                "{}: {} must hold {} ranks x {} elements = {}, got {} elements ({} {}, {} {})", collective, whole_role,
                size, chunk.numel(), chunk.numel() * size, whole.numel(), whole_role, whole.sizes(), chunk_role,
                chunk.sizes());
  check_overlap(collective, whole, chunk, rank);
}

std::shared_ptr<void> keep(std::vector<Tensor> tensors) {
  return std::make_shared<std::vector<Tensor>>(std::move(tensors));
}

// Signatures travel as int64 words: sequence, kind, dtype, op, root, then
// each shape as its rank followed by its dims.
std::vector<int64_t> encode(const CollectiveSignature& signature) {
  std::vector<int64_t> words = {signature.sequence, static_cast<int64_t>(signature.kind),
                                static_cast<int64_t>(signature.dtype), static_cast<int64_t>(signature.op),
                                signature.root};
  for (const Shape* shape : {&signature.in_shape, &signature.out_shape}) {
    words.push_back(static_cast<int64_t>(shape->size()));
    words.insert(words.end(), shape->begin(), shape->end());
  }
  return words;
}

CollectiveSignature decode(const std::vector<uint8_t>& bytes) {
  std::vector<int64_t> words(bytes.size() / sizeof(int64_t));
  std::memcpy(words.data(), bytes.data(), words.size() * sizeof(int64_t));
  CollectiveSignature signature;
  size_t next = 0;
  auto word = [&]() -> int64_t { return next < words.size() ? words[next++] : 0; };
  signature.sequence = word();
  signature.kind = static_cast<CollectiveKind>(word());
  signature.dtype = static_cast<DType>(word());
  signature.op = static_cast<ReduceOp>(word());
  signature.root = static_cast<int>(word());
  for (Shape* shape : {&signature.in_shape, &signature.out_shape}) {
    const int64_t ndim = std::clamp<int64_t>(word(), 0, static_cast<int64_t>(words.size()));
    for (int64_t d = 0; d < ndim; ++d) shape->push_back(word());
  }
  return signature;
}

std::vector<uint8_t> to_bytes(const std::vector<int64_t>& words) {
  std::vector<uint8_t> bytes(words.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

}  // namespace

ProcessGroupOptions ProcessGroupOptions::from_environment() {
  ProcessGroupOptions options;
  if (const char* timeout = std::getenv("TESSERA_DIST_TIMEOUT_S")) {
    const std::optional<double> seconds = plain_decimal(timeout);
    // The bound keeps the milliseconds (and every deadline computed from them) far from overflow.
    TESSERA_CHECK(seconds && *seconds >= kMinTimeoutSeconds && *seconds <= kMaxTimeoutSeconds,
                  "TESSERA_DIST_TIMEOUT_S: expected seconds in [{:g}, {:g}] (a week), got '{}'; write a plain "
                  "decimal number such as 30 or 0.5",
                  kMinTimeoutSeconds, kMaxTimeoutSeconds, timeout);
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000.0 + 0.5));
  }
  options.deterministic = environment_flag("TESSERA_DIST_DETERMINISTIC");
  options.check_collectives = environment_flag("TESSERA_DIST_DEBUG");
  return options;
}

std::string CollectiveSignature::to_string() const {
  std::string arguments;
  switch (kind) {
    case CollectiveKind::barrier: break;
    case CollectiveKind::broadcast:
      arguments = fmt::format("{}, root {}, {}", dtype_name(dtype), root, in_shape);
      break;
    case CollectiveKind::all_reduce:
      arguments = fmt::format("{}, {}, {}", dtype_name(dtype), reduce_op_name(op), in_shape);
      break;
    case CollectiveKind::reduce_scatter:
      arguments = fmt::format("{}, {}, in {}, out {}", dtype_name(dtype), reduce_op_name(op), in_shape, out_shape);
      break;
    case CollectiveKind::all_gather:
    case CollectiveKind::all_gather_bytes:
      arguments = fmt::format("{}, in {}, out {}", dtype_name(dtype), in_shape, out_shape);
      break;
  }
  return fmt::format("#{} {}({})", sequence, collective_name(kind), arguments);
}

ProcessGroup::ProcessGroup(int rank, int size, std::string name, std::vector<int> world_ranks, int local_rank,
                           int local_size, ProcessGroupOptions options)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      world_ranks_(std::move(world_ranks)),
      local_rank_(local_rank),
      local_size_(local_size),
      options_(options) {
  TESSERA_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "ProcessGroup '{}': rank {} is outside [0, {})", name_,
                rank_, size_);
  TESSERA_CHECK(static_cast<int>(world_ranks_.size()) == size_, "ProcessGroup '{}': {} world ranks for {} members",
                name_, world_ranks_.size(), size_);
}

ProcessGroup::~ProcessGroup() { stop_communication(); }

void ProcessGroup::stop_communication() {
  std::shared_ptr<Stream> stream;
  std::map<int, std::shared_ptr<Stream>> device_streams;
  {
    std::lock_guard lock(stream_mutex_);
    stream = std::move(comm_stream_);
    device_streams = std::move(device_streams_);
  }
  stream.reset();  // runs what is queued, then joins the thread
  for (auto& [index, device_stream] : device_streams) {
    try {
      device_stream->synchronize();
    } catch (const std::exception&) {
      // Reported to the collective's Work and the next collective; the group is going.
    }
  }
}

std::shared_ptr<Work::State> ProcessGroup::number_collective(CollectiveSignature& signature) {
  signature.sequence = next_sequence_++;
  auto state = std::make_shared<Work::State>();
  state->description = fmt::format("{} #{} on group '{}'", collective_name(signature.kind), signature.sequence, name_);
  if (const std::optional<Fault> fault = fault_at(FaultPoint::collective, world_ranks_[rank_])) {
    carry_out(*fault, fmt::format("world rank {}'s {}", world_ranks_[rank_], state->description),
              backend_name() != "local");
  }
  return state;
}

Work ProcessGroup::issue(CollectiveSignature signature, std::shared_ptr<void> keep_alive, int64_t bytes,
                         bool async_op, std::function<void(const CollectiveSignature&)> run) {
  std::shared_ptr<Work::State> state = number_collective(signature);
  state->keep_alive = std::move(keep_alive);

  std::shared_ptr<Stream> stream;
  {
    std::lock_guard lock(stream_mutex_);
    if (!comm_stream_) comm_stream_ = Stream::create(kCPU);
    stream = comm_stream_;
  }
  stream->enqueue([this, signature, bytes, state, run = std::move(run)] {
    const int64_t start_us = Tracer::now_us();
    std::exception_ptr error;
    try {
      if (options_.check_collectives) check_signatures(signature);
      run(signature);
    } catch (...) {
      error = std::current_exception();
    }
    const int64_t end_us = Tracer::now_us();
    if (!error) account(signature, bytes, start_us, end_us);
    state->complete(error);
  });

  Work work(state);
  if (!async_op) work.wait();
  return work;
}

void ProcessGroup::account(const CollectiveSignature& signature, int64_t bytes, int64_t start_us, int64_t end_us) {
  const int root_rank = signature.kind == CollectiveKind::broadcast ? signature.root : -1;
  const CommVolume volume = collective_volume(signature.kind, bytes, size_, rank_ == root_rank);
  std::shared_ptr<Tracer> tracer;
  {
    std::lock_guard lock(stats_mutex_);
    CollectiveStats& kind_stats = stats_[signature.kind];
    ++kind_stats.calls;
    kind_stats.bytes_sent += volume.sent;
    kind_stats.bytes_received += volume.received;
    kind_stats.seconds += static_cast<double>(end_us - start_us) * 1e-6;
    tracer = tracer_;
  }
  if (!tracer) return;
  TraceEvent event;
  event.rank = world_ranks_[static_cast<size_t>(rank_)];
  event.track = "comm:" + name_;
  event.name = std::string(collective_name(signature.kind));
  event.category = "collective";
  event.start_us = start_us;
  event.duration_us = end_us - start_us;
  event.args = {{"sequence", signature.sequence},  {"group", name_},
                {"bytes", bytes},                  {"bytes_sent", volume.sent},
                {"bytes_received", volume.received}, {"dtype", std::string(dtype_name(signature.dtype))}};
  tracer->record(std::move(event));
}

std::vector<std::vector<uint8_t>> ProcessGroup::exchange_bytes(const CollectiveSignature& signature,
                                                               std::span<const uint8_t> bytes) {
  // Step 1: every rank's length. Step 2: every rank's bytes, padded to the
  // longest (in whole int64 words, so the step is an ordinary all-gather).
  std::vector<int64_t> lengths(static_cast<size_t>(size_));
  const int64_t my_length = static_cast<int64_t>(bytes.size());
  run_all_gather(signature, lengths.data(), &my_length, sizeof(int64_t));
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const int64_t padded = (longest + 7) / 8 * 8;
  std::vector<uint8_t> mine(static_cast<size_t>(padded), 0);
  std::copy(bytes.begin(), bytes.end(), mine.begin());
  std::vector<uint8_t> gathered(static_cast<size_t>(padded * size_));
  run_all_gather(signature, gathered.data(), mine.data(), padded);
  std::vector<std::vector<uint8_t>> result(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const auto begin = gathered.begin() + r * padded;
    result[static_cast<size_t>(r)].assign(begin, begin + lengths[static_cast<size_t>(r)]);
  }
  return result;
}

void ProcessGroup::check_signatures(const CollectiveSignature& mine) {
  const std::vector<uint8_t> encoded = to_bytes(encode(mine));
  CollectiveSignature exchange;
  exchange.sequence = mine.sequence;
  exchange.kind = CollectiveKind::all_gather_bytes;
  exchange.dtype = DType::i64;
  const auto all = exchange_bytes(exchange, encoded);
  const CollectiveSignature reference = decode(all[0]);
  for (int r = 1; r < size_; ++r) {
    const CollectiveSignature other = decode(all[static_cast<size_t>(r)]);
    if (other == reference) continue;
    throw CollectiveMismatch(fmt::format(
        "collective mismatch on group '{}' (debug mode): rank 0 issued {} but rank {} issued {}; "
        "every rank must issue the same collectives in the same order with the same shapes, dtypes and ops",
        name_, reference.to_string(), r, other.to_string()));
  }
}

bool ProcessGroup::uses_device_collectives() const { return size_ > 1 || one_rank_uses_device_collectives(); }

Work ProcessGroup::run_on_one_device(CollectiveSignature signature, int64_t bytes, const Tensor& out,
                                     const Tensor& in) {
  signature.sequence = next_sequence_++;
  const int64_t start_us = Tracer::now_us();
  if (out.defined() && byte_address(out) != byte_address(in)) {
    Tensor destination = out;
    ops::copy_(destination, in);
  }
  account(signature, bytes, start_us, Tracer::now_us());
  return Work();
}

void ProcessGroup::enqueue_device_collective(const CollectiveSignature& signature, const Tensor&, const Tensor&,
                                             const std::shared_ptr<Stream>&, DeviceFinished) {
  fail("{} on group '{}': the {} backend has no device collectives", signature.to_string(), name_, backend_name());
}

Work ProcessGroup::issue_on_device(CollectiveSignature signature, int64_t bytes, const Tensor& out, const Tensor& in,
                                   bool async_op) {
  std::shared_ptr<Work::State> state = number_collective(signature);
  const Device device = in.device();
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard lock(stream_mutex_);
    if (device_error_) std::rethrow_exception(device_error_);
    std::shared_ptr<Stream>& made = device_streams_[device.index];
    if (!made) made = Stream::create(device);
    stream = made;
  }
  // The group's stream starts the collective once the caller's current
  // stream has produced its input, as ProcessGroupNCCL's internal stream does.
  if (dropped_ordering_ != DeviceOrdering::input_written) {
    Event ready;
    ready.record(*current_stream(device));
    stream->wait_event(ready);
  }
  // Without the output's ordering the caller waits for the point before it.
  Event before;
  if (dropped_ordering_ == DeviceOrdering::output_written) before.record(*stream);
  const int64_t start_us = Tracer::now_us();
  enqueue_device_collective(signature, out, in, stream, [this, state](std::exception_ptr error) {
    {
      std::lock_guard lock(stream_mutex_);
      if (!device_error_) device_error_ = error;
    }
    state->complete(error);
  });
  // Its buffers are not reused until the group's stream has passed them.
  record_stream(*out.storage(), stream);
  if (in.storage() != out.storage()) record_stream(*in.storage(), stream);
  state->device = device;
  if (batching_) {
    // Launched only at the batch's end: its event comes then (coalesce).
    batched_.push_back(state);
    batch_stream_ = stream;
  } else if (dropped_ordering_ == DeviceOrdering::output_written) {
    state->device_done = before;
  } else {
    Event done;
    done.record(*stream);
    state->device_done = done;
  }
  // Calls and bytes as for host collectives; the time is the host's to issue
  // it (the collective's own runs on the device, after).
  account(signature, bytes, start_us, Tracer::now_us());
  Work work(state);
  if (!async_op) work.wait();
  return work;
}

void ProcessGroup::drop_device_ordering_for_testing(DeviceOrdering ordering) { dropped_ordering_ = ordering; }

Work ProcessGroup::all_gather_into(const Tensor& out, const Tensor& in, bool async_op) {
  check_whole_and_chunk("all_gather_into", out, in, /*out_is_whole=*/true, size_, rank_, moves_device_tensors());
  const CollectiveSignature signature{
      .kind = CollectiveKind::all_gather, .dtype = in.dtype(), .in_shape = in.sizes(), .out_shape = out.sizes()};
  const int64_t bytes = in.nbytes();
  if (!out.device().is_cpu() && uses_device_collectives()) {
    return issue_on_device(signature, bytes, out, in, async_op);
  }
  if (!out.device().is_cpu()) return run_on_one_device(signature, bytes, ops::view(out, in.sizes()), in);
  void* out_data = out.raw_data();
  const void* in_data = in.raw_data();
  return issue(signature, keep({out, in}), bytes, async_op,
               [this, out_data, in_data, bytes](const CollectiveSignature& numbered) {
                 run_all_gather(numbered, out_data, in_data, bytes);
               });
}

Work ProcessGroup::reduce_scatter_into(const Tensor& out, const Tensor& in, ReduceOp op, bool async_op) {
  check_whole_and_chunk("reduce_scatter_into", out, in, /*out_is_whole=*/false, size_, rank_,
                        moves_device_tensors());
  check_reducible("reduce_scatter_into", in);
  const CollectiveSignature signature{.kind = CollectiveKind::reduce_scatter,
                                      .dtype = in.dtype(),
                                      .op = op,
                                      .in_shape = in.sizes(),
                                      .out_shape = out.sizes()};
  if (!out.device().is_cpu() && uses_device_collectives()) {
    return issue_on_device(signature, out.nbytes(), out, in, async_op);
  }
  if (!out.device().is_cpu()) return run_on_one_device(signature, out.nbytes(), out, ops::view(in, out.sizes()));
  const int64_t count = out.numel();
  const DType dtype = out.dtype();
  void* out_data = out.raw_data();
  const void* in_data = in.raw_data();
  return issue(signature, keep({out, in}), out.nbytes(), async_op,
               [this, out_data, in_data, count, dtype, op](const CollectiveSignature& numbered) {
                 run_reduce_scatter(numbered, out_data, in_data, count, dtype, op);
               });
}

Work ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op, bool async_op) {
  constexpr std::string_view name = "all_reduce";
  check_buffer(name, "tensor", tensor, size_, moves_device_tensors());
  check_reducible(name, tensor);
  const CollectiveSignature signature{.kind = CollectiveKind::all_reduce,
                                      .dtype = tensor.dtype(),
                                      .op = op,
                                      .in_shape = tensor.sizes(),
                                      .out_shape = tensor.sizes()};
  if (!tensor.device().is_cpu() && uses_device_collectives()) {
    return issue_on_device(signature, tensor.nbytes(), tensor, tensor, async_op);
  }
  if (!tensor.device().is_cpu()) return run_on_one_device(signature, tensor.nbytes(), Tensor(), tensor);
  const int64_t count = tensor.numel();
  const DType dtype = tensor.dtype();
  void* data = tensor.raw_data();
  return issue(signature, keep({tensor}), tensor.nbytes(), async_op,
               [this, data, count, dtype, op](const CollectiveSignature& numbered) {
                 run_all_reduce(numbered, data, count, dtype, op);
               });
}

Work ProcessGroup::broadcast(const Tensor& tensor, int root, bool async_op) {
  constexpr std::string_view name = "broadcast";
  check_buffer(name, "tensor", tensor, size_, moves_device_tensors());
  TESSERA_CHECK(root >= 0 && root < size_, "{}: root {} is not a rank of group '{}' (size {})", name, root, name_,
                size_);
  const CollectiveSignature signature{.kind = CollectiveKind::broadcast,
                                      .dtype = tensor.dtype(),
                                      .root = root,
                                      .in_shape = tensor.sizes(),
                                      .out_shape = tensor.sizes()};
  if (!tensor.device().is_cpu() && uses_device_collectives()) {
    return issue_on_device(signature, tensor.nbytes(), tensor, tensor, async_op);
  }
  if (!tensor.device().is_cpu()) return run_on_one_device(signature, tensor.nbytes(), Tensor(), tensor);
  const int64_t bytes = tensor.nbytes();
  void* data = tensor.raw_data();
  return issue(signature, keep({tensor}), bytes, async_op,
               [this, data, bytes, root](const CollectiveSignature& numbered) {
                 run_broadcast(numbered, data, bytes, root);
               });
}

Work ProcessGroup::barrier(bool async_op) {
  CollectiveSignature signature;
  signature.kind = CollectiveKind::barrier;
  return issue(signature, nullptr, 0, async_op,
               [this](const CollectiveSignature& numbered) { run_barrier(numbered); });
}

Work ProcessGroup::coalesce(std::string_view name, size_t count, const std::vector<Tensor>& tensors, bool async_op,
                           const std::function<Work(size_t)>& issue_one) {
  TESSERA_CHECK(count > 0, "{}: no tensors to issue", name);
  const Device device = tensors.front().device();
  for (const Tensor& tensor : tensors) {
    TESSERA_CHECK(tensor.device() == device, "{}: every tensor must be on one device, got {} and {}", name,
                  device.str(), tensor.device().str());
  }
  const bool batched = !device.is_cpu() && uses_device_collectives();
  TESSERA_CHECK(!batching_, "{}: issued inside another coalesced call", name);
  std::vector<Work> parts;
  if (batched) {
    batching_ = true;
    begin_device_batch();
  }
  try {
    for (size_t index = 0; index < count; ++index) parts.push_back(issue_one(index));
  } catch (...) {
    // Only a failure of the backend gets here (the calls were checked):
    // close the batch so that the group stays usable for the error path.
    if (batched) {
      batching_ = false;
      batched_.clear();
    }
    throw;
  }
  if (batched) {
    end_device_batch(batch_stream_);
    Event done;
    done.record(*batch_stream_);
    for (const std::shared_ptr<Work::State>& state : batched_) state->device_done = done;
    batched_.clear();
    batching_ = false;
  }
  Work work = Work::all_of(std::move(parts));
  if (!async_op) work.wait();
  return work;
}

Work ProcessGroup::coalesce_pairs(std::string_view name, const std::vector<Tensor>& outs,
                                 const std::vector<Tensor>& ins, bool out_is_whole, bool async_op,
                                 const std::function<Work(const Tensor& out, const Tensor& in)>& issue_pair) {
  TESSERA_CHECK(outs.size() == ins.size(), "{}: {} outputs for {} inputs", name, outs.size(), ins.size());
  for (size_t index = 0; index < outs.size(); ++index) {
    check_whole_and_chunk(fmt::format("{} (collective {})", name, index), outs[index], ins[index], out_is_whole,
                          size_, rank_, moves_device_tensors());
    if (!out_is_whole) check_reducible(fmt::format("{} (collective {})", name, index), ins[index]);
  }
  std::vector<Tensor> tensors = outs;
  tensors.insert(tensors.end(), ins.begin(), ins.end());
  return coalesce(name, outs.size(), tensors, async_op,
                  [&](size_t index) { return issue_pair(outs[index], ins[index]); });
}

Work ProcessGroup::all_gather_into_coalesced(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                                             bool async_op) {
  return coalesce_pairs("all_gather_into_coalesced", outs, ins, /*out_is_whole=*/true, async_op,
                        [this](const Tensor& out, const Tensor& in) {
                          return all_gather_into(out, in, /*async_op=*/true);
                        });
}

Work ProcessGroup::reduce_scatter_into_coalesced(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                                                 ReduceOp op, bool async_op) {
  return coalesce_pairs("reduce_scatter_into_coalesced", outs, ins, /*out_is_whole=*/false, async_op,
                        [this, op](const Tensor& out, const Tensor& in) {
                          return reduce_scatter_into(out, in, op, /*async_op=*/true);
                        });
}

Work ProcessGroup::all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op, bool async_op) {
  constexpr std::string_view name = "all_reduce_coalesced";
  for (size_t index = 0; index < tensors.size(); ++index) {
    check_buffer(fmt::format("{} (collective {})", name, index), "tensor", tensors[index], size_,
                 moves_device_tensors());
    check_reducible(fmt::format("{} (collective {})", name, index), tensors[index]);
  }
  return coalesce(name, tensors.size(), tensors, async_op,
                  [&](size_t index) { return all_reduce(tensors[index], op, /*async_op=*/true); });
}

std::vector<std::vector<uint8_t>> ProcessGroup::all_gather_bytes(std::span<const uint8_t> bytes) {
  // The signature holds no length: lengths may differ between ranks.
  CollectiveSignature signature;
  signature.kind = CollectiveKind::all_gather_bytes;
  signature.dtype = DType::i64;
  std::vector<std::vector<uint8_t>> result;
  const std::vector<uint8_t> mine(bytes.begin(), bytes.end());
  issue(signature, nullptr, static_cast<int64_t>(bytes.size()), false,
        [this, &mine, &result](const CollectiveSignature& numbered) { result = exchange_bytes(numbered, mine); });
  return result;
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(const std::vector<int>& members, const std::string& name) {
  TESSERA_CHECK(!members.empty(), "split '{}': the member list is empty", name);
  std::set<int> distinct;
  for (int member : members) {
    TESSERA_CHECK(member >= 0 && member < size_, "split '{}': member {} is not a rank of group '{}' (size {})", name,
                  member, name_, size_);
    TESSERA_CHECK(distinct.insert(member).second, "split '{}': member {} is listed twice in {}", name, member,
                  members);
  }
  TESSERA_CHECK(distinct.count(rank_) == 1, "split '{}': rank {} calls split but is not among its members {}", name,
                rank_, members);
  // The lists must partition the group: for every pair of ranks (r, s), s is
  // on r's list exactly when their lists are equal. Every rank checks every
  // pair of the same gathered lists, so all reach the same verdict and none
  // goes on to wait for a sub-group that never forms.
  std::vector<int64_t> words(members.begin(), members.end());
  const auto all = all_gather_bytes(to_bytes(words));
  std::vector<std::vector<int>> lists(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const auto& bytes = all[static_cast<size_t>(r)];
    for (size_t offset = 0; offset + sizeof(int64_t) <= bytes.size(); offset += sizeof(int64_t)) {
      int64_t word;
      std::memcpy(&word, bytes.data() + offset, sizeof word);
      lists[static_cast<size_t>(r)].push_back(static_cast<int>(word));
    }
  }
  for (int r = 0; r < size_; ++r) {
    const auto& list = lists[static_cast<size_t>(r)];
    for (int s = 0; s < size_; ++s) {
      const bool listed = std::find(list.begin(), list.end(), s) != list.end();
      const bool same_list = lists[static_cast<size_t>(s)] == list;
      TESSERA_CHECK(listed == same_list,
                    "split '{}': member lists do not partition group '{}': rank {} passed {} but rank {} passed {}",
                    name, name_, r, list, s, lists[static_cast<size_t>(s)]);
    }
  }
  return make_subgroup(members, name);
}

void ProcessGroup::synchronize() {
  std::shared_ptr<Stream> stream;
  std::vector<std::shared_ptr<Stream>> device_streams;
  {
    std::lock_guard lock(stream_mutex_);
    stream = comm_stream_;
    for (const auto& [index, device_stream] : device_streams_) device_streams.push_back(device_stream);
  }
  if (stream) stream->synchronize();
  for (const std::shared_ptr<Stream>& device_stream : device_streams) device_stream->synchronize();
  std::lock_guard lock(stream_mutex_);
  if (device_error_) std::rethrow_exception(device_error_);
}

CommStats ProcessGroup::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void ProcessGroup::reset_stats() {
  std::lock_guard lock(stats_mutex_);
  stats_ = CommStats{};
}

void ProcessGroup::set_tracer(std::shared_ptr<Tracer> tracer) {
  std::lock_guard lock(stats_mutex_);
  tracer_ = std::move(tracer);
}

std::shared_ptr<Tracer> ProcessGroup::tracer() const {
  std::lock_guard lock(stats_mutex_);
  return tracer_;
}

}  // namespace tessera::dist
