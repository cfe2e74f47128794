#pragma once
// The rendezvous store of an elastic job (dpar-launch --nnodes=MIN:MAX, the dpar backend): the
// launcher on the node whose address --rdzv_endpoint names hosts it, for as long as the job
// runs — past its own workers, whose loss the job survives. That node's loss ends the job.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dpar/distributed/store.h"
#include "plan.h"

namespace dpar::launch {

class ElasticStoreHost {
 public:
  // Starts the store when the endpoint's address is one of local_addresses (or loopback) and
  // its port is free. Null when the address is another machine's, or when another process
  // (another node's launcher on this machine) serves the port already.
  static std::unique_ptr<ElasticStoreHost> start_if_here(
      const LaunchPlan& plan, const std::vector<std::string>& local_addresses);

  // After this node's workers exited: keeps the store up until the members mark the job
  // finished, or until no member heartbeat moved for `idle` (the job is dead). Says so on
  // stdout when it has to wait.
  void wait_for_job_end(std::chrono::milliseconds idle);

  explicit ElasticStoreHost(const LaunchPlan& plan, const std::string& host, int port);

 private:
  std::string endpoint_;
  std::string job_id_;
  dist::StoreServer server_;
};

}  // namespace dpar::launch
