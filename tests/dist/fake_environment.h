// An environment for tests of what reads one (dist::EnvironmentLookup):
// exactly the variables given, and nothing of the process's own.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "dist/launch/launch_environment.h"

namespace tessera::test {

inline dist::EnvironmentLookup fake_environment(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

}  // namespace tessera::test
