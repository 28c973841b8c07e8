// What lets a listener tell its own job's processes from strangers: the job
// secret (dist/launch/job_secret.h) and a listening socket bound where it is
// asked (dist/launch/tcp_socket.h).
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "dist/launch/job_secret.h"
#include "dist/launch/tcp_socket.h"
#include "tests/dist/error_message.h"
#include "tests/dist/external_address.h"

using namespace tessera;
using namespace tessera::dist;
using tessera::test::external_ipv4;
using tessera::test::message_of;
using namespace std::chrono_literals;

namespace {

EnvironmentLookup environment_of(std::map<std::string, std::string> variables) {
  return [variables](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

}  // namespace

TEST_CASE("a new job secret is 32 hexadecimal digits, different every time") {
  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) {
    const std::string secret = new_job_secret();
    CHECK(secret.size() == 32);
    CHECK(secret.find_first_not_of("0123456789abcdef") == std::string::npos);
    seen.insert(secret);
  }
  CHECK(seen.size() == 64);
}

TEST_CASE("the job secret is read from TESSERA_JOB_SECRET, and a malformed one is refused by name") {
  CHECK_FALSE(job_secret_from(environment_of({})).has_value());
  CHECK(job_secret_from(environment_of({{"TESSERA_JOB_SECRET", "0123456789abcdef"}})) == "0123456789abcdef");
  const std::string made_by_a_person = "Preemptible-job/42:aZ!";
  CHECK(job_secret_from(environment_of({{"TESSERA_JOB_SECRET", made_by_a_person}})) == made_by_a_person);
  for (const std::string bad : {std::string(), std::string("short"), std::string(257, 'a'),
                                std::string("has a space in it here"), std::string("tab\there-and-there")}) {
    CAPTURE(bad);
    const std::string message = message_of([&] { job_secret_from(environment_of({{"TESSERA_JOB_SECRET", bad}})); });
    CHECK(message.find("TESSERA_JOB_SECRET") != std::string::npos);
  }
}

TEST_CASE("a secret matches only itself, whatever its length") {
  CHECK(is_job_secret("0123456789abcdef", "0123456789abcdef"));
  CHECK_FALSE(is_job_secret("0123456789abcdee", "0123456789abcdef"));
  CHECK_FALSE(is_job_secret("0123456789abcde", "0123456789abcdef"));
  CHECK_FALSE(is_job_secret("0123456789abcdef0", "0123456789abcdef"));
  CHECK_FALSE(is_job_secret("", "0123456789abcdef"));
}

TEST_CASE("a listener bound to loopback cannot be reached at this host's other addresses") {
  const Socket listener = listen_tcp("127.0.0.1", 0);
  const int port = bound_port(listener);
  CHECK(port > 0);
  CHECK(connect_tcp("127.0.0.1", port, Clock::now() + 5s).valid());
  const std::optional<std::string> external = external_ipv4();
  if (!external) {
    MESSAGE("no external IPv4 address here: only loopback is checked");
    return;
  }
  // Refused at once, then retried until the deadline: a StoreTimeout.
  const std::string message = message_of([&] { connect_tcp(*external, port, Clock::now() + 300ms); });
  CHECK(message.find("could not connect") != std::string::npos);
}

TEST_CASE("a listener on every interface is reached at loopback and at this host's address") {
  const Socket listener = listen_tcp(kEveryInterface, 0);
  const int port = bound_port(listener);
  CHECK(connect_tcp("127.0.0.1", port, Clock::now() + 5s).valid());
  if (const std::optional<std::string> external = external_ipv4()) {
    CHECK(connect_tcp(*external, port, Clock::now() + 5s).valid());
  }
}

TEST_CASE("a listener refuses a port in use and an address that is not this host's, naming them") {
  const Socket first = listen_tcp("127.0.0.1", 0);
  const int port = bound_port(first);
  const std::string in_use = message_of([&] { listen_tcp("127.0.0.1", port); });
  CHECK(in_use.find(fmt::format("127.0.0.1:{}", port)) != std::string::npos);
  CHECK(in_use.find("in use") != std::string::npos);
  // 192.0.2.0/24 is TEST-NET-1: never a local address.
  const std::string not_here = message_of([] { listen_tcp("192.0.2.7", 0); });
  CHECK(not_here.find("192.0.2.7") != std::string::npos);
  const std::string unknown = message_of([] { listen_tcp("no-such-host.invalid", 0); });
  CHECK(unknown.find("no-such-host.invalid") != std::string::npos);
}
