// Printing tensors the way NumPy and torch do: nested brackets, one common
// width per tensor, "..." in place of the middle of large tensors, then the
// shape, dtype and device (meta tensors print those alone, having no values).
#include <cmath>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

constexpr int64_t kSummaryThreshold = 1000;  // more elements than this are summarised
constexpr int64_t kEdgeItems = 3;            // shown at each end of a summarised dim
constexpr int64_t kGap = -1;                 // marks the "..." between them

std::vector<int64_t> shown_indices(int64_t size, bool summarise) {
  std::vector<int64_t> indices;
  if (!summarise || size <= 2 * kEdgeItems) {
    for (int64_t i = 0; i < size; ++i) indices.push_back(i);
    return indices;
  }
  for (int64_t i = 0; i < kEdgeItems; ++i) indices.push_back(i);
  indices.push_back(kGap);
  for (int64_t i = size - kEdgeItems; i < size; ++i) indices.push_back(i);
  return indices;
}

// Formats the shown elements of a CPU tensor and lays them out.
class Printer {
 public:
  explicit Printer(const Tensor& host) : tensor_(host), summarise_(host.numel() > kSummaryThreshold) {}

  std::string values() {
    walk(0, 0);
    format_cells();
    std::string out;
    emit(0, 0, out);
    return out;
  }

 private:
  // Visits the shown elements in order, recording their values.
  void walk(int64_t dim, int64_t offset) {
    if (dim == tensor_.dim()) {
      read(offset);
      return;
    }
    for (int64_t i : shown_indices(tensor_.sizes()[dim], summarise_)) {
      if (i != kGap) walk(dim + 1, offset + i * tensor_.strides()[dim]);
    }
  }

  void read(int64_t offset) {
    visit_dtype(tensor_.dtype(), [&]<typename T>(T) {
      const T value = static_cast<const T*>(tensor_.raw_data())[offset];
      if constexpr (std::is_integral_v<T>) {
        integers_.push_back(static_cast<int64_t>(value));
      } else if constexpr (std::is_same_v<T, double>) {
        floats_.push_back(value);
      } else {
        floats_.push_back(static_cast<double>(static_cast<float>(value)));
      }
    });
  }

  void format_cells() {
    if (tensor_.dtype() == DType::boolean) {
      for (int64_t value : integers_) cells_.push_back(value != 0 ? "true" : "false");
    } else if (!is_floating(tensor_.dtype())) {
      for (int64_t value : integers_) cells_.push_back(fmt::format("{}", value));
    } else {
      // Fixed point with 4 decimals unless the magnitudes call for exponents.
      double max_abs = 0.0;
      double min_nonzero = INFINITY;
      for (double value : floats_) {
        if (!std::isfinite(value)) continue;
        max_abs = std::max(max_abs, std::abs(value));
        if (value != 0.0) min_nonzero = std::min(min_nonzero, std::abs(value));
      }
      const bool scientific = max_abs >= 1e8 || min_nonzero < 1e-4;
      for (double value : floats_) {
        if (std::isnan(value)) {
          cells_.push_back("nan");
        } else if (std::isinf(value)) {
          cells_.push_back(value > 0 ? "inf" : "-inf");
        } else {
          cells_.push_back(scientific ? fmt::format("{:.4e}", value) : fmt::format("{:.4f}", value));
        }
      }
    }
    for (const std::string& cell : cells_) width_ = std::max(width_, cell.size());
  }

  // NumPy layout: rows of the last dim on one line; one blank line more
  // between blocks for each dim further out.
  void emit(int64_t dim, int64_t offset, std::string& out) {
    if (tensor_.dim() == 0) {
      out += cells_[next_cell_++];
      return;
    }
    const int64_t ndim = tensor_.dim();
    const std::string separator = dim == ndim - 1 ? " "
                                                  : std::string(static_cast<size_t>(ndim - dim - 1), '\n') +
                                                        std::string(static_cast<size_t>(kIndent + dim + 1), ' ');
    out += '[';
    bool first = true;
    for (int64_t i : shown_indices(tensor_.sizes()[dim], summarise_)) {
      if (!first) out += "," + separator;
      first = false;
      if (i == kGap) {
        out += "...";
      } else if (dim == ndim - 1) {
        const std::string& cell = cells_[next_cell_++];
        out += std::string(width_ - cell.size(), ' ') + cell;
      } else {
        emit(dim + 1, offset + i * tensor_.strides()[dim], out);
      }
    }
    out += ']';
  }

  static constexpr int64_t kIndent = 7;  // strlen("tensor(")
  const Tensor& tensor_;
  const bool summarise_;
  std::vector<double> floats_;
  std::vector<int64_t> integers_;
  std::vector<std::string> cells_;
  size_t width_ = 0;
  size_t next_cell_ = 0;
};

}  // namespace

std::string to_string(const Tensor& tensor) {
  if (!tensor.defined()) return "tensor(undefined)";
  std::string values;
  if (tensor.is_meta()) {
    values = "...";
  } else if (tensor.numel() == 0) {
    values = "[]";
  } else {
    const GradInputsAllowed printing_loses_no_gradient;
    const Tensor host = to(tensor, kCPU);
    values = Printer(host).values();
  }
  std::string text = fmt::format("tensor({}, shape={}, dtype={}, device={}", values, tensor.sizes(),
                                 dtype_name(tensor.dtype()), tensor.device().str());
  if (tensor.requires_grad()) text += ", requires_grad=true";
  return text + ")";
}

}  // namespace tessera::ops

namespace tessera {

std::ostream& operator<<(std::ostream& stream, const Tensor& tensor) { return stream << ops::to_string(tensor); }

}  // namespace tessera
