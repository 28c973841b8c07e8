// fsdp::FSDPParamGroup: copy-in, all-gather, copy-out; reshard; gradient
// copy-in, reduce-scatter, accumulation into the sharded gradients.
#include "fsdp/param_group.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "dist/reduction.h"
#include "tensor/host_staging.h"
#include "tensor/ops.h"

namespace tessera::fsdp {

namespace {

// The layout of the parameters `which` (indices into `params`), in that order.
FlatLayout make_layout(const std::vector<std::unique_ptr<FSDPParam>>& params, const std::vector<size_t>& which,
                       int world) {
  FlatLayout layout;
  layout.world = world;
  for (const size_t index : which) {
    const FSDPParam& param = *params[index];
    const int64_t chunk_rows = padded_shard_rows(param.rows(), world);
    layout.chunk_rows.push_back(chunk_rows);
    layout.offsets.push_back(layout.slot_numel);
    layout.slot_numel += chunk_rows * param.row_numel();
  }
  return layout;
}

std::vector<size_t> every_index(size_t count) {
  std::vector<size_t> indices(count);
  for (size_t index = 0; index < count; ++index) indices[index] = index;
  return indices;
}

// Rows [0, rows) of a chunk inside a flat buffer, shaped like the parameter.
Tensor chunk_view(const Tensor& flat, int64_t offset, int64_t rows, const FSDPParam& param) {
  Shape shape = param.global_shape();
  shape[0] = rows;
  return ops::view(ops::narrow(flat, 0, offset, rows * param.row_numel()), shape);
}

// The group's copies are segments of one ops::copy_segments call per step
// (copy-in, copy-out, gradient copy-in, gradient casts): on a GPU one launch
// for the whole group instead of one or two per parameter and rank.

// Appends dst <- src. A strided source (autograd may hand one) is copied at
// once on its own: copy_segments takes dense ones.
void add_copy(std::vector<CopySegment>& segments, Tensor dst, const Tensor& src) {
  if (src.is_contiguous()) {
    segments.push_back({std::move(dst), src});
  } else {
    ops::copy_(dst, src);
  }
}

// Appends elements [begin, begin + length) of the 1-D `flat` <- value; a
// fill that continues the previous segment's (the next elements of `flat`,
// the same value) extends it instead, as the presence flags of a slot do.
void add_fill(std::vector<CopySegment>& segments, const Tensor& flat, int64_t begin, int64_t length, double value) {
  if (length == 0) return;
  if (!segments.empty()) {
    CopySegment& last = segments.back();
    const int64_t last_begin = last.dst.storage_offset() - flat.storage_offset();
    if (!last.src.defined() && last.value == value && last.dst.storage() == flat.storage() &&
        last.dst.dtype() == flat.dtype() && last.dst.dim() == 1 && last_begin >= 0 &&
        last_begin + last.dst.numel() == begin) {
      last.dst = ops::narrow(flat, 0, last_begin, last.dst.numel() + length);
      return;
    }
  }
  segments.push_back({ops::narrow(flat, 0, begin, length), Tensor(), value});
}

// Segments that copy `source_rows` into the first rows of a chunk of
// `chunk_rows` rows at `offset` of `flat` and zero the rest of the chunk (all
// of it when `source_rows` is undefined).
void add_rows_into_chunk(std::vector<CopySegment>& segments, const Tensor& flat, int64_t offset, int64_t chunk_rows,
                         const Tensor& source_rows, const FSDPParam& param) {
  const int64_t rows = source_rows.defined() ? source_rows.size(0) : 0;
  if (rows > 0) add_copy(segments, chunk_view(flat, offset, rows, param), source_rows);
  add_fill(segments, flat, offset + rows * param.row_numel(), (chunk_rows - rows) * param.row_numel(), 0.0);
}

}  // namespace

FSDPParamGroup::FSDPParamGroup(std::vector<std::unique_ptr<FSDPParam>> params, GroupComm comm,
                               const MixedPrecisionPolicy& policy, ReshardAfterForward reshard_after_forward,
                               std::string module_fqn, std::optional<Device> offload_to)
    : params_(std::move(params)),
      comm_(std::move(comm)),
      policy_(policy),
      module_fqn_(std::move(module_fqn)),
      offload_to_(offload_to) {
  TESSERA_CHECK(!params_.empty(), "FSDPParamGroup: no parameters");
  for (const auto& param : params_) {
    TESSERA_CHECK(param->offloaded() == offload_to_.has_value(), "FSDPParamGroup: parameter '{}' is {}in host memory "
                  "but the group is {}offloaded; one group's shards live in one place", param->fqn(),
                  param->offloaded() ? "" : "not ", offload_to_ ? "" : "not ");
  }
  // The group's own dtype: its parameters', or f32 where every one is packed
  // bytes behind an all-gather extension (which picks its unsharded dtype).
  DType own = DType::f32;
  const auto floating = std::find_if(params_.begin(), params_.end(), [](const std::unique_ptr<FSDPParam>& param) {
    return is_floating(param->dtype());
  });
  if (floating != params_.end()) own = (*floating)->dtype();
  if (!policy_.param_dtype) {
    for (const auto& param : params_) {
      if (!is_floating(param->dtype())) continue;  // packed bytes: its extension unpacks them
      TESSERA_CHECK(param->dtype() == own,
                    "fully_shard: parameters '{}' ({}) and '{}' ({}) differ in dtype; one group moves one dtype: set "
                    "MixedPrecisionPolicy::param_dtype or shard them in separate calls",
                    (*floating)->fqn(), dtype_name(own), param->fqn(), dtype_name(param->dtype()));
    }
  }
  param_dtype_ = policy_.param_dtype.value_or(own);
  reduce_dtype_ = policy_.reduce_dtype.value_or(param_dtype_);
  TESSERA_CHECK(is_floating(param_dtype_) && is_floating(reduce_dtype_),
                "fully_shard: param_dtype and reduce_dtype must be floating, got {} and {}", dtype_name(param_dtype_),
                dtype_name(reduce_dtype_));
  for (const auto& param : params_) {
    const auto& extension = param->param().all_gather_extension();
    if (!extension) continue;
    extended_ = true;
    TESSERA_CHECK(!offload_to_, "fully_shard: parameter '{}' has an all-gather extension ({}); CPU offload of its "
                  "group is not supported", param->fqn(), extension->name());
    const bool same_face = extension->unsharded_shape(param->global_shape()) == param->global_shape() &&
                           extension->unsharded_dtype(param_dtype_) == param_dtype_;
    TESSERA_CHECK(same_face || !param->param().requires_grad(),
                  "fully_shard: parameter '{}' requires grad, but its all-gather extension ({}) unshards it as {} {} "
                  "where its shards hold {} rows of {} in {}; its gradient would have no shard to go back to: freeze "
                  "it (Parameter::set_requires_grad(false)) or unshard into its own shape and param_dtype",
                  param->fqn(), extension->name(), dtype_name(extension->unsharded_dtype(param_dtype_)),
                  extension->unsharded_shape(param->global_shape()), param->global_shape()[0],
                  param->global_shape(), dtype_name(param_dtype_));
  }
  const std::vector<size_t> all = every_index(params_.size());
  shard_layout_ = make_layout(params_, all, comm_.shard->size());
  if (comm_.post_forward) post_forward_layout_ = make_layout(params_, all, comm_.post_forward->size());
  set_reshard_after_forward(reshard_after_forward);
  for (size_t index = 0; index < params_.size(); ++index) {
    if (params_[index]->param().requires_grad()) trainable_.push_back(index);
  }
  expected_gradients_ = static_cast<int64_t>(trainable_.size());
  gradient_layout_ = make_layout(params_, trainable_, comm_.shard->size());
  for (size_t position = 0; position < trainable_.size(); ++position) {
    const FSDPParam& param = *params_[trainable_[position]];
    const auto& tensor_parallel = param.param().tensor_parallel();
    if (!tensor_parallel || !tensor_parallel->partial_gradient) continue;
    TESSERA_CHECK(comm_.tensor_parallel != nullptr,
                  "FSDPParamGroup: parameter '{}' has partial gradients over tensor parallelism, and no tp group to "
                  "sum them over",
                  param.fqn());
    partial_gradient_params_.push_back(position);
  }
}

FSDPParamGroup::~FSDPParamGroup() {
  if (streams_ == nullptr) return;
  // Unwinding mid-step (an error), a side stream may still read or write
  // buffers of compute's that go after this: the shards a copy-in read, the
  // sharded gradients the reduce-scatter stream adds into, the unsharded
  // ones its copy-in read. Compute waits for all of their work so far.
  for (const std::shared_ptr<Stream>* side :
       {&streams_->copy_in(), &streams_->all_gather(), &streams_->reduce_scatter(), &streams_->all_reduce()}) {
    streams_->order_compute_after(**side);
  }
}

void FSDPParamGroup::set_reshard_after_forward(ReshardAfterForward reshard_after_forward) {
  const ReshardAfterForward resolved = reshard_after_forward.resolved(comm_.shard->size());
  const int64_t post_forward_ranks = comm_.post_forward ? comm_.post_forward->size() : 0;
  TESSERA_CHECK(!extended_ || !resolved.group_size(),
                "FSDPParamGroup '{}': reshard_after_forward {} keeps a group-of-N shard of the unsharded parameters, "
                "which all-gather extensions do not define; use true or false", module_fqn_, resolved.to_string());
  TESSERA_CHECK(resolved.group_size().value_or(0) == post_forward_ranks,
                "FSDPParamGroup '{}': reshard_after_forward {} on {} shard ranks needs a post-forward group of that "
                "size, got {} ranks", module_fqn_, resolved.to_string(), comm_.shard->size(), post_forward_ranks);
  reshard_after_forward_ = resolved;
}

int64_t FSDPParamGroup::unsharded_bytes() const {
  return shard_layout_.world * shard_layout_.slot_numel * static_cast<int64_t>(element_size(param_dtype_));
}

const FlatLayout& FSDPParamGroup::layout_for(int world) const {
  return world == shard_layout_.world ? shard_layout_ : post_forward_layout_;
}

dist::Tracer* FSDPParamGroup::tracer() const { return comm_.shard->tracer().get(); }

int FSDPParamGroup::trace_rank() const { return comm_.shard->world_ranks()[static_cast<size_t>(comm_.shard->rank())]; }

void FSDPParamGroup::count(dist::CollectiveKind kind, int64_t bytes, const dist::ProcessGroup& group) {
  const dist::CommVolume volume = dist::collective_volume(kind, bytes, group.size(), /*is_root=*/false);
  for (dist::CommStats* counter : {&comm_stats_, &tensor_parallel_comm_stats_}) {
    if (counter == &tensor_parallel_comm_stats_ && &group != comm_.tensor_parallel.get()) continue;
    dist::CollectiveStats& stats = (*counter)[kind];
    ++stats.calls;
    stats.bytes_sent += volume.sent;
    stats.bytes_received += volume.received;
  }
}

void FSDPParamGroup::lazy_init(std::shared_ptr<MemoryCounters> unsharded_memory,
                               std::shared_ptr<std::vector<FSDPParamGroup*>> outstanding,
                               std::shared_ptr<FSDPStreams> streams, std::function<void()> on_gradient) {
  TESSERA_CHECK(streams != nullptr && streams->device() == device(),
                "FSDPParamGroup '{}': its shards are on {}, but the root's FSDP streams on {}; every group of a root "
                "lives on one device", module_fqn_, device().str(), streams ? streams->device().str() : "none");
  streams_ = std::move(streams);
  unsharded_memory_ = std::move(unsharded_memory);
  outstanding_ = std::move(outstanding);
  on_gradient_ = std::move(on_gradient);
  for (const auto& param : params_) {
    if (param->has_unsharded()) continue;
    param->init_unsharded(param_dtype_, device());
    if (!param->param().requires_grad()) continue;
    Tensor unsharded = param->unsharded();
    autograd::register_post_accumulate_grad_hook(unsharded, [this](Tensor&) { on_gradient_accumulated(); });
  }
}

Device FSDPParamGroup::device() const { return offload_to_ ? *offload_to_ : params_.front()->sharded().device(); }

// ---- unshard ---------------------------------------------------------------------------------

void FSDPParamGroup::unshard(bool async_op) {
  if (state_ == ShardState::unsharded || pending_all_gather_) return;
  TESSERA_CHECK(unsharded_memory_ != nullptr, "fsdp: a group is unsharded before the root's first forward; run a "
                "forward of the root module first (its lazy init sets up every group)");
  autograd::NoGradGuard no_grad;  // copies of parameters, not ops on them
  if (extended_) return unshard_payloads(async_op);
  const bool from_post_forward = state_ == ShardState::sharded_post_forward;
  const dist::ProcessGroupPtr& group = from_post_forward ? comm_.post_forward : comm_.shard;
  // FSDP made the post-forward group: its collectives go where the shard group's do.
  if (from_post_forward && group->tracer() != comm_.shard->tracer()) group->set_tracer(comm_.shard->tracer());
  const FlatLayout& layout = layout_for(group->size());
  const int64_t slot_begin = group->rank() * layout.slot_numel;

  // The copy-in stream starts once compute has written the shards (the
  // optimizer); the buffer is the copy-in stream's (streams.h).
  streams_->order_copy_in_after_compute();
  std::optional<StreamGuard> on_copy_in;
  if (streams_->separate()) on_copy_in.emplace(streams_->copy_in());
  Tensor gathered;
  {
    MemoryScope scope(unsharded_memory_);
    gathered = ops::empty({layout.world * layout.slot_numel}, {.dtype = param_dtype_, .device = device()});
  }
  Tensor slot = ops::narrow(gathered, 0, slot_begin, layout.slot_numel);
  Tensor read_from_compute;  // compute's buffer the copy-in reads, held until compute waits for it
  {
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "copy_in", "fsdp", {{"module", module_fqn_}});
    if (from_post_forward) {
      ops::copy_(slot, post_forward_slot_);
      read_from_compute = streams_->keep_post_forward_slot(std::exchange(post_forward_slot_, Tensor()));
    } else {
      copy_in_shards(slot, layout);
    }
  }
  on_copy_in.reset();
  issue_all_gather(PendingAllGather{gathered, dist::Work(), layout.world, ++all_gathers_issued_,
                                    std::move(read_from_compute), Event(), std::nullopt},
                   slot, *group, layout.slot_numel * static_cast<int64_t>(element_size(param_dtype_)), async_op);
}

void FSDPParamGroup::issue_all_gather(PendingAllGather pending, const Tensor& slot, dist::ProcessGroup& group,
                                      int64_t slot_bytes, bool async_op) {
  // The all-gather stream issues the collective once the copy-in is done;
  // the group's own stream then waits for the all-gather stream.
  streams_->order_all_gather_after_copy_in();
  std::optional<StreamGuard> on_all_gather;
  if (streams_->separate()) on_all_gather.emplace(streams_->all_gather());
  // Pending before the issue: should issuing throw, the compute buffer the
  // copy-in read is still held until compute is ordered after it (reshard,
  // or the destructor).
  pending_all_gather_ = std::move(pending);
  try {
    pending_all_gather_->work = group.all_gather_into(pending_all_gather_->gathered, slot, /*async_op=*/true);
  } catch (...) {
    // Nothing was issued, but the copy-in has read the shards (or the
    // post-forward slot): compute's wait on `issued` in reshard must still
    // come after that, or compute could write or free what it reads.
    if (streams_->separate()) pending_all_gather_->issued.record(*streams_->all_gather());
    throw;
  }
  // What compute waits for besides the Work: a group of one rank copies on
  // the all-gather stream itself.
  if (streams_->separate()) pending_all_gather_->issued.record(*streams_->all_gather());
  on_all_gather.reset();
  count(dist::CollectiveKind::all_gather, slot_bytes, group);
  if (!async_op) wait_for_unshard();
}

void FSDPParamGroup::copy_in_shards(const Tensor& slot, const FlatLayout& layout) {
  wait_for_host_step();
  std::vector<CopySegment> segments;
  for (size_t index = 0; index < params_.size(); ++index) {
    const FSDPParam& param = *params_[index];
    if (!param.offloaded()) {
      add_rows_into_chunk(segments, slot, layout.offsets[index], layout.chunk_rows[index], param.sharded(), param);
      continue;
    }
    // The padded shard is the chunk, padding included (both have
    // padded_shard_rows rows over the shard group): one copy each, straight
    // into the slot when the dtypes agree, else through a buffer of the
    // shard's dtype on this (copy-in) stream, cast with the group's segments.
    const Tensor host = ops::flatten(param.padded_sharded());
    Tensor chunk = ops::narrow(slot, 0, layout.offsets[index], layout.chunk_rows[index] * param.row_numel());
    Tensor landing = host.dtype() == chunk.dtype()
                         ? chunk
                         : ops::empty({host.numel()}, {.dtype = host.dtype(), .device = device()});
    shards_read_ = copy_from_host_async(landing, host, *current_stream(device()));
    if (landing.storage() != chunk.storage()) segments.push_back({chunk, landing});
  }
  ops::copy_segments(segments);
}

// ---- unshard through all-gather extensions ----------------------------------------------------

namespace {

constexpr int64_t kPayloadAlignment = 16;  // bytes: every payload of a byte slot starts on a 16-byte boundary

int64_t aligned(int64_t bytes) { return (bytes + kPayloadAlignment - 1) / kPayloadAlignment * kPayloadAlignment; }

}  // namespace

PayloadSlotLayout payload_slot_layout(const std::vector<nn::PayloadSize>& payloads) {
  PayloadSlotLayout layout;
  const bool one_dtype = !payloads.empty() && std::all_of(payloads.begin(), payloads.end(), [&](const auto& payload) {
    return payload.dtype == payloads.front().dtype;
  });
  layout.mixed = !one_dtype;
  layout.buffer_dtype = one_dtype ? payloads.front().dtype : DType::u8;
  for (const nn::PayloadSize& payload : payloads) {
    layout.offsets.push_back(layout.slot_units);
    const int64_t bytes = payload.numel * static_cast<int64_t>(element_size(payload.dtype));
    layout.slot_units += one_dtype ? payload.numel : aligned(bytes);
  }
  return layout;
}

namespace {

// Payload `piece` of `rank`'s slot in `gathered`, 1-D in the piece's dtype.
Tensor rank_piece(const Tensor& gathered, int64_t slot_units, int64_t rank, int64_t offset, int64_t numel,
                  DType dtype) {
  const int64_t units = gathered.dtype() == DType::u8 ? numel * static_cast<int64_t>(element_size(dtype)) : numel;
  const Tensor chunk = ops::narrow(gathered, 0, rank * slot_units + offset, units);
  return gathered.dtype() == DType::u8 && dtype != DType::u8 ? ops::view_bytes_as(chunk, dtype, {numel}) : chunk;
}

}  // namespace

void FSDPParamGroup::unshard_payloads(bool async_op) {
  const dist::ProcessGroupPtr& group = comm_.shard;
  streams_->order_copy_in_after_compute();
  std::optional<StreamGuard> on_copy_in;
  if (streams_->separate()) on_copy_in.emplace(streams_->copy_in());
  PayloadLayout layout;
  std::vector<Tensor> payloads;  // one per piece, 1-D contiguous
  {
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "pre_all_gather", "fsdp", {{"module", module_fqn_}});
    for (size_t index = 0; index < params_.size(); ++index) {
      const FSDPParam& param = *params_[index];
      const Tensor padded = param.padded_sharded();
      const auto& extension = param.param().all_gather_extension();
      if (!extension) {
        payloads.push_back(ops::flatten(ops::to(padded, param_dtype_)));
        layout.metadata.push_back(nullptr);
      } else {
        nn::AllGatherPayloads made = extension->pre_all_gather(padded, param_dtype_);
        TESSERA_CHECK(!made.payloads.empty(), "fsdp: the all-gather extension ({}) of '{}' gave no payload",
                      extension->name(), param.fqn());
        for (const Tensor& payload : made.payloads) {
          TESSERA_CHECK(payload.defined() && payload.device() == device(),
                        "fsdp: the all-gather extension ({}) of '{}' gave a payload {}; payloads live on {}",
                        extension->name(), param.fqn(), payload.defined() ? "on " + payload.device().str() :
                        std::string("that is undefined"), device().str());
          payloads.push_back(ops::flatten(ops::contiguous(payload)));
        }
        layout.metadata.push_back(std::move(made.metadata));
      }
      while (layout.pieces.size() < payloads.size()) {
        const Tensor& payload = payloads[layout.pieces.size()];
        layout.pieces.push_back({index, 0, payload.numel(), payload.dtype()});
      }
    }
  }
  check_payloads_agree(layout);
  std::vector<nn::PayloadSize> sizes;
  for (const PayloadPiece& piece : layout.pieces) sizes.push_back({piece.dtype, piece.numel});
  const PayloadSlotLayout slot_layout = payload_slot_layout(sizes);
  const bool one_dtype = !slot_layout.mixed;
  layout.buffer_dtype = slot_layout.buffer_dtype;
  layout.slot_units = slot_layout.slot_units;
  for (size_t position = 0; position < layout.pieces.size(); ++position) {
    layout.pieces[position].offset = slot_layout.offsets[position];
  }
  Tensor gathered;
  {
    MemoryScope scope(unsharded_memory_);
    const TensorOptions options{.dtype = layout.buffer_dtype, .device = device()};
    // A byte slot's alignment gaps are zeroed: every byte sent is defined.
    gathered = one_dtype ? ops::empty({group->size() * layout.slot_units}, options)
                         : ops::zeros({group->size() * layout.slot_units}, options);
  }
  const Tensor slot = ops::narrow(gathered, 0, group->rank() * layout.slot_units, layout.slot_units);
  for (size_t position = 0; position < payloads.size(); ++position) {
    const PayloadPiece& piece = layout.pieces[position];
    Tensor destination = rank_piece(gathered, layout.slot_units, group->rank(), piece.offset, piece.numel, piece.dtype);
    ops::copy_(destination, payloads[position]);  // the same dtype: bytes as they are
  }
  on_copy_in.reset();
  const int64_t slot_bytes = layout.slot_units * static_cast<int64_t>(element_size(layout.buffer_dtype));
  issue_all_gather(PendingAllGather{gathered, dist::Work(), group->size(), ++all_gathers_issued_, Tensor(), Event(),
                                    std::move(layout)},
                   slot, *group, slot_bytes, async_op);
}

void FSDPParamGroup::check_payloads_agree(const PayloadLayout& layout) const {
  // One line a parameter: "dtype numel, dtype numel".
  std::vector<std::string> mine(params_.size());
  for (const PayloadPiece& piece : layout.pieces) {
    std::string& line = mine[piece.param];
    line += fmt::format("{}{} [{}]", line.empty() ? "" : ", ", dtype_name(piece.dtype), piece.numel);
  }
  std::string text;
  for (const std::string& line : mine) text += line + "\n";
  const std::vector<std::vector<uint8_t>> everyone = comm_.shard->all_gather_bytes(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  std::vector<std::vector<std::string>> lines;  // [rank][param]
  for (const std::vector<uint8_t>& bytes : everyone) {
    std::vector<std::string> split(1);
    for (const uint8_t byte : bytes) {
      if (byte == '\n') {
        split.emplace_back();
      } else {
        split.back() += static_cast<char>(byte);
      }
    }
    split.pop_back();
    lines.push_back(std::move(split));
  }
  for (size_t index = 0; index < params_.size(); ++index) {
    std::map<std::string, std::vector<int>> ranks_of;  // payloads -> the ranks that gave them
    for (size_t rank = 0; rank < lines.size(); ++rank) {
      ranks_of[index < lines[rank].size() ? lines[rank][index] : "nothing"].push_back(static_cast<int>(rank));
    }
    if (ranks_of.size() == 1) continue;
    std::string variants;
    for (const auto& [payloads, ranks] : ranks_of) {
      variants += fmt::format("{}rank{} {} gave {}", variants.empty() ? "" : "; ", ranks.size() > 1 ? "s" : "",
                              fmt::join(ranks, ", "), payloads);
    }
    const auto& extension = params_[index]->param().all_gather_extension();
    fail("fsdp: the all-gather payloads of '{}' ({}) differ between ranks of group '{}': {}; every rank's "
         "pre_all_gather must give the same dtypes and sizes (nothing was issued)",
         params_[index]->fqn(), extension ? extension->name() : "no extension", comm_.shard->name(), variants);
  }
}

void FSDPParamGroup::copy_out_payloads(const Tensor& gathered, const PayloadLayout& layout) {
  autograd::NoGradGuard no_grad;
  const int64_t world = comm_.shard->size();
  size_t position = 0;
  for (size_t index = 0; index < params_.size(); ++index) {
    FSDPParam& param = *params_[index];
    {
      MemoryScope scope(unsharded_memory_);
      param.alloc_unsharded();
    }
    std::vector<const PayloadPiece*> pieces;
    for (; position < layout.pieces.size() && layout.pieces[position].param == index; ++position) {
      pieces.push_back(&layout.pieces[position]);
    }
    const auto& extension = param.param().all_gather_extension();
    if (!extension) {
      // Its padded shard from every rank: the real rows into the unsharded tensor.
      const PayloadPiece& piece = *pieces.front();
      for (int rank = 0; rank < world; ++rank) {
        const dist::ShardExtent extent = dist::shard_extent(param.rows(), static_cast<int>(world), rank);
        if (extent.length == 0) continue;
        const Tensor rows =
            ops::narrow(rank_piece(gathered, layout.slot_units, rank, piece.offset, piece.numel, piece.dtype), 0, 0,
                        extent.length * param.row_numel());
        Tensor target = ops::narrow(param.unsharded(), 0, extent.offset, extent.length);
        ops::copy_(target, ops::view(rows, target.sizes()));
      }
      continue;
    }
    std::vector<Tensor> gathered_payloads;
    for (const PayloadPiece* piece : pieces) {
      std::vector<Tensor> by_rank;
      for (int rank = 0; rank < world; ++rank) {
        by_rank.push_back(rank_piece(gathered, layout.slot_units, rank, piece->offset, piece->numel, piece->dtype));
      }
      gathered_payloads.push_back(world == 1 ? by_rank.front() : ops::cat(by_rank, 0));
    }
    extension->post_all_gather(gathered_payloads, layout.metadata[index], param.unsharded());
  }
  for (const auto& param : params_) param->to_unsharded();
}

std::optional<int64_t> FSDPParamGroup::pending_all_gather() const {
  if (!pending_all_gather_) return std::nullopt;
  return pending_all_gather_->number;
}

void FSDPParamGroup::wait_for_unshard() {
  if (state_ == ShardState::unsharded && !pending_all_gather_) return;
  if (!pending_all_gather_) unshard(/*async_op=*/true);
  {
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "all_gather_wait", "fsdp", {{"module", module_fqn_}});
    pending_all_gather_->work.wait();
    if (streams_->separate()) current_stream(device())->wait_event(pending_all_gather_->issued);
  }
  {
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "copy_out", "fsdp", {{"module", module_fqn_}});
    if (pending_all_gather_->payloads) {
      copy_out_payloads(pending_all_gather_->gathered, *pending_all_gather_->payloads);
    } else {
      copy_out(pending_all_gather_->gathered, layout_for(pending_all_gather_->world));
    }
  }
  // The all-gather buffer is copy_in's, and compute has just read it: it goes
  // once copy_in has waited for that read, so the allocator's event at its
  // free comes after it, whichever stream takes the block next.
  streams_->order(*streams_->copy_in(), *current_stream(device()));
  pending_all_gather_.reset();
  state_ = ShardState::unsharded;
}

void FSDPParamGroup::copy_out(const Tensor& gathered, const FlatLayout& layout) {
  autograd::NoGradGuard no_grad;
  std::vector<CopySegment> segments;
  for (size_t index = 0; index < params_.size(); ++index) {
    FSDPParam& param = *params_[index];
    {
      MemoryScope scope(unsharded_memory_);
      param.alloc_unsharded();
    }
    for (int rank = 0; rank < layout.world; ++rank) {
      const dist::ShardExtent extent = dist::shard_extent(param.rows(), layout.world, rank);
      if (extent.length == 0) continue;
      add_copy(segments, ops::narrow(param.unsharded(), 0, extent.offset, extent.length),
               chunk_view(gathered, rank * layout.slot_numel + layout.offsets[index], extent.length, param));
    }
  }
  ops::copy_segments(segments);
  for (const auto& param : params_) param->to_unsharded();
}

// ---- reshard ---------------------------------------------------------------------------------

void FSDPParamGroup::reshard(ShardState target) {
  TESSERA_CHECK(target != ShardState::unsharded, "FSDPParamGroup '{}': reshard to unsharded; call unshard",
                module_fqn_);
  if (pending_all_gather_) {
    // An issued all-gather must complete on every rank; its result is not needed.
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "all_gather_wait", "fsdp", {{"module", module_fqn_}});
    pending_all_gather_->work.wait();
    if (streams_->separate()) current_stream(device())->wait_event(pending_all_gather_->issued);
    pending_all_gather_.reset();
  }
  const bool to_post_forward = target == ShardState::sharded_post_forward && comm_.post_forward != nullptr;
  autograd::NoGradGuard no_grad;
  if (state_ == ShardState::unsharded) {
    if (to_post_forward) {
      const dist::ProcessGroupPtr& group = comm_.post_forward;
      {
        MemoryScope scope(unsharded_memory_);
        post_forward_slot_ =
            ops::empty({post_forward_layout_.slot_numel}, {.dtype = param_dtype_, .device = device()});
      }
      std::vector<CopySegment> segments;
      for (size_t index = 0; index < params_.size(); ++index) {
        const FSDPParam& param = *params_[index];
        const dist::ShardExtent extent = dist::shard_extent(param.rows(), group->size(), group->rank());
        add_rows_into_chunk(segments, post_forward_slot_, post_forward_layout_.offsets[index],
                            post_forward_layout_.chunk_rows[index],
                            ops::narrow(param.unsharded(), 0, extent.offset, extent.length), param);
      }
      ops::copy_segments(segments);
    }
    for (const auto& param : params_) {
      param->to_sharded();
      param->free_unsharded();
    }
  } else if (state_ == ShardState::sharded_post_forward && !to_post_forward) {
    post_forward_slot_ = Tensor();
  } else if (state_ == ShardState::sharded) {
    return;
  }
  state_ = to_post_forward ? ShardState::sharded_post_forward : ShardState::sharded;
}

// ---- the hooks' steps ----------------------------------------------------------------------------

void FSDPParamGroup::pre_forward() { wait_for_unshard(); }

void FSDPParamGroup::post_forward(bool backward_follows) {
  if (backward_follows) {
    needs_post_backward_ = true;
    gradients_ready_ = 0;
  }
  // With no backward to serve, never leave parameters unsharded: the
  // optimizer and state dicts must find the shards in the Parameters.
  if (!backward_follows || reshard_after_forward_.is_always()) {
    reshard(ShardState::sharded);
  } else if (reshard_after_forward_.group_size()) {
    reshard(ShardState::sharded_post_forward);
  }
}

void FSDPParamGroup::pre_backward() {
  if (backward_start_us_ == 0) backward_start_us_ = dist::Tracer::now_us();
  wait_for_unshard();
}

void FSDPParamGroup::on_gradient_accumulated() {
  if (on_gradient_) on_gradient_();
  ++gradients_ready_;
  const bool module_done = !has_frozen_parameters() || (inputs_announced_ && input_gradients_pending_ == 0);
  if (needs_post_backward_ && gradients_ready_ == expected_gradients_ && module_done) post_backward();
}

void FSDPParamGroup::expect_input_gradient() {
  inputs_announced_ = true;
  ++input_gradients_pending_;
}

void FSDPParamGroup::on_input_gradient() {
  if (on_gradient_) on_gradient_();
  if (input_gradients_pending_ > 0) --input_gradients_pending_;
  if (needs_post_backward_ && gradients_ready_ == expected_gradients_ && input_gradients_pending_ == 0) {
    post_backward();
  }
}

void FSDPParamGroup::post_backward() {
  needs_post_backward_ = false;
  gradients_ready_ = 0;
  input_gradients_pending_ = 0;
  inputs_announced_ = false;
  if (dist::Tracer* trace = tracer(); trace != nullptr && backward_start_us_ != 0) {
    trace->record(dist::TraceEvent{.rank = trace_rank(), .track = "fsdp", .name = "backward", .category = "fsdp",
                                   .start_us = backward_start_us_, .duration_us = dist::Tracer::now_us() - backward_start_us_,
                                   .args = {{"module", module_fqn_}}});
  }
  backward_start_us_ = 0;
  if (requires_gradient_sync_ && expected_gradients_ > 0) issue_reduce_scatter();
  // Synced gradients live on the shards, so the optimizer must find the
  // shards: only an unsynced pass may keep the group unsharded.
  if (reshard_after_backward_ || requires_gradient_sync_) reshard(ShardState::sharded);
}

void FSDPParamGroup::issue_reduce_scatter() {
  const FlatLayout& layout = gradient_layout_;
  const int64_t flags = static_cast<int64_t>(trainable_.size());
  const int64_t slot_numel = layout.slot_numel + flags;
  Tensor input;
  std::vector<bool> present_here;
  std::vector<Tensor> gradients_read;  // compute's, held until compute waits for the copy-in
  // The reduce-scatter stream starts once compute has written the gradients.
  std::optional<StreamGuard> on_reduce_scatter;
  if (streams_->separate()) {
    streams_->order(*streams_->reduce_scatter(), *current_stream(device()));
    on_reduce_scatter.emplace(streams_->reduce_scatter());
  }
  {
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "reduce_scatter_copy_in", "fsdp", {{"module", module_fqn_}});
    // Every byte is written once: rows, zero padding, and the flags.
    input = ops::empty({layout.world * slot_numel}, {.dtype = reduce_dtype_, .device = device()});
    std::vector<Tensor> grads;
    for (const size_t index : trainable_) {
      grads.push_back(params_[index]->unsharded().grad());
      present_here.push_back(grads.back().defined());
    }
    std::vector<CopySegment> segments;
    for (int rank = 0; rank < layout.world; ++rank) {
      const int64_t slot = rank * slot_numel;
      for (size_t position = 0; position < trainable_.size(); ++position) {
        const FSDPParam& param = *params_[trainable_[position]];
        const dist::ShardExtent extent = dist::shard_extent(param.rows(), layout.world, rank);
        const Tensor& grad = grads[position];
        const Tensor rows = grad.defined() ? ops::narrow(grad, 0, extent.offset, extent.length) : Tensor();
        add_rows_into_chunk(segments, input, slot + layout.offsets[position], layout.chunk_rows[position], rows,
                            param);
      }
      for (size_t position = 0; position < trainable_.size(); ++position) {
        add_fill(segments, input, slot + layout.slot_numel + static_cast<int64_t>(position), 1,
                 present_here[position] ? 1.0 : 0.0);
      }
    }
    ops::copy_segments(segments);
    for (const size_t index : trainable_) {
      Tensor unsharded = params_[index]->unsharded();
      if (unsharded.grad().defined()) unsharded.set_grad(Tensor());
    }
    gradients_read = streams_->keep_gradients_read(std::move(grads));
  }
  Event copied_in;
  if (streams_->separate()) copied_in.record(*streams_->reduce_scatter());
  Tensor output = ops::empty({slot_numel}, {.dtype = reduce_dtype_, .device = device()});
  // HSDP sums over the shard group, then over the replicate group, and
  // divides once; plain FSDP averages in the reduce-scatter itself.
  const dist::ReduceOp op = comm_.replicate ? dist::ReduceOp::sum : dist::ReduceOp::avg;
  // Pending before the issue: should issuing throw, the destructor still
  // orders the release of compute's gradients the copy-in read.
  pending_reduce_scatter_ = PendingReduceScatter{input, output, dist::Work(), std::move(present_here),
                                                 std::move(gradients_read), std::move(copied_in)};
  pending_reduce_scatter_->work = comm_.shard->reduce_scatter_into(output, input, op, /*async_op=*/true);
  count(dist::CollectiveKind::reduce_scatter, slot_numel * static_cast<int64_t>(element_size(reduce_dtype_)),
        *comm_.shard);
  on_reduce_scatter.reset();

  // One reduce-scatter stays in flight behind the backward pass: finishing the
  // previous one here bounds gradient buffers to two groups.
  if (outstanding_) {
    std::vector<FSDPParamGroup*> earlier = std::move(*outstanding_);
    *outstanding_ = {this};
    for (FSDPParamGroup* group : earlier) {
      if (group != this) group->finish_reduce_scatter();
    }
  }
}

void FSDPParamGroup::finish_reduce_scatter() {
  if (!pending_reduce_scatter_) return;
  // An earlier backward's reduced slot still in the landing buffer (left in
  // flight by set_is_last_backward(false)) is added before the buffer is reused.
  finish_host_gradients();
  PendingReduceScatter pending = std::move(*pending_reduce_scatter_);
  pending_reduce_scatter_.reset();
  // Compute's gradients may go once compute has waited for their copy-in
  // (long done: the collective came after it on the same stream).
  if (streams_->separate()) {
    current_stream(device())->wait_event(pending.copied_in);
    pending.gradients_read.clear();
  }
  // The rest runs on the reduce-scatter stream, off compute (streams.h).
  // It waits for compute's work so far: the new gradients take blocks of
  // compute's, whose earlier uses must come before this stream writes them.
  const std::shared_ptr<Stream> compute = streams_->separate() ? current_stream(device()) : nullptr;
  std::optional<StreamGuard> on_reduce_scatter;
  if (streams_->separate()) {
    streams_->order(*streams_->reduce_scatter(), *compute);
    on_reduce_scatter.emplace(streams_->reduce_scatter());
  }
  {
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "reduce_scatter_wait", "fsdp", {{"module", module_fqn_}});
    pending.work.wait();
    pending.input = Tensor();
  }
  if (comm_.replicate) {
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "replicate_all_reduce", "fsdp", {{"module", module_fqn_}});
    streams_->order(*streams_->all_reduce(), *streams_->reduce_scatter());
    {
      std::optional<StreamGuard> on_all_reduce;
      if (streams_->separate()) on_all_reduce.emplace(streams_->all_reduce());
      comm_.replicate->all_reduce(pending.output, dist::ReduceOp::sum);
    }
    streams_->order(*streams_->reduce_scatter(), *streams_->all_reduce());
    count(dist::CollectiveKind::all_reduce,
          pending.output.numel() * static_cast<int64_t>(element_size(reduce_dtype_)), *comm_.replicate);
    const int ranks = comm_.shard->size() * comm_.replicate->size();
    if (pending.output.device().is_cpu()) {
      dist::finish_average(pending.output.raw_data(), pending.output.numel(), reduce_dtype_, ranks);
    } else {
      // The one division of AVG, on the device: IEEE's, in the reduce dtype.
      pending.output = ops::div(pending.output, static_cast<double>(ranks));
    }
  }
  if (!partial_gradient_params_.empty()) {
    // Sequence-parallel parameters' gradients are partial over tp: their
    // shards are summed now, after the reduce-scatter, which costs 1/S of
    // the bytes of summing the whole gradients before it.
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "partial_gradient_all_reduce", "fsdp",
                         {{"module", module_fqn_}});
    // One all-reduce of the shards packed together (norm vectors are small:
    // latency, not bytes, is their cost).
    std::vector<Tensor> pieces;
    for (const size_t position : partial_gradient_params_) {
      const int64_t elements = gradient_layout_.chunk_rows[position] * params_[trainable_[position]]->row_numel();
      pieces.push_back(ops::narrow(pending.output, 0, gradient_layout_.offsets[position], elements));
    }
    Tensor packed = ops::cat(pieces, 0);
    comm_.tensor_parallel->all_reduce(packed, dist::ReduceOp::sum);
    count(dist::CollectiveKind::all_reduce, packed.numel() * static_cast<int64_t>(element_size(reduce_dtype_)),
          *comm_.tensor_parallel);
    int64_t offset = 0;
    for (Tensor& piece : pieces) {
      ops::copy_(piece, ops::narrow(packed, 0, offset, piece.numel()));
      offset += piece.numel();
    }
  }
  if (offloaded()) {
    // The reduced slot goes to the host now, on this stream; the end of
    // backward waits for it (finish_host_gradients). The device buffer is this
    // stream's block: reused only by its later work, after the copy.
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "gradient_to_host", "fsdp", {{"module", module_fqn_}});
    Tensor landing = free_host_landing(pending.output.numel());
    const Event landed = copy_to_host_async(landing, pending.output, *current_stream(device()));
    pending_host_gradient_ = PendingHostGradient{landed, std::move(landing), std::move(pending.present_here)};
    return;
  }
  dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "accumulate_grad", "fsdp", {{"module", module_fqn_}});
  accumulate_gradients(pending.output, pending.present_here, compute);
}

Tensor FSDPParamGroup::free_host_landing(int64_t numel) {
  wait_for_host_step();  // an overlapped step clears the gradients this reads
  for (const Tensor& landing : host_landings_) {
    const bool viewed = std::any_of(params_.begin(), params_.end(), [&](const std::unique_ptr<FSDPParam>& param) {
      const Tensor& grad = param->sharded().grad();
      return grad.defined() && grad.shares_storage_with(landing);
    });
    if (!viewed) return landing;
  }
  host_landings_.push_back(pinned_empty({numel}, reduce_dtype_));
  return host_landings_.back();
}

void FSDPParamGroup::finish_host_gradients() {
  if (!pending_host_gradient_) return;
  wait_for_host_step();
  PendingHostGradient pending = std::move(*pending_host_gradient_);
  pending_host_gradient_.reset();
  {
    dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "gradient_to_host_wait", "fsdp", {{"module", module_fqn_}});
    streams_->host_waits_for_gradients(pending.landed);
  }
  dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "accumulate_grad", "fsdp", {{"module", module_fqn_}});
  check_host_access(pending.landing, /*writes=*/false, "fsdp: add the reduced gradients into the host's");
  accumulate_gradients(pending.landing, pending.present_here, nullptr, /*adopt_views=*/true);
}

void FSDPParamGroup::wait_for_host_step() {
  if (!host_step_.valid()) return;
  const std::shared_future<void> stepped = std::exchange(host_step_, {});
  dist::TraceSpan span(tracer(), trace_rank(), "fsdp", "optimizer_wait", "fsdp", {{"module", module_fqn_}});
  stepped.get();
}

void FSDPParamGroup::wait_for_shard_reads() {
  if (streams_ == nullptr) return;  // before lazy init: no copy has read the shards
  streams_->host_waits_for_shard_reads(shards_read_);
}

void FSDPParamGroup::accumulate_gradients(const Tensor& reduced, const std::vector<bool>& present,
                                          const std::shared_ptr<Stream>& compute, bool adopt_views) {
  const FlatLayout& layout = gradient_layout_;
  // A parameter has a gradient when any rank's backward gave it one: the
  // reduced flags say so. Alone in its groups, this rank knows without
  // reading them (on a device, a read would be a synchronisation per group).
  const bool alone = comm_.shard->size() == 1 && !comm_.replicate;
  const std::vector<double> reduced_flags =
      alone ? std::vector<double>()
            : ops::narrow(reduced, 0, layout.slot_numel, static_cast<int64_t>(trainable_.size())).to_vector<double>();
  std::vector<CopySegment> casts;  // new sharded gradients, cast to the parameters' dtypes
  for (size_t position = 0; position < trainable_.size(); ++position) {
    if (alone ? !present[position] : reduced_flags[position] == 0.0) continue;
    const FSDPParam& param = *params_[trainable_[position]];
    Tensor sharded = param.sharded();
    const Tensor piece = chunk_view(reduced, layout.offsets[position], param.local_rows(), param);
    if (sharded.grad().defined()) {
      ops::add_(sharded.mutable_grad(), piece);
    } else if (adopt_views && piece.dtype() == param.dtype()) {
      sharded.set_grad(piece);
    } else {
      Tensor grad;
      {
        // A gradient is compute's, like its parameter (the optimizer reads
        // it there and zero_grad frees it): only its first values come
        // from this stream, before compute's wait at the end of backward.
        std::optional<StreamGuard> on_compute;
        if (compute) on_compute.emplace(compute);
        grad = ops::empty(piece.sizes(), {.dtype = param.dtype(), .device = sharded.device()});
      }
      casts.push_back({grad, piece});
      sharded.set_grad(std::move(grad));  // written by the casts below, before anything reads it
    }
  }
  ops::copy_segments(casts);
}

void FSDPParamGroup::finish_backward(bool wait_for_reduce_scatter) {
  if (pending_all_gather_ && state_ != ShardState::unsharded) reshard(ShardState::sharded);  // prefetched, never used
  if (needs_post_backward_) post_backward();
  if (state_ != ShardState::sharded && (reshard_after_backward_ || requires_gradient_sync_)) {
    reshard(ShardState::sharded);
  }
  if (wait_for_reduce_scatter) {
    finish_reduce_scatter();
    if (offloaded()) {
      // The optimizer steps the host shards next: every copy to and from
      // them has run once the host has waited for both.
      finish_host_gradients();
      wait_for_shard_reads();
    }
    // The gradients are accumulated on the reduce-scatter stream: compute
    // (the optimizer, clipping) reads them only after it.
    streams_->order_compute_after(*streams_->reduce_scatter());
  }
  gradients_ready_ = 0;
  input_gradients_pending_ = 0;
  inputs_announced_ = false;
}

}  // namespace tessera::fsdp
