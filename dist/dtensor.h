// DTensor: one logical (global) tensor stored as per-rank pieces over a
// DeviceMesh. Each mesh dim has a placement: Replicate (every rank along the
// dim holds the same data), Shard(d) (tensor dim d is split along the mesh
// dim) or Partial (every rank along the dim holds a term of a pending sum: the
// value is their sum, as a row-wise matmul leaves it). Splitting is
// ceil-chunking, as in torch.chunk: with size S over N
// ranks, chunk = ceil(S / N), rank i holds [i*chunk, min((i+1)*chunk, S)), so
// trailing ranks are short or empty (97 rows over 8 ranks: 13,13,...,13,6).
// When several mesh dims shard the same tensor dim, the first splits it and
// the next splits each piece again.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "dist/device_mesh.h"
#include "tensor/tensor.h"

namespace tessera::dist {

struct Replicate {
  bool operator==(const Replicate&) const = default;
};
struct Shard {
  int64_t dim = 0;
  bool operator==(const Shard&) const = default;
};
struct Partial {
  bool operator==(const Partial&) const = default;
};
using Placement = std::variant<Replicate, Shard, Partial>;
using Placements = std::vector<Placement>;

std::string placement_name(const Placement& placement);  // "Replicate()", "Shard(0)", "Partial(sum)"

// The piece of [0, size) that shard `index` of `num_shards` holds.
struct ShardExtent {
  int64_t offset = 0;
  int64_t length = 0;
};
ShardExtent shard_extent(int64_t size, int64_t num_shards, int64_t index);

// The local shape and global offset of the piece held at `coordinate` of a
// mesh of `mesh_shape` (pure arithmetic, usable for any rank).
struct LocalPiece {
  Shape shape;
  Shape offset;
};
LocalPiece local_piece(const Shape& global_shape, const Shape& mesh_shape, const std::vector<int64_t>& coordinate,
                       const Placements& placements);

class DTensor {
 public:
  DTensor() = default;
  // Wraps this rank's piece; its shape must be the one local_piece gives.
  DTensor(Tensor local, DeviceMesh mesh, Placements placements, Shape global_shape);

  bool defined() const { return local_.defined(); }
  const Tensor& local() const { return local_; }
  const DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const Shape& global_shape() const { return global_shape_; }
  const Shape& local_offset() const { return local_offset_; }  // where local() starts in the global tensor
  DType dtype() const { return local_.dtype(); }
  Device device() const { return local_.device(); }

  // The whole tensor on every rank (all-gathers along each sharded mesh dim,
  // all-reduces along each Partial one; collective over the mesh). Not
  // differentiable: redistribute to Replicate everywhere for that.
  Tensor full_tensor() const;

  // "DTensor(global [97, 16], local [13, 16] at [13, 0], (Shard(0)), mesh ...)"
  std::string to_string() const;

 private:
  Tensor local_;
  DeviceMesh mesh_;
  Placements placements_;
  Shape global_shape_;
  Shape local_offset_;
};

// Each rank passes the same `full` tensor and keeps its own piece (a
// contiguous copy; no communication). Along a Partial mesh dim, coordinate 0
// holds the value and the others zeros.
DTensor distribute(const Tensor& full, const DeviceMesh& mesh, Placements placements);

}  // namespace tessera::dist
