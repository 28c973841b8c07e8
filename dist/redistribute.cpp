// redistribute: the moves between placements, mesh dim by mesh dim, in three
// passes over the mesh (unshard from the innermost dim out, settle pending
// sums, shard from the outermost dim in), and the autograd node that runs the
// conjugate move on the gradient.
#include "dist/redistribute.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "autograd/function.h"
#include "tensor/ops.h"

namespace tessera::dist {

namespace {

using autograd::TensorList;

bool is_partial(const Placement& placement) { return std::holds_alternative<Partial>(placement); }

bool shards_dim(const Placement& placement, int64_t d) {
  const Shard* shard = std::get_if<Shard>(&placement);
  return shard != nullptr && shard->dim == d;
}

// Can a pending sum on mesh dim m become Shard(d) by a reduce-scatter of the
// piece held now? Yes when the outer mesh dims split d now as the target
// has them split it (the piece is the one m splits) and no inner one splits
// it yet (inner ones that shard d in the target slice after).
bool can_reduce_scatter(const Placements& current, const Placements& target, size_t m, int64_t d) {
  for (size_t k = 0; k < current.size(); ++k) {
    if (k < m && shards_dim(current[k], d) != shards_dim(target[k], d)) return false;
    if (k > m && shards_dim(current[k], d)) return false;
  }
  return true;
}

// Must mesh dim m, which shards tensor dim d now, be gathered before the
// others change? Yes when it changes itself, or when an outer mesh dim that
// splits d before it (in `current` or `target`) changes: m's piece is a
// piece of that dim's piece.
bool must_gather(const Placements& current, const Placements& target, size_t m, int64_t d) {
  if (current[m] != target[m]) return true;
  for (size_t outer = 0; outer < m; ++outer) {
    if (current[outer] != target[outer] && (shards_dim(current[outer], d) || shards_dim(target[outer], d))) return true;
  }
  return false;
}

// Tensor dim d moved to the front (so each rank's rows are one block of a
// flat buffer), and the permutation that puts it back.
std::vector<int64_t> dim_to_front(int64_t d, int64_t ndim) {
  std::vector<int64_t> order{d};
  for (int64_t i = 0; i < ndim; ++i) {
    if (i != d) order.push_back(i);
  }
  return order;
}
std::vector<int64_t> inverse(const std::vector<int64_t>& order) {
  std::vector<int64_t> back(order.size());
  for (size_t i = 0; i < order.size(); ++i) back[order[i]] = static_cast<int64_t>(i);
  return back;
}

// Writes the rows of `moved` (tensor dim d at the front) to the front of
// `block` and zeros the rest: the padded chunk that ceil-chunked collectives
// exchange.
void write_padded(Tensor block, const Tensor& moved) {
  const int64_t length = moved.size(0);
  Tensor head = ops::narrow(block, 0, 0, length);
  ops::copy_(head, moved);
  Tensor tail = ops::narrow(block, 0, length, block.size(0) - length);
  ops::zero_(tail);
}

// Shard(d) -> Replicate along mesh dim m: every rank's piece of the `size`
// rows of dim d, in rank order.
Tensor gather_along(const Tensor& local, const DeviceMesh& mesh, int64_t m, int64_t d, int64_t size) {
  const ProcessGroupPtr& group = mesh.group(m);
  const int64_t ranks = group->size();
  const int64_t chunk = shard_extent(size, ranks, 0).length;  // ceil(size / ranks)
  const std::vector<int64_t> order = dim_to_front(d, local.dim());
  Tensor moved = ops::permute(local, order);
  Shape gathered_shape = moved.sizes();
  gathered_shape[0] = ranks * chunk;
  Tensor out = ops::empty(gathered_shape, {.dtype = local.dtype(), .device = local.device()});
  // Every rank of the group sees the same shapes, so all skip an empty gather.
  if (out.numel() > 0) {
    Tensor own = ops::narrow(out, 0, group->rank() * chunk, chunk);
    write_padded(own, moved);
    group->all_gather_into(out, own);
  }
  return ops::contiguous(ops::narrow(ops::permute(out, inverse(order)), d, 0, size));
}

// Partial -> Shard(d) along mesh dim m: the sum over the group, of which this
// rank keeps its ceil-chunk of dim d.
Tensor reduce_scatter_along(const Tensor& local, const DeviceMesh& mesh, int64_t m, int64_t d) {
  const ProcessGroupPtr& group = mesh.group(m);
  const int64_t ranks = group->size();
  const int64_t size = local.size(d);
  const int64_t chunk = shard_extent(size, ranks, 0).length;
  const ShardExtent mine = shard_extent(size, ranks, group->rank());
  const std::vector<int64_t> order = dim_to_front(d, local.dim());
  const Tensor moved = ops::permute(local, order);
  Shape in_shape = moved.sizes();
  in_shape[0] = ranks * chunk;
  Tensor in = ops::empty(in_shape, {.dtype = local.dtype(), .device = local.device()});
  write_padded(in, moved);
  Shape out_shape = in_shape;
  out_shape[0] = chunk;
  Tensor out = ops::empty(out_shape, {.dtype = local.dtype(), .device = local.device()});
  if (in.numel() > 0) group->reduce_scatter_into(out, in, ReduceOp::sum);
  return ops::contiguous(ops::permute(ops::narrow(out, 0, 0, mine.length), inverse(order)));
}

// Partial -> Replicate along mesh dim m.
Tensor all_reduce_along(const Tensor& local, const DeviceMesh& mesh, int64_t m) {
  Tensor sum = ops::clone(local);
  if (sum.numel() > 0) mesh.group(m)->all_reduce(sum, ReduceOp::sum);
  return sum;
}

// Replicate -> Shard(d) along mesh dim m: this rank's ceil-chunk of what it holds.
Tensor slice_along(const Tensor& local, const DeviceMesh& mesh, int64_t m, int64_t d) {
  const ShardExtent mine = shard_extent(local.size(d), mesh.size(m), mesh.coordinate(m));
  return ops::clone(ops::narrow(local, d, mine.offset, mine.length));
}

// Replicate -> Partial along mesh dim m: the sum over the group is the value.
Tensor keep_on_first(const Tensor& local, const DeviceMesh& mesh, int64_t m) {
  return mesh.coordinate(m) == 0 ? ops::clone(local) : ops::zeros_like(local);
}

// Tensor dim d's extent in the piece that mesh dims 0..m-1 leave under `placements`.
int64_t extent_before(const Shape& global_shape, const DeviceMesh& mesh, const Placements& placements, size_t m,
                      int64_t d) {
  int64_t extent = global_shape[d];
  for (size_t k = 0; k < m; ++k) {
    if (shards_dim(placements[k], d)) extent = shard_extent(extent, mesh.size(k), mesh.coordinate(k)).length;
  }
  return extent;
}

// Where a gradient's placements may differ from the output's: only as
// Replicate and Partial where the output is Replicate; where the output is
// Partial, its gradient is Replicate.
void check_grad_placements(const Placements& target, const Placements& grad) {
  TESSERA_CHECK(grad.size() == target.size(), "redistribute: {} grad_placements for {} placements", grad.size(),
                target.size());
  for (size_t m = 0; m < target.size(); ++m) {
    const bool fits = std::holds_alternative<Replicate>(target[m])
                          ? !std::holds_alternative<Shard>(grad[m])
                          : (is_partial(target[m]) ? std::holds_alternative<Replicate>(grad[m]) : grad[m] == target[m]);
    TESSERA_CHECK(fits,
                  "redistribute: grad placement {} on mesh dim {} does not fit output placement {} (a Shard output's "
                  "gradient is sharded alike, a Replicate one's is Replicate or Partial, a Partial one's is Replicate)",
                  placement_name(grad[m]), m, placement_name(target[m]));
  }
}

// Partial read as Replicate: the layout of a Partial input's gradient.
Placements with_partial_as_replicate(Placements placements) {
  for (Placement& placement : placements) {
    if (is_partial(placement)) placement = Replicate{};
  }
  return placements;
}

class Redistribution : public autograd::Function {
 public:
  Redistribution(DeviceMesh mesh, Shape global_shape, Placements from, Placements to, Placements grad_from,
                 Placements grad_to)
      : mesh_(std::move(mesh)),
        global_shape_(std::move(global_shape)),
        from_(std::move(from)),
        to_(std::move(to)),
        grad_from_(std::move(grad_from)),
        grad_to_(std::move(grad_to)) {}

  TensorList forward(autograd::FunctionContext&, const TensorList& inputs) override {
    return {redistribute_local(inputs[0], mesh_, global_shape_, from_, to_)};
  }
  TensorList backward(autograd::FunctionContext&, const TensorList& grads) override {
    return {redistribute_local(grads[0], mesh_, global_shape_, grad_from_, grad_to_)};
  }
  std::string name() const override { return "Redistribute"; }

 private:
  DeviceMesh mesh_;
  Shape global_shape_;
  Placements from_, to_, grad_from_, grad_to_;
};

}  // namespace

Tensor redistribute_local(const Tensor& local, const DeviceMesh& mesh, const Shape& global_shape,
                          const Placements& from, const Placements& to) {
  TESSERA_CHECK(local.defined(), "redistribute: the local tensor is undefined");
  TESSERA_CHECK(mesh.ndim() > 0, "redistribute: the mesh is empty (default-constructed)");
  const LocalPiece held = local_piece(global_shape, mesh.shape(), mesh.coordinate(), from);
  const LocalPiece wanted = local_piece(global_shape, mesh.shape(), mesh.coordinate(), to);
  TESSERA_CHECK(local.sizes() == held.shape,
                "redistribute: local shape {} is not the piece {} that coordinate ({}) holds of global shape {}",
                local.sizes(), held.shape, fmt::join(mesh.coordinate(), ", "), global_shape);
  // A meta tensor has no bytes to move: the answer is its new shape.
  if (local.is_meta()) return ops::empty(wanted.shape, {.dtype = local.dtype(), .device = local.device()});

  Placements current = from;
  Tensor moved = local;
  bool copied = false;
  // 1. Unshard, innermost mesh dim first, so that each gather's rows are one
  //    piece of its outer neighbour's.
  for (size_t m = current.size(); m-- > 0;) {
    const Shard* shard = std::get_if<Shard>(&current[m]);
    if (shard == nullptr || !must_gather(current, to, m, shard->dim)) continue;
    const int64_t size = extent_before(global_shape, mesh, current, m, shard->dim);
    moved = gather_along(moved, mesh, static_cast<int64_t>(m), shard->dim, size);
    current[m] = Replicate{};
    copied = true;
  }
  // 2. Settle the pending sums that do not stay: a reduce-scatter where the
  //    target shards the piece held now, else an all-reduce.
  for (size_t m = 0; m < current.size(); ++m) {
    if (!is_partial(current[m]) || is_partial(to[m])) continue;
    const Shard* shard = std::get_if<Shard>(&to[m]);
    if (shard != nullptr && can_reduce_scatter(current, to, m, shard->dim)) {
      moved = reduce_scatter_along(moved, mesh, static_cast<int64_t>(m), shard->dim);
      current[m] = *shard;
    } else {
      moved = all_reduce_along(moved, mesh, static_cast<int64_t>(m));
      current[m] = Replicate{};
    }
    copied = true;
  }
  // 3. Shard (or mark pending), outermost mesh dim first: each slice is of
  //    the piece its outer neighbours left.
  for (size_t m = 0; m < current.size(); ++m) {
    if (current[m] == to[m]) continue;
    if (const Shard* shard = std::get_if<Shard>(&to[m])) {
      moved = slice_along(moved, mesh, static_cast<int64_t>(m), shard->dim);
    } else {
      moved = keep_on_first(moved, mesh, static_cast<int64_t>(m));
    }
    current[m] = to[m];
    copied = true;
  }
  return copied ? moved : ops::clone(moved);
}

DTensor redistribute(const DTensor& source, Placements target, const RedistributeOptions& options) {
  TESSERA_CHECK(source.defined(), "redistribute: the DTensor is undefined");
  Placements grad_from = options.grad_placements.value_or(with_partial_as_replicate(target));
  check_grad_placements(target, grad_from);
  Tensor local = autograd::Function::apply<Redistribution>({source.local()}, source.mesh(), source.global_shape(),
                                                           source.placements(), target, std::move(grad_from),
                                                           with_partial_as_replicate(source.placements()))[0];
  return DTensor(std::move(local), source.mesh(), std::move(target), source.global_shape());
}

}  // namespace tessera::dist
