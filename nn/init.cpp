// nn::init: Philox-backed initialisers that can fill any row slice of a
// logical tensor with the bits the whole would have had.
#include "nn/init.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace tessera::nn::init {

namespace {

// The global shape of `tensor` under `slice`, after checking that the local
// tensor really is rows [row_offset, row_offset + rows) of it.
Shape global_shape_of(const Tensor& tensor, const RowSlice& slice, const char* op) {
  TESSERA_CHECK(tensor.defined(), "init::{}: the tensor is undefined", op);
  if (slice.global_shape.empty()) {
    TESSERA_CHECK(slice.row_offset == 0, "init::{}: a row offset ({}) needs a global shape", op, slice.row_offset);
    return tensor.sizes();
  }
  const Shape& global = slice.global_shape;
  const Shape& local = tensor.sizes();
  bool inner_match = local.size() == global.size();
  for (size_t d = 1; inner_match && d < local.size(); ++d) inner_match = local[d] == global[d];
  TESSERA_CHECK(inner_match, "init::{}: local shape {} is not a row slice of global shape {}", op, local, global);
  TESSERA_CHECK(slice.row_offset >= 0 && slice.row_offset + local[0] <= global[0],
                "init::{}: rows [{}, {}) are outside the global shape {}", op, slice.row_offset,
                slice.row_offset + local[0], global);
  return global;
}

// Index of the local tensor's first element in the global tensor's sequence.
uint64_t first_index_of(const Tensor& tensor, const RowSlice& slice) {
  if (slice.global_shape.empty() || tensor.dim() == 0) return 0;
  const int64_t row_elements = shape_numel(slice.global_shape) / std::max<int64_t>(slice.global_shape[0], 1);
  return static_cast<uint64_t>(slice.row_offset * row_elements);
}

double gain_for_leaky_relu(double a) { return std::sqrt(2.0 / (1.0 + a * a)); }

}  // namespace

std::pair<int64_t, int64_t> fans(const Shape& shape) {
  TESSERA_CHECK(shape.size() >= 2, "init: fan in and fan out need a tensor of dim >= 2, got shape {}", shape);
  int64_t receptive = 1;
  for (size_t d = 2; d < shape.size(); ++d) receptive *= shape[d];
  return {shape[1] * receptive, shape[0] * receptive};
}

void normal_(Tensor& tensor, PhiloxKey key, double mean, double std, const RowSlice& slice) {
  global_shape_of(tensor, slice, "normal_");
  TESSERA_CHECK(std >= 0.0, "init::normal_: std must be >= 0, got {}", std);
  if (tensor.is_meta()) return;
  autograd::NoGradGuard no_grad;
  ops::normal_(tensor, key, mean, std, first_index_of(tensor, slice));
}

void uniform_(Tensor& tensor, PhiloxKey key, double low, double high, const RowSlice& slice) {
  global_shape_of(tensor, slice, "uniform_");
  TESSERA_CHECK(low <= high, "init::uniform_: low ({}) must be <= high ({})", low, high);
  if (tensor.is_meta()) return;
  autograd::NoGradGuard no_grad;
  ops::uniform_(tensor, key, low, high, first_index_of(tensor, slice));
}

void constant_(Tensor& tensor, double value) {
  TESSERA_CHECK(tensor.defined(), "init::constant_: the tensor is undefined");
  if (tensor.is_meta()) return;
  autograd::NoGradGuard no_grad;
  ops::fill_(tensor, value);
}

void zeros_(Tensor& tensor) { constant_(tensor, 0.0); }
void ones_(Tensor& tensor) { constant_(tensor, 1.0); }

void xavier_uniform_(Tensor& tensor, PhiloxKey key, double gain, const RowSlice& slice) {
  const auto [fan_in, fan_out] = fans(global_shape_of(tensor, slice, "xavier_uniform_"));
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  uniform_(tensor, key, -bound, bound, slice);
}

void xavier_normal_(Tensor& tensor, PhiloxKey key, double gain, const RowSlice& slice) {
  const auto [fan_in, fan_out] = fans(global_shape_of(tensor, slice, "xavier_normal_"));
  normal_(tensor, key, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), slice);
}

void kaiming_uniform_(Tensor& tensor, PhiloxKey key, double a, FanMode mode, const RowSlice& slice) {
  const auto [fan_in, fan_out] = fans(global_shape_of(tensor, slice, "kaiming_uniform_"));
  const int64_t fan = mode == FanMode::fan_in ? fan_in : fan_out;
  TESSERA_CHECK(fan > 0, "init::kaiming_uniform_: fan is 0 for shape {}", tensor.sizes());
  const double bound = std::sqrt(3.0) * gain_for_leaky_relu(a) / std::sqrt(static_cast<double>(fan));
  uniform_(tensor, key, -bound, bound, slice);
}

void kaiming_normal_(Tensor& tensor, PhiloxKey key, double a, FanMode mode, const RowSlice& slice) {
  const auto [fan_in, fan_out] = fans(global_shape_of(tensor, slice, "kaiming_normal_"));
  const int64_t fan = mode == FanMode::fan_in ? fan_in : fan_out;
  TESSERA_CHECK(fan > 0, "init::kaiming_normal_: fan is 0 for shape {}", tensor.sizes());
  normal_(tensor, key, 0.0, gain_for_leaky_relu(a) / std::sqrt(static_cast<double>(fan)), slice);
}

// The Parameter overloads fill each element with the value the logical
// tensor has there. The local tensor is cut into runs whose elements are
// consecutive in the logical tensor: one run for a whole tensor or an FSDP
// shard of rows; for a tensor-parallel Shard(d), one run per box and index
// of the dims before d (a row-wise weight's piece: one run per row).
namespace {

struct GlobalRun {
  Tensor local;          // a view of the parameter's tensor
  uint64_t first_index;  // the logical index of its first element
};

int64_t product(const Shape& shape, size_t begin, size_t end) {
  int64_t result = 1;
  for (size_t d = begin; d < end; ++d) result *= shape[d];
  return result;
}

// Where the local rows sit along the logical dim 0: the parameter's FSDP
// rows (or all of them) of its tensor-parallel piece (or of the whole).
using RowSegment = TensorParallelSpec::RowRun;
std::vector<RowSegment> row_segments(int64_t first_row, int64_t rows, const TensorParallelSpec* tensor_parallel) {
  if (tensor_parallel == nullptr) return {{0, rows, first_row}};
  return tensor_parallel->logical_rows(first_row, rows, tensor_parallel->mesh.coordinate(0));
}

std::vector<GlobalRun> global_runs(Parameter& parameter) {
  Tensor& local = parameter.tensor();
  if (local.dim() == 0) return {{local, 0}};
  const auto& sharding = parameter.sharding();
  const TensorParallelSpec* tensor_parallel = parameter.tensor_parallel().get();
  const Shape& global = parameter.global_shape();
  const int64_t first_row = sharding ? sharding->row_offset : 0;
  const std::vector<RowSegment> segments = row_segments(first_row, local.size(0), tensor_parallel);
  const int64_t dim = tensor_parallel ? tensor_parallel->shard_dim() : -1;
  std::vector<GlobalRun> runs;
  if (dim <= 0) {  // whole logical rows
    const int64_t row_elements = product(global, 1, global.size());
    for (const RowSegment& segment : segments) {
      runs.push_back({ops::narrow(local, 0, segment.piece_row, segment.count),
                      static_cast<uint64_t>(segment.logical_row * row_elements)});
    }
    return runs;
  }
  // Shard(d), d >= 1: in each row, one run per box and index of the dims
  // between 0 and d.
  const auto d = static_cast<size_t>(dim);
  const int64_t middle = product(global, 1, d);
  const int64_t inner = product(global, d + 1, global.size());
  const std::vector<dist::ShardExtent> boxes = tensor_parallel->boxes(tensor_parallel->mesh.coordinate(0));
  for (const RowSegment& segment : segments) {
    for (int64_t i = 0; i < segment.count; ++i) {
      const Tensor row = ops::view(ops::narrow(local, 0, segment.piece_row + i, 1), {middle, local.size(dim), inner});
      int64_t piece_offset = 0;
      for (const dist::ShardExtent& box : boxes) {
        for (int64_t m = 0; m < middle && box.length > 0; ++m) {
          const int64_t global_outer = (segment.logical_row + i) * middle + m;
          runs.push_back({ops::narrow(ops::narrow(row, 1, piece_offset, box.length), 0, m, 1),
                          static_cast<uint64_t>((global_outer * global[d] + box.offset) * inner)});
        }
        piece_offset += box.length;
      }
    }
  }
  return runs;
}

}  // namespace

void normal_(Parameter& parameter, PhiloxKey key, double mean, double std) {
  TESSERA_CHECK(std >= 0.0, "init::normal_: std must be >= 0, got {}", std);
  if (parameter.tensor().is_meta()) return;
  autograd::NoGradGuard no_grad;
  for (GlobalRun& run : global_runs(parameter)) ops::normal_(run.local, key, mean, std, run.first_index);
}

void uniform_(Parameter& parameter, PhiloxKey key, double low, double high) {
  TESSERA_CHECK(low <= high, "init::uniform_: low ({}) must be <= high ({})", low, high);
  if (parameter.tensor().is_meta()) return;
  autograd::NoGradGuard no_grad;
  for (GlobalRun& run : global_runs(parameter)) ops::uniform_(run.local, key, low, high, run.first_index);
}

void zeros_(Parameter& parameter) { zeros_(parameter.tensor()); }
void ones_(Parameter& parameter) { ones_(parameter.tensor()); }

void zero_rows_(Parameter& parameter, int64_t begin, int64_t end) {
  Tensor& local = parameter.tensor();
  TESSERA_CHECK(local.dim() >= 1 && 0 <= begin && begin <= end && end <= parameter.global_shape()[0],
                "init::zero_rows_: rows [{}, {}) of a parameter of shape {}", begin, end, parameter.global_shape());
  if (local.is_meta()) return;
  const int64_t first_row = parameter.sharding() ? parameter.sharding()->row_offset : 0;
  for (const RowSegment& segment : row_segments(first_row, local.size(0), parameter.tensor_parallel().get())) {
    const int64_t first = std::max(begin, segment.logical_row);
    const int64_t last = std::min(end, segment.logical_row + segment.count);
    if (first >= last) continue;
    Tensor rows = ops::narrow(local, 0, segment.piece_row + first - segment.logical_row, last - first);
    zeros_(rows);
  }
}

void kaiming_uniform_(Parameter& parameter, PhiloxKey key, double a, FanMode mode) {
  const auto [fan_in, fan_out] = fans(parameter.global_shape());
  const int64_t fan = mode == FanMode::fan_in ? fan_in : fan_out;
  TESSERA_CHECK(fan > 0, "init::kaiming_uniform_: fan is 0 for shape {}", parameter.global_shape());
  const double bound = std::sqrt(3.0) * gain_for_leaky_relu(a) / std::sqrt(static_cast<double>(fan));
  uniform_(parameter, key, -bound, bound);
}

uint64_t next_seed() {
  const PhiloxKey key = default_generator().next_key();
  // splitmix64 of the key: distinct keys give unrelated seeds.
  uint64_t z = key.seed ^ (key.stream * 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace tessera::nn::init
