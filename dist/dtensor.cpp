// DTensor: the arithmetic of ceil-chunked pieces (which rank holds which
// slice of the global tensor), the checks that a local tensor is that slice,
// and the two conversions: distribute (slice, no communication) and
// full_tensor (redistribute_local to Replicate on every mesh dim).
#include "dist/dtensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "dist/redistribute.h"
#include "tensor/ops.h"

namespace tessera::dist {

namespace {

// "(Shard(0), Replicate())"
std::string placements_name(const Placements& placements) {
  std::vector<std::string> names;
  for (const Placement& placement : placements) names.push_back(placement_name(placement));
  return fmt::format("({})", fmt::join(names, ", "));
}

// Checks what local_piece needs before any arithmetic: one placement and one
// coordinate per mesh dim, coordinates inside the mesh, Shard dims inside the tensor.
void check_layout(const char* op, const Shape& global_shape, const Shape& mesh_shape,
                  const std::vector<int64_t>& coordinate, const Placements& placements) {
  TESSERA_CHECK(placements.size() == mesh_shape.size(), "{}: {} placements {} for a {}-d mesh of shape {}", op,
                placements.size(), placements_name(placements), mesh_shape.size(), mesh_shape);
  TESSERA_CHECK(coordinate.size() == mesh_shape.size(), "{}: coordinate {} does not fit a mesh of shape {}", op,
                coordinate, mesh_shape);
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    TESSERA_CHECK(coordinate[m] >= 0 && coordinate[m] < mesh_shape[m],
                  "{}: coordinate {} is outside a mesh of shape {}", op, coordinate, mesh_shape);
  }
  for (int64_t extent : global_shape) {
    TESSERA_CHECK(extent >= 0, "{}: global shape {} has a negative size", op, global_shape);
  }
  const auto ndim = static_cast<int64_t>(global_shape.size());
  for (const Placement& placement : placements) {
    if (const Shard* shard = std::get_if<Shard>(&placement)) {
      TESSERA_CHECK(shard->dim >= 0 && shard->dim < ndim, "{}: {} is out of range for a {}-d tensor of shape {}", op,
                    placement_name(placement), ndim, global_shape);
    }
  }
}

// local_piece after check_layout.
LocalPiece checked_local_piece(const Shape& global_shape, const Shape& mesh_shape,
                               const std::vector<int64_t>& coordinate, const Placements& placements) {
  LocalPiece piece{.shape = global_shape, .offset = Shape(global_shape.size(), 0)};
  // Mesh dims apply in order, so a later mesh dim sharding the same tensor dim
  // splits the piece the earlier one left.
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    if (const Shard* shard = std::get_if<Shard>(&placements[m])) {
      const ShardExtent extent = shard_extent(piece.shape[shard->dim], mesh_shape[m], coordinate[m]);
      piece.offset[shard->dim] += extent.offset;
      piece.shape[shard->dim] = extent.length;
    }
  }
  return piece;
}

}  // namespace

std::string placement_name(const Placement& placement) {
  if (const Shard* shard = std::get_if<Shard>(&placement)) return fmt::format("Shard({})", shard->dim);
  if (std::holds_alternative<Partial>(placement)) return "Partial(sum)";
  return "Replicate()";
}

ShardExtent shard_extent(int64_t size, int64_t num_shards, int64_t index) {
  TESSERA_CHECK(size >= 0, "shard_extent: size must be >= 0, got {}", size);
  TESSERA_CHECK(num_shards >= 1, "shard_extent: num_shards must be >= 1, got {}", num_shards);
  TESSERA_CHECK(index >= 0 && index < num_shards, "shard_extent: index {} is outside [0, {})", index, num_shards);
  const int64_t chunk = size / num_shards + (size % num_shards != 0 ? 1 : 0);  // ceil, without overflow
  // offset = min(index * chunk, size), tested without forming a product that could overflow.
  const int64_t offset = (chunk == 0 || index > size / chunk) ? size : index * chunk;
  return {.offset = offset, .length = std::min(chunk, size - offset)};
}

LocalPiece local_piece(const Shape& global_shape, const Shape& mesh_shape, const std::vector<int64_t>& coordinate,
                       const Placements& placements) {
  check_layout("local_piece", global_shape, mesh_shape, coordinate, placements);
  return checked_local_piece(global_shape, mesh_shape, coordinate, placements);
}

DTensor::DTensor(Tensor local, DeviceMesh mesh, Placements placements, Shape global_shape)
    : local_(std::move(local)),
      mesh_(std::move(mesh)),
      placements_(std::move(placements)),
      global_shape_(std::move(global_shape)) {
  TESSERA_CHECK(local_.defined(), "DTensor: the local tensor is undefined");
  TESSERA_CHECK(mesh_.ndim() > 0, "DTensor: the mesh is empty (default-constructed)");
  check_layout("DTensor", global_shape_, mesh_.shape(), mesh_.coordinate(), placements_);
  LocalPiece piece = checked_local_piece(global_shape_, mesh_.shape(), mesh_.coordinate(), placements_);
  TESSERA_CHECK(local_.sizes() == piece.shape,
                "DTensor: local shape {} is not the piece {} that coordinate ({}) holds of global shape {} under {}",
                local_.sizes(), piece.shape, fmt::join(mesh_.coordinate(), ", "), global_shape_,
                placements_name(placements_));
  local_offset_ = std::move(piece.offset);
}

Tensor DTensor::full_tensor() const {
  TESSERA_CHECK(defined(), "DTensor::full_tensor: the DTensor is undefined");
  Tensor full = redistribute_local(local_, mesh_, global_shape_, placements_,
                                   Placements(placements_.size(), Replicate{}));
  // A tensor with no elements counts as contiguous whatever its strides: give
  // it the canonical ones.
  return full.numel() == 0 ? ops::empty(global_shape_, {.dtype = dtype(), .device = device()}) : full;
}

std::string DTensor::to_string() const {
  if (!defined()) return "DTensor(undefined)";
  return fmt::format("DTensor(global {}, local {} at {}, {}, {}, {})", global_shape_, local_.sizes(), local_offset_,
                     placements_name(placements_), dtype_name(dtype()), mesh_.to_string());
}

DTensor distribute(const Tensor& full, const DeviceMesh& mesh, Placements placements) {
  TESSERA_CHECK(full.defined(), "distribute: the tensor is undefined");
  TESSERA_CHECK(mesh.ndim() > 0, "distribute: the mesh is empty (default-constructed)");
  check_layout("distribute", full.sizes(), mesh.shape(), mesh.coordinate(), placements);
  const LocalPiece piece = checked_local_piece(full.sizes(), mesh.shape(), mesh.coordinate(), placements);
  Tensor slice = full;
  for (int64_t d = 0; d < full.dim(); ++d) {
    if (piece.shape[d] != full.size(d)) slice = ops::narrow(slice, d, piece.offset[d], piece.shape[d]);
  }
  bool holds_value = true;  // zeros off coordinate 0 of a Partial mesh dim
  for (size_t m = 0; m < placements.size(); ++m) {
    const bool off_first = mesh.coordinate(static_cast<int64_t>(m)) != 0;
    if (std::holds_alternative<Partial>(placements[m]) && off_first) holds_value = false;
  }
  Tensor local = holds_value ? ops::clone(slice)
                             : ops::zeros(piece.shape, {.dtype = full.dtype(), .device = full.device()});
  return DTensor(std::move(local), mesh, std::move(placements), full.sizes());
}

}  // namespace tessera::dist
