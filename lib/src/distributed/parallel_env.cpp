// init_parallel_env() and friends: a process-wide ParallelContext behind free functions.
#include "dpar/distributed/parallel_env.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "distributed/collective_check.h"
#include "distributed/store_common.h"

namespace dpar::dist {
namespace {

// Resolves a host name (Slurm node names, "localhost") to a numeric address so that rank 0
// binds exactly what the other ranks connect to. Numeric addresses pass through.
std::string resolve_host(const std::string& host, const ParallelEnv& env) {
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return host;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  DPAR_CHECK(rc == 0 && result != nullptr, "init_parallel_env: cannot resolve the master host '",
             host, "' (from the ", env.source, " environment): ", gai_strerror(rc));
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr, text,
            sizeof(text));
  freeaddrinfo(result);
  return text;
}

// How long rank 0 keeps the store up at destroy() for ranks that have not finished yet; after
// a failed collective, only briefly: the others cannot finish either (a stopped one never
// arrives), and the launcher stops the job when this rank exits.
constexpr Millis kDestroyGrace{std::chrono::seconds(30)};
constexpr Millis kDestroyGraceAfterFailure{std::chrono::seconds(2)};

struct Global {
  std::mutex mutex;
  std::unique_ptr<ParallelContext> context;
  ParallelEnv env;  // a copy, so parallel_env()'s reference stays valid after destroy()
  bool atexit_registered = false;
};

// Never destroyed: at exit the atexit handler below tears the context down while gRPC and
// Gloo are still intact; a static destructor would run in an unspecified order with theirs.
Global& global() {
  static Global* g = new Global;
  return *g;
}

void destroy_at_exit() {
  try {
    destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpar: destroy at exit: %s\n", e.what());
  }
}

ParallelContext& context_or_throw(const char* fn) {
  auto& g = global();
  DPAR_CHECK(g.context != nullptr, fn, ": init_parallel_env() has not been called");
  return *g.context;
}

}  // namespace

ParallelContext::ParallelContext(const ParallelEnv& env, const InitOptions& options) : env_(env) {
  DPAR_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
             "init_parallel_env: rank ", env.rank, " is outside a world of ", env.world_size);
  ProcessGroupOptions group_options = options.group;
  if (!options.backend.empty()) {
    DPAR_CHECK(options.backend == "nccl" || options.backend == "gloo",
               "init_parallel_env: backend '", options.backend, "': expected nccl or gloo");
    group_options.cuda_backend = options.backend;
  }
  if (env.world_size == 1) {
    // A world of one needs no store and no sockets; its group answers every collective
    // locally, so code written for several ranks runs unchanged.
    group_ = std::make_shared<Group>(nullptr, 0, 1, group_options);
    return;
  }
  DPAR_CHECK(!env.master_addr.empty() && env.master_port > 0 && env.master_port <= 65535,
             "init_parallel_env: a world of ", env.world_size,
             " needs a master address and port for the store, got '", env.master_addr, ":",
             env.master_port, "' (from the ", env.source, " environment)");
  try {
    const std::string host = resolve_host(env.master_addr, env);
    if (env.rank == 0) {
      server_ = std::make_unique<StoreServer>(host, env.master_port, env.job_id, env.world_size);
    }
    StoreClientOptions client_options;
    client_options.connect_timeout = options.connect_timeout;
    client_options.timeout = group_options.timeout;
    store_ = std::make_shared<StoreClient>(detail::join_host_port(host, env.master_port),
                                           StoreIdentity{env.job_id, env.world_size, env.rank},
                                           client_options);
    group_ = std::make_shared<Group>(store_, env.rank, env.world_size, group_options);
    group_->barrier();
  } catch (const Error& e) {
    // One line that says which rank of which job failed, then what.
    throw Error("init_parallel_env (rank " + std::to_string(env.rank) + " of " +
                std::to_string(env.world_size) + ", job '" + env.job_id + "', " + env.source +
                " environment): " + e.what());
  }
}

ParallelContext::~ParallelContext() {
  try {
    destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpar: rank %d: tearing down the parallel context: %s\n", env_.rank,
                 e.what());
  }
}

void ParallelContext::barrier() {
  if (group_ && group_->size() > 1) group_->barrier();
}

void ParallelContext::destroy() {
  group_.reset();
  if (store_) {
    const std::string done = "dpar/destroyed/";
    try {
      store_->set(done + std::to_string(env_.rank), Store::to_bytes("1"));
      if (server_) {
        std::vector<std::string> keys;
        for (int r = 0; r < env_.world_size; ++r) keys.push_back(done + std::to_string(r));
        store_->wait(keys, detail::any_group_failed() ? kDestroyGraceAfterFailure : kDestroyGrace);
      }
    } catch (const Error&) {
      // A rank that died or never calls destroy() must not keep rank 0 alive: after the
      // grace period the store goes down regardless.
    }
    store_.reset();
  }
  if (server_) {
    server_->shutdown();
    server_.reset();
  }
}

// ---- the process-wide context --------------------------------------------------------------
void init_parallel_env(const InitOptions& options) {
  init_parallel_env(parse_parallel_env(current_environment()), options);
}

void init_parallel_env(const ParallelEnv& env, const InitOptions& options) {
  auto& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  DPAR_CHECK(g.context == nullptr, "init_parallel_env: already initialised as rank ",
             g.context ? g.context->env().rank : 0, " of ",
             g.context ? g.context->env().world_size : 0, "; call destroy() first");
  g.context = std::make_unique<ParallelContext>(env, options);
  g.env = env;
  if (!g.atexit_registered) {
    // Registered after gRPC/Gloo initialised, so it runs before their static destructors.
    std::atexit(destroy_at_exit);
    g.atexit_registered = true;
  }
}

void require_init_under_launcher(const char* who) {
  if (is_initialized()) return;
  const auto env = current_environment();
  if (env.count("TRAINING_ROLE")) return;  // parameter-server mode forms no collective group
  ParallelEnv launched;
  try {
    launched = parse_parallel_env(env);
  } catch (const Error&) {
    return;  // an inconsistent environment is init_parallel_env()'s to report, naming it
  }
  if (launched.world_size <= 1) return;
  static const std::map<std::string, std::string> world_variable{
      {"dpar-launch", "DPAR_WORLD_SIZE"},
      {"torchrun", "WORLD_SIZE"},
      {"paddle", "PADDLE_TRAINERS_NUM"},
      {"slurm", "SLURM_NTASKS"},
      {"openmpi", "OMPI_COMM_WORLD_SIZE"}};
  const auto var = world_variable.find(launched.source);
  DPAR_FAIL(who, ": this process was started by ", launched.source, " as rank ", launched.rank,
            " of ", launched.world_size, " (",
            var == world_variable.end() ? "world size" : var->second, "=", launched.world_size,
            ") but dpar::dist::init_parallel_env() was not called, so it would train alone as "
            "rank 0 of 1; call init_parallel_env() first");
}

bool is_initialized() {
  auto& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.context != nullptr;
}

int get_rank() {
  auto& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.context ? g.context->env().rank : 0;
}

int get_world_size() {
  auto& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.context ? g.context->env().world_size : 1;
}

int get_local_rank() {
  auto& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.context ? g.context->env().local_rank : 0;
}

const ParallelEnv& parallel_env() {
  auto& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.env;
}

std::shared_ptr<Group> default_group_ptr() {
  auto& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.context ? g.context->group() : nullptr;
}

Group& default_group() {
  auto& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  return *context_or_throw("default_group").group();
}

void barrier() {
  std::shared_ptr<Group> group = default_group_ptr();
  if (group && group->size() > 1) group->barrier();
}

void destroy() {
  auto& g = global();
  std::unique_ptr<ParallelContext> context;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    context = std::move(g.context);
    g.env = ParallelEnv{};
  }
  if (context) context->destroy();
}

}  // namespace dpar::dist
