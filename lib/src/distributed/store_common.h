#pragma once
// Internals shared by the store server and client (lib/src/distributed/store_*.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpar/core/error.h"
#include "dpar/distributed/store.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace dpar::dist::detail {

// Identity metadata sent with every call. The job id travels as a "-bin" header so any bytes
// are allowed (plain gRPC metadata values must be printable ASCII).
inline constexpr char kJobIdKey[] = "dpar-job-id-bin";
inline constexpr char kWorldSizeKey[] = "dpar-world-size";
inline constexpr char kRankKey[] = "dpar-rank";

// Explicit message size cap on both ends: values are small (addresses, NCCL ids), but a caller
// may publish e.g. a serialized model config; 64 MiB is generous without being unbounded.
inline constexpr int kMaxMessageBytes = 64 << 20;

// The "(is rank 0 running?)" style messages quote seconds: whole numbers print plainly, short
// test timeouts keep one decimal.
inline std::string format_seconds(Millis t) {
  if (t.count() % 1000 == 0 || t.count() >= 10000) return std::to_string((t.count() + 500) / 1000);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

// A duration given in seconds by environment variable `name` (DPAR_TIMEOUT, DPAR_ELASTIC_*):
// nothing when unset or empty; a dpar::Error naming the variable when it is not a number of
// seconds (positive, or also 0 with allow_zero).
inline std::optional<Millis> seconds_from_env(const char* name, bool allow_zero) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  DPAR_CHECK(end != text && *end == '\0' && std::isfinite(seconds) &&
                 (allow_zero ? seconds >= 0 : seconds > 0),
             name, ": expected a ", allow_zero ? "" : "positive ", "number of seconds",
             allow_zero ? " (0: off)" : "", ", got '", text, "'");
  return Millis(std::max<int64_t>(seconds > 0 ? 1 : 0, std::llround(seconds * 1000.0)));
}

// Where the distributed parts' warnings go: the caller's log callback (ProcessGroupOptions::log,
// a store's options), else stderr as "dpar: <line>".
inline void log_line(const std::function<void(const std::string&)>& log, const std::string& line) {
  if (log) {
    log(line);
  } else {
    std::fprintf(stderr, "dpar: %s\n", line.c_str());
  }
}

// 'a', 'b', 'c' — for error messages naming keys.
inline std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  return out;
}

// "host:port" or "[v6addr]:port" -> host (without brackets) and a port in 1..65535 (0..65535
// with allow_port_zero, for servers asked to pick a free port); false when the text is not of
// that form.
inline bool split_host_port(const std::string& text, std::string* host, int* port,
                            bool allow_port_zero = false) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) return false;
  int value = 0;
  for (size_t i = colon + 1; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9' || value > 65535) return false;
    value = value * 10 + (text[i] - '0');
  }
  if (value < (allow_port_zero ? 0 : 1) || value > 65535) return false;
  std::string h = text.substr(0, colon);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (host) *host = h;
  if (port) *port = value;
  return true;
}

// host:port, with brackets around an IPv6 literal so the port stays unambiguous.
inline std::string join_host_port(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// Binds a probe socket to host:port (with SO_REUSEADDR, as gRPC's listeners) and throws
// dpar::Error "<what>: cannot listen on <where>: <why>" when that fails: gRPC itself only
// reports "no port selected", without the reason (in use, not an address of this machine).
void probe_bind(const std::string& host, int port, const std::string& where,
                const std::string& what);

// Starts a gRPC server for `service` on exactly `where` (host:port) with the message limit on
// both directions, SO_REUSEPORT off (a second job must fail to bind, not share the port) and
// client keepalive pings allowed. Throws "<what>: cannot listen on <where> ..." on failure.
std::unique_ptr<grpc::Server> start_grpc_server(const std::string& where, grpc::Service* service,
                                                int max_message_bytes, const std::string& what,
                                                int* port = nullptr);

}  // namespace dpar::dist::detail
