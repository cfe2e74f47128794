#pragma once
// A TCP proxy for corruption tests: it forwards a client's connections to a server on loopback
// and flips one byte of the stream in one direction (or whichever carries it first), once,
// mid-job. It follows the frames of one of two protocols:
//  - HTTP/2 (gRPC: the store, the parameter servers): the byte is inside the payload of the n-th
//    DATA frame of at least `min_payload` bytes (where gRPC's messages, and so tensor bytes,
//    travel) or in that frame's header (the framing: its stream id);
//  - Gloo's TCP transport: each frame is a 48-byte preamble of six little-endian size_t (total
//    bytes including the preamble, opcode, slot, offset, length, remote offset) and, for the send
//    opcodes, the payload; the byte is in the middle of the n-th payload of at least
//    `min_payload` bytes (Gloo has no checksum, so only dpar's CRCs can notice).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dpar::test {

class FlippingProxy {
 public:
  enum class Protocol { kHttp2, kGloo };
  enum class Direction { kToServer, kToClient, kEither };
  enum class Spot { kPayload, kFrameHeader };
  struct Plan {
    Direction direction = Direction::kToServer;
    Spot spot = Spot::kPayload;
    int nth = 3;               // which qualifying DATA frame (1-based)
    size_t min_payload = 180;  // DATA frames smaller than this do not count
    Protocol protocol = Protocol::kHttp2;
    // kFrameHeader: which byte of the frame header. HTTP/2's 8 is the stream id's low byte (a
    // client's streams are odd, so the frame then names a stream that does not exist); in
    // Gloo's preamble 0 is the frame length's, 16 the slot's, 32 the payload length's.
    size_t header_byte = 8;
  };

  // port_ok: a condition the proxy's own port must meet (it draws ports until one does).
  FlippingProxy(
      int server_port, Plan plan,
      const std::function<bool(int)>& port_ok = [](int) { return true; })
      : server_port_(server_port), plan_(plan) {
    for (int tries = 0; tries < 200 && port_ == 0; ++tries) {
      listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr = loopback(0);
      socklen_t len = sizeof addr;
      if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
          ::listen(listener_, 16) != 0 ||
          ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
        throw std::runtime_error("FlippingProxy: cannot listen on loopback");
      if (port_ok(ntohs(addr.sin_port))) {
        port_ = ntohs(addr.sin_port);
      } else {
        ::close(listener_);
      }
    }
    if (port_ == 0) throw std::runtime_error("FlippingProxy: no port met the condition");
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FlippingProxy() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : pumps_) t.join();
    ::close(listener_);
  }
  FlippingProxy(const FlippingProxy&) = delete;
  FlippingProxy& operator=(const FlippingProxy&) = delete;

  int port() const { return port_; }
  bool flipped() const { return flipped_.load(); }

 private:
  // Where one direction of one connection stands in the byte stream.
  struct Framing {
    size_t preface_left = 0;  // HTTP/2: the client's 24-byte connection preface comes first
    std::array<uint8_t, 48> header{};
    size_t header_have = 0;
    size_t payload_left = 0;
    size_t payload_size = 0;
    bool target = false;  // this frame is the one whose payload gets the flip
  };

  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }

  void accept_loop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr = loopback(server_port_);
      if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      pumps_.emplace_back([this, client, server] { pump(client, server); });
    }
  }

  // Copies bytes both ways until either side closes (or the proxy stops), then closes both.
  void pump(int client, int server) {
    Framing to_server, to_client;
    if (plan_.protocol == Protocol::kHttp2) to_server.preface_left = 24;
    std::vector<uint8_t> buf(1 << 16);
    while (!stop_) {
      std::array<pollfd, 2> p{pollfd{client, POLLIN, 0}, pollfd{server, POLLIN, 0}};
      if (::poll(p.data(), 2, 20) <= 0) continue;
      bool closed = false;
      for (int i = 0; i < 2 && !closed; ++i) {
        if (!(p[static_cast<size_t>(i)].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const int from = i == 0 ? client : server;
        const int to = i == 0 ? server : client;
        const ssize_t n = ::recv(from, buf.data(), buf.size(), 0);
        if (n <= 0) {
          closed = true;
          break;
        }
        const bool watched = plan_.direction == Direction::kEither ||
                             (i == 0) == (plan_.direction == Direction::kToServer);
        if (watched) scan(i == 0 ? to_server : to_client, buf.data(), static_cast<size_t>(n));
        size_t sent = 0;
        while (sent < static_cast<size_t>(n)) {
          const ssize_t m =
              ::send(to, buf.data() + sent, static_cast<size_t>(n) - sent, MSG_NOSIGNAL);
          if (m <= 0) {
            closed = true;
            break;
          }
          sent += static_cast<size_t>(m);
        }
      }
      if (closed) break;
    }
    ::close(client);
    ::close(server);
  }

  // Follows the frames in bytes[0, n) and flips the chosen byte when it passes by.
  void scan(Framing& f, uint8_t* bytes, size_t n) {
    const bool gloo = plan_.protocol == Protocol::kGloo;
    const size_t header_size = gloo ? 48 : 9;
    for (size_t i = 0; i < n; ++i) {
      if (f.preface_left > 0) {
        --f.preface_left;
      } else if (f.payload_left > 0) {
        if (f.target && f.payload_left == f.payload_size / 2 && !flipped_.exchange(true))
          bytes[i] ^= 0x5a;
        --f.payload_left;
      } else {
        f.header[f.header_have++] = bytes[i];
        if (f.header_have < header_size) continue;
        f.header_have = 0;
        size_t length = 0;
        bool data = false;
        if (gloo) {
          const uint64_t total = little_endian(f.header, 0);
          const uint64_t opcode = little_endian(f.header, 8);
          length = total >= 48 ? static_cast<size_t>(total - 48) : 0;
          data = opcode <= 1;  // SEND_BUFFER, SEND_UNBOUND_BUFFER
          length = data ? length : 0;
        } else {
          length = (size_t{f.header[0]} << 16) | (size_t{f.header[1]} << 8) | f.header[2];
          data = f.header[3] == 0;
        }
        f.target = false;
        if (data && length >= plan_.min_payload && ++qualifying_ == plan_.nth && !flipped_) {
          if (plan_.spot == Spot::kFrameHeader) {
            // The header is complete at bytes[i]; its first bytes may have gone out in an
            // earlier read already.
            const size_t back = header_size - 1 - plan_.header_byte;
            if (back <= i && !flipped_.exchange(true)) bytes[i - back] ^= 0x01;
          } else {
            f.target = true;
          }
        }
        f.payload_left = length;
        f.payload_size = length;
      }
    }
  }

  static uint64_t little_endian(const std::array<uint8_t, 48>& header, size_t at) {
    uint64_t v = 0;
    for (size_t k = 0; k < 8; ++k) v |= uint64_t{header[at + k]} << (8 * k);
    return v;
  }

  const int server_port_;
  const Plan plan_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> flipped_{false};
  std::atomic<int> qualifying_{0};
  std::mutex mu_;
  std::vector<std::thread> pumps_;
  std::thread acceptor_;
};

}  // namespace dpar::test
