#pragma once
// Which local address the Gloo TCP transport listens on.
#include <string>

#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

// "127.0.0.1" when the store's host is a loopback address (a single-machine job); otherwise the
// local address of the interface that routes to the store host, found with getsockname() on a
// UDP socket connect()ed to it (connect on UDP only picks the route; nothing is sent). The store
// host is a StoreClient's or an EtcdStore's first member's, seen through PrefixStores; other
// stores carry no host, so they get this machine's hostname as resolved by getaddrinfo (Gloo's
// own default).
std::string default_bind_address(const Store* store);

// The host part of "host:port", "[v6]:port" or a bare host.
std::string endpoint_host(const std::string& endpoint);
bool is_loopback_host(const std::string& host);

}  // namespace dpar::dist::detail
