// Parameter-server mode: the shard layout, the environment, and real gRPC servers with
// trainers on threads of this process (loopback). Sync training is checked against one
// process averaging the same gradients itself; async and GEO with one trainer against plain
// local training; then the failure cases (wrong token, servers not up, a trainer that stops).
// Hostile peers and corrupted connections are in test_ps_hostile.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "dpar/core/error.h"
#include "dpar/optim/adamw.h"
#include "dpar/optim/sgd.h"
#include "unit/ps_job.h"

using namespace dpar;
using namespace dpar::test;
using Catch::Matchers::Contains;

namespace {

double max_rel_diff(nn::Module& a, nn::Module& b) {
  double worst = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    auto va = pa[i].to_float_vector(), vb = pb[i].to_float_vector();
    for (size_t j = 0; j < va.size(); ++j) {
      worst = std::max(worst, std::abs(static_cast<double>(va[j]) - vb[j]) /
                                  std::max(1e-6, std::abs(static_cast<double>(vb[j]))));
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("ps layout: whole blocks, balanced, tiling the flat vector", "[ps]") {
  ps::ShardLayout layout({{"w", 20000}, {"b", 100}, {"v", 5000}}, 3, 8192);
  REQUIRE(layout.total() == 25100);
  REQUIRE(layout.num_blocks() == 4);
  int64_t next = 0;
  for (int s = 0; s < 3; ++s) {
    const ps::ElementRange r = layout.shard(s);
    REQUIRE(r.begin == next);
    REQUIRE((r.begin % 8192 == 0 || r.begin == layout.total()));
    next = r.end;
  }
  REQUIRE(next == layout.total());
  // Fewer blocks than servers: some servers get nothing, nobody gets a partial block.
  ps::ShardLayout tiny({{"w", 10}}, 4, 8192);
  int holders = 0;
  for (int s = 0; s < 4; ++s) holders += tiny.shard(s).size() > 0;
  REQUIRE(holders == 1);
  // The same inputs give the same mapping; a difference is named.
  ps::ShardLayout other({{"w", 20000}, {"bias", 100}, {"v", 5000}}, 3, 8192);
  REQUIRE(layout.first_difference(ps::ShardLayout({{"w", 20000}, {"b", 100}, {"v", 5000}}, 3, 8192))
              .empty());
  REQUIRE_THAT(layout.first_difference(other),
               Contains("parameter 1: 'b' (100 elements) vs 'bias'"));
  REQUIRE_THAT(layout.first_difference(ps::ShardLayout({{"w", 20000}}, 2, 8192)),
               Contains("server count 3 vs 2"));
  REQUIRE_THROWS_WITH(ps::ShardLayout({{"w", 1}, {"w", 2}}, 1), Contains("appears twice"));
}

TEST_CASE("ps environment: roles, ids and the server list", "[ps]") {
  std::map<std::string, std::string> env{
      {"TRAINING_ROLE", "PSERVER"},
      {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7000,127.0.0.1:7001"},
      {"PADDLE_TRAINERS_NUM", "2"},
      {"POD_IP", "127.0.0.1"},
      {"PADDLE_PORT", "7001"},
      {"DPAR_JOB_TOKEN", "t"}};
  ps::PsEnv server = ps::parse_ps_env(env);
  REQUIRE(server.role == ps::Role::kServer);
  REQUIRE(server.server_id == 1);
  REQUIRE(server.endpoint() == "127.0.0.1:7001");
  REQUIRE(server.job_token == "t");
  env["PADDLE_PORT"] = "7005";
  REQUIRE_THROWS_WITH(ps::parse_ps_env(env), Contains("'127.0.0.1:7005'") && Contains("is not in"));
  env["TRAINING_ROLE"] = "TRAINER";
  env["DPAR_TRAINER_ID"] = "2";
  REQUIRE_THROWS_WITH(ps::parse_ps_env(env), Contains("DPAR_TRAINER_ID=2 out of range 0..1"));
  env["DPAR_TRAINER_ID"] = "1";
  REQUIRE(ps::parse_ps_env(env).trainer_id == 1);
  env["DPAR_PSERVER_ENDPOINTS"] = "127.0.0.1";
  REQUIRE_THROWS_WITH(ps::parse_ps_env(env), Contains("entry '127.0.0.1' is not ip:port"));
  env.erase("TRAINING_ROLE");
  REQUIRE(ps::parse_ps_env(env).role == ps::Role::kNone);
}

TEST_CASE("ps sync: 2 servers x 2 trainers equal one process averaging the gradients", "[ps]") {
  constexpr int kSteps = 4;
  Job job(2, 2);
  ps::TrainerOptions options;
  options.block_size = 8;  // 47 floats: params straddle blocks and servers
  options.log = quiet;
  std::vector<std::unique_ptr<TwoLayer>> models;
  std::vector<std::unique_ptr<optim::SGD>> opts;
  for (int t = 0; t < 2; ++t) {
    // Different initial values on trainer 1: the servers take trainer 0's.
    models.push_back(std::make_unique<TwoLayer>(t == 0 ? 11 : 99));
    opts.push_back(std::make_unique<optim::SGD>(
        models.back()->parameters(),
        optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true}));
  }
  std::vector<std::string> errors(2);
  std::vector<std::thread> trainers;
  for (int t = 0; t < 2; ++t) {
    trainers.emplace_back([&, t] {
      try {
        ps::ParameterServerTrainer trainer(*models[static_cast<size_t>(t)],
                                           *opts[static_cast<size_t>(t)], job.trainer_env(t, 2),
                                           options);
        for (int step = 0; step < kSteps; ++step) {
          opts[static_cast<size_t>(t)]->set_lr(0.1 / (step + 1));  // a schedule: sent per push
          opts[static_cast<size_t>(t)]->zero_grad();
          backward_on(*models[static_cast<size_t>(t)], batch_input(100 + 2 * step + t, 5));
          trainer.step(5);
        }
        trainer.finish();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (auto& t : trainers) t.join();
  job.join();
  REQUIRE(errors[0].empty());
  REQUIRE(errors[1].empty());
  REQUIRE(job.errors.empty());

  TwoLayer reference(11);
  optim::SGD ref_opt(reference.parameters(),
                     {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  for (int step = 0; step < kSteps; ++step) {
    ref_opt.set_lr(0.1 / (step + 1));
    std::vector<std::vector<float>> sums;
    for (int t = 0; t < 2; ++t) {
      ref_opt.zero_grad();
      backward_on(reference, batch_input(100 + 2 * step + t, 5));
      auto params = reference.parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        auto g = params[i].grad().to_float_vector();
        if (t == 0) sums.push_back(g);
        for (size_t j = 0; t == 1 && j < g.size(); ++j)
          sums[i][j] = 0.5f * sums[i][j] + 0.5f * g[j];
      }
    }
    auto params = reference.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].set_grad(Tensor::from_vector(sums[i], params[i].shape()));
    }
    ref_opt.step();
  }
  CHECK(max_rel_diff(*models[0], reference) <= 1e-5);
  CHECK(max_rel_diff(*models[1], reference) <= 1e-5);
  CHECK(max_rel_diff(*models[0], *models[1]) == 0);  // every trainer holds the servers' values
}

TEST_CASE("ps async and geo with one trainer follow local training", "[ps]") {
  for (ps::Mode mode : {ps::Mode::kAsync, ps::Mode::kGeo}) {
    DYNAMIC_SECTION(ps::mode_name(mode)) {
      Job job(2, 1);
      TwoLayer model(5), local(5);
      optim::AdamW opt(model.parameters(), {.lr = 0.01, .weight_decay = 0.01});
      optim::AdamW local_opt(local.parameters(), {.lr = 0.01, .weight_decay = 0.01});
      ps::TrainerOptions options;
      options.mode = mode;
      options.block_size = 8;
      options.geo_k_steps = 2;
      options.log = quiet;
      {
        ps::ParameterServerTrainer trainer(model, opt, job.trainer_env(0, 1), options);
        for (int step = 0; step < 5; ++step) {  // geo: exchanges after 2 and 4, and at finish
          opt.zero_grad();
          backward_on(model, batch_input(7 + step, 4));
          trainer.step(4);
          local_opt.zero_grad();
          backward_on(local, batch_input(7 + step, 4));
          local_opt.step();
        }
        trainer.finish();
        REQUIRE(trainer.stats().bytes_pushed > 0);
      }
      job.join();
      REQUIRE(job.errors.empty());
      CHECK(max_rel_diff(model, local) <= 1e-5);
    }
  }
}

TEST_CASE("ps: servers refuse calls without this job's token", "[ps]") {
  Job job(1, 1, milliseconds(20000), "right");
  TwoLayer model(1);
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  ps::TrainerOptions options;
  options.log = quiet;
  options.connect_timeout = milliseconds(5000);
  REQUIRE_THROWS_WITH(
      ps::ParameterServerTrainer(model, opt, job.trainer_env(0, 1, "wrong"), options),
      Contains("refuses the call: its job token belongs to another job"));
  REQUIRE_THROWS_WITH(ps::ParameterServerTrainer(model, opt, job.trainer_env(0, 1, ""), options),
                      Contains("refuses the call: it carries no job token"));
}

TEST_CASE("ps: a trainer gives up on servers that never come up, saying so", "[ps]") {
  ps::PsEnv env;
  env.role = ps::Role::kTrainer;
  env.server_endpoints = {"127.0.0.1:" + std::to_string(free_port())};
  env.trainer_id = 0;
  env.num_trainers = 1;
  TwoLayer model(1);
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  std::vector<std::string> lines;
  ps::TrainerOptions options;
  options.connect_timeout = milliseconds(4000);
  options.log = [&](const std::string& l) { lines.push_back(l); };
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(ps::ParameterServerTrainer(model, opt, env, options),
                      Contains("pserver not ready: " + env.server_endpoints[0] +
                               " did not answer within 4 s (--ps-connect-timeout)"));
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(8));
  REQUIRE(!lines.empty());
  REQUIRE_THAT(lines[0],
               Contains("pserver not ready: " + env.server_endpoints[0] + " (retrying, "));
}

TEST_CASE("ps sync: a trainer that stops is named by the servers and the other trainer", "[ps]") {
  Job job(1, 2, milliseconds(1500));
  TwoLayer m0(3), m1(3);
  optim::SGD o0(m0.parameters(), {.lr = 0.1}), o1(m1.parameters(), {.lr = 0.1});
  ps::TrainerOptions options;
  options.log = quiet;
  options.timeout = milliseconds(1500);
  std::string error;
  std::thread t0([&] {
    try {
      ps::ParameterServerTrainer trainer(m0, o0, job.trainer_env(0, 2), options);
      for (int step = 0; step < 3; ++step) {
        o0.zero_grad();
        backward_on(m0, batch_input(1, 2));
        trainer.step(2);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  {
    // Trainer 1 joins, takes one step, then vanishes without finishing.
    ps::ParameterServerTrainer trainer(m1, o1, job.trainer_env(1, 2), options);
    o1.zero_grad();
    backward_on(m1, batch_input(2, 2));
    trainer.step(2);
    t0.join();
  }
  job.join();
  REQUIRE_THAT(error, Contains("step 1 still lacks the gradients of trainer(s) 1"));
  REQUIRE(job.errors.size() == 1);
  REQUIRE_THAT(job.errors[0], Contains("ps server 0") && Contains("trainer(s) 1"));
}

TEST_CASE("ps: servers save their shards and optimizer state, and resume from them", "[ps]") {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("dpar_ps_ckpt_" + std::to_string(getpid()));
  TwoLayer trained(8);
  std::vector<float> saved;
  ps::TrainerOptions options;
  options.block_size = 8;
  options.log = quiet;
  {
    Job job(2, 1);
    optim::SGD opt(trained.parameters(), {.lr = 0.1, .momentum = 0.9});
    ps::ParameterServerTrainer trainer(trained, opt, job.trainer_env(0, 1), options);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      backward_on(trained, batch_input(step, 3));
      trainer.step(3);
    }
    const auto paths = trainer.save(dir, 2);
    REQUIRE(paths.size() == 2);
    REQUIRE_THAT(paths[1], Contains("pserver.1.step3.safetensors"));
    trainer.finish();
  }
  {
    Job job(2, 1);
    TwoLayer fresh(123);  // different values: the servers' checkpoint wins
    optim::SGD opt(fresh.parameters(), {.lr = 0.1, .momentum = 0.9});
    options.resume_dir = dir;
    options.resume_step = 3;
    ps::ParameterServerTrainer trainer(fresh, opt, job.trainer_env(0, 1), options);
    CHECK(max_rel_diff(fresh, trained) == 0);
    REQUIRE(trainer.steps() == 3);
    trainer.finish();
  }
  {
    Job job(2, 1);
    TwoLayer fresh(123);
    optim::SGD opt(fresh.parameters(), {.lr = 0.1, .momentum = 0.9});
    options.resume_step = 7;  // no such checkpoint
    REQUIRE_THROWS_WITH(ps::ParameterServerTrainer(fresh, opt, job.trainer_env(0, 1), options),
                        Contains(".step7.safetensors: no such file"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("ps async: max_staleness holds a trainer back until the others catch up", "[ps]") {
  Job job(1, 2, milliseconds(20000));
  TwoLayer m0(3), m1(3);
  optim::SGD o0(m0.parameters(), {.lr = 0.1}), o1(m1.parameters(), {.lr = 0.1});
  ps::TrainerOptions options;
  options.mode = ps::Mode::kAsync;
  options.max_staleness = 0;
  options.timeout = milliseconds(1500);
  options.log = quiet;
  ps::ParameterServerTrainer t0(m0, o0, job.trainer_env(0, 2), options);
  ps::ParameterServerTrainer t1(m1, o1, job.trainer_env(1, 2), options);
  o0.zero_grad();
  backward_on(m0, batch_input(1, 2));
  // Trainer 1 has pushed nothing: with a bound of 0 this pull must wait for it, and fail.
  REQUIRE_THROWS_WITH(t0.step(2), Contains("trainer(s) 1 lag more than 0 steps behind trainer 0"));
  t0.finish();
  t1.finish();
}

TEST_CASE("ps: a server listens only on the address it was given", "[ps]") {
  Job job(1, 1);
  ps::PsEnv env = job.trainer_env(0, 1);
  // Same port, another loopback address: nothing answers there.
  env.server_endpoints[0].replace(0, std::string("127.0.0.1").size(), "127.0.0.2");
  TwoLayer model(1);
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  ps::TrainerOptions options;
  options.connect_timeout = milliseconds(1500);
  options.log = quiet;
  REQUIRE_THROWS_WITH(ps::ParameterServerTrainer(model, opt, env, options),
                      Contains("pserver not ready: 127.0.0.2:"));
}

TEST_CASE("ps fleet-style API: init_server/run_server and init_worker/worker/stop_worker", "[ps]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto set_role = [&](const char* role) {
    setenv("TRAINING_ROLE", role, 1);
    setenv("DPAR_PSERVER_ENDPOINTS", endpoint.c_str(), 1);
    setenv("DPAR_TRAINERS_NUM", "1", 1);
    setenv("DPAR_SERVER_ID", "0", 1);
    setenv("DPAR_TRAINER_ID", "0", 1);
    setenv("DPAR_JOB_TOKEN", "fleet", 1);
  };
  set_role("PSERVER");
  REQUIRE(ps::is_server());
  ps::init_server(milliseconds(20000));
  std::string server_error;
  std::thread server([&] {
    try {
      ps::run_server();  // returns once the one trainer has stopped
    } catch (const std::exception& e) {
      server_error = e.what();
    }
  });
  set_role("TRAINER");
  REQUIRE(ps::is_worker());
  TwoLayer model(4), local(4);
  optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.5});
  optim::SGD local_opt(local.parameters(), {.lr = 0.05, .momentum = 0.5});
  ps::TrainerOptions options;
  options.log = quiet;
  ps::init_worker(model, opt, options);
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    backward_on(model, batch_input(step, 3));
    ps::worker().step(3);
    local_opt.zero_grad();
    backward_on(local, batch_input(step, 3));
    local_opt.step();
  }
  ps::stop_worker();
  server.join();
  for (const char* name : {"TRAINING_ROLE", "DPAR_PSERVER_ENDPOINTS", "DPAR_TRAINERS_NUM",
                           "DPAR_SERVER_ID", "DPAR_TRAINER_ID", "DPAR_JOB_TOKEN"}) {
    unsetenv(name);
  }
  REQUIRE(server_error.empty());
  REQUIRE_THROWS_WITH(ps::worker(), Contains("call init_worker() first"));
  CHECK(max_rel_diff(model, local) <= 1e-6);
}

TEST_CASE("ps: a trainer going down with an exception fails the job instead of finishing", "[ps]") {
  Job job(1, 2);
  TwoLayer m0(3), m1(3);
  optim::SGD o0(m0.parameters(), {.lr = 0.1}), o1(m1.parameters(), {.lr = 0.1});
  ps::TrainerOptions options;
  options.log = quiet;
  ps::ParameterServerTrainer t0(m0, o0, job.trainer_env(0, 2), options);
  try {
    ps::ParameterServerTrainer t1(m1, o1, job.trainer_env(1, 2), options);
    throw std::runtime_error("loss became nan");  // unwinding destroys t1
  } catch (const std::runtime_error&) {
  }
  o0.zero_grad();
  backward_on(m0, batch_input(1, 2));
  REQUIRE_THROWS_WITH(t0.step(2), Contains("trainer 1 stopped with an error"));
  job.join();
  REQUIRE(job.errors.size() == 1);
  REQUIRE_THAT(job.errors[0], Contains("trainer 1 stopped with an error"));
}

TEST_CASE("ps: servers refuse a trainer whose model or mode differs from trainer 0's", "[ps]") {
  Job job(2, 2);
  TwoLayer m0(3);
  optim::SGD o0(m0.parameters(), {.lr = 0.1});
  ps::TrainerOptions options;
  options.log = quiet;
  options.timeout = milliseconds(5000);
  ps::ParameterServerTrainer t0(m0, o0, job.trainer_env(0, 2), options);

  nn::Linear other(7, 4);  // same first tensor size, other names
  optim::SGD o_other(other.parameters(), {.lr = 0.1});
  REQUIRE_THROWS_WITH(
      ps::ParameterServerTrainer(other, o_other, job.trainer_env(1, 2), options),
      Contains("trainer 1's parameter layout differs from trainer 0's: parameter 0: 'a.weight'"));

  TwoLayer m1(3);
  optim::SGD o1(m1.parameters(), {.lr = 0.1});
  ps::TrainerOptions async = options;
  async.mode = ps::Mode::kAsync;
  REQUIRE_THROWS_WITH(ps::ParameterServerTrainer(m1, o1, job.trainer_env(1, 2), async),
                      Contains("trainer 1 runs with mode async instead of sync"));
  t0.finish();
}
