// The job secret: a random word that only one job's processes know, so that
// what listens for that job (the launcher's lifelines, the rendezvous store)
// can tell its own ranks from any other process that reaches the port. The
// launcher (tools/launch) makes one and hands it to the ranks in
// TESSERA_JOB_SECRET; under a torchrun-style launch whoever starts the ranks
// sets it for all of them. It proves membership, nothing more: the traffic
// itself is not encrypted (docs/distributed.md#security-model).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "dist/launch/launch_environment.h"

namespace tessera::dist {

inline constexpr const char* kJobSecretVariable = "TESSERA_JOB_SECRET";
// The lengths a secret may have (a listener refuses a longer one unread).
inline constexpr size_t kShortestJobSecret = 16;
inline constexpr size_t kLongestJobSecret = 256;

// 32 hexadecimal digits from the kernel's random source (128 bits).
std::string new_job_secret();

// TESSERA_JOB_SECRET when set: 16 to 256 characters of printable ASCII with
// no space (a secret a person or a scheduler made also serves); empty or
// malformed is an Error naming the variable, never a fallback to none.
// Nothing when unset.
std::optional<std::string> job_secret_from(const EnvironmentLookup& environment = process_environment);

// Whether `presented` is `expected`, in a time that does not depend on
// where they first differ (a stranger cannot guess it a character at a time).
bool is_job_secret(std::string_view presented, std::string_view expected);

}  // namespace tessera::dist
