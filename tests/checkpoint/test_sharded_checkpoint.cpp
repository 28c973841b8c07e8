// Sharded checkpoints: round trips for every dtype, resharding N -> M ranks
// and 2-D -> 1-D meshes with uneven shards, the atomic commit, every
// corruption detected with the file and tensor named, and live parameters
// (tensors that require grad) saved as they are.
#include <doctest/doctest.h>


#include <filesystem>
#include <fstream>

#include "checkpoint/async_save.h"
#include "checkpoint/checksum.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/sealed_json.h"
#include "checkpoint/sharded_checkpoint.h"
#include "dist/backends/local_backend.h"
#include "tensor/ops.h"
#include "tests/checkpoint/known_state.h"
#include "tests/checkpoint/temp_dir.h"

using namespace tessera;
using namespace tessera::checkpoint;
namespace fs = std::filesystem;

using tessera::checkpoint::testing::TempDir;
using tessera::checkpoint::testing::zeros_like_state;

namespace {

// The global tensors every test saves: awkward sizes, several dtypes.
std::map<std::string, Tensor> global_tensors() {
  return {{"embedding", ops::randn({97, 5}, PhiloxKey{1, 1})},
          {"bias", ops::randn({7}, PhiloxKey{1, 2}, {.dtype = DType::f64})},
          {"half", ops::randn({13, 3}, PhiloxKey{1, 3}, {.dtype = DType::bf16})},
          {"steps", ops::from_vector(std::vector<int64_t>{1, 2, 3}, {3})}};
}

// On `mesh`: 2-D tensors sharded on dim 0 along the mesh's last dim, the rest replicated.
DistributedStateDict distribute_all(const std::map<std::string, Tensor>& tensors, const dist::DeviceMesh& mesh) {
  DistributedStateDict state;
  for (const auto& [name, tensor] : tensors) {
    dist::Placements placements(static_cast<size_t>(mesh.ndim()), dist::Replicate{});
    if (tensor.dim() == 2) placements.back() = dist::Shard{0};
    state[name] = dist::distribute(tensor, mesh, placements);
  }
  return state;
}

void save_on(int world, const Shape& mesh_shape, const std::string& dir) {
  dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, mesh_shape);
    save(dir, distribute_all(global_tensors(), mesh), {.group = group, .training_state = {{"step", 42}}});
  });
}

// Loads on `world` ranks laid out as `mesh_shape` and checks every value.
void check_load_on(int world, const Shape& mesh_shape, const std::string& dir) {
  std::atomic<int> wrong{0};
  dist::run_local(world, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, mesh_shape);
    const DistributedStateDict expected = distribute_all(global_tensors(), mesh);
    const DistributedStateDict loaded = zeros_like_state(expected);
    const LoadReport report = load(dir, loaded, {.group = group});
    if (report.training_state.value("step", 0) != 42) ++wrong;
    for (const auto& [name, entry] : expected) {
      const auto want = std::get<dist::DTensor>(entry).local().to_vector<double>();
      const auto got = std::get<dist::DTensor>(loaded.at(name)).local().to_vector<double>();
      if (want != got) ++wrong;
    }
  });
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("checkpoint: whole tensors of every dtype round-trip bitwise in one process") {
  TempDir tmp;
  DistributedStateDict state;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean}) {
    state[std::string(dtype_name(dtype))] = ops::to(ops::randn({4, 3}, PhiloxKey{7, 1}), dtype);
  }
  save(tmp / "ckpt", state);
  DistributedStateDict loaded;
  for (const auto& [name, entry] : state) loaded[name] = ops::zeros_like(std::get<Tensor>(entry));
  load(tmp / "ckpt", loaded);
  for (const auto& [name, entry] : state) {
    CAPTURE(name);
    CHECK(std::get<Tensor>(loaded.at(name)).to_vector<double>() == std::get<Tensor>(entry).to_vector<double>());
  }
}

TEST_CASE("checkpoint: saved on N ranks, loaded on M, for N, M in {1, 2, 3, 4, 8}") {
  for (int saved : {1, 2, 3, 4, 8}) {
    TempDir tmp;
    save_on(saved, {saved}, tmp / "ckpt");
    for (int loaded : {1, 2, 3, 4, 8}) {
      CAPTURE(saved);
      CAPTURE(loaded);
      check_load_on(loaded, {loaded}, tmp / "ckpt");
    }
  }
}

TEST_CASE("checkpoint: an HSDP 2x2 checkpoint loads on a 1-D mesh of 3, and back") {
  TempDir tmp;
  save_on(4, {2, 2}, tmp / "hsdp");
  check_load_on(3, {3}, tmp / "hsdp");
  save_on(3, {3}, tmp / "flat");
  check_load_on(4, {2, 2}, tmp / "flat");
  // Replicated pieces were written once: 2 shard files for the 2x2 mesh.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(tmp.path / "hsdp")) files += entry.path().extension() == ".safetensors";
  CHECK(files == 2);
}

TEST_CASE("checkpoint: every rank file is a valid safetensors file") {
  TempDir tmp;
  save_on(3, {3}, tmp / "ckpt");
  const SafetensorsHeader header = read_safetensors_header(tmp / "ckpt/rank-00001.safetensors");
  const SafetensorsEntry& embedding = header.entry("embedding", "test");
  CHECK(embedding.shape == Shape{33, 5});
  CHECK(read_safetensors_tensor(tmp / "ckpt/rank-00001.safetensors", "embedding").to_vector<float>() ==
        ops::narrow(global_tensors().at("embedding"), 0, 33, 33).to_vector<float>());
}

TEST_CASE("checkpoint: the commit is atomic and never overwrites") {
  TempDir tmp;
  save_on(2, {2}, tmp / "ckpt");
  CHECK_FALSE(fs::exists(tmp / "ckpt.tmp"));
  CHECK_THROWS_WITH_AS(save_on(2, {2}, tmp / "ckpt"), doctest::Contains("already exists"), Error);
  // A save that died before its commit leaves only the .tmp directory: not a checkpoint.
  fs::create_directories(tmp / "dead.tmp");
  std::ofstream(tmp / "dead.tmp/rank-00000.safetensors") << "partial";
  CHECK_THROWS_WITH_AS(load(tmp / "dead", {}), doctest::Contains("is not a directory"), Error);
  save_on(2, {2}, tmp / "dead");  // the stale .tmp is replaced
  check_load_on(2, {2}, tmp / "dead");
}

TEST_CASE("checkpoint: corrupt, truncated, missing and foreign files are reported") {
  TempDir tmp;
  save_on(2, {2}, tmp / "ckpt");
  const std::string rank1 = tmp / "ckpt/rank-00001.safetensors";
  auto expect_load_error = [&](const std::string& fragment) {
    CHECK_THROWS_WITH_AS(check_load_on(2, {2}, tmp / "ckpt"), doctest::Contains(fragment.c_str()), Error);
  };
  const std::string pristine = [&] {
    std::ifstream in(rank1, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto write = [&](const std::string& bytes) { std::ofstream(rank1, std::ios::binary | std::ios::trunc) << bytes; };

  std::string flipped = pristine;
  flipped[flipped.size() - 3] ^= 0x10;
  write(flipped);
  expect_load_error("do not match their checksum");

  write(pristine.substr(0, pristine.size() - 10));
  expect_load_error("truncated");

  fs::remove(rank1);
  expect_load_error("rank-00001.safetensors: cannot open");

  write(pristine);
  const std::string metadata = tmp / "ckpt/metadata.json";
  const std::string text = [&] {
    std::ifstream in(metadata);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  std::ofstream(metadata, std::ios::trunc) << "{\"format\": \"something else\"}";
  expect_load_error("no \"crc32c\" seal");
  // metadata.json is sealed: any changed byte is reported as a change.
  std::string future = text;
  future.replace(future.find("\"format_version\": 2"), 19, "\"format_version\": 9");
  std::ofstream(metadata, std::ios::trunc) << future;
  expect_load_error("metadata.json: checksum mismatch");
  std::ofstream(metadata, std::ios::trunc) << seal_json(
      [&] {
        nlohmann::ordered_json json = nlohmann::ordered_json::parse(future);
        json.erase("crc32c");
        return json;
      }());
  expect_load_error("format version 9");
  std::ofstream(metadata, std::ios::trunc) << text.substr(0, text.size() / 2);
  expect_load_error("not a JSON object");
  std::ofstream(metadata, std::ios::trunc) << text;
  check_load_on(2, {2}, tmp / "ckpt");
}

TEST_CASE("checkpoint: a rank file's header that disagrees with the metadata is refused, before any data is read") {
  // A rank file is a safetensors file of its own; no checksum covers its
  // header, so the load holds the header to the sealed metadata.
  TempDir tmp;
  save_on(2, {2}, tmp / "ckpt");
  const std::string rank1 = tmp / "ckpt/rank-00001.safetensors";
  const std::string pristine = [&] {
    std::ifstream in(rank1, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const SafetensorsHeader header = read_safetensors_header(rank1);
  const SafetensorsEntry& embedding = header.entry("embedding", "test");
  REQUIRE(embedding.dtype == DType::f32);
  REQUIRE(embedding.shape.size() == 2);
  // Each edit keeps the header's length, so the file still parses as safetensors.
  const auto edited = [&](const std::string& from, const std::string& to) {
    const size_t at = pristine.find(from);
    REQUIRE(at != std::string::npos);
    REQUIRE(at < static_cast<size_t>(header.data_offset));
    REQUIRE(from.size() == to.size());
    std::string bytes = pristine;
    bytes.replace(at, from.size(), to);
    std::ofstream(rank1, std::ios::binary | std::ios::trunc) << bytes;
    read_safetensors_header(rank1);  // a valid file all the same
  };
  const auto expect_refused = [&](const std::string& fragment) {
    INFO(fragment);
    CHECK_THROWS_WITH_AS(check_load_on(2, {2}, tmp / "ckpt"),
                         doctest::Contains((rank1 + ": its safetensors header disagrees with metadata.json").c_str()),
                         Error);
    CHECK_THROWS_WITH_AS(check_load_on(1, {1}, tmp / "ckpt"), doctest::Contains(fragment.c_str()), Error);
  };
  edited("\"dtype\":\"F32\"", "\"dtype\":\"I32\"");  // the edit: same bytes, read as integers
  expect_refused("'embedding' is I32 in the file, F32 in the metadata");
  const std::string shape = fmt::format("[{},{}]", embedding.shape[0], embedding.shape[1]);
  const std::string transposed = fmt::format("[{},{}]", embedding.shape[1], embedding.shape[0]);
  edited("\"shape\":" + shape, "\"shape\":" + transposed);
  expect_refused(fmt::format("'embedding' has shape {} in the file, {} in the metadata",
                             Shape{embedding.shape[1], embedding.shape[0]}, embedding.shape));
  edited("\"half\":", "\"halt\":");
  expect_refused("'half' is not in the file; 'halt' is in the file, not in the metadata");
  std::ofstream(rank1, std::ios::binary | std::ios::trunc) << pristine;
  check_load_on(2, {2}, tmp / "ckpt");
  check_load_on(1, {1}, tmp / "ckpt");
}

TEST_CASE("checkpoint: names and shapes are validated first, every offending key in one error") {
  TempDir tmp;
  DistributedStateDict state{{"a", ops::zeros({3})}, {"b", ops::zeros({2, 2})}};
  save(tmp / "ckpt", state);
  DistributedStateDict other{{"a", ops::zeros({4})}, {"c", ops::zeros({1})}};
  CHECK_THROWS_WITH_AS(load(tmp / "ckpt", other),
                       doctest::Contains("a: shape [3] in the checkpoint, [4] here; missing keys: c; unexpected keys: b"),
                       Error);
  DistributedStateDict partial{{"b", ops::ones({2, 2})}, {"c", ops::ones({1})}};
  const LoadReport report = load(tmp / "ckpt", partial, {.strict = false});
  CHECK(report.missing_keys == std::vector<std::string>{"c"});
  CHECK(report.unexpected_keys == std::vector<std::string>{"a"});
  CHECK(std::get<Tensor>(partial.at("b")).to_vector<float>() == std::vector<float>(4, 0.0f));
}

TEST_CASE("checkpoint: crc32c matches the standard check value") {
  const std::string text = "123456789";
  CHECK(crc32c(text.data(), text.size()) == 0xE3069283u);
}

TEST_CASE("checkpoint: the crc32 instruction and the tables agree on every length, alignment and chaining") {
  CHECK(crc32c_portable("123456789", 9) == 0xE3069283u);
  std::vector<uint8_t> bytes(4099);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(philox4x32(PhiloxKey{3, 4}, i)[0]);
  for (size_t offset : {0, 1, 3, 7}) {
    for (size_t size : {0, 1, 7, 8, 9, 63, 64, 1000, 4091}) {
      CAPTURE(offset);
      CAPTURE(size);
      CHECK(crc32c(bytes.data() + offset, size) == crc32c_portable(bytes.data() + offset, size));
      // Extending a CRC over a second range equals the CRC of both at once.
      const uint32_t first = crc32c(bytes.data() + offset, size / 2);
      CHECK(crc32c(bytes.data() + offset + size / 2, size - size / 2, first) ==
            crc32c_portable(bytes.data() + offset, size));
    }
  }
}

TEST_CASE("checkpoint: load converts to the receiving tensor's dtype, across a resharding") {
  TempDir tmp;
  const Tensor saved = ops::randn({11, 6}, PhiloxKey{9, 1});
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {3});
    save(tmp / "ckpt", {{"w", dist::distribute(saved, mesh, {dist::Shard{0}})}}, {.group = group});
  });
  for (DType dtype : {DType::f64, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    std::atomic<int> wrong{0};
    dist::run_local(2, [&](const dist::ProcessGroupPtr& group) {
      const dist::DeviceMesh mesh(group, kCPU, {2});
      const dist::DTensor expected = dist::distribute(ops::to(saved, dtype), mesh, {dist::Shard{0}});
      const DistributedStateDict loaded = zeros_like_state({{"w", expected}});
      load(tmp / "ckpt", loaded, {.group = group});
      const Tensor local = std::get<dist::DTensor>(loaded.at("w")).local();
      if (local.dtype() != dtype || local.to_vector<double>() != expected.local().to_vector<double>()) ++wrong;
    });
    CHECK(wrong == 0);
  }
}

TEST_CASE("checkpoint: live tensors that require grad save, snapshot and export with grad mode on") {
  // A checkpoint reads values and is no function of them: the raw ops it runs
  // on a model's parameters must not trip the raw-op guard (tensor/ops.h).
  TempDir tmp;
  Tensor weight = ops::transpose(ops::randn({3, 5}, PhiloxKey{9, 1}), 0, 1);  // [5, 3], not contiguous
  weight.set_requires_grad(true);
  const std::vector<double> values = weight.to_vector<double>();
  const DistributedStateDict state{{"weight", weight}};

  save(tmp / "ckpt", state);
  const DistributedStateDict loaded{{"weight", ops::zeros({5, 3})}};
  load(tmp / "ckpt", loaded);
  CHECK(std::get<Tensor>(loaded.at("weight")).to_vector<double>() == values);
  CHECK(std::get<Tensor>(snapshot(state, 0).at("weight")).to_vector<double>() == values);
  write_safetensors(tmp / "direct.safetensors", {{"weight", weight}}, {}, false);
  CHECK(read_safetensors_tensor(tmp / "direct.safetensors", "weight").to_vector<double>() == values);

  // Exported from 2 ranks, each holding its shard as a tensor that requires grad.
  const Tensor whole = ops::randn({5, 3}, PhiloxKey{9, 2});
  dist::run_local(2, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    const dist::DTensor sharded = dist::distribute(whole, mesh, {dist::Shard{0}});
    Tensor local = ops::clone(sharded.local());
    local.set_requires_grad(true);
    export_safetensors(tmp / "sharded.safetensors", {{"weight", dist::DTensor(local, mesh, sharded.placements(),
                                                                             sharded.global_shape())}},
                       {.group = group, .sync = false});
  });
  CHECK(read_safetensors_tensor(tmp / "sharded.safetensors", "weight").to_vector<double>() ==
        whole.to_vector<double>());
}

TEST_CASE("checkpoint: a Partial DTensor is refused by save, load and export, by name") {
  TempDir tmp;
  dist::run_local(2, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    DistributedStateDict state;
    state["pending"] = dist::distribute(ops::ones({4, 2}), mesh, {dist::Partial{}});
    const std::string expected =
        "'pending' is Partial(sum) on mesh dim 0: its pieces are terms of a pending sum, not the value; "
        "redistribute it to Replicate or Shard first";
    CHECK_THROWS_WITH_AS(save(tmp / "ckpt", state, {.group = group}), ("checkpoint::save: " + expected).c_str(), Error);
    CHECK_THROWS_WITH_AS(load(tmp / "ckpt", state, {.group = group}), ("checkpoint::load: " + expected).c_str(), Error);
    CHECK_THROWS_WITH_AS(export_safetensors(tmp / "out.safetensors", state, {.group = group}),
                         ("checkpoint export: " + expected).c_str(), Error);
    CHECK_FALSE(fs::exists(tmp / "ckpt.tmp"));
    CHECK_FALSE(fs::exists(tmp / "out.safetensors"));
  });
}
