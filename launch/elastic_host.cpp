// The elastic job's rendezvous store, hosted by one node's launcher (elastic_host.h).
#include "elastic_host.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "address.h"
#include "dpar/core/error.h"
#include "dpar/distributed/elastic.h"
#include "log_sink.h"

namespace dpar::launch {
namespace {

// gRPC's threads must not take the signals the supervisor reads from a signalfd (SIGCHLD would
// go to one of them and be lost, and the supervisor would never see its workers exit): threads
// inherit the signal mask of the thread that creates them, so the server starts with every
// signal blocked.
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &previous_);
  }
  ~SignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace

ElasticStoreHost::ElasticStoreHost(const LaunchPlan& plan, const std::string& host, int port)
    : endpoint_(plan.rdzv_endpoint),
      job_id_(plan.job_id),
      server_(host, port, plan.job_id, /*world_size=*/0) {}

std::unique_ptr<ElasticStoreHost> ElasticStoreHost::start_if_here(
    const LaunchPlan& plan, const std::vector<std::string>& local_addresses) {
  if (plan.rdzv_backend != "dpar") return nullptr;  // etcd: the user's cluster holds the keys
  std::string host;
  int port = 0;
  if (!split_endpoint(plan.rdzv_endpoint, &host, &port)) return nullptr;
  const bool local =
      host == "localhost" || host.rfind("127.", 0) == 0 ||
      std::find(local_addresses.begin(), local_addresses.end(), host) != local_addresses.end();
  if (!local) return nullptr;
  try {
    SignalsBlocked blocked;
    return std::make_unique<ElasticStoreHost>(plan, host == "localhost" ? "127.0.0.1" : host, port);
  } catch (const Error& e) {
    // In use: another launcher on this machine (one per node, several nodes in a test) serves it.
    if (std::string(e.what()).find("in use") != std::string::npos) return nullptr;
    throw;
  }
}

void ElasticStoreHost::wait_for_job_end(std::chrono::milliseconds idle) {
  // The supervisor is done with the signals it blocked: Ctrl-C or SIGTERM now end the launcher
  // (and the store) through their default action.
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&stop, sig);
  pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
  dist::StoreClientOptions options;
  options.log_waiting = false;
  dist::StoreClient client(endpoint_, dist::StoreIdentity{job_id_, 0, 0}, options);
  auto last_move = std::chrono::steady_clock::now();
  std::string last_seen;
  bool said = false;
  for (;;) {
    const dist::ElasticProgress progress = dist::elastic_progress(client);
    if (progress.finished) return;
    const auto now = std::chrono::steady_clock::now();
    if (progress.heartbeats != last_seen) {
      last_seen = progress.heartbeats;
      last_move = now;
    } else if (now - last_move >= idle) {
      write_all(STDOUT_FILENO, "dpar-launch: elastic job: no member sent a heartbeat for " +
                                   std::to_string(idle.count() / 1000) +
                                   " s; stopping the rendezvous store\n");
      return;
    }
    if (!said) {
      write_all(STDOUT_FILENO, "dpar-launch: this node's workers are done; the rendezvous store " +
                                   endpoint_ + " stays up while the job goes on (round " +
                                   std::to_string(progress.round) + ")\n");
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace dpar::launch
