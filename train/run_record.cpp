// run.json: the run that owns a checkpoint root.
#include "train/run_record.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>
#include <random>

#include "checkpoint/sealed_json.h"
#include "tensor/error.h"

namespace tessera::train {

namespace {

constexpr const char* kRunFormat = "tessera-run";
constexpr int kRunFormatVersion = 1;

const nlohmann::json& field(const nlohmann::json& json, const char* key, const std::string& path) {
  TESSERA_CHECK(json.contains(key), "{}: no \"{}\"", path, key);
  return json[key];
}

}  // namespace

RunRecord RunRecord::start(nlohmann::json identity) {
  TESSERA_CHECK(identity.is_object(), "RunRecord: the identity must be a JSON object, got {}", identity.dump());
  const auto now = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
  std::random_device entropy;
  RunRecord record;
  record.run_id = fmt::format("{:%Y%m%dT%H%M%SZ}-{:08x}", now, entropy());
  record.created = fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", now);
  record.identity = std::move(identity);
  return record;
}

RunRecord RunRecord::read(const std::string& path) {
  const nlohmann::json json = checkpoint::read_sealed_json_file(path);
  const nlohmann::json& format = field(json, "format", path);
  TESSERA_CHECK(format.is_string() && format.get<std::string>() == kRunFormat, "{}: not a tessera run record ({})",
                path, format.dump());
  const nlohmann::json& version = field(json, "format_version", path);
  TESSERA_CHECK(version.is_number_unsigned() && version.get<uint64_t>() == kRunFormatVersion,
                "{}: format version {}; this tessera reads version {}", path, version.dump(), kRunFormatVersion);
  RunRecord record;
  const nlohmann::json& run_id = field(json, "run_id", path);
  const nlohmann::json& created = field(json, "created", path);
  TESSERA_CHECK(run_id.is_string() && !run_id.get<std::string>().empty() && created.is_string(),
                "{}: run_id and created must be strings", path);
  record.run_id = run_id.get<std::string>();
  record.created = created.get<std::string>();
  record.identity = field(json, "identity", path);
  record.amendments = field(json, "amendments", path);
  TESSERA_CHECK(record.identity.is_object() && record.amendments.is_array(),
                "{}: identity must be an object and amendments an array", path);
  return record;
}

void RunRecord::write(const std::string& path, bool sync) const {
  nlohmann::ordered_json json;
  json["format"] = kRunFormat;
  json["format_version"] = kRunFormatVersion;
  json["run_id"] = run_id;
  json["created"] = created;
  json["identity"] = identity;
  json["amendments"] = amendments;
  checkpoint::write_sealed_json_file(path, json, sync);
}

std::vector<IdentityDifference> identity_differences(const nlohmann::json& recorded, const nlohmann::json& current) {
  std::vector<IdentityDifference> differences;
  auto describe = [&](const std::string& key) {
    const nlohmann::json before = recorded.contains(key) ? recorded[key] : nlohmann::json("(absent)");
    const nlohmann::json now = current.contains(key) ? current[key] : nlohmann::json("(absent)");
    if (before != now) {
      differences.push_back({key, fmt::format("{}: the run's {}, this launch's {}", key, before.dump(), now.dump())});
    }
  };
  for (const auto& [key, value] : recorded.items()) describe(key);
  for (const auto& [key, value] : current.items()) {
    if (!recorded.contains(key)) describe(key);
  }
  return differences;
}

}  // namespace tessera::train
