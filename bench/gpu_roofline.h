// bench/gpu_roofline.h: a GPU's speeds, each with where it came from, and the
// roofline that turns a kernel's counted work into a PREDICTED time and names
// the bound that sets it. bench/gpt2_step_prediction feeds it the simulator's
// counters; a calibration file (JSON) replaces assumed figures with measured ones.
//
// A kernel's time is the largest of its bounds plus a launch overhead:
//
//   hbm       = device bytes / (HBM peak x efficiency)
//   shared    = shared-memory bytes / (shared peak x efficiency)
//   tensor    = FLOPs / (bf16 tensor peak x the efficiency of its GEMM shapes)   (tensor-core GEMMs)
//             = FLOPs / (bf16 tensor peak x attention's efficiency)            (tensor-core attention)
//   cuda-core = FLOPs / (f32 peak without FMA x efficiency)                      (every other kernel)
//   time      = max(hbm, shared, compute) + launches x overhead
//
// No figure is taken at 100% of a spec sheet: each has an efficiency, measured
// or stated as an assumption, and its source string says which.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bench {

// A number and where it came from: a published spec sheet, a measurement
// (which GPU, when, with what), or "pessimistic assumption: why".
struct Figure {
  double value = 0;
  std::string source;
};

// C[m, n] = A[m, k] B[k, n]: 2 m n k FLOPs.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};

// The fraction of the tensor-core peak one GEMM shape reaches.
struct GemmEfficiency {
  GemmShape shape;
  Figure efficiency;
};

// Where a kernel's FLOPs run: cuBLASLt's GEMMs or mma.sync attention on
// tensor cores (bf16 in, f32 accumulate), or f32 on CUDA cores.
enum class ComputeUnit { tensor_core_gemm, tensor_core_attention, cuda_core };
enum class Bound { hbm, shared, tensor, cuda_core, launch };
// "hbm", "shared", "tensor", "cuda-core", "launch".
const char* bound_name(Bound bound);

struct GpuModel {
  std::string name;
  Figure sms;                                // streaming multiprocessors
  Figure hbm_bytes_per_second;               // peak
  Figure hbm_efficiency;                     // achievable fraction of it
  Figure shared_bytes_per_second;            // all SMs together, peak
  Figure shared_efficiency;
  Figure tensor_flops_per_second;            // dense bf16 in, f32 accumulate, peak
  std::vector<GemmEfficiency> gemm_table;    // measured (or assumed) shapes
  Figure gemm_default_efficiency;            // a shape the table does not cover
  Figure gemm_few_tiles_efficiency;          // ... whose output is under two waves of 128 x 128 tiles
  Figure attention_tensor_efficiency;        // flash attention on mma.sync, of the tensor peak
  Figure cuda_core_flops_per_second;         // f32, a multiply and an add counted as 2 instructions (no FMA)
  Figure cuda_core_efficiency;
  Figure launch_seconds;                     // per kernel launch
  std::string calibration;                   // "" or the calibration file applied, with its gpu and date

  // The efficiency of a GEMM shape: the table's entry for that exact shape;
  // else the lowest among the table's shapes no larger in any of m, n, k
  // (a smaller GEMM is never faster per FLOP); else the assumed default (the
  // few-tiles one if m n / 128^2 < 2 x sms).
  Figure gemm_efficiency(const GemmShape& shape) const;
};

// H100 SXM5 80GB HBM3: spec-sheet peaks, the efficiencies measured on one
// such GPU where there are measurements, stated assumptions elsewhere.
GpuModel h100_sxm();

// Replaces the model's HBM efficiency and adds measured GEMM shapes from a
// calibration (see docs/benchmarks.md#gpt2_step_prediction for the format):
//   {"gpu": "...", "date": "...", "source": "...",
//    "hbm_bytes_per_second": 3.0e12,
//    "gemm": [{"m": 16384, "n": 2304, "k": 768, "tflops": 640, "source": "..."}]}
// Every figure must be positive and below the model's peak; `where` names the
// file in errors (tessera::Error naming the field).
void apply_calibration(GpuModel& model, const nlohmann::json& calibration, const std::string& where);
// Reads and applies a calibration file; bad JSON is a tessera::Error too.
void apply_calibration_file(GpuModel& model, const std::string& path);

// What one kernel (or one kernel name over a step) did.
struct GemmCalls {
  GemmShape shape;
  double calls = 0;
};
struct KernelWork {
  std::string name;
  ComputeUnit unit = ComputeUnit::cuda_core;
  double launches = 0;
  double hbm_bytes = 0;     // device memory read + written
  double shared_bytes = 0;  // shared memory read + written, each lane's bytes (the simulator's count)
  double flops = 0;
  // tensor_core_gemm only: the shapes it ran; their FLOP-weighted harmonic
  // mean efficiency applies to `flops` (empty: the default efficiency).
  std::vector<GemmCalls> gemms;
};

struct KernelPrediction {
  KernelWork work;
  double hbm_seconds = 0, shared_seconds = 0, compute_seconds = 0, launch_seconds = 0;
  double compute_efficiency = 0;  // the fraction of the compute peak assumed
  double seconds = 0;             // max(hbm, shared, compute) + launch
  Bound bound = Bound::hbm;       // the largest of the four terms
};

KernelPrediction predict_kernel(const GpuModel& model, const KernelWork& work);

// The model's figures, one per line, each with its source (for a report's header).
std::vector<std::string> describe(const GpuModel& model);

}  // namespace bench
