// Full-model safetensors export and import: the Python-written golden file
// read value by value, export on N ranks (uneven shards, an HSDP mesh) and
// import on M compared bitwise, a file for the Python oracle, rank 0's memory
// during export, and every malformed input reported clearly on every rank.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_export.h"
#include "dist/backends/local_backend.h"
#include "tensor/ops.h"
#include "tests/checkpoint/known_state.h"
#include "tests/checkpoint/temp_dir.h"

using namespace tessera;
using namespace tessera::checkpoint;
using tessera::checkpoint::testing::TempDir;
using tessera::checkpoint::testing::zeros_like_state;
namespace fs = std::filesystem;

namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = ops::contiguous(a), y = ops::contiguous(b);
  return x.dtype() == y.dtype() && x.sizes() == y.sizes() &&
         (x.nbytes() == 0 || std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0);
}

// ---- the formula tensors, shared with tests/oracle/safetensors_oracle.py (TENSORS) ----

struct FormulaTensor {
  const char* name;
  DType dtype;
  Shape shape;
};
const std::vector<FormulaTensor> kFormulaTensors = {
    {"bf16", DType::bf16, {3, 2}}, {"bool", DType::boolean, {7}}, {"empty", DType::f32, {0, 3}},
    {"f16", DType::f16, {2, 3}},   {"f32", DType::f32, {3, 4}},   {"f64", DType::f64, {5}},
    {"i32", DType::i32, {4}},      {"i64", DType::i64, {2, 2}},   {"scalar", DType::f32, {}},
    {"u8", DType::u8, {6}}};

// The oracle's value(dtype, i): exact in every dtype it is stored in.
double formula_value(DType dtype, int64_t i) {
  const int64_t v = (i * 7) % 23 - 11;
  switch (dtype) {
    case DType::f32: return static_cast<double>(v) * 0.25;
    case DType::f64: return static_cast<double>(v) / 3.0;
    case DType::f16: return static_cast<double>(v) * 0.5;
    case DType::bf16: return static_cast<double>(v) * 0.125;
    case DType::i32: return static_cast<double>(v * 100000 + i);
    case DType::i64: return static_cast<double>(v * (int64_t{1} << 40) + i);
    case DType::boolean: return v > 0 ? 1.0 : 0.0;
    case DType::u8: return static_cast<double>(v + 11);
  }
  return 0.0;
}

Tensor formula_tensor(DType dtype, const Shape& shape) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = formula_value(dtype, static_cast<int64_t>(i));
  return ops::to(ops::from_vector(values, shape, {.dtype = DType::f64}), dtype);
}

std::string golden_path() { return fmt::format("{}/python_written.safetensors", TESSERA_CHECKPOINT_GOLDEN_DIR); }

// ---- the model the round trips export: awkward sizes, every dtype, a whole tensor ----

std::map<std::string, Tensor> globals() {
  return {{"embedding", ops::randn({97, 5}, PhiloxKey{3, 1})},
          {"bias", ops::randn({7}, PhiloxKey{3, 2}, {.dtype = DType::f64})},
          {"half", ops::randn({13, 3}, PhiloxKey{3, 3}, {.dtype = DType::bf16})},
          {"mask", ops::gt(ops::randn({11, 2}, PhiloxKey{3, 4}), 0.0)},
          {"tiny", ops::randn({2, 3}, PhiloxKey{3, 5}, {.dtype = DType::f16})},  // empty pieces on ranks >= 2
          {"steps", ops::from_vector(std::vector<int64_t>{1, 2, 3}, {3})},
          {"scale", ops::randn({4}, PhiloxKey{3, 6})}};
}

// "scale" stays a whole tensor; 2-D tensors shard `shard_dim` along the
// mesh's last dim; the rest are replicated.
DistributedStateDict layout(const std::map<std::string, Tensor>& tensors, const dist::DeviceMesh& mesh,
                            int64_t shard_dim) {
  DistributedStateDict state;
  for (const auto& [name, tensor] : tensors) {
    if (name == "scale") {
      state[name] = ops::clone(tensor);
      continue;
    }
    dist::Placements placements(static_cast<size_t>(mesh.ndim()), dist::Replicate{});
    if (tensor.dim() == 2) placements.back() = dist::Shard{shard_dim};
    state[name] = dist::distribute(tensor, mesh, placements);
  }
  return state;
}

const Tensor& local_of(const StateEntry& entry) {
  if (const Tensor* tensor = std::get_if<Tensor>(&entry)) return *tensor;
  return std::get<dist::DTensor>(entry).local();
}

void export_on(int world, const Shape& mesh_shape, const std::string& path) {
  dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, mesh_shape);
    export_safetensors(path, layout(globals(), mesh, 0), {.metadata = {{"step", "42"}}, .sync = false});
  });
}

// Imports on `world` ranks laid out as `mesh_shape` (2-D tensors sharded on
// `shard_dim`); returns how many local pieces differ from the originals' bits.
int import_mismatches(int world, const Shape& mesh_shape, int64_t shard_dim, const std::string& path) {
  std::atomic<int> wrong{0};
  dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, mesh_shape);
    const DistributedStateDict expected = layout(globals(), mesh, shard_dim);
    const DistributedStateDict imported = zeros_like_state(expected);
    const ImportReport report = import_safetensors(path, imported);
    if (report.metadata != std::map<std::string, std::string>{{"step", "42"}}) ++wrong;
    for (const auto& [name, entry] : expected) {
      if (!same_bytes(local_of(entry), local_of(imported.at(name)))) ++wrong;
    }
  });
  return wrong;
}

}  // namespace

TEST_CASE("safetensors export: the Python-written golden file imports with every value") {
  const SafetensorsHeader header = read_safetensors_header(golden_path());
  CHECK(header.metadata == std::map<std::string, std::string>{{"producer", "python"}});
  REQUIRE(header.entries.size() == kFormulaTensors.size());
  DistributedStateDict same_dtypes, widened;
  for (const FormulaTensor& tensor : kFormulaTensors) {
    CAPTURE(tensor.name);
    const SafetensorsEntry& entry = header.entry(tensor.name, "golden");
    CHECK(entry.dtype == tensor.dtype);
    CHECK(entry.shape == tensor.shape);
    same_dtypes[tensor.name] = ops::zeros(tensor.shape, {.dtype = tensor.dtype});
    // Floats widen to f64 on the way in; integers and bools load only as themselves.
    widened[tensor.name] = ops::zeros(tensor.shape, {.dtype = is_floating(tensor.dtype) ? DType::f64 : tensor.dtype});
  }
  const ImportReport report = import_safetensors(golden_path(), same_dtypes);
  CHECK(report.metadata.at("producer") == "python");
  CHECK(report.missing_keys.empty());
  CHECK(report.unexpected_keys.empty());
  import_safetensors(golden_path(), widened);
  for (const FormulaTensor& tensor : kFormulaTensors) {
    CAPTURE(tensor.name);
    const Tensor want = formula_tensor(tensor.dtype, tensor.shape);
    CHECK(same_bytes(std::get<Tensor>(same_dtypes.at(tensor.name)), want));
    CHECK(std::get<Tensor>(widened.at(tensor.name)).to_vector<double>() == want.to_vector<double>());
  }
}

TEST_CASE("safetensors export: the golden file's pieces import on 3 ranks") {
  std::atomic<int> wrong{0};
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {3});
    DistributedStateDict state, expected;
    for (const FormulaTensor& tensor : kFormulaTensors) {
      if (tensor.shape.size() != 2) continue;
      const dist::DTensor piece = dist::distribute(formula_tensor(tensor.dtype, tensor.shape), mesh, {dist::Shard{1}});
      expected[tensor.name] = piece;
      state[tensor.name] = dist::DTensor(ops::zeros_like(piece.local()), mesh, piece.placements(), piece.global_shape());
    }
    const ImportReport report = import_safetensors(golden_path(), state, {.strict = false});
    const std::vector<std::string> not_2d = {"bool", "f64", "i32", "scalar", "u8"};
    if (report.unexpected_keys != not_2d) ++wrong;
    for (const auto& [name, entry] : expected) wrong += !same_bytes(local_of(entry), local_of(state.at(name)));
  });
  CHECK(wrong == 0);
}

TEST_CASE("safetensors export: exported on N ranks (uneven, HSDP 2x2), imported on M, bitwise") {
  TempDir tmp;
  // The reference: one process writing the whole tensors, in name order.
  std::vector<std::pair<std::string, Tensor>> whole;
  for (const auto& [name, tensor] : globals()) whole.emplace_back(name, tensor);
  write_safetensors(tmp / "reference.safetensors", whole, {{"step", "42"}}, false);
  const std::string reference = file_bytes(tmp / "reference.safetensors");

  const std::vector<std::pair<int, Shape>> layouts = {{1, {1}}, {2, {2}}, {3, {3}}, {4, {4}}, {4, {2, 2}}};
  for (const auto& [saved, saved_mesh] : layouts) {
    const std::string path = tmp / fmt::format("model-{}.safetensors", saved_mesh);
    export_on(saved, saved_mesh, path);
    CAPTURE(saved_mesh);
    CHECK_FALSE(fs::exists(path + ".tmp"));
    CHECK(file_bytes(path) == reference);  // the same file, whatever the layout
    for (const auto& [loaded, loaded_mesh] : layouts) {
      CAPTURE(loaded_mesh);
      CHECK(import_mismatches(loaded, loaded_mesh, 0, path) == 0);
      CHECK(import_mismatches(loaded, loaded_mesh, 1, path) == 0);  // column pieces
    }
  }
}

TEST_CASE("safetensors export: a file for the Python oracle (TESSERA_EXPORT_FOR_ORACLE)") {
  TempDir tmp;
  const char* requested = std::getenv("TESSERA_EXPORT_FOR_ORACLE");
  const std::string path = requested != nullptr ? std::string(requested) : tmp / "for_oracle.safetensors";
  // 3 ranks: 2-D tensors sharded on dim 0 (the empty one has no pieces at all), the rest replicated.
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {3});
    DistributedStateDict state;
    for (const FormulaTensor& tensor : kFormulaTensors) {
      const dist::Placement placement =
          tensor.shape.size() == 2 ? dist::Placement{dist::Shard{0}} : dist::Placement{dist::Replicate{}};
      state[tensor.name] = dist::distribute(formula_tensor(tensor.dtype, tensor.shape), mesh, {placement});
    }
    export_safetensors(path, state, {.metadata = {{"producer", "tessera"}}});
  });
  const SafetensorsHeader header = read_safetensors_header(path);
  CHECK(header.metadata == std::map<std::string, std::string>{{"producer", "tessera"}});
  for (const FormulaTensor& tensor : kFormulaTensors) {
    CAPTURE(tensor.name);
    CHECK(same_bytes(read_safetensors_tensor(path, tensor.name), formula_tensor(tensor.dtype, tensor.shape)));
  }
}

TEST_CASE("safetensors export: rank 0 holds its pieces plus one gathered tensor and one piece, never more") {
  constexpr int kWorld = 4;
  constexpr int kTensors = 6;
  const Shape shape{256, 256};
  const int64_t tensor_bytes = shape_numel(shape) * 4;
  const int64_t piece_bytes = tensor_bytes / kWorld;
  TempDir tmp;
  std::vector<int64_t> extra(kWorld, 0);
  dist::run_local(kWorld, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {kWorld});
    DistributedStateDict state;
    for (int i = 0; i < kTensors; ++i) {
      state[fmt::format("layer{}.weight", i)] =
          dist::distribute(ops::randn(shape, PhiloxKey{9, static_cast<uint64_t>(i)}), mesh, {dist::Shard{0}});
    }
    dist::reset_rank_peak_memory();
    const int64_t before = dist::rank_memory_stats().live_bytes;
    export_safetensors(tmp / "big.safetensors", state, {.group = group, .metadata = {}, .sync = false});
    extra[static_cast<size_t>(group->rank())] = dist::rank_memory_stats().peak_bytes - before;
  });
  MESSAGE("export of ", kTensors, " tensors of ", tensor_bytes, " bytes on ", kWorld, " ranks: rank 0 peaked ",
          extra[0], " bytes above its pieces; ranks 1-3: ", extra[1], ", ", extra[2], ", ", extra[3]);
  CHECK(extra[0] >= tensor_bytes);                // it did gather a whole tensor
  CHECK(extra[0] <= tensor_bytes + piece_bytes);  // ... and only one at a time (all six: 6x)
  for (int rank = 1; rank < kWorld; ++rank) CHECK(extra[static_cast<size_t>(rank)] <= piece_bytes);
}

TEST_CASE("safetensors export: shapes, missing and unexpected keys are reported together") {
  TempDir tmp;
  export_safetensors(tmp / "m.safetensors", {{"a", ops::zeros({3})}, {"b", ops::zeros({2, 2})}, {"d", ops::ones({1})}});
  DistributedStateDict wrong{{"a", ops::zeros({4})}, {"b", ops::zeros({2, 3})}, {"c", ops::zeros({1})}};
  CHECK_THROWS_WITH_AS(import_safetensors(tmp / "m.safetensors", wrong),
                       doctest::Contains("a: shape [3] in the file, [4] here; b: shape [2, 2] in the file, [2, 3] "
                                         "here; missing keys: c; unexpected keys: d"),
                       Error);
  DistributedStateDict partial{{"d", ops::zeros({1})}, {"c", ops::zeros({1})}};
  const ImportReport report = import_safetensors(tmp / "m.safetensors", partial, {.strict = false});
  CHECK(report.missing_keys == std::vector<std::string>{"c"});
  CHECK(report.unexpected_keys == std::vector<std::string>{"a", "b"});
  CHECK(std::get<Tensor>(partial.at("d")).to_vector<float>() == std::vector<float>{1.0f});
}

TEST_CASE("safetensors export: truncated and foreign files are reported with the file named") {
  TempDir tmp;
  const std::string path = tmp / "m.safetensors";
  export_safetensors(path, {{"w", ops::ones({4, 4})}});
  const std::string pristine = file_bytes(path);
  const DistributedStateDict state{{"w", ops::zeros({4, 4})}};
  auto write = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; };

  write(pristine.substr(0, pristine.size() - 10));
  CHECK_THROWS_WITH_AS(import_safetensors(path, state), doctest::Contains("(truncated file?)"), Error);
  write(pristine.substr(0, 5));
  CHECK_THROWS_WITH_AS(import_safetensors(path, state), doctest::Contains("too short for a safetensors file"), Error);
  write("this is a text file, not a tensor file\n");
  CHECK_THROWS_WITH_AS(import_safetensors(path, state), doctest::Contains("not safetensors"), Error);
  std::string not_json(8, '\0');
  not_json[0] = 8;
  write(not_json + "[1, 2]  ");
  CHECK_THROWS_WITH_AS(import_safetensors(path, state), doctest::Contains("header is not a JSON object"), Error);
  CHECK_THROWS_WITH_AS(import_safetensors(tmp / "absent.safetensors", state), doctest::Contains("cannot open"), Error);
  write(pristine);
  import_safetensors(path, state);
  CHECK(std::get<Tensor>(state.at("w")).to_vector<float>() == std::vector<float>(16, 1.0f));
}

TEST_CASE("safetensors export: every rank raises the error of any rank, and ranks must agree on the tensors") {
  TempDir tmp;
  // Counts the ranks that raised an error containing `fragment`.
  auto ranks_raising = [&](const std::string& path, const std::string& fragment,
                           const std::function<DistributedStateDict(int rank)>& state_of) {
    std::atomic<int> raised{0};
    dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
      try {
        export_safetensors(path, state_of(group->rank()));
      } catch (const Error& error) {
        raised += std::string(error.what()).find(fragment) != std::string::npos;
      }
    });
    return raised.load();
  };

  CHECK(ranks_raising(tmp / "names.safetensors",
                      "rank 2 passes [b: f32 [2, 3] whole; c: f32 [1] whole] where rank 0 passes [b: f32 [2, 2] whole]",
                      [](int rank) {
                        DistributedStateDict state{{"a", ops::zeros({3})}, {"b", ops::zeros({2, 2})}};
                        if (rank == 2) state = {{"a", ops::zeros({3})}, {"b", ops::zeros({2, 3})}, {"c", ops::zeros({1})}};
                        return state;
                      }) == 3);
  CHECK(ranks_raising(tmp / "dtypes.safetensors", "rank 1 passes [a: f64 [3] whole] where rank 0 passes [a: f32 [3]",
                      [](int rank) {
                        return DistributedStateDict{{"a", ops::zeros({3}, {.dtype = rank == 1 ? DType::f64 : DType::f32})}};
                      }) == 3);
  CHECK(ranks_raising(tmp / "undefined.safetensors", "rank 1 failed: 'a' is an undefined tensor", [](int rank) {
          return DistributedStateDict{{"a", rank == 1 ? Tensor() : ops::zeros({3})}};
        }) == 3);
  CHECK(ranks_raising(tmp / "no/such/dir/m.safetensors", "rank 0 failed", [](int) {
          return DistributedStateDict{{"a", ops::zeros({3})}};
        }) == 3);
  CHECK_FALSE(fs::exists(tmp / "names.safetensors"));
  CHECK_FALSE(fs::exists(tmp / "names.safetensors.tmp"));
}

TEST_CASE("safetensors export: a new export replaces the file atomically") {
  TempDir tmp;
  const std::string path = tmp / "m.safetensors";
  export_safetensors(path, {{"w", ops::zeros({2})}});
  export_safetensors(path, {{"w", ops::ones({3})}}, {.metadata = {{"version", "2"}}});
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK(read_safetensors_header(path).metadata.at("version") == "2");
  CHECK(read_safetensors_tensor(path, "w").to_vector<float>() == std::vector<float>(3, 1.0f));
}
