// How the ranks of a collective checkpoint step agree on failure: each rank
// reports its part's outcome as JSON ({"error": text} when it failed), all
// reports are all-gathered, and every rank throws the first error. A rank
// that fails therefore never leaves the others waiting in a collective.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/process_group.h"

namespace tessera::checkpoint {

// `group`, or dist::world_or_null() when null (null again: this process alone).
dist::ProcessGroupPtr resolve_group(const dist::ProcessGroupPtr& group);
int rank_of(const dist::ProcessGroupPtr& group);  // 0 for this process alone

// Everyone's JSON (or a single process's), in rank order.
std::vector<nlohmann::json> gather_json(const dist::ProcessGroupPtr& group, const nlohmann::json& mine);

// Throws on every rank the first error any rank reported:
// "checkpoint::<phase>: rank R failed: <error>".
void rethrow_any(const std::vector<nlohmann::json>& reports, const char* phase);

// Runs `part` and returns its outcome as a report: {} or {"error": what()}.
nlohmann::json report_of(const std::function<void()>& part);

}  // namespace tessera::checkpoint
