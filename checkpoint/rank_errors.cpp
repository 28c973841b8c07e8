// Error agreement across the ranks of a checkpoint step.
#include "checkpoint/rank_errors.h"

#include <exception>
#include <span>

#include "dist/init.h"
#include "tensor/error.h"

namespace tessera::checkpoint {

dist::ProcessGroupPtr resolve_group(const dist::ProcessGroupPtr& group) { return group ? group : dist::world_or_null(); }

int rank_of(const dist::ProcessGroupPtr& group) { return group ? group->rank() : 0; }

std::vector<nlohmann::json> gather_json(const dist::ProcessGroupPtr& group, const nlohmann::json& mine) {
  if (!group) return {mine};
  const std::string text = mine.dump();
  const auto all = group->all_gather_bytes(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  std::vector<nlohmann::json> parsed;
  for (const auto& bytes : all) parsed.push_back(nlohmann::json::parse(bytes.begin(), bytes.end()));
  return parsed;
}

void rethrow_any(const std::vector<nlohmann::json>& reports, const char* phase) {
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    if (reports[rank].contains("error")) {
      fail("checkpoint::{}: rank {} failed: {}", phase, rank, reports[rank]["error"].get<std::string>());
    }
  }
}

nlohmann::json report_of(const std::function<void()>& part) {
  try {
    part();
  } catch (const std::exception& error) {
    return {{"error", error.what()}};
  }
  return nlohmann::json::object();
}

}  // namespace tessera::checkpoint
