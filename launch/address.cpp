#include "address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dpar::launch {

bool is_ipv4(const std::string& text) {
  in_addr addr{};
  if (inet_pton(AF_INET, text.c_str(), &addr) != 1) return false;
  // inet_pton already rejects "1.2.3" and "1.2.3.256"; reject leading zeros too, since
  // other tools read "010" as octal and the same --ips must mean the same on every node.
  char canonical[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr, canonical, sizeof canonical);
  return text == canonical;
}

std::vector<std::string> local_ipv4_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    const auto* sin = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
    if (inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text) == nullptr) continue;
    if (std::find(out.begin(), out.end(), text) == out.end()) out.emplace_back(text);
  }
  freeifaddrs(list);
  return out;
}

std::string resolve_ipv4(const std::string& host) {
  if (is_ipv4(host)) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0 || result == nullptr) return "";
  char text[INET_ADDRSTRLEN];
  const auto* sin = reinterpret_cast<const sockaddr_in*>(result->ai_addr);
  std::string out = inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text) ? text : "";
  freeaddrinfo(result);
  return out;
}

bool split_endpoint(const std::string& endpoint, std::string* ip, int* port) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) return false;
  const std::string port_text = endpoint.substr(colon + 1);
  if (port_text.size() > 5 || !std::all_of(port_text.begin(), port_text.end(), ::isdigit)) {
    return false;
  }
  const int value = std::stoi(port_text);
  if (value < 1 || value > 65535) return false;
  *ip = endpoint.substr(0, colon);
  *port = value;
  return true;
}

namespace {

// 0 when ip:port could be bound, otherwise the errno of the failure.
int try_bind(const std::string& ip, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  int err = 0;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    err = errno;
  } else if (listen(fd, 1) != 0) {
    // bind() can succeed next to a listener when both use SO_REUSEADDR in some kernels;
    // listen() is where the conflict surfaces then.
    err = errno;
  }
  close(fd);
  return err;
}

}  // namespace

std::string probe_port(const std::string& ip, int port) {
  int err = try_bind(ip, port);
  if (err == EADDRNOTAVAIL) err = try_bind("0.0.0.0", port);
  return err == 0 ? "" : std::strerror(err);
}

}  // namespace dpar::launch
