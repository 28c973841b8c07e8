// DeviceMesh: the ranks of a job arranged in an N-D grid with named dims,
// e.g. {2, 4} as ("replicate", "shard") for HSDP. Each dim has its own process
// group over the ranks that differ only in that coordinate, so FSDP can
// all-gather along "shard" and all-reduce along "replicate".
// Ranks are laid out row-major: world rank = sum(coordinate[d] * stride[d]).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "tensor/device.h"

namespace tessera::dist {

class DeviceMesh {
 public:
  DeviceMesh() = default;
  // Collective over `group`: lays its ranks out as `shape` (whose product
  // must equal the group size) and creates one sub-group per dim. Names must
  // be unique and non-empty; default names are "dim0", "dim1", ...
  DeviceMesh(ProcessGroupPtr group, Device device, Shape shape, std::vector<std::string> dim_names = {});

  // A mesh of sizes and one rank's coordinate, without process groups: what
  // a plan lays a meta model out on (train --plan tensor-parallelizes a model
  // as rank `coordinate` would, for any mesh, starting no rank). Not
  // collective; group(dim) and rank() throw on it, group() is null.
  static DeviceMesh planning(Device device, Shape shape, std::vector<std::string> dim_names,
                             std::vector<int64_t> coordinate);
  // Whether this mesh has process groups (false for a planning mesh).
  bool has_groups() const { return mesh_group_ != nullptr; }

  Device device() const { return device_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  const Shape& shape() const { return shape_; }
  int64_t size() const;  // ranks in the mesh
  int64_t size(int64_t dim) const;
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  // The index of a named dim; throws listing the names there are.
  int64_t dim_index(const std::string& name) const;

  // This rank's coordinates in the mesh, and its rank in the mesh's group.
  const std::vector<int64_t>& coordinate() const { return coordinate_; }
  int64_t coordinate(int64_t dim) const;
  int rank() const;

  // The group of ranks that share every coordinate but `dim`.
  const ProcessGroupPtr& group(int64_t dim) const;
  const ProcessGroupPtr& group(const std::string& name) const { return group(dim_index(name)); }
  // The group of the whole mesh.
  const ProcessGroupPtr& group() const { return mesh_group_; }

  // The 1-D sub-mesh along `name` that contains this rank (no communication).
  DeviceMesh operator[](const std::string& name) const;

  // "DeviceMesh(cpu, (replicate=2, shard=4), coordinate (1, 3))"
  std::string to_string() const;

 private:
  Device device_ = kCPU;
  Shape shape_;
  std::vector<std::string> dim_names_;
  std::vector<int64_t> coordinate_;
  ProcessGroupPtr mesh_group_;
  std::vector<ProcessGroupPtr> dim_groups_;
};

// A mesh over the calling rank's world group (dist::world()).
DeviceMesh init_device_mesh(Device device, Shape shape, std::vector<std::string> dim_names = {});

}  // namespace tessera::dist
