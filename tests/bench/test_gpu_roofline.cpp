// bench/gpu_roofline: a prediction follows the counters it is given, the bound
// it names is the one that sets the time, the H100's figures are the ones its
// sources state (none at 100%), and a calibration file replaces figures or is
// refused with a tessera::Error naming the bad field.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/gpu_roofline.h"
#include "tensor/error.h"

namespace {

using bench::Bound;
using bench::ComputeUnit;
using bench::GemmShape;
using bench::KernelWork;
using bench::predict_kernel;

// The simulator's count of shared bytes per visible (query, key) pair of the
// tiled attention kernels at head dim 64, and the FLOPs each does per pair.
constexpr double kForwardSharedPerPair = 652, kForwardFlopsPerPair = 4 * 64;
constexpr double kKeyGradsSharedPerPair = 1294, kKeyGradsFlopsPerPair = 8 * 64;
constexpr double kQueryGradsSharedPerPair = 978, kQueryGradsFlopsPerPair = 6 * 64;

KernelWork cuda_core_kernel(double hbm_bytes, double shared_bytes, double flops, double launches = 0) {
  KernelWork work;
  work.name = "kernel";
  work.unit = ComputeUnit::cuda_core;
  work.launches = launches;
  work.hbm_bytes = hbm_bytes;
  work.shared_bytes = shared_bytes;
  work.flops = flops;
  return work;
}

KernelWork gemm_kernel(const GemmShape& shape, double calls = 1) {
  KernelWork work;
  work.name = "cublasLtMatmul";
  work.unit = ComputeUnit::tensor_core_gemm;
  work.flops = 2.0 * static_cast<double>(shape.m) * static_cast<double>(shape.n) * static_cast<double>(shape.k) * calls;
  work.gemms = {{shape, calls}};
  return work;
}

// The effective FLOP/s of an attention-like kernel over `pairs` visible pairs.
double attention_flops_per_second(double shared_per_pair, double flops_per_pair) {
  const double pairs = 12 * 16 * 1024.0 * 1025 / 2;  // a layer's heads at B = 16, T = 1024
  const bench::KernelPrediction p =
      predict_kernel(bench::h100_sxm(), cuda_core_kernel(0, shared_per_pair * pairs, flops_per_pair * pairs));
  CHECK(p.bound == Bound::shared);
  return p.work.flops / p.seconds;
}

// Raises tessera::Error whose message holds every one of `fragments`.
template <typename F>
void check_error(F&& call, std::initializer_list<std::string> fragments) {
  try {
    call();
    FAIL("expected a tessera::Error");
  } catch (const tessera::Error& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments) {
      INFO(message);
      CHECK(message.find(fragment) != std::string::npos);
    }
  }
}

nlohmann::json valid_calibration() {
  return nlohmann::json::parse(R"({
    "gpu": "H100 80GB HBM3", "date": "2026-12-01", "source": "tools probe, 20 repetitions, median",
    "hbm_bytes_per_second": 3.0e12,
    "gemm": [{"m": 16384, "n": 2304, "k": 768, "tflops": 600},
             {"m": 768, "n": 768, "k": 16384, "tflops": 400, "ms": 0.05, "source": "split-K kernel, nsys"}]
  })");
}

}  // namespace

TEST_CASE("the H100 figures are the spec sheet's, each below 100% and with a source") {
  const bench::GpuModel h100 = bench::h100_sxm();
  CHECK(h100.hbm_bytes_per_second.value == doctest::Approx(3.35e12));
  CHECK(h100.tensor_flops_per_second.value == doctest::Approx(989e12));
  // 132 SMs x 128 B per clock x 1.98 GHz.
  CHECK(h100.shared_bytes_per_second.value == doctest::Approx(33.45e12).epsilon(0.001));
  // Without FMA a multiply and an add are two instructions: half the 67 TFLOP/s FMA-counted peak.
  CHECK(h100.cuda_core_flops_per_second.value == doctest::Approx(67e12 / 2).epsilon(0.005));
  CHECK(h100.launch_seconds.value > 0);
  for (const bench::Figure* efficiency : {&h100.hbm_efficiency, &h100.shared_efficiency, &h100.gemm_default_efficiency,
                                          &h100.gemm_few_tiles_efficiency, &h100.cuda_core_efficiency}) {
    CHECK(efficiency->value > 0);
    CHECK(efficiency->value < 1);
    CHECK_FALSE(efficiency->source.empty());
  }
  for (const bench::Figure* figure : {&h100.sms, &h100.hbm_bytes_per_second, &h100.shared_bytes_per_second,
                                      &h100.tensor_flops_per_second, &h100.cuda_core_flops_per_second,
                                      &h100.launch_seconds}) {
    CHECK_FALSE(figure->source.empty());
  }
  // The measured ones say so; the assumed ones too.
  CHECK(h100.hbm_efficiency.value == doctest::Approx(0.90));
  CHECK(h100.hbm_efficiency.source.find("measured") != std::string::npos);
  CHECK(h100.shared_efficiency.value == doctest::Approx(0.80));
  CHECK(h100.shared_efficiency.source.find("assumption") != std::string::npos);
  CHECK(h100.gemm_default_efficiency.source.find("assumption") != std::string::npos);
  CHECK(bench::describe(h100).size() >= 12);
}

TEST_CASE("a shared-bound kernel's time doubles with its shared bytes, and the bound says shared") {
  const bench::GpuModel h100 = bench::h100_sxm();
  const KernelWork once = cuda_core_kernel(1e9, 100e9, 1e9);
  KernelWork twice = once;
  twice.shared_bytes *= 2;
  const bench::KernelPrediction a = predict_kernel(h100, once), b = predict_kernel(h100, twice);
  CHECK(a.bound == Bound::shared);
  CHECK(b.bound == Bound::shared);
  CHECK(b.seconds == doctest::Approx(2 * a.seconds));
  // 100 GB at 80% of 33.45 TB/s.
  CHECK(a.seconds == doctest::Approx(100e9 / (132 * 128 * 1.98e9 * 0.80)));
  // HBM bytes well under their bound do not change it.
  KernelWork more_hbm = once;
  more_hbm.hbm_bytes *= 2;
  CHECK(predict_kernel(h100, more_hbm).seconds == doctest::Approx(a.seconds));
}

TEST_CASE("attention at the simulator's shared bytes per pair runs near 10, under 13 TFLOP/s") {
  // The shared bound: FLOPs per pair / shared bytes per pair x 33.45 TB/s x 80%.
  const double rate = 132 * 128 * 1.98e9 * 0.80;
  const double forward = attention_flops_per_second(kForwardSharedPerPair, kForwardFlopsPerPair);
  const double key_grads = attention_flops_per_second(kKeyGradsSharedPerPair, kKeyGradsFlopsPerPair);
  const double query_grads = attention_flops_per_second(kQueryGradsSharedPerPair, kQueryGradsFlopsPerPair);
  CHECK(forward == doctest::Approx(kForwardFlopsPerPair / kForwardSharedPerPair * rate));
  CHECK(key_grads == doctest::Approx(kKeyGradsFlopsPerPair / kKeyGradsSharedPerPair * rate));
  CHECK(query_grads == doctest::Approx(kQueryGradsFlopsPerPair / kQueryGradsSharedPerPair * rate));
  for (const double flops_per_second : {forward, key_grads, query_grads}) {
    CHECK(flops_per_second <= 13e12);
    CHECK(flops_per_second >= 10e12);
  }
  // Without the shared bytes the same kernel would be CUDA-core bound, at 70% of 33.45 TFLOP/s.
  const bench::KernelPrediction no_shared = predict_kernel(bench::h100_sxm(), cuda_core_kernel(0, 0, 1e12));
  CHECK(no_shared.bound == Bound::cuda_core);
  CHECK(no_shared.seconds == doctest::Approx(1e12 / (132 * 128 * 1.98e9 * 0.70)));
}

TEST_CASE("a tensor-core GEMM runs at its shape's efficiency") {
  const bench::GpuModel h100 = bench::h100_sxm();
  // Measured: 8192^3 at 798 TFLOP/s.
  const bench::KernelPrediction measured = predict_kernel(h100, gemm_kernel({8192, 8192, 8192}));
  CHECK(measured.bound == Bound::tensor);
  CHECK(measured.compute_efficiency == doctest::Approx(798.0 / 989.0));
  CHECK(measured.seconds == doctest::Approx(2.0 * 8192 * 8192 * 8192 / 798e12));
  // GPT-2's forward qkv at B T = 16384: the assumed default, 65%.
  const bench::KernelPrediction qkv = predict_kernel(h100, gemm_kernel({16384, 2304, 768}));
  CHECK(qkv.compute_efficiency == doctest::Approx(0.65));
  CHECK(qkv.seconds == doctest::Approx(2.0 * 16384 * 2304 * 768 / (989e12 * 0.65)));
  // Its weight gradient: a 2304 x 768 output is 108 tiles of 128 x 128, under two waves of 132 SMs: 50%.
  const bench::KernelPrediction weight_grad = predict_kernel(h100, gemm_kernel({2304, 768, 16384}));
  CHECK(weight_grad.compute_efficiency == doctest::Approx(0.50));
  // Both in one kernel name: the FLOP-weighted harmonic mean, so the time is the sum.
  KernelWork both = gemm_kernel({16384, 2304, 768});
  both.gemms.push_back({{2304, 768, 16384}, 1});
  both.flops *= 2;  // the two have the same FLOPs
  const bench::KernelPrediction mix = predict_kernel(h100, both);
  CHECK(mix.compute_efficiency == doctest::Approx(2 / (1 / 0.65 + 1 / 0.50)));
  CHECK(mix.seconds == doctest::Approx(qkv.seconds + weight_grad.seconds));
}

TEST_CASE("tensor-core attention runs at the assumed flash-attention efficiency, or its shared bound") {
  const bench::GpuModel h100 = bench::h100_sxm();
  KernelWork attention = cuda_core_kernel(0, 0, 1e12);
  attention.unit = ComputeUnit::tensor_core_attention;
  const bench::KernelPrediction p = predict_kernel(h100, attention);
  CHECK(p.bound == Bound::tensor);
  CHECK(p.compute_efficiency == doctest::Approx(0.15));
  CHECK(p.seconds == doctest::Approx(1e12 / (989e12 * 0.15)));
  // The same FLOPs with the CUDA-core kernels' shared bytes per FLOP: shared-bound, 8x slower or more.
  attention.shared_bytes = 1e12 * kForwardSharedPerPair / kForwardFlopsPerPair;
  const bench::KernelPrediction shared = predict_kernel(h100, attention);
  CHECK(shared.bound == Bound::shared);
  CHECK(shared.seconds > 8 * p.seconds);
  // GEMM shapes belong to GEMMs only.
  attention.gemms = {{{64, 64, 64}, 1}};
  check_error([&] { predict_kernel(h100, attention); }, {"GEMM shapes", "not a GEMM"});
}

TEST_CASE("the binding bound is named: hbm for a copy, launch for a tiny kernel, plus the overhead per launch") {
  const bench::GpuModel h100 = bench::h100_sxm();
  const bench::KernelPrediction copy = predict_kernel(h100, cuda_core_kernel(3e9, 0, 0.75e9, 10));
  CHECK(copy.bound == Bound::hbm);
  CHECK(copy.seconds == doctest::Approx(3e9 / (3.35e12 * 0.90) + 10 * 3e-6));
  const bench::KernelPrediction tiny = predict_kernel(h100, cuda_core_kernel(4096, 0, 1024, 1));
  CHECK(tiny.bound == Bound::launch);
  CHECK(tiny.seconds == doctest::Approx(3e-6 + 4096 / (3.35e12 * 0.90)));
  CHECK(std::string(bench::bound_name(Bound::cuda_core)) == "cuda-core");
  check_error([&] { predict_kernel(h100, cuda_core_kernel(-1, 0, 0)); }, {"must not be negative", "kernel"});
}

TEST_CASE("a calibration replaces HBM and GEMM figures, with its sources") {
  bench::GpuModel model = bench::h100_sxm();
  bench::apply_calibration(model, valid_calibration(), "calibration test.json");
  CHECK(model.hbm_efficiency.value == doctest::Approx(3.0e12 / 3.35e12));
  CHECK(model.hbm_efficiency.source.find("H100 80GB HBM3 2026-12-01") != std::string::npos);
  CHECK(model.hbm_efficiency.source.find("tools probe") != std::string::npos);
  CHECK(model.calibration.find("test.json") != std::string::npos);
  // The exact shape: its measurement.
  const bench::Figure qkv = model.gemm_efficiency({16384, 2304, 768});
  CHECK(qkv.value == doctest::Approx(600 / 989.0));
  // An entry's own source wins over the file's.
  CHECK(model.gemm_efficiency({768, 768, 16384}).source.find("split-K kernel") != std::string::npos);
  // A larger shape: the lowest measured shape no larger than it in m, n and k.
  CHECK(model.gemm_efficiency({32768, 2304, 768}).value == doctest::Approx(600 / 989.0));
  CHECK(model.gemm_efficiency({32768, 2304, 32768}).value == doctest::Approx(400 / 989.0));
  CHECK(model.gemm_efficiency({32768, 2304, 32768}).source.find("no larger") != std::string::npos);
  // A shape no measured one fits under: the assumed default.
  CHECK(model.gemm_efficiency({16384, 768, 768}).value == doctest::Approx(0.65));
  // And the time follows: HBM at the measured 3.0 TB/s.
  CHECK(predict_kernel(model, cuda_core_kernel(3e9, 0, 0)).seconds == doctest::Approx(1e-3));
}

TEST_CASE("a calibration's attention_mma rate replaces the assumed attention efficiency") {
  bench::GpuModel model = bench::h100_sxm();
  nlohmann::json calibration = valid_calibration();
  calibration["attention_mma"] = {{"tflops", 112.5}, {"source", "ncu, counted mma FLOPs per second"}};
  bench::apply_calibration(model, calibration, "calibration test.json");
  CHECK(model.attention_tensor_efficiency.value == doctest::Approx(112.5 / 989.0));
  CHECK(model.attention_tensor_efficiency.source.find("ncu, counted mma FLOPs") != std::string::npos);
  // 1.125 TFLOP of mma work at 112.5 TFLOP/s: 10 ms.
  const bench::KernelWork attention{"attention", bench::ComputeUnit::tensor_core_attention, 0, 0, 0, 1.125e12, {}};
  CHECK(predict_kernel(model, attention).compute_seconds == doctest::Approx(10e-3));
  // Refused like the others: the field is named.
  bench::GpuModel untouched = bench::h100_sxm();
  calibration["attention_mma"]["tflops"] = -1;
  check_error([&] { bench::apply_calibration(untouched, calibration, "calibration bad.json"); },
              {"attention_mma", "'tflops'", "positive"});
  CHECK(untouched.attention_tensor_efficiency.value == doctest::Approx(0.15));
}

TEST_CASE("a bad calibration is a tessera::Error naming the field, and leaves the model as it was") {
  const auto rejects = [](const std::function<void(nlohmann::json&)>& edit,
                          std::initializer_list<std::string> fragments) {
    nlohmann::json calibration = valid_calibration();
    edit(calibration);
    bench::GpuModel model = bench::h100_sxm();
    check_error([&] { bench::apply_calibration(model, calibration, "calibration bad.json"); }, fragments);
    CHECK(model.hbm_efficiency.value == doctest::Approx(0.90));
    CHECK(model.gemm_table.size() == 1);
    CHECK(model.calibration.empty());
  };
  rejects([](nlohmann::json& c) { c.erase("source"); }, {"bad.json", "'source'", "missing"});
  rejects([](nlohmann::json& c) { c["source"] = ""; }, {"'source'", "non-empty string"});
  rejects([](nlohmann::json& c) { c.erase("gpu"); }, {"'gpu'", "missing"});
  rejects([](nlohmann::json& c) { c.erase("date"); }, {"'date'", "missing"});
  rejects([](nlohmann::json& c) { c["hbm_bytes_per_second"] = -3e12; }, {"'hbm_bytes_per_second'", "positive"});
  rejects([](nlohmann::json& c) { c["hbm_bytes_per_second"] = "fast"; }, {"'hbm_bytes_per_second'", "number"});
  rejects([](nlohmann::json& c) { c["hbm_bytes_per_second"] = 4e12; }, {"'hbm_bytes_per_second'", "above the model's peak"});
  rejects([](nlohmann::json& c) { c["gemm"][1]["tflops"] = -400; }, {"gemm[1]", "'tflops'", "positive"});
  rejects([](nlohmann::json& c) { c["gemm"][0]["tflops"] = 1200; }, {"gemm[0]", "'tflops'", "above the model's peak"});
  rejects([](nlohmann::json& c) { c["gemm"][0].erase("k"); }, {"gemm[0]", "'k'", "missing"});
  rejects([](nlohmann::json& c) { c["gemm"][0]["m"] = 0; }, {"gemm[0]", "'m'", "positive integer"});
  rejects([](nlohmann::json& c) { c["gemm"][1]["source"] = 7; }, {"gemm[1]", "'source'"});
  rejects([](nlohmann::json& c) { c["gemm"] = nlohmann::json::array(); }, {"'gemm'", "non-empty array"});
  rejects([](nlohmann::json& c) { c["hbm_efficiency"] = 0.9; }, {"unknown field 'hbm_efficiency'"});
  rejects([](nlohmann::json& c) { c.erase("gemm"), c.erase("hbm_bytes_per_second"); }, {"no figures"});
  rejects([](nlohmann::json& c) { c = nlohmann::json::array(); }, {"JSON object"});
}

TEST_CASE("a calibration file: applied when valid; bad JSON or a missing file is a tessera::Error") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("test_gpu_roofline_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "good.json").string(), bad = (dir / "bad.json").string();
  std::ofstream(good) << valid_calibration().dump(2);
  std::ofstream(bad) << R"({"gpu": "H100", "date": "2026-12-01", "source": "x", "gemm": [)";
  bench::GpuModel model = bench::h100_sxm();
  bench::apply_calibration_file(model, good);
  CHECK(model.hbm_efficiency.value == doctest::Approx(3.0e12 / 3.35e12));
  CHECK(model.calibration.find("good.json") != std::string::npos);
  check_error([&] { bench::apply_calibration_file(model, bad); }, {"bad.json", "not valid JSON"});
  check_error([&] { bench::apply_calibration_file(model, (dir / "absent.json").string()); },
              {"absent.json", "cannot read"});
  std::filesystem::remove_all(dir);
}
