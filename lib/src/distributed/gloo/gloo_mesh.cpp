#include "distributed/gloo/gloo_mesh.h"

#include <arpa/inet.h>
#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include "distributed/store_common.h"
#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

template <class... Parts>
std::string cat(const Parts&... parts) {
  return ::dpar::detail::str_cat(parts...);
}

// Gloo's collectives use slot prefixes 0x01..0x08 and dpar's checked rings 0x40 and 0x42..0x44.
constexpr uint8_t kHandshakeSlotPrefix = 0x41;

// gloo::Context keeps the device and the transport context in protected members that only its
// rendezvous subclass sets; this hands Gloo's collectives the mesh built here.
class MeshContext final : public gloo::Context {
 public:
  MeshContext(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::transport::Context> transport)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

// What one rank sends another over their pair; trivially copyable, no padding.
struct Handshake {
  std::array<char, 8> magic{'d', 'p', 'a', 'r', 'm', 'e', 's', 'h'};
  std::array<uint8_t, 16> nonce{};
  int32_t from = 0;
  int32_t to = 0;
  int32_t attempt = 0;
  int32_t reserved = 0;
};
static_assert(sizeof(Handshake) == 40);

Handshake make_handshake(const Bytes& nonce, int from, int to, int attempt) {
  Handshake h;
  std::memcpy(h.nonce.data(), nonce.data(), std::min(nonce.size(), h.nonce.size()));
  h.from = from;
  h.to = to;
  h.attempt = attempt;
  return h;
}

// "10.0.0.7:41234" / "[fe80::1]:41234" (Gloo's own Address::str() prints the port's bytes
// swapped).
std::string format_address(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return cat(host, ":", ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    return cat("[", host, "]:", ntohs(a->sin6_port));
  }
  return cat("(an address of family ", ss.ss_family, ")");
}

std::string local_address(gloo::transport::Pair& pair) {
  return format_address(gloo::transport::tcp::Address(pair.address().bytes()).getSockaddr());
}

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto* x = reinterpret_cast<const sockaddr_in*>(&a);
    const auto* y = reinterpret_cast<const sockaddr_in*>(&b);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto* x = reinterpret_cast<const sockaddr_in6*>(&a);
    const auto* y = reinterpret_cast<const sockaddr_in6*>(&b);
    return x->sin6_port == y->sin6_port &&
           std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
  }
  return false;
}

// This process's connected sockets as the kernel sees them: fn(fd, local end, remote end) for
// every open file that is a socket with a peer. Gloo's tcp::Pair keeps its socket to itself
// (its header cannot be included from Debian's package), so pairs are matched by address.
template <class Fn>
void for_each_connected_socket(Fn&& fn) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage mine{}, theirs{};
    socklen_t mine_len = sizeof mine, theirs_len = sizeof theirs;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_len) != 0) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_len) != 0) continue;
    if (fn(fd, mine, theirs)) return;
  }
}

sockaddr_storage listen_address(gloo::transport::Pair& pair) {
  return gloo::transport::tcp::Address(pair.address().bytes()).getSockaddr();
}

// Who is connected to the pair's port: the socket whose local end is the port the pair
// listened on (a port listens once, so there is at most one).
std::string remote_address(gloo::transport::Pair& pair) {
  const sockaddr_storage local = listen_address(pair);
  std::string found = "(an address no longer connected)";
  for_each_connected_socket([&](int, const sockaddr_storage& mine, const sockaddr_storage& theirs) {
    if (!same_endpoint(mine, local)) return false;
    found = format_address(theirs);
    return true;
  });
  return found;
}

void throw_if_cancelled(const MeshOptions& options) {
  if (!options.cancelled) return;
  const std::string why = options.cancelled();
  if (!why.empty()) DPAR_FAIL("connecting was cancelled: ", why);
}

// store.wait for the connect's timeout; with options.cancelled, in slices between which the
// cancellation is looked at, so that an abort (a peer found dead meanwhile) ends the connect
// within a slice instead of at the timeout.
void wait_keys(Store& store, const std::vector<std::string>& keys, const MeshOptions& options) {
  if (!options.cancelled) {
    store.wait(keys, options.timeout);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  for (;;) {
    throw_if_cancelled(options);
    const auto left =
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    try {
      store.wait(keys, std::clamp(left, Millis(1), kCancelPoll));
      return;
    } catch (const Error&) {
      // A slice ran out (a store that failed throws again from check).
      if (store.check(keys)) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string names;
        for (const std::string& k : keys) names += (names.empty() ? "'" : ", '") + k + "'";
        DPAR_FAIL("timed out after ", format_seconds(options.timeout), " s waiting for ", names);
      }
    }
  }
}

// Waits for "<prefix><r>" of every rank; a timeout names the ranks whose key never came.
void wait_for_ranks(Store& store, const std::string& prefix, int size, const MeshOptions& options,
                    const std::string& what) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    wait_keys(store, keys, options);
  } catch (const Error& e) {
    throw_if_cancelled(options);
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[static_cast<size_t>(r)]}))
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (missing.empty()) throw;
    DPAR_FAIL("rank ", missing, " did not ", what, " (", e.what(), ")");
  }
}

// How a pair ended in one attempt, as this rank saw it.
enum class PairOutcome : char {
  Authenticated = 'a',
  NoConnect = 'c',       // connect() failed
  NoHandshake = 'h',     // connected, but no handshake came (silence, I/O error, given up)
  WrongHandshake = 'w',  // connected, and what came was not the peer's handshake
};

struct PeerState {
  PairOutcome outcome = PairOutcome::Authenticated;
  std::string detail;
};

Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Entries of "addr/<rank>": see AddressEntry.
void append_address(Bytes& blob, int32_t peer, const std::vector<char>& address) {
  const auto length = static_cast<uint32_t>(address.size());
  const auto* p = reinterpret_cast<const uint8_t*>(&peer);
  blob.insert(blob.end(), p, p + sizeof peer);
  const auto* l = reinterpret_cast<const uint8_t*>(&length);
  blob.insert(blob.end(), l, l + sizeof length);
  blob.insert(blob.end(), address.begin(), address.end());
}

std::vector<char> find_address(const Bytes& blob, int32_t peer, int owner) {
  const AddressEntry e = find_address_entry(blob, peer, owner);
  return std::vector<char>(blob.begin() + static_cast<ptrdiff_t>(e.offset),
                           blob.begin() + static_cast<ptrdiff_t>(e.offset + e.length));
}

// One attempt at the mesh (steps 1-4 of gloo_mesh.h). transport is set when every pair of
// every rank was authenticated.
struct AttemptResult {
  std::shared_ptr<gloo::transport::Context> transport;
  std::vector<int> sockets;            // the connected pairs' sockets (see pair_sockets)
  std::string failures;                // every rank's failed pairs, for the error or the log
  std::vector<std::string> strangers;  // lines this rank logs
};

class MeshAttempt {
 public:
  MeshAttempt(const std::shared_ptr<Store>& root, std::shared_ptr<gloo::transport::Device> device,
              const MeshOptions& options, int attempt)
      : store_(std::make_shared<PrefixStore>(cat("attempt/", attempt), root)),
        device_(std::move(device)),
        options_(options),
        attempt_(attempt),
        peers_(static_cast<size_t>(options.size)) {}

  AttemptResult run() {
    const int rank = options_.rank;
    const int size = options_.size;
    store_->set(cat("joined/", rank), Bytes{'1'});
    wait_for_ranks(*store_, "joined/", size, options_, "join");
    if (rank == 0) store_->set("nonce", draw_nonce());

    transport_ = device_->createContext(rank, size);
    transport_->setTimeout(options_.timeout);
    Bytes blob;
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) append_address(blob, peer, transport_->createPair(peer)->address().bytes());
    }
    store_->set(cat("addr/", rank), blob);
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) connect(peer);
    }
    handshake();

    std::string mine;
    for (int peer = 0; peer < size; ++peer) {
      const PeerState& s = peers_[static_cast<size_t>(peer)];
      if (peer != rank && s.outcome != PairOutcome::Authenticated)
        mine += cat(peer, " ", static_cast<char>(s.outcome), " ", s.detail, "\n");
    }
    store_->set(cat("outcome/", rank), to_bytes(mine));
    wait_for_ranks(*store_, "outcome/", size, options_, "finish connecting");

    AttemptResult result;
    for (int other = 0; other < size; ++other) {
      const Bytes b = store_->get(cat("outcome/", other));
      std::istringstream lines(std::string(b.begin(), b.end()));
      std::string line;
      while (std::getline(lines, line)) {
        int peer = -1;
        char outcome = 0;
        std::istringstream fields(line);
        fields >> peer >> outcome;
        std::string detail;
        std::getline(fields >> std::ws, detail);
        result.failures += (result.failures.empty() ? "" : "; ") + detail;
        // The peer could not reach this rank's port, yet something is connected to it.
        if (peer == rank && outcome == static_cast<char>(PairOutcome::NoConnect) &&
            peers_[static_cast<size_t>(other)].outcome == PairOutcome::NoHandshake)
          peers_[static_cast<size_t>(other)].outcome = PairOutcome::WrongHandshake;
      }
    }
    for (int peer = 0; peer < size; ++peer) {
      if (peers_[static_cast<size_t>(peer)].outcome != PairOutcome::WrongHandshake) continue;
      auto& pair = transport_->getPair(peer);
      result.strangers.push_back(cat("gloo rendezvous: rank ", rank, " took a connection from ",
                                     remote_address(*pair), " on the port ", local_address(*pair),
                                     " it had opened for rank ", peer, ", but it was not rank ",
                                     peer,
                                     " (no valid handshake); the ranks start again on new ports"));
    }
    if (result.failures.empty()) {
      result.sockets = pair_sockets();
      result.transport = std::move(transport_);
    }
    return result;
  }

  ~MeshAttempt() {
    // Buffers before the context whose pairs they were posted to.
    send_.clear();
    recv_.clear();
  }

 private:
  Bytes draw_nonce() {
    std::random_device device;
    Bytes nonce(16);
    for (uint8_t& b : nonce) b = static_cast<uint8_t>(device() & 0xff);
    return nonce;
  }

  void fail(int peer, PairOutcome outcome, const std::string& detail) {
    PeerState& s = peers_[static_cast<size_t>(peer)];
    if (s.outcome != PairOutcome::Authenticated) return;
    s.outcome = outcome;
    s.detail = detail;
    // Tells the other ranks to stop waiting for handshakes that will not come.
    store_->set("failed", to_bytes(detail));
  }

  void connect(int peer) {
    const std::string who = cat("rank ", peer);
    try {
      const std::string key = cat("addr/", peer);
      wait_keys(*store_, {key}, options_);
      const std::vector<char> address = find_address(store_->get(key), options_.rank, peer);
      remote_[static_cast<size_t>(peer)] = gloo::transport::tcp::Address(address).getSockaddr();
      transport_->getPair(peer)->connect(address);
    } catch (const std::exception& e) {
      fail(peer, PairOutcome::NoConnect,
           cat("rank ", options_.rank, " could not connect to ", who, ": ",
               clean_gloo_message(e.what())));
    }
  }

  void handshake() {
    const int rank = options_.rank;
    const int size = options_.size;
    wait_keys(*store_, {"nonce"}, options_);
    nonce_ = store_->get("nonce");
    const uint64_t slot = gloo::Slot::build(kHandshakeSlotPrefix, static_cast<uint32_t>(attempt_));
    sent_.resize(static_cast<size_t>(size));
    received_.resize(static_cast<size_t>(size));
    send_.resize(static_cast<size_t>(size));
    recv_.resize(static_cast<size_t>(size));
    for (int peer = 0; peer < size; ++peer) {
      const auto p = static_cast<size_t>(peer);
      if (peer == rank || peers_[p].outcome != PairOutcome::Authenticated) continue;
      try {
        sent_[p] = make_handshake(nonce_, rank, peer, attempt_);
        recv_[p] = transport_->createUnboundBuffer(&received_[p], sizeof(Handshake));
        recv_[p]->recv(peer, slot);
        send_[p] = transport_->createUnboundBuffer(&sent_[p], sizeof(Handshake));
        send_[p]->send(peer, slot);
      } catch (const std::exception& e) {
        fail(peer, PairOutcome::NoHandshake, pair_failure(peer, e.what()));
      }
    }
    // A rank that failed says so in the store; then nobody waits for the rest. Nor after a
    // cancellation.
    std::atomic<bool> done{false};
    std::thread watcher([&] {
      while (!done.load()) {
        const bool cancelled = options_.cancelled && !options_.cancelled().empty();
        if (cancelled || store_->check({"failed"})) {
          for (auto& b : recv_)
            if (b) b->abortWaitRecv();
          for (auto& b : send_)
            if (b) b->abortWaitSend();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    for (int peer = 0; peer < size; ++peer) wait_for_handshake(peer);
    done = true;
    watcher.join();
    throw_if_cancelled(options_);
  }

  void wait_for_handshake(int peer) {
    const auto p = static_cast<size_t>(peer);
    if (!recv_[p] || peers_[p].outcome != PairOutcome::Authenticated) return;
    const std::string who = cat("rank ", peer);
    try {
      if (!recv_[p]->waitRecv(nullptr, options_.timeout)) {
        fail(peer, PairOutcome::NoHandshake,
             cat("rank ", options_.rank, " got no handshake from ", who,
                 " before another pair failed"));
        return;
      }
      const Handshake expected = make_handshake(nonce_, peer, options_.rank, attempt_);
      if (std::memcmp(&expected, &received_[p], sizeof(Handshake)) != 0) {
        fail(peer, PairOutcome::WrongHandshake,
             cat("rank ", options_.rank, "'s connection for ", who,
                 " did not present its handshake"));
        return;
      }
      if (!send_[p]->waitSend(nullptr, options_.timeout))
        fail(peer, PairOutcome::NoHandshake,
             cat("rank ", options_.rank, " could not hand ", who,
                 " its handshake before another pair failed"));
    } catch (const std::exception& e) {
      fail(peer, PairOutcome::NoHandshake, pair_failure(peer, e.what()));
    }
  }

  // Each pair's socket: the pair either accepted its peer on the port it listened on (local end
  // = that port) or connected out to the port the peer listened on (remote end = that port).
  std::vector<int> pair_sockets() {
    std::vector<sockaddr_storage> listened(static_cast<size_t>(options_.size));
    for (int peer = 0; peer < options_.size; ++peer) {
      if (peer != options_.rank)
        listened[static_cast<size_t>(peer)] = listen_address(*transport_->getPair(peer));
    }
    std::vector<int> sockets;
    for_each_connected_socket(
        [&](int fd, const sockaddr_storage& mine, const sockaddr_storage& theirs) {
          for (int peer = 0; peer < options_.size; ++peer) {
            const auto p = static_cast<size_t>(peer);
            if (peer != options_.rank &&
                (same_endpoint(mine, listened[p]) || same_endpoint(theirs, remote_[p]))) {
              sockets.push_back(fd);
              break;
            }
          }
          return false;
        });
    return sockets;
  }

  std::string pair_failure(int peer, const std::string& what) const {
    return cat("rank ", options_.rank, "'s pair with rank ", peer,
               " failed: ", clean_gloo_message(what));
  }

  std::shared_ptr<Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  const MeshOptions& options_;
  const int attempt_;
  std::shared_ptr<gloo::transport::Context> transport_;
  std::vector<PeerState> peers_;
  std::vector<sockaddr_storage> remote_ = std::vector<sockaddr_storage>(peers_.size());
  Bytes nonce_;
  std::vector<Handshake> sent_, received_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> send_, recv_;
};

}  // namespace

AddressEntry find_address_entry(const Bytes& blob, int32_t peer, int owner) {
  size_t at = 0;
  while (at + 8 <= blob.size()) {
    int32_t who = 0;
    uint32_t length = 0;
    std::memcpy(&who, blob.data() + at, 4);
    std::memcpy(&length, blob.data() + at + 4, 4);
    at += 8;
    DPAR_CHECK(length <= blob.size() - at, "rank ", owner,
               "'s published Gloo addresses are cut short");
    if (who == peer) return AddressEntry{at, length};
    at += length;
  }
  DPAR_FAIL("rank ", owner, " published no Gloo address for rank ", peer);
}

std::string clean_gloo_message(const std::string& what) {
  std::string text = what;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find("] ");
    if (close != std::string::npos) text = text.substr(close + 2);
  }
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::shared_ptr<gloo::Context> connect_gloo_mesh(
    const std::shared_ptr<Store>& store, const std::shared_ptr<gloo::transport::Device>& device,
    const MeshOptions& options, std::vector<int>* pair_sockets) {
  auto log = [&](const std::string& line) { log_line(options.log, line); };
  std::string failures;
  for (int attempt = 0; attempt < kMaxMeshAttempts; ++attempt) {
    throw_if_cancelled(options);  // not another attempt after a cancellation
    AttemptResult result = MeshAttempt(store, device, options, attempt).run();
    for (const std::string& line : result.strangers) log(line);
    if (result.transport) {
      auto context = std::make_shared<MeshContext>(options.rank, options.size, device,
                                                   std::move(result.transport));
      context->setTimeout(options.timeout);
      if (pair_sockets != nullptr) *pair_sockets = std::move(result.sockets);
      return context;
    }
    failures = result.failures;
    if (options.rank == 0 && attempt + 1 < kMaxMeshAttempts)
      log(cat("gloo rendezvous attempt ", attempt + 1, " of ", kMaxMeshAttempts, " failed (",
              failures, "); starting again on new ports"));
  }
  DPAR_FAIL("no authenticated Gloo connections after ", kMaxMeshAttempts,
            " attempts; the last failed with: ", failures);
}

}  // namespace dpar::dist::detail
