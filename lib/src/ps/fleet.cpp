// The process-wide ps roles behind dpar::ps::init_server / run_server / init_worker /
// stop_worker (dpar/ps/ps.h).
#include <mutex>

#include "dpar/core/error.h"
#include "dpar/ps/ps.h"

namespace dpar::ps {
namespace {

std::mutex g_mu;
std::unique_ptr<Server> g_server;
std::unique_ptr<ParameterServerTrainer> g_worker;

}  // namespace

bool is_server() { return env_from_environment().role == Role::kServer; }
bool is_worker() { return env_from_environment().role == Role::kTrainer; }

void init_server(Millis timeout) {
  const PsEnv env = env_from_environment();
  DPAR_CHECK(env.role == Role::kServer,
             "ps::init_server: this process is not a parameter "
             "server (TRAINING_ROLE must be PSERVER)");
  std::lock_guard<std::mutex> lock(g_mu);
  DPAR_CHECK(!g_server, "ps::init_server: called twice");
  g_server = std::make_unique<Server>(
      ServerOptions{.endpoint = env.endpoint(),
                    .server_id = env.server_id,
                    .num_servers = static_cast<int>(env.server_endpoints.size()),
                    .num_trainers = env.num_trainers,
                    .job_token = env.job_token,
                    .timeout = timeout,
                    .log = {}});
}

void run_server() {
  Server* server = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    DPAR_CHECK(g_server, "ps::run_server: call init_server() first");
    server = g_server.get();
  }
  // The server goes away on every way out, so a failure is reported from here rather than
  // from gRPC's shutdown during static destruction.
  struct Release {
    ~Release() {
      std::lock_guard<std::mutex> lock(g_mu);
      g_server.reset();
    }
  } release;
  server->run();
}

void init_worker(nn::Module& model, optim::Optimizer& optimizer, TrainerOptions options) {
  const PsEnv env = env_from_environment();
  DPAR_CHECK(env.role == Role::kTrainer,
             "ps::init_worker: this process is not a trainer "
             "(TRAINING_ROLE must be TRAINER)");
  std::lock_guard<std::mutex> lock(g_mu);
  DPAR_CHECK(!g_worker, "ps::init_worker: called twice");
  g_worker = std::make_unique<ParameterServerTrainer>(model, optimizer, env, std::move(options));
}

ParameterServerTrainer& worker() {
  std::lock_guard<std::mutex> lock(g_mu);
  DPAR_CHECK(g_worker, "ps::worker: call init_worker() first");
  return *g_worker;
}

void stop_worker() {
  std::unique_ptr<ParameterServerTrainer> w;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    w = std::move(g_worker);
  }
  if (w) w->finish();
}

}  // namespace dpar::ps
