// The job secret (contract in job_secret.h).
#include "dist/launch/job_secret.h"

#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "dist/errors.h"

namespace tessera::dist {
namespace {

constexpr size_t kSecretBytes = 16;

bool is_secret_character(char c) { return c > ' ' && c < 0x7f; }

}  // namespace

std::string new_job_secret() {
  std::array<unsigned char, kSecretBytes> bytes{};
  size_t filled = 0;
  while (filled < bytes.size()) {
    const ssize_t got = ::getrandom(bytes.data() + filled, bytes.size() - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail("dist: cannot make a job secret: getrandom failed: {}", std::strerror(errno));
    }
    filled += static_cast<size_t>(got);
  }
  std::string secret;
  for (const unsigned char byte : bytes) secret += fmt::format("{:02x}", byte);
  return secret;
}

std::optional<std::string> job_secret_from(const EnvironmentLookup& environment) {
  std::optional<std::string> secret = environment(kJobSecretVariable);
  if (!secret) return std::nullopt;
  TESSERA_CHECK(secret->size() >= kShortestJobSecret && secret->size() <= kLongestJobSecret,
                "{} must hold {} to {} characters, it holds {}", kJobSecretVariable, kShortestJobSecret, kLongestJobSecret,
                secret->size());
  TESSERA_CHECK(std::all_of(secret->begin(), secret->end(), is_secret_character),
                "{} must be printable ASCII with no spaces", kJobSecretVariable);
  return secret;
}

bool is_job_secret(std::string_view presented, std::string_view expected) {
  // Every character of the longer one is read whatever the others hold.
  const size_t length = std::max(presented.size(), expected.size());
  unsigned difference = presented.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < length; ++i) {
    const unsigned char a = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    const unsigned char b = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    difference |= static_cast<unsigned>(a ^ b);
  }
  return difference == 0;
}

}  // namespace tessera::dist
