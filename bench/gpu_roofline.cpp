// The H100 model's figures with their sources, the calibration file's reader
// and the per-kernel roofline (see gpu_roofline.h).
#include "bench/gpu_roofline.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "tensor/error.h"

namespace bench {

namespace {

constexpr int64_t kTile = 128;  // an output tile of a Hopper cuBLAS GEMM kernel, in rows and in columns

// "integer 3", "string \"x\"", "array": what came, for "expected X, got Y".
std::string json_kind(const nlohmann::json& value) {
  if (value.is_primitive()) return fmt::format("{} {}", value.type_name(), value.dump());
  return value.type_name();
}

std::string required_string(const nlohmann::json& json, std::string_view field, const std::string& where) {
  const auto found = json.find(field);
  TESSERA_CHECK(found != json.end(), "{}: field '{}' is missing (every calibration says what it measured and how)",
                where, field);
  TESSERA_CHECK(found->is_string() && !found->get<std::string>().empty(),
                "{}: field '{}' must be a non-empty string, got {}", where, field, json_kind(*found));
  return found->get<std::string>();
}

// A figure of the calibration: a positive number, at most `ceiling` (a peak
// the measurement cannot beat; 0 for none).
double positive_number(const nlohmann::json& json, std::string_view field, double ceiling, const std::string& where) {
  const auto found = json.find(field);
  TESSERA_CHECK(found != json.end(), "{}: field '{}' is missing", where, field);
  TESSERA_CHECK(found->is_number(), "{}: field '{}' must be a number, got {}", where, field, json_kind(*found));
  const double value = found->get<double>();
  TESSERA_CHECK(value > 0, "{}: field '{}' must be positive, got {}", where, field, found->dump());
  TESSERA_CHECK(ceiling <= 0 || value <= ceiling, "{}: field '{}' is {}, above the model's peak {} (a measurement "
                "cannot beat the spec sheet; check its units)", where, field, found->dump(), ceiling);
  return value;
}

int64_t positive_integer(const nlohmann::json& json, std::string_view field, const std::string& where) {
  const auto found = json.find(field);
  TESSERA_CHECK(found != json.end(), "{}: field '{}' is missing", where, field);
  TESSERA_CHECK(found->is_number_integer() && found->get<int64_t>() > 0,
                "{}: field '{}' must be a positive integer, got {}", where, field, json_kind(*found));
  return found->get<int64_t>();
}

template <size_t N>
void check_known_fields(const nlohmann::json& json, const std::array<std::string_view, N>& known,
                        const std::string& where) {
  for (const auto& [key, value] : json.items()) {
    TESSERA_CHECK(std::find(known.begin(), known.end(), key) != known.end(), "{}: unknown field '{}' (known: {})",
                  where, key, fmt::join(known, ", "));
  }
}

bool same_shape(const GemmShape& a, const GemmShape& b) { return a.m == b.m && a.n == b.n && a.k == b.k; }

std::string shape_text(const GemmShape& s) { return fmt::format("{}x{}x{}", s.m, s.n, s.k); }

double gemm_flops(const GemmCalls& g) {
  return 2.0 * static_cast<double>(g.shape.m) * static_cast<double>(g.shape.n) * static_cast<double>(g.shape.k) *
         g.calls;
}

}  // namespace

const char* bound_name(Bound bound) {
  switch (bound) {
    case Bound::hbm: return "hbm";
    case Bound::shared: return "shared";
    case Bound::tensor: return "tensor";
    case Bound::cuda_core: return "cuda-core";
    case Bound::launch: return "launch";
  }
  return "?";
}

Figure GpuModel::gemm_efficiency(const GemmShape& shape) const {
  const GemmEfficiency* lowest = nullptr;
  for (const GemmEfficiency& entry : gemm_table) {
    if (same_shape(entry.shape, shape)) return entry.efficiency;
    if (entry.shape.m <= shape.m && entry.shape.n <= shape.n && entry.shape.k <= shape.k &&
        (lowest == nullptr || entry.efficiency.value < lowest->efficiency.value)) {
      lowest = &entry;
    }
  }
  if (lowest != nullptr) {
    return {lowest->efficiency.value,
            fmt::format("the lowest measured shape no larger than it, {}: {}", shape_text(lowest->shape),
                        lowest->efficiency.source)};
  }
  const double tiles = static_cast<double>((shape.m + kTile - 1) / kTile) *
                       static_cast<double>((shape.n + kTile - 1) / kTile);
  return tiles < 2 * sms.value ? gemm_few_tiles_efficiency : gemm_default_efficiency;
}

GpuModel h100_sxm() {
  const std::string datasheet = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM";
  const std::string review = "measured on an H100 80GB HBM3 in issue 28's review";
  GpuModel m;
  m.name = "H100 SXM5 80GB HBM3";
  m.sms = {132, "NVIDIA H100 whitepaper (Hopper architecture): 132 SMs on H100 SXM5"};
  m.hbm_bytes_per_second = {3.35e12, datasheet + ": HBM3 3.35 TB/s"};
  m.hbm_efficiency = {0.90, review + ": a device-to-device copy at about 3.0 TB/s, bytes read + written counted"};
  m.shared_bytes_per_second = {132 * 128 * 1.98e9,
                               "derived: 132 SMs x 128 B per clock (32 banks x 4 B, CUDA C++ Programming Guide) x "
                               "1.98 GHz max boost (" + datasheet + ")"};
  m.shared_efficiency = {0.80, "pessimistic assumption, not measured: the attention kernels pad their staged "
                               "rows against bank conflicts, but loads are not always issued back to back"};
  m.tensor_flops_per_second = {989e12, datasheet + ": bf16 dense tensor core 989 TFLOP/s (1979 with sparsity)"};
  m.gemm_table = {{{8192, 8192, 8192}, {798.0 / 989.0, review + ": 798 TFLOP/s on an 8192^3 bf16 matmul"}}};
  m.gemm_default_efficiency = {0.65, "pessimistic assumption until measured: GPT-2's GEMMs have a 768-wide "
                                     "dimension (short k loops or narrow outputs), smaller than the 8192^3 "
                                     "measured at 81%"};
  m.gemm_few_tiles_efficiency = {0.50, "pessimistic assumption until measured: an output of fewer than 2 x 132 "
                                       "tiles of 128 x 128 (768 x 768 is 36) idles SMs or needs split-K and its "
                                       "reduction"};
  m.attention_tensor_efficiency = {0.15, "pessimistic assumption, not measured: FlashAttention-2's tuned mma.sync "
                                         "kernels are reported at roughly 20-35% of the dense peak on H100 at head "
                                         "dim 64 (as recalled from the FlashAttention-3 paper's baselines, not "
                                         "re-checked); tessera's untuned kernel of that schedule is taken lower"};
  m.cuda_core_flops_per_second = {132 * 128 * 1.98e9,
                                  "derived: the datasheet's 67 TFLOP/s f32 counts an FMA as 2 FLOPs (132 SMs x 128 "
                                  "lanes x 2 x 1.98 GHz); built with -fmad=false a multiply and an add are 2 "
                                  "instructions, so counted FLOPs run at half: 33.5 TFLOP/s"};
  m.cuda_core_efficiency = {0.70, "pessimistic assumption: exp, max, compares, conversions, address arithmetic and "
                                  "loop control share the issue slots and are not in the counted FLOPs"};
  m.launch_seconds = {3e-6, "assumption: one stream, no CUDA graphs; a launch's cost, ramp and tail, cudaLaunchKernel "
                            "measures 2-4 us"};
  return m;
}

void apply_calibration(GpuModel& model, const nlohmann::json& calibration, const std::string& where) {
  TESSERA_CHECK(calibration.is_object(), "{}: a calibration is a JSON object, got {}", where, json_kind(calibration));
  check_known_fields(calibration,
                     std::array<std::string_view, 6>{"gpu", "date", "source", "hbm_bytes_per_second", "gemm",
                                                     "attention_mma"},
                     where);
  const std::string gpu = required_string(calibration, "gpu", where);
  const std::string date = required_string(calibration, "date", where);
  const std::string source = required_string(calibration, "source", where);
  const std::string measured = fmt::format("measured on {} {} ({}): ", gpu, date, where);
  TESSERA_CHECK(calibration.contains("hbm_bytes_per_second") || calibration.contains("gemm") ||
                    calibration.contains("attention_mma"),
                "{}: no figures: expected 'hbm_bytes_per_second', 'gemm' or 'attention_mma'", where);
  // Checked in full before anything changes, so a bad file leaves the model as it was.
  GpuModel calibrated = model;
  if (calibration.contains("hbm_bytes_per_second")) {
    const double bytes_per_second =
        positive_number(calibration, "hbm_bytes_per_second", model.hbm_bytes_per_second.value, where);
    calibrated.hbm_efficiency = {bytes_per_second / model.hbm_bytes_per_second.value,
                                 fmt::format("{}{:.2f} TB/s: {}", measured, bytes_per_second / 1e12, source)};
  }
  if (calibration.contains("gemm")) {
    const nlohmann::json& gemm = calibration["gemm"];
    TESSERA_CHECK(gemm.is_array() && !gemm.empty(), "{}: field 'gemm' must be a non-empty array, got {}", where,
                  json_kind(gemm));
    for (size_t i = 0; i < gemm.size(); ++i) {
      const std::string entry_where = fmt::format("{}: gemm[{}]", where, i);
      const nlohmann::json& entry = gemm[i];
      TESSERA_CHECK(entry.is_object(), "{}: expected an object, got {}", entry_where, json_kind(entry));
      // "ms": the measured time, which bench/torch_gpu_step.py writes beside tflops; not used here.
      check_known_fields(entry, std::array<std::string_view, 6>{"m", "n", "k", "tflops", "ms", "source"},
                         entry_where);
      const GemmShape shape{positive_integer(entry, "m", entry_where), positive_integer(entry, "n", entry_where),
                            positive_integer(entry, "k", entry_where)};
      const double tflops = positive_number(entry, "tflops", model.tensor_flops_per_second.value / 1e12, entry_where);
      const std::string entry_source = entry.contains("source") ? required_string(entry, "source", entry_where) : source;
      const Figure efficiency{tflops * 1e12 / model.tensor_flops_per_second.value,
                              fmt::format("{}{} TFLOP/s at {}: {}", measured, tflops, shape_text(shape), entry_source)};
      auto& table = calibrated.gemm_table;
      const auto same = std::find_if(table.begin(), table.end(),
                                     [&](const GemmEfficiency& e) { return same_shape(e.shape, shape); });
      if (same != table.end()) {
        same->efficiency = efficiency;
      } else {
        table.push_back({shape, efficiency});
      }
    }
  }
  if (calibration.contains("attention_mma")) {  // {"tflops": counted mma FLOPs per measured second, "source": ...}
    const std::string entry_where = where + ": attention_mma";
    const nlohmann::json& entry = calibration["attention_mma"];
    TESSERA_CHECK(entry.is_object(), "{}: expected an object, got {}", entry_where, json_kind(entry));
    check_known_fields(entry, std::array<std::string_view, 2>{"tflops", "source"}, entry_where);
    const double tflops = positive_number(entry, "tflops", model.tensor_flops_per_second.value / 1e12, entry_where);
    const std::string entry_source = entry.contains("source") ? required_string(entry, "source", entry_where) : source;
    calibrated.attention_tensor_efficiency = {tflops * 1e12 / model.tensor_flops_per_second.value,
                                              fmt::format("{}{} TFLOP/s: {}", measured, tflops, entry_source)};
  }
  calibrated.calibration = fmt::format("{} ({}, {})", where, gpu, date);
  model = calibrated;
}

void apply_calibration_file(GpuModel& model, const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "calibration {}: cannot read the file", path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json calibration;
  try {
    calibration = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& error) {
    tessera::fail("calibration {}: not valid JSON: {}", path, error.what());
  }
  apply_calibration(model, calibration, "calibration " + path);
}

KernelPrediction predict_kernel(const GpuModel& model, const KernelWork& work) {
  TESSERA_CHECK(work.launches >= 0 && work.hbm_bytes >= 0 && work.shared_bytes >= 0 && work.flops >= 0,
                "predict_kernel: {}: counts must not be negative, got launches {}, hbm bytes {}, shared bytes {}, "
                "FLOPs {}", work.name, work.launches, work.hbm_bytes, work.shared_bytes, work.flops);
  TESSERA_CHECK(work.unit == ComputeUnit::tensor_core_gemm || work.gemms.empty(),
                "predict_kernel: {}: GEMM shapes given for a kernel that is not a GEMM", work.name);
  KernelPrediction p;
  p.work = work;
  p.hbm_seconds = work.hbm_bytes / (model.hbm_bytes_per_second.value * model.hbm_efficiency.value);
  p.shared_seconds = work.shared_bytes / (model.shared_bytes_per_second.value * model.shared_efficiency.value);
  if (work.unit == ComputeUnit::tensor_core_gemm) {
    // The FLOP-weighted harmonic mean: the time each shape's FLOPs take at
    // its own efficiency, over the FLOPs.
    double flops = 0, peak_seconds = 0;
    for (const GemmCalls& g : work.gemms) {
      TESSERA_CHECK(g.calls >= 0 && g.shape.m > 0 && g.shape.n > 0 && g.shape.k > 0,
                    "predict_kernel: {}: a GEMM of shape {} called {} times", work.name, shape_text(g.shape), g.calls);
      flops += gemm_flops(g);
      peak_seconds += gemm_flops(g) / model.gemm_efficiency(g.shape).value;
    }
    p.compute_efficiency = flops > 0 ? flops / peak_seconds : model.gemm_default_efficiency.value;
    p.compute_seconds = work.flops / (model.tensor_flops_per_second.value * p.compute_efficiency);
  } else if (work.unit == ComputeUnit::tensor_core_attention) {
    p.compute_efficiency = model.attention_tensor_efficiency.value;
    p.compute_seconds = work.flops / (model.tensor_flops_per_second.value * p.compute_efficiency);
  } else {
    p.compute_efficiency = model.cuda_core_efficiency.value;
    p.compute_seconds = work.flops / (model.cuda_core_flops_per_second.value * p.compute_efficiency);
  }
  p.launch_seconds = work.launches * model.launch_seconds.value;
  const Bound compute = work.unit == ComputeUnit::cuda_core ? Bound::cuda_core : Bound::tensor;
  const std::array<std::pair<double, Bound>, 4> terms = {
      {{p.hbm_seconds, Bound::hbm}, {p.shared_seconds, Bound::shared}, {p.compute_seconds, compute},
       {p.launch_seconds, Bound::launch}}};
  const auto largest = std::max_element(terms.begin(), terms.end(),
                                        [](const auto& a, const auto& b) { return a.first < b.first; });
  p.bound = largest->second;
  p.seconds = std::max({p.hbm_seconds, p.shared_seconds, p.compute_seconds}) + p.launch_seconds;
  return p;
}

std::vector<std::string> describe(const GpuModel& m) {
  std::vector<std::string> lines = {
      fmt::format("GPU                 {}{}", m.name, m.calibration.empty() ? "" : ", calibrated by " + m.calibration),
      fmt::format("SMs                 {:.0f}  [{}]", m.sms.value, m.sms.source),
      fmt::format("HBM peak            {:.2f} TB/s  [{}]", m.hbm_bytes_per_second.value / 1e12,
                  m.hbm_bytes_per_second.source),
      fmt::format("HBM efficiency      {:.0f}% -> {:.2f} TB/s  [{}]", 100 * m.hbm_efficiency.value,
                  m.hbm_bytes_per_second.value * m.hbm_efficiency.value / 1e12, m.hbm_efficiency.source),
      fmt::format("shared peak         {:.1f} TB/s  [{}]", m.shared_bytes_per_second.value / 1e12,
                  m.shared_bytes_per_second.source),
      fmt::format("shared efficiency   {:.0f}% -> {:.1f} TB/s  [{}]", 100 * m.shared_efficiency.value,
                  m.shared_bytes_per_second.value * m.shared_efficiency.value / 1e12, m.shared_efficiency.source),
      fmt::format("tensor bf16 peak    {:.0f} TFLOP/s  [{}]", m.tensor_flops_per_second.value / 1e12,
                  m.tensor_flops_per_second.source)};
  for (const GemmEfficiency& e : m.gemm_table) {
    lines.push_back(fmt::format("GEMM {:<14} {:.0f}% -> {:.0f} TFLOP/s  [{}]", shape_text(e.shape),
                                100 * e.efficiency.value, e.efficiency.value * m.tensor_flops_per_second.value / 1e12,
                                e.efficiency.source));
  }
  lines.push_back(fmt::format("GEMM other shapes   {:.0f}% -> {:.0f} TFLOP/s  [{}]", 100 * m.gemm_default_efficiency.value,
                              m.gemm_default_efficiency.value * m.tensor_flops_per_second.value / 1e12,
                              m.gemm_default_efficiency.source));
  lines.push_back(fmt::format("GEMM few tiles      {:.0f}% -> {:.0f} TFLOP/s  [{}]",
                              100 * m.gemm_few_tiles_efficiency.value,
                              m.gemm_few_tiles_efficiency.value * m.tensor_flops_per_second.value / 1e12,
                              m.gemm_few_tiles_efficiency.source));
  lines.push_back(fmt::format("attention (mma)     {:.0f}% -> {:.0f} TFLOP/s  [{}]",
                              100 * m.attention_tensor_efficiency.value,
                              m.attention_tensor_efficiency.value * m.tensor_flops_per_second.value / 1e12,
                              m.attention_tensor_efficiency.source));
  lines.push_back(fmt::format("CUDA-core f32       {:.1f} TFLOP/s  [{}]", m.cuda_core_flops_per_second.value / 1e12,
                              m.cuda_core_flops_per_second.source));
  lines.push_back(fmt::format("CUDA-core eff.      {:.0f}% -> {:.1f} TFLOP/s  [{}]", 100 * m.cuda_core_efficiency.value,
                              m.cuda_core_efficiency.value * m.cuda_core_flops_per_second.value / 1e12,
                              m.cuda_core_efficiency.source));
  lines.push_back(fmt::format("launch overhead     {:.1f} us per launch  [{}]", m.launch_seconds.value * 1e6,
                              m.launch_seconds.source));
  return lines;
}

}  // namespace bench
