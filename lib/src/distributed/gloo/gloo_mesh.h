#pragma once
// connect_gloo_mesh: Gloo's full-mesh rendezvous, with every pair authenticated.
//
// Why dpar does not call gloo::rendezvous::Context::connectFullMesh: each TCP pair of the Gloo
// dpar links (Debian's 0.0~git20220518) listens on a port of its own from the moment it is
// created until connect() is called, and takes the first connection that arrives as its peer,
// without checking who it is. A port scanner or health check that connects in that window
// breaks the rendezvous with misleading errors, and frames from it reach Gloo's event-loop
// thread, which aborts the process on some malformed ones. So the steps of connectFullMesh are
// done here, with guards around Gloo's own pairs:
//  1. Every rank announces itself and waits for all: the pairs are created only when every
//     peer is there to connect at once, so a port listens for milliseconds instead of for as
//     long as the slowest rank takes to start.
//  2. Pairs are created, their addresses exchanged through the store (which admits only this
//     job's ranks) and connected. A failed connect is recorded and the other pairs still
//     connected, so no rank waits on a peer that gave up.
//  3. Each rank sends every peer a handshake over the pair: a nonce rank 0 draws for the
//     attempt and publishes in the store, its own rank and the peer's; it checks the ones it
//     receives. A stranger on a pair cannot produce it.
//  4. Every rank publishes its outcome. If any pair failed, all ranks drop the attempt and start
//     again on fresh ports (up to kMaxMeshAttempts), and a rank whose port a stranger took logs
//     one line naming the stranger's address.
// What remains: a stranger that connects within those milliseconds and sends a well-formed
// Gloo frame for a slot nobody posted can still make Gloo abort the process; closing that
// needs authentication inside Gloo's transport.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dpar/distributed/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace dpar::dist::detail {

inline constexpr int kMaxMeshAttempts = 5;

struct MeshOptions {
  int rank = 0;
  int size = 1;
  Millis timeout{std::chrono::minutes(30)};  // for each wait: peers joining, connect, handshake
  // Where the line about a stranger (or a retried attempt) goes; empty: stderr as "dpar: ...".
  std::function<void(const std::string&)> log;
  // Asked between slices of every wait (kCancelPoll): a non-empty answer ends the connect with
  // an error naming it (ProcessGroupOptions::cancel_connect). Empty: waits last the timeout.
  std::function<std::string()> cancelled;
};

// How often a cancellable connect looks at MeshOptions::cancelled while it waits.
inline constexpr Millis kCancelPoll{200};

// Rank `owner`'s published Gloo addresses (the store key "addr/<owner>" of an attempt) are
// repeated entries (int32 peer, uint32 length, Gloo's tcp::Address bytes, which start with the
// pair's sockaddr_storage). Where the address for `peer` lies in `blob`; throws dpar::Error when
// the blob is cut short or holds none for `peer`.
struct AddressEntry {
  size_t offset = 0;
  size_t length = 0;
};
AddressEntry find_address_entry(const Bytes& blob, int32_t peer, int owner);

// Gloo's exception texts start with "[/path/file.cc:123] ": the text after it, on one line.
std::string clean_gloo_message(const std::string& what);

// Returns a context whose pairs to every other rank are connected and authenticated. store is
// the group's own prefixed view. Throws dpar::Error naming the ranks that did not join, or what
// failed in the last attempt, or (options.cancelled) why the connect was cancelled. pair_sockets
// (optional) receives the descriptors of the pairs' connected sockets, for an abort that shuts them
// down (ProcessGroupGloo::abort).
std::shared_ptr<gloo::Context> connect_gloo_mesh(
    const std::shared_ptr<Store>& store, const std::shared_ptr<gloo::transport::Device>& device,
    const MeshOptions& options, std::vector<int>* pair_sockets = nullptr);

}  // namespace dpar::dist::detail
