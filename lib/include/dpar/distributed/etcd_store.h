#pragma once
// EtcdStore: the rendezvous Store kept in an etcd cluster (etcd's v3 gRPC API; Debian's
// etcd-server 3.4 or newer) instead of dpar's own StoreServer, so that no training node is a
// single point of failure: the keys live on every etcd member, and the client moves to another
// member when the one it talks to dies. Elastic jobs use it with `dpar-launch
// --rdzv_backend=etcd --rdzv_endpoint=ip:port[,ip:port...]` (docs/elastic.md).
//
// Keys are kept under /dpar/<job id>/. add() and compare_set() are etcd transactions; get() and
// wait() watch the key; set_leased() attaches a key to this client's lease, which a background
// thread keeps alive: etcd deletes the key lease_ttl after this process dies, stops or loses
// every member — the elastic job's heartbeat.
#include <memory>
#include <string>

#include "dpar/distributed/store.h"

namespace dpar::dist {

struct EtcdStoreOptions {
  Millis connect_timeout{std::chrono::seconds(30)};  // to reach a member at first
  Millis timeout{std::chrono::minutes(30)};          // default for get/wait
  // Deadline of one request (set/add/compare_set/check), retried across members while it runs;
  // also how long a leader election may take before the store is reported lost.
  Millis rpc_timeout{std::chrono::seconds(30)};
  Millis lease_ttl{std::chrono::seconds(10)};  // at least 2 s (etcd's floor is about 1.5 s)
};

class EtcdStore final : public Store {
 public:
  // endpoints: "ip:port" or a comma-separated list of one cluster's members ("ip:port,ip:port";
  // a single endpoint may be a host name). Waits up to connect_timeout for a member to answer;
  // throws dpar::Error naming the endpoints otherwise.
  EtcdStore(const std::string& endpoints, std::string job_id, EtcdStoreOptions options = {});
  ~EtcdStore() override;  // revokes the lease: this client's leased keys go at once
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;

  // set(), with the key attached to this client's lease (see above).
  void set_leased(const std::string& key, const Bytes& value);
  // Deletes every key under this job id (a finished job's clean-up; a test's fresh start).
  void erase_job();
  const std::string& endpoints() const;
  Millis lease_ttl() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpar::dist
