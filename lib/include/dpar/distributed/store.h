#pragma once
// Rendezvous key-value store. Rank 0 hosts a gRPC StoreServer at the master endpoint; every
// rank (rank 0 included) talks to it through a StoreClient. Keys live under the job id, and a
// client of another job (different job id or world size) is refused with a message that says
// so. The same store backs Gloo's rendezvous (see gloo adapter) and, later, NCCL's id exchange.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dpar::dist {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits (up to timeout()) for the key to exist, then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds delta to the integer stored at key (0 if absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired if its current value equals expected (an empty expected means "key
  // absent"). Returns the value after the operation.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // Waits until every key exists; throws dpar::Error naming the missing keys on timeout.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  // True when every key exists now (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;

  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

  static Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
  static std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

 protected:
  Millis timeout_{std::chrono::minutes(30)};
};

// Who a client is; sent on connect and checked by the server.
struct StoreIdentity {
  std::string job_id = "default";
  int world_size = 1;  // 0 (with rank 0): a member of an elastic job (elastic.h)
  int rank = 0;
};

// The gRPC store service (lib/proto/store.proto), served from a background thread.
class StoreServer {
 public:
  // Binds host:port (port 0 picks a free port); throws dpar::Error naming the address if it
  // is in use or cannot be bound. world_size 0 serves an elastic job: its clients identify as
  // world size 0 and have no fixed rank. A call from a peer of another job (or none) is refused and
  // logged once per peer host to `log` (empty: stderr).
  StoreServer(const std::string& host, int port, std::string job_id, int world_size,
              std::function<void(const std::string&)> log = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const;
  std::string endpoint() const;  // host:port
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct StoreClientOptions {
  Millis connect_timeout{std::chrono::minutes(5)};  // how long to wait for rank 0's server
  Millis timeout{std::chrono::minutes(30)};         // default for get/wait
  // Deadline of calls that do not wait for keys (set/add/compare_set/check): a store that does
  // not answer within it is reported as unresponsive instead of hanging the caller.
  Millis rpc_timeout{std::chrono::seconds(30)};
  bool log_waiting = true;  // print "waiting for rank 0 at <ip:port> (<n> s)" while connecting
  Millis log_interval{std::chrono::seconds(5)};  // how often that line repeats
  // Where the waiting line goes (one line, no newline); empty means std::cerr. Lets a launcher
  // add its rank prefix and tests capture the line.
  std::function<void(const std::string&)> log;
};

// Connects to a StoreServer with backoff until connect_timeout; identifies itself, and fails
// with a clear dpar::Error if the server belongs to another job or world size.
class StoreClient final : public Store {
 public:
  StoreClient(const std::string& endpoint, StoreIdentity identity, StoreClientOptions options = {});
  ~StoreClient() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  const std::string& endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A view of another store with every key prefixed (one namespace per process group).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  const Store& base() const { return *base_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace dpar::dist
