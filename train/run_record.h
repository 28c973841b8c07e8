// A checkpoint root belongs to one run. ROOT/run.json (sealed, see
// checkpoint/sealed_json.h) records which: a run id, when the run started, and its
// identity, the settings that make two launches the same run (for the
// trainer: model config, seed, data fingerprint, batch geometry). A launch
// that finds another identity in the root never saves, prunes or resumes
// there; an identity key the user explicitly allows to change (say, new data)
// is recorded as an amendment, so the record tells the whole story.
//
//   { "format": "tessera-run", "format_version": 1,
//     "run_id": "20261124T101500Z-4f2a9c1e", "created": "2026-11-24T10:15:00Z",
//     "identity": { ... }, "amendments": [ { "at_step": 300, "key": "data", "from": ..., "to": ... } ],
//     "crc32c": N }
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::train {

inline constexpr const char* kRunRecordFile = "run.json";

struct RunRecord {
  std::string run_id;
  std::string created;  // UTC, ISO 8601
  nlohmann::json identity = nlohmann::json::object();
  nlohmann::json amendments = nlohmann::json::array();

  // A new run of `identity`: a fresh id (UTC time plus 32 random bits) and now.
  static RunRecord start(nlohmann::json identity);
  static RunRecord read(const std::string& path);  // checks the seal and the fields
  void write(const std::string& path, bool sync) const;
};

// A key whose value differs between two identities, and
// "key: the run's <recorded>, this launch's <current>".
struct IdentityDifference {
  std::string key;
  std::string description;
};
std::vector<IdentityDifference> identity_differences(const nlohmann::json& recorded, const nlohmann::json& current);

}  // namespace tessera::train
