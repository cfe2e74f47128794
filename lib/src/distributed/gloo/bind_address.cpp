#include "distributed/gloo/bind_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dpar/core/error.h"
#include "dpar/distributed/etcd_store.h"

namespace dpar::dist::detail {

std::string endpoint_host(const std::string& endpoint) {
  if (!endpoint.empty() && endpoint[0] == '[') {
    const size_t close = endpoint.find(']');
    return close == std::string::npos ? endpoint.substr(1) : endpoint.substr(1, close - 1);
  }
  const size_t colon = endpoint.rfind(':');
  // More than one colon without brackets: a bare IPv6 address.
  if (colon == std::string::npos || endpoint.find(':') != colon) return endpoint;
  return endpoint.substr(0, colon);
}

bool is_loopback_host(const std::string& host) {
  // 0.0.0.0 as a destination also means this machine on Linux.
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1" ||
         host == "ip6-localhost" || host == "0.0.0.0";
}

namespace {

// The local address of the route to host (numeric), or "" if it cannot be determined.
std::string route_source_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) return {};
  std::string result;
  for (addrinfo* ai = found; ai != nullptr && result.empty(); ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) result = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return result;
}

}  // namespace

std::string default_bind_address(const Store* store) {
  while (const auto* prefixed = dynamic_cast<const PrefixStore*>(store)) store = &prefixed->base();
  // The store's host: a dpar StoreServer's, or the first etcd member's (a list names one
  // cluster, all reachable the same way).
  std::string endpoint;
  if (const auto* client = dynamic_cast<const StoreClient*>(store)) endpoint = client->endpoint();
  if (const auto* etcd = dynamic_cast<const EtcdStore*>(store))
    endpoint = etcd->endpoints().substr(0, etcd->endpoints().find(','));
  if (!endpoint.empty()) {
    const std::string host = endpoint_host(endpoint);
    if (is_loopback_host(host)) return "127.0.0.1";
    const std::string local = route_source_address(host);
    DPAR_CHECK(!local.empty(), "gloo: cannot find a local address that routes to the store host '",
               host, "'; set ProcessGroupOptions::bind_address");
    return local;
  }
  char name[256] = {};
  DPAR_CHECK(gethostname(name, sizeof(name) - 1) == 0,
             "gloo: gethostname failed: ", std::strerror(errno));
  return name;
}

}  // namespace dpar::dist::detail
