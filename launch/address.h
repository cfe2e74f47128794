#pragma once
// Addresses and ports of this machine: which IPv4 addresses its interfaces carry, how a
// host name in a hostfile resolves, and whether a port can still be bound.
#include <string>
#include <vector>

namespace dpar::launch {

// True when `text` is a dotted-quad IPv4 address ("10.0.0.1"; no leading zeros, no spaces).
bool is_ipv4(const std::string& text);

// IPv4 addresses of this machine's interfaces (getifaddrs), in interface order, no duplicates.
std::vector<std::string> local_ipv4_addresses();

// An IPv4 literal is returned as is; a name ("localhost", "node-3") is resolved with
// getaddrinfo. Returns "" when it does not resolve.
std::string resolve_ipv4(const std::string& host);

// Splits "ip:port" (port 1..65535). Returns false when it is malformed.
bool split_endpoint(const std::string& endpoint, std::string* ip, int* port);

// Tries to bind a TCP socket to ip:port the way a server would (SO_REUSEADDR, so a port in
// TIME_WAIT from an earlier run is not reported). When ip is not an address of this machine
// (a NAT'ed node address), the port is probed on 0.0.0.0 instead. Returns "" when the port is
// free, otherwise why not ("Address already in use").
std::string probe_port(const std::string& ip, int port);

}  // namespace dpar::launch
