#pragma once
// PeerRefusals: the one log line a server writes about a peer it refused (wrong job token, no
// identity, another job's world size). A hostile or misconfigured peer can call in a loop, so
// each peer host is named once, and after kMaxHosts distinct hosts one last line says further
// refusals go unlogged: the log and the memory behind it stay bounded whatever the peers do.
#include <functional>
#include <mutex>
#include <set>
#include <string>

namespace dpar::dist::detail {

class PeerRefusals {
 public:
  static constexpr size_t kMaxHosts = 64;

  // server: how lines start ("rendezvous store 127.0.0.1:6170"); log: where they go (empty:
  // stderr, as "dpar: <line>").
  PeerRefusals(std::string server, std::function<void(const std::string&)> log);

  // peer: gRPC's peer string ("ipv4:10.0.0.7:53412", "ipv6:[::1]:4000"); why: the refusal.
  void note(const std::string& peer, const std::string& why);

 private:
  const std::string server_;
  const std::function<void(const std::string&)> log_;
  std::mutex mu_;
  std::set<std::string> hosts_;
  bool capped_ = false;
};

// "ipv4:10.0.0.7:53412" -> "10.0.0.7:53412" (the address a reader can look up).
std::string peer_address(const std::string& grpc_peer);

}  // namespace dpar::dist::detail
