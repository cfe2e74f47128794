// dpar-launch's parsers and environment builder, without starting processes: cluster
// descriptions (--ips, hostfile, rank table), node selection, endpoints, the per-process
// environment and the option checks in collective mode (ps mode: test_launch_ps.cpp). The shell
// tests next to this file run the real launcher.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "address.h"
#include "cluster.h"
#include "cpu_binding.h"
#include "environment.h"
#include "launch_test_util.h"
#include "log_sink.h"
#include "plan.h"

using namespace dpar::launch;
using namespace dpar::launch::testing;
using Catch::Matchers::Contains;

TEST_CASE("launch: GPU lists", "[launch]") {
  CHECK(parse_gpu_list("0,1, 3", "--gpus") == std::vector<std::string>{"0", "1", "3"});
  CHECK(parse_gpu_list("01", "--gpus") == std::vector<std::string>{"1"});
  CHECK_THAT(error_of([] { parse_gpu_list("0,,1", "--gpus"); }), Contains("empty entry"));
  CHECK_THAT(error_of([] { parse_gpu_list("0,a", "--gpus"); }), Contains("'a' is not a GPU id"));
  CHECK_THAT(error_of([] { parse_gpu_list("2,02", "--gpus"); }), Contains("GPU 2 listed twice"));
  CHECK_THAT(error_of([] { parse_gpu_list("99999999999", "--gpus"); }), Contains("not a GPU id"));
}

TEST_CASE("launch: --ips gives node-by-node ranks", "[launch]") {
  Cluster c = cluster_from_ips("10.0.0.1, 10.0.0.2", {"0", "1"}, 1);
  REQUIRE(c.nodes.size() == 2);
  CHECK(c.world_size() == 4);
  CHECK(c.nodes[1].ip == "10.0.0.2");
  CHECK(c.nodes[1].procs[1].rank == 3);
  CHECK(c.nodes[1].procs[1].local_rank == 1);
  CHECK(c.nodes[1].procs[1].gpu == "1");
  Cluster cpu = cluster_from_ips("127.0.0.1", {}, 3);
  CHECK(cpu.world_size() == 3);
  CHECK(cpu.nodes[0].procs[2].gpu.empty());
  CHECK_THAT(error_of([] { cluster_from_ips("10.0.0.1,10.0.0.256", {}, 1); }),
             Contains("'10.0.0.256' is not an IPv4 address"));
  CHECK_THAT(error_of([] { cluster_from_ips("10.0.0.01", {}, 1); }),
             Contains("not an IPv4 address"));
}

TEST_CASE("launch: hostfiles in Horovod/Open MPI and MPICH style", "[launch]") {
  const std::string text =
      "# cluster\n"
      "127.0.0.1 slots=2 max_slots=4\n"
      "\n"
      "localhost:3   # MPICH style\n"
      "127.0.0.3\n";
  Cluster c = cluster_from_hostfile(text, "hosts", {}, 1);
  REQUIRE(c.nodes.size() == 3);
  CHECK(c.nodes[0].procs.size() == 2);
  CHECK(c.nodes[1].host == "localhost");
  CHECK(c.nodes[1].ip == "127.0.0.1");
  CHECK(c.nodes[1].procs.size() == 3);
  CHECK(c.nodes[1].procs[0].rank == 2);
  CHECK(c.nodes[2].procs.size() == 1);  // default: --nproc_per_node
  CHECK(c.world_size() == 6);
  CHECK(c.max_local_size() == 3);

  // With --gpus, a line without slots runs one process per GPU.
  Cluster g = cluster_from_hostfile("127.0.0.1\n127.0.0.2 slots=1\n", "h", {"2", "3"}, 1);
  CHECK(g.nodes[0].procs.size() == 2);
  CHECK(g.nodes[0].procs[1].gpu == "3");
  CHECK(g.nodes[1].procs.size() == 1);

  // Lines of vertical tabs or form feeds are blank (fuzz_launch_parse: such a line read past
  // the end of its token list).
  CHECK(cluster_from_hostfile("127.0.0.1\n\v\n \f \n", "h", {}, 1).nodes.size() == 1);

  CHECK_THAT(error_of([] { cluster_from_hostfile("a slots=0\n", "h", {}, 1); }),
             Contains("hostfile h line 1: 'slots=0': expected slots=N with N >= 1"));
  CHECK_THAT(error_of([] { cluster_from_hostfile("127.0.0.1 gpus=2\n", "h", {}, 1); }),
             Contains("unknown field 'gpus=2'"));
  CHECK_THAT(error_of([] { cluster_from_hostfile("127.0.0.1:x\n", "h", {}, 1); }),
             Contains("expected host:N"));
  CHECK_THAT(
      error_of([] { cluster_from_hostfile("127.0.0.1:5555555555555555555555555\n", "h", {}, 1); }),
      Contains("expected host:N"));  // fuzz_launch_parse: stoll overflowed first
  CHECK_THAT(error_of([] {
               cluster_from_hostfile("127.0.0.1 slots=3\n", "h", {"0", "1"}, 1);
             }),
             Contains("slots=3 but --gpus lists only 2 GPUs"));
  CHECK_THAT(error_of([] { cluster_from_hostfile("no-such-host.invalid\n", "h", {}, 1); }),
             Contains("cannot resolve host 'no-such-host.invalid'"));
  CHECK_THAT(error_of([] { cluster_from_hostfile("  # only comments\n", "h", {}, 1); }),
             Contains("lists no hosts"));
}

TEST_CASE("launch: MindSpore-style rank tables", "[launch]") {
  const std::string table = R"({
    "version": "1.0", "server_count": "2",
    "server_list": [
      {"server_id": "10.0.0.1", "device": [
        {"device_id": "0", "device_ip": "192.0.2.1", "rank_id": "3"},
        {"device_id": "1", "device_ip": "192.0.2.2", "rank_id": "0"}]},
      {"server_id": "10.0.0.2", "device": [
        {"device_id": 4, "rank_id": 1}, {"device_id": 5, "rank_id": 2}]}],
    "status": "completed"})";
  // A number too large for JSON's parser is invalid JSON too, not an escaping exception
  // (fuzz_launch_parse).
  CHECK_THAT(error_of([] { cluster_from_rank_table("7770000000000000E000000000000012481", "rt"); }),
             Contains("rank table rt: not valid JSON"));
  Cluster c = cluster_from_rank_table(table, "rt.json");
  REQUIRE(c.nodes.size() == 2);
  CHECK(c.world_size() == 4);
  // Local ranks follow rank_id within a node.
  CHECK(c.nodes[0].procs[0].rank == 0);
  CHECK(c.nodes[0].procs[0].gpu == "1");
  CHECK(c.nodes[0].procs[1].rank == 3);
  CHECK(c.nodes[0].procs[1].local_rank == 1);
  CHECK(c.nodes[1].procs[0].gpu == "4");

  CHECK_THAT(error_of([] { cluster_from_rank_table("[1,2]", "r"); }),
             Contains("non-empty \"server_list\""));
  CHECK_THAT(error_of([] { cluster_from_rank_table("{", "r"); }), Contains("not valid JSON"));
  CHECK_THAT(error_of([] {
               cluster_from_rank_table(
                   R"({"server_list":[{"server_id":"10.0.0.1","device":[{"device_id":"0"}]}]})",
                   "r");
             }),
             Contains("server_list[0].device[0].rank_id is missing"));
  CHECK_THAT(error_of([] {
               cluster_from_rank_table(
                   R"({"server_list":[{"server_id":"10.0.0.1","device":[
                {"device_id":"0","rank_id":"0"},{"device_id":"0","rank_id":"1"}]}]})",
                   "r");
             }),
             Contains("device_id 0 appears twice on 10.0.0.1"));
  CHECK_THAT(error_of([] {
               cluster_from_rank_table(
                   R"({"server_list":[{"server_id":"10.0.0.1","device":[
                {"device_id":"0","rank_id":"0"},{"device_id":"1","rank_id":"2"}]}]})",
                   "r");
             }),
             Contains("rank 1 is missing"));
  CHECK_THAT(error_of([] {
               cluster_from_rank_table(
                   R"({"server_list":[{"server_id":"10.0.0.1","device":[
                       {"device_id":"x","rank_id":"0"}]}]})",
                   "r");
             }),
             Contains("device_id is \"x\" (expected a non-negative id)"));
}

TEST_CASE("launch: finding this node", "[launch]") {
  Cluster c = cluster_from_ips("10.0.0.1,10.0.0.2", {}, 1);
  const std::vector<std::string> local = {"127.0.0.1", "10.0.0.2"};
  CHECK(select_node(c, "", -1, local) == 1);
  CHECK(select_node(c, "10.0.0.1", -1, local) == 0);
  CHECK(select_node(c, "", 0, local) == 0);
  CHECK(select_node(c, "10.0.0.2", 1, local) == 1);
  CHECK_THAT(error_of([&] {
               select_node(c, "", -1, {"127.0.0.1", "192.0.2.7"});
             }),
             Contains("this host is not in --ips=10.0.0.1,10.0.0.2 (local addresses: "
                      "127.0.0.1, 192.0.2.7)"));
  CHECK_THAT(error_of([&] {
               select_node(c, "", -1, {"10.0.0.1", "10.0.0.2"});
             }),
             Contains("several nodes of --ips=10.0.0.1,10.0.0.2 are addresses of this host"));
  CHECK_THAT(error_of([&] { select_node(c, "10.0.0.1", 1, local); }), Contains("disagree"));
  CHECK_THAT(error_of([&] { select_node(c, "", 2, local); }), Contains("expected 0..1"));
  CHECK_THAT(error_of([&] { select_node(c, "10.0.0.9", -1, local); }),
             Contains("--host=10.0.0.9 is not one of the nodes"));
}

TEST_CASE("launch: endpoints, store endpoint and job id", "[launch]") {
  LaunchPlan plan = make_plan(options({"--ips=10.0.0.1,10.0.0.2", "--nproc_per_node=3",
                                       "--start_port=7000", "--host=10.0.0.2"}),
                              {});
  CHECK(plan.node_rank == 1);
  CHECK(plan.endpoints == std::vector<std::string>{"10.0.0.1:7000", "10.0.0.1:7001",
                                                   "10.0.0.1:7002", "10.0.0.2:7000",
                                                   "10.0.0.2:7001", "10.0.0.2:7002"});
  CHECK(plan.master() == "10.0.0.1:7003");  // the port after the per-rank block
  CHECK(plan.job_id == "dpar-10.0.0.1-7003");
  CHECK_FALSE(plan.hosts_rank0());

  LaunchPlan custom = make_plan(
      options({"--ips=10.0.0.1", "--master=10.0.0.1:9000", "--job_id=run7", "--node_rank=0"}), {});
  CHECK(custom.master() == "10.0.0.1:9000");
  CHECK(custom.job_id == "run7");
  CHECK(custom.hosts_rank0());

  CHECK_THAT(error_of([] {
               make_plan(options({"--ips=10.0.0.1,10.0.0.1", "--node_rank=0"}), {});
             }),
             Contains("nodes 0 and 1 have the same address 10.0.0.1"));
  CHECK_THAT(
      error_of([] {
        make_plan(options({"--ips=10.0.0.1", "--node_rank=0", "--master=10.0.0.1:6070"}), {});
      }),
      Contains("is also the endpoint of rank 0 (duplicate endpoint)"));
  CHECK_THAT(error_of([] {
               make_plan(options({"--node_rank=0", "--start_port=65535"}), {});
             }),
             Contains("past 65535"));
}

TEST_CASE("launch: per-process environment", "[launch]") {
  LaunchPlan plan =
      make_plan(options({"--ips=10.0.0.1,10.0.0.2", "--gpus=2,3", "--host=10.0.0.2"}), {});
  const Process& p = plan.node().procs[1];
  Env env = worker_environment(plan, p, {{"PATH", "/bin"}}, 0, 8);
  CHECK(env["PATH"] == "/bin");
  CHECK(env["DPAR_RANK"] == "3");
  CHECK(env["DPAR_WORLD_SIZE"] == "4");
  CHECK(env["DPAR_LOCAL_RANK"] == "1");
  CHECK(env["DPAR_LOCAL_SIZE"] == "2");
  CHECK(env["DPAR_NODE_RANK"] == "1");
  CHECK(env["DPAR_NNODES"] == "2");
  CHECK(env["DPAR_MASTER"] == "10.0.0.1:6072");
  CHECK(env["DPAR_ENDPOINTS"] == "10.0.0.1:6070,10.0.0.1:6071,10.0.0.2:6070,10.0.0.2:6071");
  CHECK(env["DPAR_CURRENT_ENDPOINT"] == "10.0.0.2:6071");
  CHECK(env["DPAR_JOB_ID"] == "dpar-10.0.0.1-6072");
  CHECK(env["DPAR_DEVICE"] == "gpu:1");
  CHECK(env["DPAR_RESTART_COUNT"] == "0");
  CHECK(env["CUDA_VISIBLE_DEVICES"] == "2,3");
  CHECK(env["FLAGS_selected_gpus"] == "1");
  CHECK(env["PADDLE_TRAINER_ID"] == "3");
  CHECK(env["PADDLE_TRAINERS_NUM"] == "4");
  CHECK(env["PADDLE_TRAINER_ENDPOINTS"] == env["DPAR_ENDPOINTS"]);
  CHECK(env["PADDLE_CURRENT_ENDPOINT"] == "10.0.0.2:6071");
  CHECK(env["PADDLE_RANK_IN_NODE"] == "1");
  CHECK(env["RANK"] == "3");
  CHECK(env["WORLD_SIZE"] == "4");
  CHECK(env["LOCAL_RANK"] == "1");
  CHECK(env["LOCAL_WORLD_SIZE"] == "2");
  CHECK(env["MASTER_ADDR"] == "10.0.0.1");
  CHECK(env["MASTER_PORT"] == "6072");
  CHECK(env["OMP_NUM_THREADS"] == "4");  // 8 cpus / 2 local processes

  CHECK(worker_environment(plan, p, {{"OMP_NUM_THREADS", "3"}}, 2, 8)["OMP_NUM_THREADS"] == "3");
  CHECK(worker_environment(plan, p, {}, 2, 1)["OMP_NUM_THREADS"] == "1");
  CHECK(worker_environment(plan, p, {}, 2, 8)["DPAR_RESTART_COUNT"] == "2");
  // Bound (--cpu_bind=cores): its CPU list, and one OpenMP thread per CPU unless set.
  CHECK(worker_environment(plan, p, {}, 0, 8, {2, 3})["DPAR_CPUS"] == "2-3");
  CHECK(worker_environment(plan, p, {}, 0, 8, {2, 3})["OMP_NUM_THREADS"] == "2");
  CHECK(worker_environment(plan, p, {{"OMP_NUM_THREADS", "3"}}, 0, 8, {2})["OMP_NUM_THREADS"] ==
        "3");
  // Unbound under a bound parent: the inherited list is not this process's.
  CHECK(worker_environment(plan, p, {{"DPAR_CPUS", "5"}}, 0, 8).count("DPAR_CPUS") == 0);
  CHECK(worker_environment(plan, p, {{"CUDA_VISIBLE_DEVICES", "3,2,7"}}, 0,
                           8)["CUDA_VISIBLE_DEVICES"] == "2,3");
  CHECK_THAT(error_of([&] {
               worker_environment(plan, p, {{"CUDA_VISIBLE_DEVICES", "0,1"}}, 0, 8);
             }),
             Contains("GPU 2 is not in this launcher's CUDA_VISIBLE_DEVICES=0,1"));

  const std::string table = format_env_table(env, "Distributed environment of local rank 0");
  CHECK_THAT(table, Contains("| DPAR_RANK "));
  CHECK_THAT(table, Contains("| 10.0.0.2:6071 "));
  CHECK_THAT(table, !Contains("PATH"));
}

TEST_CASE("launch: several ranks share a GPU when --nproc_per_node is a multiple of --gpus",
          "[launch]") {
  LaunchPlan plan = make_plan(options({"--gpus=3", "--nproc_per_node=2", "--node_rank=0"}), {});
  REQUIRE(plan.node().procs.size() == 2);
  std::vector<std::string> host_ids;
  for (const Process& p : plan.node().procs) {
    CHECK(p.gpu == "3");
    Env env = worker_environment(plan, p, {}, 0, 8);
    CHECK(env["CUDA_VISIBLE_DEVICES"] == "3");
    CHECK(env["DPAR_DEVICE"] == "gpu:0");
    CHECK(env["FLAGS_selected_gpus"] == "0");
    CHECK(env["NCCL_SOCKET_IFNAME"] == "lo");  // one node: loopback
    host_ids.push_back(env["NCCL_HOSTID"]);
  }
  // NCCL refuses two ranks on one device of one host: each rank is its own "host".
  CHECK(host_ids[0] != host_ids[1]);
  CHECK_FALSE(host_ids[0].empty());
  // The caller's own settings win.
  const Env own = worker_environment(
      plan, plan.node().procs[1], {{"NCCL_HOSTID", "mine"}, {"NCCL_SOCKET_IFNAME", "eth0"}}, 0, 8);
  CHECK(own.at("NCCL_HOSTID") == "mine");
  CHECK(own.at("NCCL_SOCKET_IFNAME") == "eth0");

  // Two GPUs, four ranks: in turn, 0 1 0 1, each numbered inside CUDA_VISIBLE_DEVICES.
  LaunchPlan four = make_plan(options({"--gpus=5,2", "--nproc_per_node=4", "--node_rank=0"}), {});
  std::vector<std::string> devices;
  for (const Process& p : four.node().procs) {
    devices.push_back(worker_environment(four, p, {}, 0, 8)["DPAR_DEVICE"]);
  }
  CHECK(devices == std::vector<std::string>{"gpu:0", "gpu:1", "gpu:0", "gpu:1"});
  CHECK(worker_environment(four, four.node().procs[0], {}, 0, 8)["CUDA_VISIBLE_DEVICES"] == "5,2");

  // One rank per GPU sets no NCCL_HOSTID.
  LaunchPlan one_each = make_plan(options({"--gpus=0,1", "--node_rank=0"}), {});
  CHECK(worker_environment(one_each, one_each.node().procs[1], {}, 0, 8).count("NCCL_HOSTID") == 0);
  CHECK_THAT(error_of([] {
               make_plan(options({"--gpus=0,1", "--nproc_per_node=3", "--node_rank=0"}), {});
             }),
             Contains("--nproc_per_node=3 does not match --gpus=0,1 (one process per GPU, or a "
                      "multiple of the 2 GPUs to share them"));
}

TEST_CASE("launch: GPUs must be devices of this machine", "[launch]") {
  int asked = 0;
  auto machine = [&asked](int count) {
    return [&asked, count] {
      ++asked;
      return GpuInventory{count,
                          count == 0 ? "no CUDA device (cudaGetDeviceCount found none)" : ""};
    };
  };
  // Node 1 of two runs GPUs 2 and 3; each node checks only its own processes.
  const LaunchPlan plan =
      make_plan(options({"--ips=10.0.0.1,10.0.0.2", "--gpus=2,3", "--host=10.0.0.2"}), {});
  CHECK(plan.gpu_source == "--gpus=2,3");
  CHECK_NOTHROW(check_local_gpus(plan, {}, machine(4)));
  CHECK_THAT(error_of([&] { check_local_gpus(plan, {}, machine(3)); }),
             Contains("dpar-launch: --gpus=2,3: GPU 3 is not a device of this machine (it has 3 "
                      "CUDA devices: 0..2)"));
  CHECK_THAT(error_of([&] { check_local_gpus(plan, {}, machine(2)); }),
             Contains("--gpus=2,3: GPU 2 is not a device of this machine (it has 2 CUDA "
                      "devices: 0,1)"));
  CHECK_THAT(error_of([&] { check_local_gpus(plan, {}, machine(1)); }),
             Contains("GPU 2 is not a device of this machine (it has 1 CUDA device: 0)"));
  CHECK_THAT(error_of([&] { check_local_gpus(plan, {}, machine(0)); }),
             Contains("--gpus=2,3: GPU 2 is not a device of this machine (no CUDA device "
                      "(cudaGetDeviceCount found none))"));
  // An inherited CUDA_VISIBLE_DEVICES is the rule instead (worker_environment checks it): the
  // machine is not asked.
  asked = 0;
  CHECK_NOTHROW(check_local_gpus(plan, {{"CUDA_VISIBLE_DEVICES", "2,3"}}, machine(0)));
  CHECK(asked == 0);
  // Set but blank counts as not set.
  CHECK_THAT(error_of([&] {
               check_local_gpus(plan, {{"CUDA_VISIBLE_DEVICES", " "}}, machine(0));
             }),
             Contains("GPU 2 is not a device of this machine"));
  // CPU processes ask nothing.
  const LaunchPlan cpu = make_plan(options({"--nproc_per_node=2"}), {"127.0.0.1"});
  asked = 0;
  CHECK_NOTHROW(check_local_gpus(cpu, {}, machine(0)));
  CHECK(asked == 0);
  // A rank table names its file.
  LaunchPlan table;
  table.cluster = cluster_from_rank_table(
      R"({"server_list":[{"server_id":"10.0.0.1","device":[{"device_id":"0","rank_id":"0"},
         {"device_id":"5","rank_id":"1"}]}]})",
      "rt.json");
  table.gpu_source = table.cluster.source;
  CHECK_THAT(error_of([&] { check_local_gpus(table, {}, machine(2)); }),
             Contains("dpar-launch: --rank_table=rt.json: GPU 5 is not a device of this machine "
                      "(it has 2 CUDA devices: 0,1)"));
}

TEST_CASE("launch: option checks", "[launch]") {
  Options o = options({"--log-dir=out", "--devices=0,1", "--max_restart=2"});
  CHECK(o.log_dir == "out");
  CHECK(o.gpus == "0,1");
  CHECK(o.gpus_given);
  CHECK(o.max_restarts == 2);
  CHECK(options({"--run_mode=collective"}).run_mode == "collective");
  CHECK(parse_options({"--nproc_per_node", "2", "prog", "--lr=0.1", "x"}).command ==
        std::vector<std::string>{"prog", "--lr=0.1", "x"});
  CHECK_THAT(error_of([] { parse_options({"--nproc_per_node=2"}); }), Contains("no program given"));
  CHECK_THAT(error_of([] { options({"--run_mode=hybrid"}); }),
             Contains("--run_mode=hybrid: expected collective or ps"));
  CHECK_THAT(error_of([] { options({"--nproc_per_node=0"}); }),
             Contains("expected at least 1 process"));
  CHECK_THAT(error_of([] {
               options({"--hostfile=h", "--rank_table=r"});
             }),
             Contains("give one of them"));
  CHECK_THAT(error_of([] {
               options({"--ips=127.0.0.1", "--hostfile=h"});
             }),
             Contains("--ips and --hostfile both describe the cluster"));
  CHECK_THAT(error_of([] {
               options({"--rank_table=r", "--nproc_per_node=2"});
             }),
             Contains("--nproc_per_node cannot be combined with --rank_table"));
  CHECK_THAT(error_of([] { options({"--grace_period=-1"}); }), Contains("expected 0..3600"));
  CHECK_THAT(error_of([] { options({"--job_id=a b"}); }), Contains("expected no spaces"));
}

TEST_CASE("launch: --cpu_bind=cores shares out whole cores in local-rank order", "[launch]") {
  using Shares = std::vector<std::vector<int>>;
  CHECK(options({"--cpu_bind=cores"}).cpu_bind == "cores");
  CHECK(options({}).cpu_bind == "none");
  CHECK_THAT(error_of([] { options({"--cpu_bind=numa"}); }),
             Contains("--cpu_bind=numa: expected none or cores"));
  // One hardware thread per core: the CPUs in order, the remainder unused.
  const std::vector<int> four{0, 1, 2, 3};
  CHECK(cpu_shares(four, four, 2) == Shares{{0, 1}, {2, 3}});
  CHECK(cpu_shares(four, four, 3) == Shares{{0}, {1}, {2}});
  CHECK(cpu_shares({2, 5, 6}, {2, 5, 6}, 1) == Shares{{2, 5, 6}});
  // Two threads per core, siblings numbered i and i + 4 (as Linux numbers them on x86): each
  // rank gets whole cores, never one thread of another rank's core.
  const std::vector<int> eight{0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<int> core{0, 1, 2, 3, 0, 1, 2, 3};
  CHECK(cpu_shares(eight, core, 2) == Shares{{0, 1, 4, 5}, {2, 3, 6, 7}});
  CHECK(cpu_shares(eight, core, 4) == Shares{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // More processes than cores: single hardware threads.
  CHECK(cpu_shares(eight, core, 8).size() == 8);
  CHECK(cpu_shares(eight, core, 6)[5] == std::vector<int>{5});
  CHECK_THAT(error_of([&] { cpu_shares(four, four, 5); }),
             Contains("--cpu_bind=cores needs a CPU for each of this node's 5 processes, but the "
                      "launcher may use 4 (CPUs 0-3)"));
  CHECK(cpu_list_text({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8");
  CHECK(cpu_list_text({3}) == "3");
  CHECK(cpu_list_text({}).empty());
  // This machine: the launcher's CPUs, each with a core id among them.
  const std::vector<int> mine = allowed_cpus();
  REQUIRE(!mine.empty());
  CHECK(core_ids(mine).size() == mine.size());
  CHECK(cpu_shares(mine, core_ids(mine), 1).front().size() >= 1);
}

TEST_CASE("launch: torchrun's spellings", "[launch]") {
  // --master_addr/--master_port make up the store's endpoint; --nnodes must match the list.
  LaunchPlan plan =
      make_plan(options({"--ips=10.0.0.1,10.0.0.2", "--nnodes=2", "--node_rank=1",
                         "--master_addr=10.0.0.1", "--master_port=29400", "--nproc-per-node=2"}),
                {});
  CHECK(plan.master() == "10.0.0.1:29400");
  CHECK(plan.node_rank == 1);
  CHECK(plan.cluster.world_size() == 4);
  // Only the port: rank 0's node; only the address: the derived port.
  CHECK(make_plan(options({"--node_rank=0", "--master_port=29400"}), {}).master() ==
        "127.0.0.1:29400");
  CHECK(make_plan(options({"--node_rank=0", "--master_addr=127.0.0.1", "--start_port=7000"}), {})
            .master() == "127.0.0.1:7001");
  CHECK(make_plan(options({"--node_rank=0", "--nnodes=1:1"}), {}).cluster.nodes.size() == 1);

  CHECK_THAT(error_of([] { options({"--nnodes=1:4"}); }),
             Contains("--nnodes=1:4 is an elastic job: give --rdzv_endpoint=host:port"));
  CHECK_THAT(error_of([] { options({"--nnodes=4:1"}); }),
             Contains("--nnodes=4:1: MIN is above MAX"));
  CHECK_THAT(error_of([] {
               options({"--nnodes=1:4", "--rdzv_endpoint=10.0.0.1"});
             }),
             Contains("--rdzv_endpoint=10.0.0.1: '10.0.0.1' is not host:port"));
  // etcd: the members' list (each checked); dpar: one store.
  CHECK_THAT(
      error_of([] {
        options({"--nnodes=1:4", "--rdzv_backend=etcd", "--rdzv_endpoint=10.0.0.1:2379,10.0.0.2"});
      }),
      Contains("'10.0.0.2' is not host:port"));
  CHECK_THAT(error_of([] {
               options({"--nnodes=1:4", "--rdzv_endpoint=10.0.0.1:2379,10.0.0.2:2379"});
             }),
             Contains("a list of members is for --rdzv_backend=etcd"));
  CHECK_THAT(error_of([] {
               options({"--nnodes=1:4", "--rdzv_backend=etcd"});
             }),
             Contains("--nnodes=1:4 with --rdzv_backend=etcd: give "
                      "--rdzv_endpoint=ip:port[,ip:port...], the etcd members' client addresses"));
  CHECK_THAT(error_of([] {
               options({"--nnodes=1:4", "--rdzv_endpoint=10.0.0.1:2379", "--rdzv_backend=zk"});
             }),
             Contains("--rdzv_backend=zk: expected dpar or etcd"));
  {
    const LaunchPlan etcd_plan = make_plan(
        options({"--nnodes=2:3", "--rdzv_backend=etcd",
                 "--rdzv_endpoint=10.0.0.1:2379, 10.0.0.2:2379,10.0.0.3:2379", "--rdzv_id=j"}),
        {});
    CHECK(etcd_plan.rdzv_backend == "etcd");
    CHECK(etcd_plan.rdzv_endpoint == "10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379");
  }
  CHECK_THAT(error_of([] {
               options({"--nnodes=1:4", "--rdzv_endpoint=10.0.0.1:29400", "--ips=10.0.0.1"});
             }),
             Contains("leave out --ips"));
  CHECK_THAT(error_of([] { options({"--rdzv_endpoint=10.0.0.1:29400"}); }),
             Contains("give --nnodes=MIN:MAX too"));
  {
    const Options elastic =
        options({"--nnodes=2:3", "--rdzv_endpoint=10.0.0.1:29400", "--rdzv_id=job7",
                 "--elastic_timeout=5", "--nproc_per_node=2"});
    CHECK(elastic.elastic());
    CHECK(elastic.min_nodes == 2);
    CHECK(elastic.max_nodes == 3);
    CHECK(elastic.nnodes == 0);
    const LaunchPlan plan = make_plan(elastic, {});
    CHECK(plan.elastic);
    CHECK(plan.min_members == 4);
    CHECK(plan.max_members == 6);
    CHECK(plan.job_id == "job7");
    CHECK(plan.node().procs.size() == 2);
  }
  CHECK_THAT(error_of([] { options({"--nnodes=two"}); }), Contains("expected a number of nodes"));
  CHECK_THAT(error_of([] {
               make_plan(options({"--nnodes=2", "--node_rank=0"}), {});
             }),
             Contains("--nnodes=2 needs the nodes' addresses: give --ips="));
  CHECK_THAT(error_of([] {
               make_plan(options({"--ips=10.0.0.1,10.0.0.2", "--nnodes=3", "--node_rank=0"}), {});
             }),
             Contains("--nnodes=3 but --ips=10.0.0.1,10.0.0.2 lists 2 node(s)"));
  CHECK_THAT(error_of([] {
               options({"--master=1.2.3.4:5", "--master_port=7"});
             }),
             Contains("both give the store's endpoint"));
  CHECK_THAT(error_of([] {
               options({"--standalone", "--ips=10.0.0.1"});
             }),
             Contains("--standalone runs one node on this machine"));
  CHECK_THAT(error_of([] {
               options({"--standalone", "--master_port=7"});
             }),
             Contains("--standalone chooses the store's endpoint itself"));
}

TEST_CASE("launch: --standalone is loopback with a free block of ports", "[launch]") {
  LaunchPlan plan = make_plan(options({"--standalone", "--nproc_per_node=3"}), {});
  CHECK(plan.node().ip == "127.0.0.1");
  CHECK(plan.start_port >= 29500);
  CHECK(plan.master_port == plan.start_port + 3);
  for (int port = plan.start_port; port <= plan.master_port; ++port) {
    CHECK(probe_port("127.0.0.1", port).empty());
  }
  CHECK(make_plan(options({"--standalone", "--start_port=7100"}), {}).start_port == 7100);
}

TEST_CASE("launch: an earlier run's logs move to previous.K instead of being overwritten",
          "[launch]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dpar_logs_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> names{"workerlog.0", "workerlog.1"};
  CHECK(move_earlier_logs(dir.string(), names).empty());  // a fresh folder: nothing to keep
  for (int run = 1; run <= 2; ++run) {
    std::ofstream(dir / "workerlog.0") << "run " << run;
    CHECK(move_earlier_logs(dir.string(), names) ==
          (dir / ("previous." + std::to_string(run))).string());
    CHECK_FALSE(fs::exists(dir / "workerlog.0"));
  }
  std::ifstream first(dir / "previous.1" / "workerlog.0");
  std::string text;
  std::getline(first, text);
  CHECK(text == "run 1");
  CHECK_FALSE(fs::exists(dir / "previous.1" / "workerlog.1"));  // only what existed moves
  fs::remove_all(dir);
}
