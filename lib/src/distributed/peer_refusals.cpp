#include "distributed/peer_refusals.h"

#include "distributed/store_common.h"

namespace dpar::dist::detail {

std::string peer_address(const std::string& grpc_peer) {
  for (const char* scheme : {"ipv4:", "ipv6:", "unix:"}) {
    if (grpc_peer.rfind(scheme, 0) == 0) return grpc_peer.substr(5);
  }
  return grpc_peer;
}

PeerRefusals::PeerRefusals(std::string server, std::function<void(const std::string&)> log)
    : server_(std::move(server)), log_(std::move(log)) {}

void PeerRefusals::note(const std::string& peer, const std::string& why) {
  const std::string address = peer_address(peer);
  std::string host = address;
  split_host_port(address, &host, nullptr);
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (capped_ || hosts_.count(host)) return;
    if (hosts_.size() == kMaxHosts) {
      capped_ = true;
      line = server_ + ": refused peers from " + std::to_string(kMaxHosts) +
             " hosts; further refusals are not logged";
    } else {
      hosts_.insert(host);
      line = server_ + ": refused a call from " + address + ": " + why + " (further calls from " +
             host + " are refused without a log line)";
    }
  }
  log_line(log_, line);
}

}  // namespace dpar::dist::detail
