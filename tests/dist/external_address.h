// This machine's address as another host would reach it, for tests that a
// listener bound to loopback is not reachable there (and one bound to every
// interface is).
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <optional>
#include <string>

namespace tessera::test {

// The first IPv4 address of an interface that is up and not loopback;
// nothing on a machine without one (the tests then say what they skip).
inline std::optional<std::string> external_ipv4() {
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (const ifaddrs* entry = interfaces; entry != nullptr && !found; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
  }
  ::freeifaddrs(interfaces);
  return found;
}

}  // namespace tessera::test
