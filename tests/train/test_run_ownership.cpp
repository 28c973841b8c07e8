// A checkpoint root belongs to one run: what opening a root refuses (another
// run's record or checkpoints, a torn step directory, a damaged newest
// checkpoint, a second launch, an unwritable root), what it allows and
// records (a permitted identity change), what pruning may delete (only this
// run's, never the one just written), and sealed JSON (any changed byte found).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/metadata.h"
#include "checkpoint/sealed_json.h"
#include "tensor/error.h"
#include "tests/checkpoint/known_state.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/train/text_file.h"
#include "train/checkpoint_manager.h"
#include "train/model_loader.h"
#include "train/run_record.h"

using namespace tessera;
using namespace tessera::checkpoint;
using namespace tessera::train;
using tessera::checkpoint::testing::TempDir;
namespace fs = std::filesystem;

using tessera::testing::read_file;
using tessera::testing::write_file;

namespace {

ManagerOptions run_options(RootMode mode, nlohmann::json identity, int keep_last = 0) {
  return {.group = nullptr, .keep_last = keep_last, .sync = false, .mode = mode, .identity = std::move(identity)};
}

const nlohmann::json kSeed1 = {{"seed", 1}, {"data", "a.txt"}};
const nlohmann::json kSeed42 = {{"seed", 42}, {"data", "a.txt"}};

void save_steps(const std::string& root, const nlohmann::json& identity, std::initializer_list<int64_t> steps,
                RootMode mode = RootMode::new_run) {
  CheckpointManager manager(root, run_options(mode, identity));
  for (const int64_t step : steps) manager.save(step, checkpoint::testing::known_state(nullptr, step, 10), {{"step", step}});
}

}  // namespace

TEST_CASE("run ownership: another run's root is refused before anything is written or pruned") {
  // The data loss: a second run with --keep 1 pruned the first run's
  // step 6 and kept it as "the latest". Now it cannot even open the root.
  TempDir tmp;
  const std::string root = tmp / "ckpt";
  save_steps(root, kSeed1, {6});
  const std::string before = read_file(fs::path(root) / kRunRecordFile);
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::new_run, kSeed42, 1)),
                       doctest::Contains("belongs to run"), Error);
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::continue_run, kSeed42, 1)),
                       doctest::Contains("seed: the run's 1, this launch's 42"), Error);
  CHECK(list_checkpoints(root).size() == 1);
  CHECK(read_file(fs::path(root) / kRunRecordFile) == before);
}

TEST_CASE("run ownership: a fresh run into a root holding this run's checkpoints is refused up front") {
  TempDir tmp;
  const std::string root = tmp / "ckpt";
  save_steps(root, kSeed1, {3, 6});
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::new_run, kSeed1)),
                       doctest::Contains("already holds this run's checkpoints"), Error);
  // Continuing it is what the root is for.
  CheckpointManager manager(root, run_options(RootMode::continue_run, kSeed1));
  REQUIRE(manager.latest().has_value());
  CHECK(manager.latest()->step == 6);
  // A launch that died before its first save left only its record, which
  // protects nothing: any run may take the root, and says so.
  save_steps(tmp / "empty-run", kSeed1, {});
  const std::string dead_run = RunRecord::read(tmp / "empty-run/run.json").run_id;
  CheckpointManager taken(tmp / "empty-run", run_options(RootMode::new_run, kSeed42));
  REQUIRE(taken.notices().size() == 1);
  CHECK(taken.notices()[0].find("(run " + dead_run + " saved no checkpoint here)") != std::string::npos);
  CHECK(taken.run_id() != dead_run);
  CHECK(RunRecord::read(tmp / "empty-run/run.json").identity == kSeed42);
}

TEST_CASE("run ownership: a torn run.json in a root without checkpoints may be deleted, and the error says why") {
  TempDir tmp;
  const std::string root = tmp / "ckpt";
  save_steps(root, kSeed1, {});  // a launch that died before its first save
  const std::string record = fs::path(root) / kRunRecordFile;
  const std::string text = read_file(record);
  const std::string torn = text.substr(0, text.size() / 2);
  write_file(record, torn);
  for (const RootMode mode : {RootMode::new_run, RootMode::continue_run}) {
    CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(mode, kSeed1)),
                         doctest::Contains((record + ": not a JSON object (corrupt file?)").c_str()), Error);
    CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(mode, kSeed1)),
                         doctest::Contains((root + " holds no checkpoint, so nothing depends on its run.json").c_str()),
                         Error);
    CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(mode, kSeed1)),
                         doctest::Contains("Delete the file and launch again"), Error);
  }
  CHECK(read_file(record) == torn);  // never rewritten unasked
  fs::remove(record);
  CheckpointManager taken(root, run_options(RootMode::new_run, kSeed1));  // as the message says

  // With checkpoints, the record says whose they are: no such advice.
  save_steps(tmp / "saved", kSeed1, {2});
  write_file(tmp / "saved/run.json", torn);
  try {
    CheckpointManager refused(tmp / "saved", run_options(RootMode::continue_run, kSeed1));
    FAIL("a torn record beside checkpoints was accepted");
  } catch (const Error& error) {
    CHECK(std::string(error.what()).find("corrupt file?") != std::string::npos);
    CHECK(std::string(error.what()).find("Delete") == std::string::npos);
  }
}

TEST_CASE("run ownership: torn, foreign and unrecorded step directories are named") {
  TempDir tmp;
  const std::string root = tmp / "ckpt";
  save_steps(root, kSeed1, {2});
  fs::create_directories(checkpoint_path(root, 5));  // no metadata.json
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::continue_run, kSeed1)),
                       doctest::Contains("step-00000005"), Error);
  fs::remove(checkpoint_path(root, 5));

  // A checkpoint of another run copied in.
  save_steps(tmp / "other", kSeed1, {4});
  fs::copy(checkpoint_path(tmp / "other", 4), checkpoint_path(root, 4));
  const std::string foreign = "holds checkpoints of another run (copied in?): " + checkpoint_path(root, 4);
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::continue_run, kSeed1)),
                       doctest::Contains(foreign.c_str()), Error);
  fs::remove_all(checkpoint_path(root, 4));

  // Checkpoints without a run record (an older tessera, or copied).
  fs::create_directories(tmp / "bare");
  fs::copy(checkpoint_path(root, 2), checkpoint_path(tmp / "bare", 2));
  CHECK_THROWS_WITH_AS(CheckpointManager(tmp / "bare", run_options(RootMode::continue_run, kSeed1)),
                       doctest::Contains("holds checkpoint directories but no run.json"), Error);

  // Other files are left alone and mentioned.
  write_file(fs::path(root) / "notes.txt", "mine");
  CheckpointManager manager(root, run_options(RootMode::continue_run, kSeed1));
  REQUIRE(manager.notices().size() == 1);
  CHECK(manager.notices()[0].find("notes.txt (not checkpoints; left alone)") != std::string::npos);
}

TEST_CASE("run ownership: a changed metadata.json is found, and the step must be the directory's") {
  TempDir tmp;
  const std::string root = tmp / "ckpt";
  save_steps(root, kSeed1, {3, 4});
  const std::string metadata = fs::path(checkpoint_path(root, 4)) / kMetadataFile;
  const std::string pristine = read_file(metadata);

  // The one-bit change: "step": 4 -> 5 in the training state.
  std::string flipped = pristine;
  const size_t at = flipped.find("\"step\": 4");
  REQUIRE(at != std::string::npos);
  flipped[at + 8] = '5';
  write_file(metadata, flipped);
  const std::string damaged =
      "the newest checkpoint " + checkpoint_path(root, 4) + " is damaged: " + metadata + ": checksum mismatch";
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::continue_run, kSeed1)),
                       doctest::Contains(damaged.c_str()), Error);
  CHECK_THROWS_WITH_AS(read_metadata(checkpoint_path(root, 4)), doctest::Contains("checksum mismatch"), Error);

  // Resealed by hand with a step that is not the directory's.
  nlohmann::ordered_json json = nlohmann::ordered_json::parse(pristine);
  json.erase("crc32c");
  json["step"] = 5;
  write_file(metadata, seal_json(json));
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::continue_run, kSeed1)),
                       doctest::Contains("its metadata says step 5, its name step 4"), Error);
  // generate refuses it the same way, given the directory or its root (one check: step_name_disagreement).
  for (const std::string& given : {checkpoint_path(root, 4), root, checkpoint_path(root, 4) + "/"}) {
    INFO(given);
    CHECK_THROWS_WITH_AS(load_model_from_checkpoint(given),
                         doctest::Contains("its metadata says step 5, its name step 4: not the checkpoint its name says"),
                         Error);
  }
  CHECK(step_name_disagreement(tmp / "best", 5).empty());  // a name without a step says none
  CHECK(step_name_disagreement(checkpoint_path(root, 4), 4).empty());
  CHECK(step_name_disagreement(checkpoint_path(root, 4), std::nullopt).empty());  // a plain save records none

  // An older damaged checkpoint does not block a resume from the newest, and pruning keeps it.
  write_file(metadata, pristine);
  write_file(fs::path(checkpoint_path(root, 3)) / kMetadataFile, flipped);
  CheckpointManager manager(root, run_options(RootMode::continue_run, kSeed1, 1));
  CHECK(manager.latest()->step == 4);
  REQUIRE(manager.notices().size() == 1);
  CHECK(manager.notices()[0].find("step-00000003 is damaged") != std::string::npos);
  manager.save(5, checkpoint::testing::known_state(nullptr, 5, 10), {});
  const auto kept = list_checkpoints(root);
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].step == 3);  // damaged: not provably this run's, so not pruned
  CHECK(kept[1].step == 5);
}

TEST_CASE("run ownership: a permitted identity change is recorded in run.json") {
  TempDir tmp;
  const std::string root = tmp / "ckpt";
  save_steps(root, kSeed1, {2});
  nlohmann::json new_data = kSeed1;
  new_data["data"] = "b.txt";
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::continue_run, new_data)),
                       doctest::Contains("data: the run's \"a.txt\", this launch's \"b.txt\""), Error);
  ManagerOptions allowed = run_options(RootMode::continue_run, new_data);
  allowed.may_change = {"data"};
  {
    CheckpointManager manager(root, allowed);
    REQUIRE(manager.notices().size() == 1);
    CHECK(manager.notices()[0].find("identity amended at step 2") != std::string::npos);
  }
  const RunRecord record = RunRecord::read(fs::path(root) / kRunRecordFile);
  CHECK(record.identity["data"] == "b.txt");
  REQUIRE(record.amendments.size() == 1);
  CHECK(record.amendments[0] ==
        nlohmann::json{{"at_step", 2}, {"key", "data"}, {"from", "a.txt"}, {"to", "b.txt"}});
  // A fresh run may not change it: may_change is for continuing only.
  ManagerOptions fresh = run_options(RootMode::new_run, kSeed1);
  fresh.may_change = {"data"};
  CHECK_THROWS_WITH_AS(CheckpointManager(root, fresh), doctest::Contains("belongs to run"), Error);
}

TEST_CASE("run ownership: pruning keeps the checkpoint just written, even below a newer one") {
  TempDir tmp;
  const std::string root = tmp / "ckpt";
  save_steps(root, kSeed1, {6});
  // A resume that starts lower than the newest (e.g. a user moved step 6
  // away and back) saves step 5: keep 1 must not delete step 5 in favour of 6.
  fs::rename(checkpoint_path(root, 6), tmp / "aside");
  CheckpointManager manager(root, run_options(RootMode::continue_run, kSeed1, 1));
  fs::rename(tmp / "aside", checkpoint_path(root, 6));
  manager.save(5, checkpoint::testing::known_state(nullptr, 5, 10), {});
  const auto kept = list_checkpoints(root);
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].step == 5);
  CHECK(kept[1].step == 6);
}

TEST_CASE("run ownership: one launch per root, and an unwritable root fails when opened") {
  TempDir tmp;
  const std::string root = tmp / "ckpt";
  CheckpointManager first(root, run_options(RootMode::new_run, kSeed1));
  CHECK_THROWS_WITH_AS(CheckpointManager(root, run_options(RootMode::continue_run, kSeed1)),
                       doctest::Contains("another launch is using this checkpoint root (pid "), Error);
  // /proc refuses new files even to root, where permission bits would not.
  CHECK_THROWS_AS(CheckpointManager("/proc/self/tessera-ckpt", run_options(RootMode::new_run, kSeed1)), Error);
}

TEST_CASE("sealed JSON: any changed byte, a missing or misplaced seal is an error naming the file") {
  const nlohmann::ordered_json object = {{"a", 1}, {"b", {{"c", "text"}}}};
  const std::string text = seal_json(object);
  CHECK(parse_sealed_json(text, "f.json") == nlohmann::json::parse(object.dump()));
  CHECK(parse_sealed_json(seal_json(nlohmann::ordered_json::object()), "e.json").empty());
  for (size_t at = 0; at < text.find("\"crc32c\""); ++at) {
    std::string changed = text;
    changed[at] ^= 0x01;
    CAPTURE(at);
    CHECK_THROWS_AS(parse_sealed_json(changed, "f.json"), Error);
  }
  CHECK_THROWS_WITH_AS(parse_sealed_json(object.dump(), "f.json"), doctest::Contains("f.json: no \"crc32c\" seal"),
                       Error);
  std::string moved = text;
  moved.replace(moved.find("\"a\": 1"), 6, "\"a\": 2");
  CHECK_THROWS_WITH_AS(parse_sealed_json(moved, "f.json"), doctest::Contains("f.json: checksum mismatch"), Error);
  CHECK_THROWS_WITH_AS(seal_json(nlohmann::ordered_json::array()), doctest::Contains("expected a JSON object"), Error);
}
