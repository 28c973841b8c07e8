// DeviceMesh: validation of the grid, row-major coordinates, and one sub-group
// per mesh dim made by ProcessGroup::split. Building a mesh is collective over
// its group; slicing one (mesh["shard"]) is not.
#include "dist/device_mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "dist/init.h"

namespace tessera::dist {

namespace {

// "(replicate=2, shard=4)"
std::string named_shape(const Shape& shape, const std::vector<std::string>& names) {
  std::vector<std::string> parts;
  for (size_t d = 0; d < shape.size(); ++d) parts.push_back(fmt::format("{}={}", names[d], shape[d]));
  return fmt::format("({})", fmt::join(parts, ", "));
}

std::vector<std::string> checked_dim_names(const Shape& shape, std::vector<std::string> names) {
  if (names.empty()) {
    for (size_t d = 0; d < shape.size(); ++d) names.push_back(fmt::format("dim{}", d));
    return names;
  }
  TESSERA_CHECK(names.size() == shape.size(), "DeviceMesh: {} dim names {} for a {}-d mesh of shape {}", names.size(),
                names, shape.size(), shape);
  std::set<std::string> seen;
  for (const std::string& name : names) {
    TESSERA_CHECK(!name.empty(), "DeviceMesh: dim names must be non-empty, got {}", names);
    TESSERA_CHECK(seen.insert(name).second, "DeviceMesh: dim name \"{}\" repeats in {}", name, names);
  }
  return names;
}

// Wraps a possibly negative mesh dim into [0, ndim).
size_t checked_dim(int64_t dim, const Shape& shape, const std::vector<std::string>& names, const char* op) {
  const auto ndim = static_cast<int64_t>(shape.size());
  TESSERA_CHECK(dim >= -ndim && dim < ndim, "{}: dim {} out of range for a {}-d mesh {}", op, dim, ndim,
                named_shape(shape, names));
  return static_cast<size_t>(dim < 0 ? dim + ndim : dim);
}

// The product of the sizes as a double: exact for any mesh that could match
// a group, and no overflow for absurd shapes.
double mesh_ranks(const Shape& shape) {
  double ranks = 1;
  for (int64_t extent : shape) ranks *= static_cast<double>(extent);
  return ranks;
}

// Row-major strides of the grid: the group rank at coordinate c is sum(c[d] * stride[d]).
Shape row_major_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

}  // namespace

DeviceMesh::DeviceMesh(ProcessGroupPtr group, Device device, Shape shape, std::vector<std::string> dim_names)
    : device_(device), shape_(std::move(shape)) {
  TESSERA_CHECK(group != nullptr, "DeviceMesh: the process group is null");
  TESSERA_CHECK(!shape_.empty(), "DeviceMesh: the mesh shape needs at least one dim, got []");
  for (int64_t extent : shape_) {
    TESSERA_CHECK(extent > 0, "DeviceMesh: mesh sizes must be positive, got shape {}", shape_);
  }
  TESSERA_CHECK(mesh_ranks(shape_) == group->size(), "DeviceMesh: shape {} holds {} ranks but group \"{}\" has {}",
                shape_, mesh_ranks(shape_), group->name(), group->size());
  dim_names_ = checked_dim_names(shape_, std::move(dim_names));
  mesh_group_ = std::move(group);

  const Shape strides = row_major_strides(shape_);
  int64_t remainder = mesh_group_->rank();
  for (int64_t d = 0; d < ndim(); ++d) {
    coordinate_.push_back(remainder / strides[d]);
    remainder %= strides[d];
  }

  // Every rank creates the groups of every dim in the same order, as split
  // is collective over the mesh group. Along dim d, the members are the ranks
  // at this rank's coordinate with coordinate d running 0..shape[d]-1.
  for (int64_t d = 0; d < ndim(); ++d) {
    const int64_t base = mesh_group_->rank() - coordinate_[d] * strides[d];
    std::vector<int> members;
    for (int64_t k = 0; k < shape_[d]; ++k) members.push_back(static_cast<int>(base + k * strides[d]));
    dim_groups_.push_back(mesh_group_->split(members, dim_names_[d]));
  }
}

DeviceMesh DeviceMesh::planning(Device device, Shape shape, std::vector<std::string> dim_names,
                                 std::vector<int64_t> coordinate) {
  TESSERA_CHECK(!shape.empty(), "DeviceMesh::planning: the mesh shape needs at least one dim, got []");
  for (int64_t extent : shape) {
    TESSERA_CHECK(extent > 0, "DeviceMesh::planning: mesh sizes must be positive, got shape {}", shape);
  }
  TESSERA_CHECK(coordinate.size() == shape.size(), "DeviceMesh::planning: coordinate {} for a {}-d mesh of shape {}",
                coordinate, shape.size(), shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    TESSERA_CHECK(coordinate[d] >= 0 && coordinate[d] < shape[d],
                  "DeviceMesh::planning: coordinate {} is outside the mesh of shape {}", coordinate, shape);
  }
  DeviceMesh mesh;
  mesh.device_ = device;
  mesh.dim_names_ = checked_dim_names(shape, std::move(dim_names));
  mesh.shape_ = std::move(shape);
  mesh.coordinate_ = std::move(coordinate);
  return mesh;
}

int64_t DeviceMesh::size() const { return shape_numel(shape_); }

int64_t DeviceMesh::size(int64_t dim) const { return shape_[checked_dim(dim, shape_, dim_names_, "DeviceMesh::size")]; }

int64_t DeviceMesh::dim_index(const std::string& name) const {
  const auto found = std::find(dim_names_.begin(), dim_names_.end(), name);
  TESSERA_CHECK(found != dim_names_.end(), "DeviceMesh: no dim named \"{}\"; the dims are {}", name, dim_names_);
  return found - dim_names_.begin();
}

int64_t DeviceMesh::coordinate(int64_t dim) const {
  return coordinate_[checked_dim(dim, shape_, dim_names_, "DeviceMesh::coordinate")];
}

int DeviceMesh::rank() const {
  TESSERA_CHECK(mesh_group_ != nullptr,
                "DeviceMesh::rank: the mesh has no process group (default-constructed, or a planning mesh)");
  return mesh_group_->rank();
}

const ProcessGroupPtr& DeviceMesh::group(int64_t dim) const {
  const size_t index = checked_dim(dim, shape_, dim_names_, "DeviceMesh::group");
  TESSERA_CHECK(!dim_groups_.empty(),
                "DeviceMesh::group: {} is a planning mesh (sizes only) and has no process groups; build the mesh over "
                "a process group to communicate",
                to_string());
  return dim_groups_[index];
}

DeviceMesh DeviceMesh::operator[](const std::string& name) const {
  const int64_t d = dim_index(name);
  DeviceMesh sub;
  sub.device_ = device_;
  sub.shape_ = {shape_[d]};
  sub.dim_names_ = {dim_names_[d]};
  sub.coordinate_ = {coordinate_[d]};
  if (has_groups()) {
    sub.mesh_group_ = dim_groups_[d];
    sub.dim_groups_ = {dim_groups_[d]};
  }
  return sub;
}

std::string DeviceMesh::to_string() const {
  return fmt::format("DeviceMesh({}, {}, coordinate ({}))", device_.str(), named_shape(shape_, dim_names_),
                     fmt::join(coordinate_, ", "));
}

DeviceMesh init_device_mesh(Device device, Shape shape, std::vector<std::string> dim_names) {
  return DeviceMesh(world(), device, std::move(shape), std::move(dim_names));
}

}  // namespace tessera::dist
