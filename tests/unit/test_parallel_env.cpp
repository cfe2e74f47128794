// parse_parallel_env for every launcher flavour and every inconsistency, the world of one,
// and init over loopback (rank 0 through the process-wide functions, rank 1 as a
// ParallelContext on a thread).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/nn/layers.h"
#include "dpar/tensor/ops.h"
#include "unit/helpers.h"

using namespace dpar;
using namespace dpar::dist;
using Env = std::map<std::string, std::string>;
using Catch::Matchers::Contains;

namespace {

std::string error_of(const Env& env) {
  try {
    parse_parallel_env(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("no launcher variables: a world of one", "[parallel_env]") {
  const ParallelEnv e = parse_parallel_env({{"HOME", "/root"}, {"PATH", "/bin"}});
  CHECK(e.source == "none");
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.local_rank == 0);
  CHECK(e.local_size == 1);
  CHECK(e.device == "cpu");
  // Empty values count as absent.
  CHECK(parse_parallel_env({{"RANK", ""}, {"WORLD_SIZE", ""}}).source == "none");
}

TEST_CASE("dpar-launch variables", "[parallel_env]") {
  const Env env = {{"DPAR_RANK", "3"},
                   {"DPAR_WORLD_SIZE", "4"},
                   {"DPAR_LOCAL_RANK", "1"},
                   {"DPAR_LOCAL_SIZE", "2"},
                   {"DPAR_NODE_RANK", "1"},
                   {"DPAR_NNODES", "2"},
                   {"DPAR_MASTER", "10.0.0.1:6170"},
                   {"DPAR_ENDPOINTS", "10.0.0.1:6070,10.0.0.1:6071,10.0.0.2:6070,10.0.0.2:6071"},
                   {"DPAR_CURRENT_ENDPOINT", "10.0.0.2:6071"},
                   {"DPAR_JOB_ID", "job7"},
                   {"DPAR_DEVICE", "gpu:1"},
                   // Lower precedence launchers' variables are ignored.
                   {"RANK", "0"},
                   {"WORLD_SIZE", "8"}};
  const ParallelEnv e = parse_parallel_env(env);
  CHECK(e.source == "dpar-launch");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 2);
  CHECK(e.node_rank == 1);
  CHECK(e.nnodes == 2);
  CHECK(e.master_addr == "10.0.0.1");
  CHECK(e.master_port == 6170);
  CHECK(e.endpoints.size() == 4);
  CHECK(e.current_endpoint == "10.0.0.2:6071");
  CHECK(e.job_id == "job7");
  CHECK(e.device == "gpu:1");

  const ParallelEnv v6 = parse_parallel_env(
      {{"DPAR_RANK", "0"}, {"DPAR_WORLD_SIZE", "2"}, {"DPAR_MASTER", "[::1]:7000"}});
  CHECK(v6.master_addr == "::1");
  CHECK(v6.master_port == 7000);
}

TEST_CASE("inconsistent dpar-launch variables name the variables and values", "[parallel_env]") {
  const Env base = {{"DPAR_RANK", "1"}, {"DPAR_WORLD_SIZE", "2"}, {"DPAR_MASTER", "1.2.3.4:5"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Env e = base;
    e[k] = v;
    return error_of(e);
  };
  auto without = [&](const std::string& k) {
    Env e = base;
    e.erase(k);
    return error_of(e);
  };
  CHECK_THAT(with("DPAR_RANK", "2"), Contains("DPAR_RANK=2 must be less than DPAR_WORLD_SIZE=2"));
  CHECK_THAT(with("DPAR_RANK", "-1"), Contains("DPAR_RANK=-1 must not be negative"));
  CHECK_THAT(with("DPAR_RANK", "one"), Contains("DPAR_RANK='one' is not an integer"));
  CHECK_THAT(with("DPAR_WORLD_SIZE", "2x"), Contains("DPAR_WORLD_SIZE='2x' is not an integer"));
  CHECK_THAT(with("DPAR_WORLD_SIZE", "0"), Contains("DPAR_WORLD_SIZE=0 must be at least 1"));
  CHECK_THAT(without("DPAR_MASTER"),
             Contains("DPAR_WORLD_SIZE=2 needs a master address for the store: set DPAR_MASTER"));
  CHECK_THAT(without("DPAR_WORLD_SIZE"), Contains("DPAR_WORLD_SIZE is not set"));
  CHECK_THAT(with("DPAR_MASTER", "1.2.3.4"),
             Contains("DPAR_MASTER='1.2.3.4' is not of the form host:port"));
  CHECK_THAT(with("DPAR_MASTER", "1.2.3.4:70000"),
             Contains("DPAR_MASTER='1.2.3.4:70000': port must be in 1..65535"));
  CHECK_THAT(with("DPAR_MASTER", "1.2.3.4:http"), Contains("port 'http' is not an integer"));
  CHECK_THAT(with("DPAR_ENDPOINTS", "a:1,b:2,c:3"),
             Contains("DPAR_ENDPOINTS lists 3 endpoints (a:1,b:2,c:3) but DPAR_WORLD_SIZE=2"));
  {
    Env e = base;
    e["DPAR_ENDPOINTS"] = "a:1,b:2";
    e["DPAR_CURRENT_ENDPOINT"] = "a:1";
    CHECK_THAT(error_of(e), Contains("DPAR_CURRENT_ENDPOINT=a:1 but entry 1 (DPAR_RANK) of "
                                     "DPAR_ENDPOINTS is b:2"));
  }
  CHECK_THAT(with("DPAR_DEVICE", "tpu:0"), Contains("DPAR_DEVICE='tpu:0' is not a device"));
  CHECK_THAT(with("DPAR_LOCAL_RANK", "3"), Contains("DPAR_LOCAL_RANK=3 must be less than "
                                                    "DPAR_LOCAL_SIZE=2"));
  CHECK_THAT(with("DPAR_LOCAL_SIZE", "3"), Contains("DPAR_LOCAL_SIZE=3 exceeds DPAR_WORLD_SIZE=2"));
  CHECK_THAT(with("DPAR_NODE_RANK", "1"), Contains("DPAR_NODE_RANK=1 must be in 0..0 "
                                                   "(DPAR_NNODES=1)"));
  // Every message says which launcher's variables were read.
  CHECK_THAT(with("DPAR_RANK", "2"), Contains("parse_parallel_env (dpar-launch environment)"));
}

TEST_CASE("torchrun variables", "[parallel_env]") {
  Env env = {{"RANK", "5"},
             {"WORLD_SIZE", "8"},
             {"LOCAL_RANK", "1"},
             {"LOCAL_WORLD_SIZE", "4"},
             {"MASTER_ADDR", "node0"},
             {"MASTER_PORT", "29500"},
             {"TORCHELASTIC_RUN_ID", "run42"}};
  ParallelEnv e = parse_parallel_env(env);
  CHECK(e.source == "torchrun");
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 4);
  CHECK(e.nnodes == 2);  // derived: WORLD_SIZE / LOCAL_WORLD_SIZE
  CHECK(e.node_rank == 1);
  CHECK(e.master_addr == "node0");
  CHECK(e.master_port == 29500);
  CHECK(e.job_id == "run42");

  // With the static rendezvous the agent itself listens on MASTER_PORT: the store takes +1.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  CHECK(parse_parallel_env(env).master_port == 29501);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  CHECK(parse_parallel_env(env).master_port == 29500);

  env["GROUP_RANK"] = "1";
  env["GROUP_WORLD_SIZE"] = "2";
  CHECK(parse_parallel_env(env).node_rank == 1);

  CHECK_THAT(
      error_of({{"RANK", "8"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
      Contains("parse_parallel_env (torchrun environment): RANK=8 must be less than "
               "WORLD_SIZE=8"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
             Contains("WORLD_SIZE=2 needs a master address for the store: set MASTER_ADDR and "
                      "MASTER_PORT"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}),
             Contains("MASTER_ADDR=a is set but MASTER_PORT is not"));
  CHECK_THAT(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "x1"}}),
      Contains("MASTER_PORT='x1': port 'x1' is not an integer"));
  CHECK_THAT(error_of({{"RANK", "0"}}), Contains("WORLD_SIZE is not set"));
  CHECK_THAT(
      error_of(
          {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "1"}}),
      Contains("LOCAL_RANK=1 must be less than LOCAL_WORLD_SIZE=1"));
  // A single process under torchrun needs no master.
  CHECK(parse_parallel_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).world_size == 1);
}

TEST_CASE("PaddlePaddle variables", "[parallel_env]") {
  const Env env = {{"PADDLE_TRAINER_ID", "2"},
                   {"PADDLE_TRAINERS_NUM", "4"},
                   {"PADDLE_TRAINER_ENDPOINTS",
                    "192.168.0.1:6070,192.168.0.1:6071,192.168.0.2:6070,192.168.0.2:6071"},
                   {"PADDLE_CURRENT_ENDPOINT", "192.168.0.2:6070"},
                   {"PADDLE_RANK_IN_NODE", "0"},
                   {"FLAGS_selected_gpus", "3"}};
  const ParallelEnv e = parse_parallel_env(env);
  CHECK(e.source == "paddle");
  CHECK(e.rank == 2);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 0);
  CHECK(e.local_size == 2);
  CHECK(e.node_rank == 1);
  CHECK(e.nnodes == 2);
  // The store is trainer 0's endpoint.
  CHECK(e.master_addr == "192.168.0.1");
  CHECK(e.master_port == 6070);
  CHECK(e.device == "gpu:3");
  CHECK(e.endpoints.size() == 4);

  Env bad = env;
  bad["PADDLE_TRAINERS_NUM"] = "3";
  CHECK_THAT(error_of(bad),
             Contains("parse_parallel_env (paddle environment): PADDLE_TRAINER_ENDPOINTS lists 4 "
                      "endpoints (192.168.0.1:6070,192.168.0.1:6071,192.168.0.2:6070,"
                      "192.168.0.2:6071) but PADDLE_TRAINERS_NUM=3"));
  bad = env;
  bad["PADDLE_CURRENT_ENDPOINT"] = "192.168.0.2:6071";
  CHECK_THAT(error_of(bad), Contains("PADDLE_CURRENT_ENDPOINT=192.168.0.2:6071 but entry 2 "
                                     "(PADDLE_TRAINER_ID) of PADDLE_TRAINER_ENDPOINTS is "
                                     "192.168.0.2:6070"));
  bad = env;
  bad.erase("PADDLE_TRAINER_ENDPOINTS");
  CHECK_THAT(error_of(bad), Contains("PADDLE_TRAINERS_NUM=4 needs a master address for the "
                                     "store: set PADDLE_TRAINER_ENDPOINTS"));
  bad = env;
  bad["PADDLE_TRAINER_ID"] = "4";
  CHECK_THAT(error_of(bad),
             Contains("PADDLE_TRAINER_ID=4 must be less than PADDLE_TRAINERS_NUM=4"));
  bad = env;
  bad["FLAGS_selected_gpus"] = "gpu0";
  CHECK_THAT(error_of(bad), Contains("FLAGS_selected_gpus='gpu0' is not a list of GPU ids"));
}

TEST_CASE("Slurm variables", "[parallel_env]") {
  Env env = {{"SLURM_PROCID", "3"},
             {"SLURM_NTASKS", "4"},
             {"SLURM_LOCALID", "1"},
             {"SLURM_NODEID", "1"},
             {"SLURM_NNODES", "2"},
             {"SLURM_JOB_ID", "123456"},
             {"SLURM_TASKS_PER_NODE", "2(x2)"},
             {"SLURM_JOB_NODELIST", "gpu[07-08,11]"}};
  ParallelEnv e = parse_parallel_env(env);
  CHECK(e.source == "slurm");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 2);
  CHECK(e.node_rank == 1);
  CHECK(e.nnodes == 2);
  CHECK(e.job_id == "123456");
  CHECK(e.master_addr == "gpu07");  // first host, zero padding kept
  CHECK(e.master_port == 15000 + 123456 % 15000);

  auto first_host = [&](const std::string& list) {
    Env e2 = env;
    e2["SLURM_JOB_NODELIST"] = list;
    return parse_parallel_env(e2).master_addr;
  };
  CHECK(first_host("nodeA") == "nodeA");
  CHECK(first_host("nodeA,nodeB") == "nodeA");
  CHECK(first_host("n[3-4],m1") == "n3");
  CHECK(first_host("rack[1-2]-n[05-06]") == "rack1-n05");
  CHECK_THAT(error_of({{"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "2"},
                       {"SLURM_JOB_ID", "1"},
                       {"SLURM_JOB_NODELIST", "n[1-2"}}),
             Contains("SLURM_JOB_NODELIST='n[1-2' is not a host list this parser understands"));

  // The step's node list wins over the job's; MASTER_ADDR/MASTER_PORT win over both.
  env["SLURM_STEP_NODELIST"] = "step[2-3]";
  CHECK(parse_parallel_env(env).master_addr == "step2");
  env["MASTER_ADDR"] = "10.1.1.1";
  env["MASTER_PORT"] = "4000";
  e = parse_parallel_env(env);
  CHECK(e.master_addr == "10.1.1.1");
  CHECK(e.master_port == 4000);

  // An srun step's own task count beats the allocation's.
  env["SLURM_STEP_NUM_TASKS"] = "2";
  CHECK_THAT(error_of(env), Contains("SLURM_PROCID=3 must be less than SLURM_STEP_NUM_TASKS=2"));

  CHECK_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}),
             Contains("needs a master for the store: set MASTER_ADDR and MASTER_PORT"));
  CHECK_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n1"}}),
             Contains("no MASTER_PORT and no SLURM_JOB_ID"));
  CHECK_THAT(error_of({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}),
             Contains("SLURM_PROCID='x' is not an integer"));
  // One task needs nothing else.
  CHECK(parse_parallel_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).world_size == 1);
}

TEST_CASE("Open MPI variables", "[parallel_env]") {
  const Env env = {{"OMPI_COMM_WORLD_RANK", "5"},       {"OMPI_COMM_WORLD_SIZE", "8"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                   {"MASTER_ADDR", "10.0.0.9"},         {"MASTER_PORT", "5555"}};
  const ParallelEnv e = parse_parallel_env(env);
  CHECK(e.source == "openmpi");
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 4);
  CHECK(e.nnodes == 2);
  CHECK(e.node_rank == 1);
  CHECK(e.master_addr == "10.0.0.9");
  CHECK(e.master_port == 5555);

  Env no_master = env;
  no_master.erase("MASTER_ADDR");
  no_master.erase("MASTER_PORT");
  CHECK_THAT(error_of(no_master),
             Contains("parse_parallel_env (openmpi environment): OMPI_COMM_WORLD_SIZE=8 needs a "
                      "master address for the store: set MASTER_ADDR and MASTER_PORT (e.g. mpirun "
                      "-x MASTER_ADDR="));
  CHECK(parse_parallel_env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}})
            .world_size == 1);
  CHECK_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "-2"}}),
             Contains("OMPI_COMM_WORLD_SIZE=-2 must be at least 1"));
}

TEST_CASE("init_parallel_env in a world of one needs no network", "[parallel_env]") {
  CHECK_FALSE(is_initialized());
  CHECK(get_rank() == 0);
  CHECK(get_world_size() == 1);
  CHECK(default_group_ptr() == nullptr);
  CHECK_THROWS_WITH(default_group(), Contains("init_parallel_env() has not been called"));

  init_parallel_env(ParallelEnv{});
  CHECK(is_initialized());
  CHECK(get_rank() == 0);
  CHECK(get_world_size() == 1);
  CHECK(get_local_rank() == 0);
  CHECK(parallel_env().source == "none");
  CHECK(default_group().size() == 1);
  barrier();
  // Collectives of one answer locally.
  Tensor t = Tensor::full({3}, 2.0);
  default_group().allreduce({t})->wait();
  CHECK(t.to_float_vector() == std::vector<float>{2, 2, 2});
  CHECK_THROWS_WITH(init_parallel_env(ParallelEnv{}), Contains("already initialised"));

  // DataParallel is a plain wrapper: the module's names and gradients, no buckets.
  auto net = std::make_shared<nn::Linear>(3, 2);
  DataParallel dp(net);
  CHECK(dp.buckets().empty());
  CHECK_THAT(dp.bucket_summary(), Contains("all_reduce tensors: 0"));
  CHECK(dp.named_parameters().size() == 2);
  CHECK(dp.named_parameters()[0].first == "weight");
  CHECK(dp.state_dict().size() == 2);
  Tensor y = dp(Tensor::ones({4, 3}));
  sum(y).backward();
  CHECK(net->weight.grad().defined());
  CHECK(dp.parameters()[0].grad().is_same(net->weight.grad()));
  dp.zero_grad();
  CHECK(net->weight.grad().to_float_vector() == std::vector<float>(6, 0.f));

  destroy();
  CHECK_FALSE(is_initialized());
  CHECK(get_world_size() == 1);
  destroy();  // idempotent
}

TEST_CASE("init_parallel_env: the backend for CUDA tensors is nccl or gloo", "[parallel_env]") {
  InitOptions options;
  options.backend = "mpi";
  CHECK_THROWS_WITH(ParallelContext(ParallelEnv{}, options),
                    Contains("init_parallel_env: backend 'mpi': expected nccl or gloo"));
  options.backend = "gloo";
  ParallelContext gloo_context(ParallelEnv{}, options);
  CHECK(gloo_context.group()->size() == 1);
}

TEST_CASE("init over loopback: process-wide rank 0 and a ParallelContext rank 1",
          "[parallel_env]") {
  const int port = free_port();
  ParallelEnv e0 = parse_parallel_env({{"DPAR_RANK", "0"},
                                       {"DPAR_WORLD_SIZE", "2"},
                                       {"DPAR_MASTER", "127.0.0.1:" + std::to_string(port)},
                                       {"DPAR_JOB_ID", "test-init"}});
  ParallelEnv e1 = e0;
  e1.rank = 1;
  e1.local_rank = 1;
  InitOptions options;
  options.connect_timeout = std::chrono::seconds(20);
  options.group.timeout = std::chrono::seconds(20);

  auto rank1 = std::async(std::launch::async, [&] {
    ParallelContext ctx(e1, options);
    Tensor t = Tensor::full({4}, 2.0);
    ctx.group()->allreduce({t})->wait();
    ctx.barrier();
    ctx.destroy();
    return t.to_float_vector();
  });
  init_parallel_env(e0, options);
  CHECK(get_rank() == 0);
  CHECK(get_world_size() == 2);
  CHECK(parallel_env().job_id == "test-init");
  Tensor t = Tensor::full({4}, 1.0);
  default_group().allreduce({t})->wait();
  barrier();
  CHECK(t.to_float_vector() == std::vector<float>(4, 3.f));
  CHECK(rank1.get() == std::vector<float>(4, 3.f));
  destroy();
  CHECK_FALSE(is_initialized());
}

TEST_CASE("init fails with one clear error when rank 0 never comes", "[parallel_env]") {
  ParallelEnv e = parse_parallel_env({{"DPAR_RANK", "1"},
                                      {"DPAR_WORLD_SIZE", "2"},
                                      {"DPAR_MASTER", "127.0.0.1:" + std::to_string(free_port())}});
  InitOptions options;
  options.connect_timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(ParallelContext(e, options), Error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));

  ParallelEnv unresolvable = e;
  unresolvable.master_addr = "no-such-host.invalid";
  CHECK_THROWS_WITH(ParallelContext(unresolvable, options),
                    Contains("cannot resolve the master host 'no-such-host.invalid'"));
}
