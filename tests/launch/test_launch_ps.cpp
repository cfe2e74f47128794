// dpar-launch in parameter-server mode, without starting processes: the ps options, server
// and trainer lists, plans on one and several nodes, the environment of servers and trainers,
// and the job token.
#include <catch2/catch.hpp>
#include <set>

#include "cluster.h"
#include "environment.h"
#include "launch_test_util.h"
#include "plan.h"

using namespace dpar::launch;
using namespace dpar::launch::testing;
using Catch::Matchers::Contains;

TEST_CASE("launch: ps mode options", "[launch][ps]") {
  Options o = options({"--run_mode=ps", "--server_num=2", "--worker_num=3"});
  CHECK(o.ps_mode());
  CHECK(o.server_num == 2);
  CHECK(o.trainer_num == 3);
  CHECK(o.trainer_num_given);
  CHECK_FALSE(o.servers_given);
  CHECK(o.server_stop_timeout == 30.0);
  Options lists = options({"--run-mode=ps", "--servers=127.0.0.1:7000", "--workers=127.0.0.1",
                           "--job-token=abc", "--server-stop-timeout=2.5"});
  CHECK(lists.servers == "127.0.0.1:7000");
  CHECK(lists.trainers == "127.0.0.1");
  CHECK(lists.trainers_given);
  CHECK(lists.job_token == "abc");
  CHECK(lists.server_stop_timeout == 2.5);

  // ps flags need ps mode, whatever their spelling.
  CHECK_THAT(error_of([] { options({"--servers=127.0.0.1:7000"}); }),
             Contains("--servers needs --run_mode=ps"));
  CHECK_THAT(error_of([] { options({"--workers=127.0.0.1"}); }),
             Contains("--trainers needs --run_mode=ps"));
  CHECK_THAT(error_of([] {
               options({"--run_mode=collective", "--server_num=1"});
             }),
             Contains("--server_num needs --run_mode=ps"));
  CHECK_THAT(error_of([] { options({"--trainer_num=1"}); }),
             Contains("--trainer_num needs --run_mode=ps"));
  CHECK_THAT(error_of([] { options({"--job_token=x"}); }),
             Contains("--job_token needs --run_mode=ps"));
  // Collective-mode cluster flags are refused in ps mode, each by name.
  const std::string why =
      "cannot be used with --run_mode=ps: ps mode runs CPU trainers described by "
      "--servers/--trainers or --server_num/--trainer_num";
  for (const std::string flag :
       {"--gpus=0", "--hostfile=h", "--rank_table=r", "--nproc_per_node=2", "--master=1.2.3.4:5"}) {
    const std::string name = flag.substr(0, flag.find('='));
    CHECK_THAT(error_of([&] {
                 options({"--run_mode=ps", "--server_num=1", "--trainer_num=1", flag});
               }),
               Contains(name + " " + why));
  }
  CHECK_THAT(error_of([] {
               options({"--run_mode=ps", "--server_num=0", "--trainer_num=1"});
             }),
             Contains("--server_num=0: ps mode needs at least 1 server"));
  CHECK_THAT(error_of([] {
               options({"--run_mode=ps", "--server_num=1", "--trainer_num=-1"});
             }),
             Contains("--trainer_num=-1: ps mode needs at least 1 trainer"));
  CHECK_THAT(error_of([] {
               options({"--run_mode=ps", "--trainer_num=1"});
             }),
             Contains("needs at least 1 server and 1 trainer: give --servers=ip:port,... or "
                      "--server_num=N"));
  CHECK_THAT(error_of([] {
               options({"--run_mode=ps", "--server_num=1"});
             }),
             Contains("give --trainers=ip,... or --trainer_num=M"));
  CHECK_THAT(error_of([] {
               options({"--run_mode=ps", "--servers=", "--trainer_num=1"});
             }),
             Contains("--servers is empty"));
  CHECK_THAT(
      error_of([] {
        options({"--run_mode=ps", "--ips=10.0.0.1", "--servers=10.0.0.1:1", "--trainers=10.0.0.1"});
      }),
      Contains("--ips is not used with --servers and --trainers"));
  CHECK_THAT(error_of([] {
               options({"--run_mode=ps", "--server_num=1", "--trainer_num=1", "--job_token="});
             }),
             Contains("--job_token is empty"));
  CHECK_THAT(
      error_of([] {
        options({"--run_mode=ps", "--server_num=1", "--trainer_num=1", "--server_stop_timeout=-1"});
      }),
      Contains("expected 0..86400 seconds"));
}

TEST_CASE("launch: ps server and trainer lists", "[launch][ps]") {
  CHECK(parse_server_list("10.0.0.1:6000, 10.0.0.2:06001") ==
        std::vector<std::string>{"10.0.0.1:6000", "10.0.0.2:6001"});
  CHECK_THAT(error_of([] { parse_server_list("127.0.0.1"); }),
             Contains("--servers=127.0.0.1: entry '127.0.0.1': expected ip:port"));
  CHECK_THAT(error_of([] { parse_server_list("127.0.0.1:99999"); }),
             Contains("entry '127.0.0.1:99999': expected ip:port"));
  CHECK_THAT(error_of([] { parse_server_list("node-a:6000"); }),
             Contains("entry 'node-a:6000': expected ip:port (an IPv4 address"));
  CHECK_THAT(error_of([] { parse_server_list("127.0.0.1:1,,127.0.0.1:2"); }),
             Contains("empty entry"));
  CHECK_THAT(error_of([] { parse_server_list("127.0.0.1:6070,127.0.0.2:6070,127.0.0.1:06070"); }),
             Contains("duplicate server endpoint 127.0.0.1:6070 (servers 0 and 2)"));

  CHECK(parse_trainer_list("10.0.0.1,10.0.0.1,10.0.0.2:8000") ==
        std::vector<std::string>{"10.0.0.1", "10.0.0.1", "10.0.0.2"});
  CHECK_THAT(error_of([] { parse_trainer_list("10.0.0.1,x"); }),
             Contains("--trainers=10.0.0.1,x: entry 'x': expected an IPv4 address"));
  CHECK_THAT(error_of([] { parse_trainer_list("10.0.0.1:0"); }),
             Contains("entry '10.0.0.1:0': expected an IPv4 address (or ip:port"));
  CHECK_THAT(error_of([] { parse_trainer_list("10.0.0.1,"); }), Contains("empty entry"));
}

TEST_CASE("launch: ps plan on one node", "[launch][ps]") {
  LaunchPlan plan = make_plan(
      options({"--run_mode=ps", "--server_num=2", "--trainer_num=3", "--start_port=7000"}),
      {"127.0.0.1", "192.0.2.4"});
  CHECK(plan.ps_mode);
  CHECK(plan.servers == std::vector<std::string>{"127.0.0.1:7000", "127.0.0.1:7001"});
  CHECK(plan.trainers_num == 3);
  CHECK(plan.job_id == "dpar-ps-127.0.0.1-7000");
  CHECK(plan.endpoints.empty());
  REQUIRE(plan.cluster.nodes.size() == 1);
  const std::vector<Process>& procs = plan.node().procs;
  REQUIRE(procs.size() == 5);
  // Servers first, then trainers; log files and names by role.
  CHECK(procs[1].role == Role::kServer);
  CHECK(procs[1].role_id == 1);
  CHECK(procs[1].role_local == 1);
  CHECK(procs[1].endpoint == "127.0.0.1:7001");
  CHECK(procs[4].role == Role::kTrainer);
  CHECK(procs[4].role_id == 2);
  CHECK(procs[4].role_local == 2);
  CHECK(procs[4].local_rank == 4);
  CHECK(process_name(procs[1]) == "server 1");
  CHECK(process_name(procs[4]) == "trainer 2");
  CHECK(log_file_name(procs[1]) == "serverlog.1");
  CHECK(log_file_name(procs[2]) == "workerlog.0");
  CHECK(plan.local_count(Role::kServer) == 2);
  CHECK(plan.local_count(Role::kTrainer) == 3);
  CHECK(plan.all_trainers_local());
  CHECK(plan.echo_local_rank() == 2);  // trainer 0

  // Collective processes keep their names and log files.
  Process rank;
  rank.rank = 5;
  rank.local_rank = 1;
  CHECK(process_name(rank) == "rank 5");
  CHECK(log_file_name(rank) == "workerlog.1");

  LaunchPlan named = make_plan(options({"--run_mode=ps", "--ips=10.0.0.5", "--server_num=1",
                                        "--trainer_num=1", "--job_id=ctr", "--host=10.0.0.5"}),
                               {});
  CHECK(named.servers == std::vector<std::string>{"10.0.0.5:6070"});
  CHECK(named.job_id == "ctr");

  CHECK_THAT(error_of([] {
               make_plan(options({"--run_mode=ps", "--ips=10.0.0.1,10.0.0.2", "--server_num=1",
                                  "--trainer_num=1"}),
                         {"10.0.0.1"});
             }),
             Contains("--server_num/--trainer_num run on one node, so expected one IPv4 address"));
  CHECK_THAT(error_of([] {
               make_plan(options({"--run_mode=ps", "--server_num=2", "--trainer_num=1",
                                  "--start_port=65535"}),
                         {"127.0.0.1"});
             }),
             Contains("the 2 servers need ports 65535..65536, past 65535"));
  CHECK_THAT(
      error_of([] {
        make_plan(options({"--run_mode=ps", "--server_num=1", "--trainer_num=1"}), {"192.0.2.4"});
      }),
      Contains("this host is not in --ips=127.0.0.1 (local addresses: 192.0.2.4)"));
}

TEST_CASE("launch: ps plan across nodes", "[launch][ps]") {
  const std::vector<std::string> flags = {"--run_mode=ps",
                                          "--servers=10.0.0.1:6000,10.0.0.2:6000,10.0.0.1:6001",
                                          "--trainers=10.0.0.3,10.0.0.2:7000,10.0.0.3"};
  LaunchPlan plan = make_plan(options(flags), {"127.0.0.1", "10.0.0.2"});
  // Nodes: distinct addresses among the servers, then the trainers, by first appearance.
  REQUIRE(plan.cluster.nodes.size() == 3);
  CHECK(plan.cluster.nodes[0].ip == "10.0.0.1");
  CHECK(plan.cluster.nodes[1].ip == "10.0.0.2");
  CHECK(plan.cluster.nodes[2].ip == "10.0.0.3");
  CHECK(plan.node_rank == 1);
  CHECK(plan.job_id == "dpar-ps-10.0.0.1-6000");
  CHECK(plan.trainers_num == 3);
  const Node& first = plan.cluster.nodes[0];
  REQUIRE(first.procs.size() == 2);
  CHECK(first.procs[1].role_id == 2);
  CHECK(first.procs[1].role_local == 1);
  CHECK(first.procs[1].endpoint == "10.0.0.1:6001");
  const Node& mixed = plan.node();
  REQUIRE(mixed.procs.size() == 2);
  CHECK(mixed.procs[0].role == Role::kServer);
  CHECK(mixed.procs[0].role_id == 1);
  CHECK(mixed.procs[1].role == Role::kTrainer);
  CHECK(mixed.procs[1].role_id == 1);
  CHECK(mixed.procs[1].role_local == 0);
  CHECK(plan.echo_local_rank() == 1);
  CHECK_FALSE(plan.all_trainers_local());
  const Node& last = plan.cluster.nodes[2];
  REQUIRE(last.procs.size() == 2);
  CHECK(last.procs[1].role_id == 2);
  CHECK(last.procs[1].role_local == 1);
  CHECK(log_file_name(last.procs[1]) == "workerlog.1");

  // A servers-only node echoes its first server; --node_rank and --host work as collectively.
  LaunchPlan servers_only = make_plan(options({flags[0], flags[1], flags[2], "--node_rank=0"}), {});
  CHECK(servers_only.local_count(Role::kTrainer) == 0);
  CHECK(servers_only.echo_local_rank() == 0);
  CHECK(make_plan(options({flags[0], flags[1], flags[2], "--host=10.0.0.3"}), {}).node_rank == 2);

  CHECK_THAT(error_of([&] {
               make_plan(options(flags), {"127.0.0.1", "192.0.2.7"});
             }),
             Contains("this host is not in --servers=10.0.0.1:6000,10.0.0.2:6000,10.0.0.1:6001 "
                      "--trainers=10.0.0.3,10.0.0.2:7000,10.0.0.3 (local addresses: "
                      "127.0.0.1, 192.0.2.7)"));

  // Servers from a list, trainers on the --ips node.
  LaunchPlan half = make_plan(options({"--run_mode=ps", "--servers=10.0.0.1:6000",
                                       "--trainer_num=2", "--ips=10.0.0.9", "--node_rank=1"}),
                              {});
  REQUIRE(half.cluster.nodes.size() == 2);
  CHECK(half.node().ip == "10.0.0.9");
  CHECK(half.node().procs.size() == 2);
  CHECK(half.all_trainers_local());

  CHECK_THAT(error_of([] {
               make_plan(
                   options({"--run_mode=ps", "--server_num=2",
                            "--servers=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--trainer_num=1"}),
                   {"127.0.0.1"});
             }),
             Contains("--server_num=2 but --servers=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3 lists 3 "
                      "server(s)"));
  CHECK_THAT(error_of([] {
               make_plan(options({"--run_mode=ps", "--servers=127.0.0.1:1", "--trainer_num=1",
                                  "--trainers=127.0.0.1,127.0.0.1"}),
                         {"127.0.0.1"});
             }),
             Contains("--trainer_num=1 but --trainers=127.0.0.1,127.0.0.1 lists 2 trainer(s)"));
}

TEST_CASE("launch: ps environment", "[launch][ps]") {
  LaunchPlan plan = make_plan(
      options({"--run_mode=ps", "--server_num=2", "--trainer_num=2", "--start_port=7000"}),
      {"127.0.0.1"});
  plan.job_token = "s3cr3t-value";
  const Env base = {{"PATH", "/bin"}, {"RANK", "5"}};
  Env server = worker_environment(plan, plan.node().procs[1], base, 0, 8);
  CHECK(server["PATH"] == "/bin");
  CHECK(server["TRAINING_ROLE"] == "PSERVER");
  CHECK(server["DPAR_RUN_MODE"] == "ps");
  CHECK(server["DPAR_PSERVER_ENDPOINTS"] == "127.0.0.1:7000,127.0.0.1:7001");
  CHECK(server["PADDLE_PSERVERS_IP_PORT_LIST"] == "127.0.0.1:7000,127.0.0.1:7001");
  CHECK(server["DPAR_SERVER_ID"] == "1");
  CHECK(server["DPAR_SERVER_NUM"] == "2");
  CHECK(server["DPAR_TRAINERS_NUM"] == "2");
  CHECK(server["PADDLE_TRAINERS_NUM"] == "2");
  CHECK(server["PADDLE_PORT"] == "7001");
  CHECK(server["DPAR_CURRENT_ENDPOINT"] == "127.0.0.1:7001");
  CHECK(server["PADDLE_CURRENT_ENDPOINT"] == "127.0.0.1:7001");
  CHECK(server["DPAR_JOB_ID"] == "dpar-ps-127.0.0.1-7000");
  CHECK(server["DPAR_JOB_TOKEN"] == "s3cr3t-value");
  CHECK(server["POD_IP"] == "127.0.0.1");
  CHECK(server["DPAR_NODE_RANK"] == "0");
  CHECK(server["DPAR_NNODES"] == "1");
  CHECK(server["DPAR_RESTART_COUNT"] == "0");
  CHECK(server["DPAR_DEVICE"] == "cpu");
  CHECK(server["OMP_NUM_THREADS"] == "1");
  CHECK(server.count("DPAR_TRAINER_ID") == 0);
  CHECK(server.count("PADDLE_TRAINER_ID") == 0);

  Env trainer = worker_environment(plan, plan.node().procs[3], base, 2, 8);
  CHECK(trainer["TRAINING_ROLE"] == "TRAINER");
  CHECK(trainer["DPAR_TRAINER_ID"] == "1");
  CHECK(trainer["PADDLE_TRAINER_ID"] == "1");
  CHECK(trainer["DPAR_SERVER_NUM"] == "2");
  CHECK(trainer["DPAR_TRAINERS_NUM"] == "2");
  CHECK(trainer["DPAR_PSERVER_ENDPOINTS"] == "127.0.0.1:7000,127.0.0.1:7001");
  CHECK(trainer["DPAR_RESTART_COUNT"] == "2");
  CHECK(trainer["OMP_NUM_THREADS"] == "4");  // 8 cpus / 2 local trainers
  CHECK(trainer.count("DPAR_SERVER_ID") == 0);
  CHECK(trainer.count("PADDLE_PORT") == 0);
  CHECK(trainer.count("DPAR_CURRENT_ENDPOINT") == 0);
  // The collective names are not set (inherited ones are left alone).
  for (const Env* env : {&server, &trainer}) {
    for (const char* name :
         {"DPAR_RANK", "DPAR_WORLD_SIZE", "DPAR_MASTER", "DPAR_ENDPOINTS", "WORLD_SIZE",
          "MASTER_ADDR", "MASTER_PORT", "PADDLE_TRAINER_ENDPOINTS"}) {
      CHECK(env->count(name) == 0);
    }
    CHECK(env->at("RANK") == "5");
  }
  CHECK(worker_environment(plan, plan.node().procs[0], {{"OMP_NUM_THREADS", "3"}}, 0,
                           8)["OMP_NUM_THREADS"] == "3");
  CHECK(worker_environment(plan, plan.node().procs[2], {}, 0, 1)["OMP_NUM_THREADS"] == "1");

  const std::string table = format_env_table(trainer, "Parameter-server environment of trainer 1");
  CHECK_THAT(table, Contains("| TRAINING_ROLE "));
  CHECK_THAT(table, Contains("| DPAR_PSERVER_ENDPOINTS "));
  CHECK_THAT(table, Contains("| PADDLE_PSERVERS_IP_PORT_LIST "));
  CHECK_THAT(table, Contains("| DPAR_JOB_TOKEN "));
  CHECK_THAT(table, Contains("| (set) "));
  CHECK_THAT(table, !Contains("s3cr3t"));
  CHECK_THAT(format_env_table(server, "server 1"), Contains("| PADDLE_PORT "));

  // A trainer on the second node of a multi-node job.
  LaunchPlan multi =
      make_plan(options({"--run_mode=ps", "--servers=10.0.0.1:6000,10.0.0.2:6000",
                         "--trainers=10.0.0.2,10.0.0.1,10.0.0.2", "--host=10.0.0.2"}),
                {});
  multi.job_token = "t";
  Env second = worker_environment(multi, multi.node().procs[2], {}, 0, 8);
  CHECK(second["TRAINING_ROLE"] == "TRAINER");
  CHECK(second["DPAR_TRAINER_ID"] == "2");
  CHECK(second["POD_IP"] == "10.0.0.2");
  CHECK(second["DPAR_NODE_RANK"] == "1");
  CHECK(second["DPAR_NNODES"] == "2");
  CHECK(second["DPAR_TRAINERS_NUM"] == "3");
  CHECK(second["OMP_NUM_THREADS"] == "4");  // 2 trainers on this node
  Env remote_server = worker_environment(multi, multi.node().procs[0], {}, 0, 8);
  CHECK(remote_server["DPAR_SERVER_ID"] == "1");
  CHECK(remote_server["PADDLE_PORT"] == "6000");
}

TEST_CASE("launch: ps job token", "[launch][ps]") {
  bool derived = true;
  CHECK(choose_job_token("given", false, "job", &derived) == "given");
  CHECK_FALSE(derived);

  // One node: random, 32 hex characters, different every time.
  const std::string a = choose_job_token("", true, "job", &derived);
  CHECK_FALSE(derived);
  CHECK(a.size() == 32);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  std::set<std::string> seen;
  for (int i = 0; i < 8; ++i) seen.insert(choose_job_token("", true, "job", &derived));
  CHECK(seen.size() == 8);

  // Several nodes without a token: FNV-1a of "dpar-ps-token/<job id>", the same on every node.
  CHECK(choose_job_token("", false, "dpar-ps-10.0.0.1-6000", &derived) == "a14fa8a4bd2b2d00");
  CHECK(derived);
  CHECK(derived_job_token("dpar-ps-10.0.0.1-6000") == "a14fa8a4bd2b2d00");
  CHECK(derived_job_token("dpar-ps-10.0.0.1-6001") != derived_job_token("dpar-ps-10.0.0.1-6000"));
}
