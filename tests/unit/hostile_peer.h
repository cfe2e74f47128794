#pragma once
// A hostile client for the servers' robustness tests: raw TCP connections that send garbage,
// a hand-made HTTP/2 stream whose gRPC length prefix claims 4 GiB, or nothing at all (slowloris).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace dpar::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// ASan's quarantine and TSan's shadow memory grow the resident set by design; LeakSanitizer
// covers leaks there, so memory bounds are checked in plain builds only.
inline constexpr bool kMeasureMemory = false;
#else
inline constexpr bool kMeasureMemory = true;
#endif
// How much slower code runs instrumented: bounds on elapsed time are scaled by it.
#if defined(__SANITIZE_THREAD__)
inline constexpr double kSlowdown = 10;
#elif defined(__SANITIZE_ADDRESS__)
inline constexpr double kSlowdown = 4;
#else
inline constexpr double kSlowdown = 1;
#endif
// How much a server's resident set may grow under attack.
inline constexpr double kMaxGrowthMb = 64;

// A connected socket to 127.0.0.1:port, closed on destruction; -1 when connect failed.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  RawConnection(RawConnection&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }

  bool connected() const { return fd_ >= 0; }
  // The port this end was given (how a server's log names it).
  int local_port() const {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
    return ntohs(addr.sin_port);
  }
  // Sends what the peer still accepts; a server hanging up mid-way is an expected answer.
  void send(const std::string& bytes) {
    size_t done = 0;
    while (fd_ >= 0 && done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_ = -1;
};

inline std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(gen() & 0xff);
  return out;
}

// One HTTP/2 frame: 24-bit length, type, flags, stream id.
inline std::string http2_frame(uint8_t type, uint8_t flags, uint32_t stream,
                               const std::string& payload) {
  std::string f;
  const size_t n = payload.size();
  f += static_cast<char>((n >> 16) & 0xff);
  f += static_cast<char>((n >> 8) & 0xff);
  f += static_cast<char>(n & 0xff);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  for (int shift : {24, 16, 8, 0}) f += static_cast<char>((stream >> shift) & 0xff);
  return f + payload;
}

// HPACK "literal header field without indexing, new name", short strings, no Huffman.
inline std::string hpack_literal(const std::string& name, const std::string& value) {
  return std::string(1, '\0') + static_cast<char>(name.size()) + name +
         static_cast<char>(value.size()) + value;
}

inline constexpr char kHttp2Preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// A gRPC call to `method` ("/pkg.Service/Method") whose message header claims `claimed` bytes
// (e.g. 4 GiB - 1) while only a few follow: the server must refuse it by the header alone.
inline std::string grpc_call_claiming(const std::string& method, uint32_t claimed) {
  std::string headers = hpack_literal(":method", "POST") + hpack_literal(":scheme", "http") +
                        hpack_literal(":path", method) + hpack_literal(":authority", "x") +
                        hpack_literal("content-type", "application/grpc") +
                        hpack_literal("te", "trailers");
  std::string message(1, '\0');  // not compressed
  for (int shift : {24, 16, 8, 0}) message += static_cast<char>((claimed >> shift) & 0xff);
  message += "partial";
  return std::string(kHttp2Preface) + http2_frame(4, 0, 0, "") +  // SETTINGS
         http2_frame(1, 4, 1, headers) +                          // HEADERS, END_HEADERS
         http2_frame(0, 0, 1, message);                           // DATA
}

// The TCP ports this process listens on (IPv4 and IPv6): sockets of /proc/net/tcp{,6} in the
// LISTEN state whose inode is one of this process's open files.
inline std::set<int> listening_ports_of_this_process() {
  std::set<unsigned long> inodes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), link_ec).string();
    if (!link_ec && target.rfind("socket:[", 0) == 0) inodes.insert(std::stoul(target.substr(8)));
  }
  std::set<int> ports;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // sl local remote st tx:rx tr:when retrnsmt uid timeout inode
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout;
      unsigned long inode = 0;
      fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && inodes.count(inode) != 0)
        ports.insert(std::stoi(local.substr(local.rfind(':') + 1), nullptr, 16));
    }
  }
  return ports;
}

// What a test throws at a server: each kind of garbage on fresh connections.
inline void send_garbage(int port) {
  RawConnection(port).send(random_bytes(64 << 10, 1));  // noise
  RawConnection(port).send(std::string(kHttp2Preface) +
                           random_bytes(4096, 2));                     // noise after preface
  RawConnection(port).send(std::string(kHttp2Preface).substr(0, 10));  // truncated preface
  // A frame header announcing a 16 MiB frame that never comes.
  RawConnection(port).send(std::string(kHttp2Preface) + http2_frame(4, 0, 0, "") +
                           std::string("\xff\xff\xff\x00\x00\x00\x00\x00\x01", 9));
}

}  // namespace dpar::test

namespace dpar::test {

// Runs attack() in a loop on its own thread, with `idle` slowloris connections to each port held
// open, for as long as the object lives.
class Attack {
 public:
  Attack(std::vector<int> ports, int idle, std::function<void()> attack) {
    for (int port : ports)
      for (int i = 0; i < idle; ++i) idle_.emplace_back(port);
    thread_ = std::thread([this, attack = std::move(attack)] {
      while (!stop_.load()) attack();
    });
  }
  ~Attack() {
    stop_ = true;
    thread_.join();
  }
  Attack(const Attack&) = delete;
  Attack& operator=(const Attack&) = delete;

 private:
  std::vector<RawConnection> idle_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dpar::test
