// Parameter servers against hostile and broken peers: garbage, slowloris and foreign tokens
// while a real job runs (it must end bitwise equal to an unattacked one), and a proxy that
// corrupts one byte of one trainer's connection (the job must fail, naming trainer and call).
#include <catch2/catch.hpp>
#include <functional>
#include <mutex>
#include <thread>

#include "dpar/core/error.h"
#include "dpar/core/sysinfo.h"
#include "dpar/optim/sgd.h"
#include "unit/flipping_proxy.h"
#include "unit/hostile_peer.h"
#include "unit/ps_job.h"

using namespace dpar;
using namespace dpar::test;
using Catch::Matchers::Contains;

namespace {

// Trainer 0's parameters after a 2 servers x 2 trainers sync job of `steps` steps.
std::vector<std::vector<float>> train_sync_job(Job& job, int steps) {
  ps::TrainerOptions options;
  options.block_size = 8;
  options.log = quiet;
  std::vector<std::unique_ptr<TwoLayer>> models;
  std::vector<std::unique_ptr<optim::SGD>> opts;
  for (int t = 0; t < 2; ++t) {
    models.push_back(std::make_unique<TwoLayer>(11));
    opts.push_back(std::make_unique<optim::SGD>(models.back()->parameters(),
                                                optim::SGDOptions{.lr = 0.1, .momentum = 0.9}));
  }
  std::vector<std::string> errors(2);
  std::vector<std::thread> trainers;
  for (int t = 0; t < 2; ++t) {
    trainers.emplace_back([&, t] {
      try {
        auto& model = *models[static_cast<size_t>(t)];
        auto& opt = *opts[static_cast<size_t>(t)];
        ps::ParameterServerTrainer trainer(model, opt, job.trainer_env(t, 2), options);
        for (int step = 0; step < steps; ++step) {
          opt.zero_grad();
          backward_on(model, batch_input(300 + 2 * step + t, 5));
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
  std::vector<std::vector<float>> weights;
  for (const Tensor& p : models[0]->parameters()) weights.push_back(p.to_float_vector());
  return weights;
}

int port_of(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

}  // namespace

TEST_CASE("ps: hostile peers cannot crash, stall or bloat a server", "[ps][hostile]") {
  constexpr int kSteps = 30;
  std::vector<std::vector<float>> clean;
  {
    Job job(2, 2);
    clean = train_sync_job(job, kSteps);
  }
  std::mutex log_mu;
  std::vector<std::string> refusals;
  Job job(2, 2, milliseconds(20000), "secret", [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(log_mu);
    if (line.find("refused") != std::string::npos) refusals.push_back(line);
  });
  const std::vector<int> ports{port_of(job.endpoints[0]), port_of(job.endpoints[1])};
  const double before_mb = sysinfo::current_rss_mb();
  std::vector<std::vector<float>> attacked;
  {
    // 200 slowloris connections per server, and garbage, a 4 GiB push header and a trainer with
    // another job's token, in a loop for the whole job.
    // Built before the attack starts: TwoLayer seeds the default generator, which the job's
    // own models draw from.
    TwoLayer intruder(5);
    optim::SGD intruder_opt(intruder.parameters(), {.lr = 0.1});
    test::Attack attack(ports, 200, [&] {
      for (int port : ports) {
        test::send_garbage(port);
        test::RawConnection(port).send(
            test::grpc_call_claiming("/dpar.rpc.ps.ParameterServer/Push", 0xffffffffu));
      }
      ps::TrainerOptions o;
      o.log = quiet;
      o.timeout = milliseconds(2000);
      o.connect_timeout = milliseconds(2000);  // once the job ends, its servers are gone
      try {
        ps::ParameterServerTrainer t(intruder, intruder_opt, job.trainer_env(1, 2, "stolen"), o);
      } catch (const Error&) {
      }
    });
    attacked = train_sync_job(job, kSteps);
  }
  REQUIRE(attacked == clean);  // bitwise: the attack changed nothing the job computed
  std::lock_guard<std::mutex> lock(log_mu);
  REQUIRE(refusals.size() == 2);  // one line per server, naming the one intruding host
  for (const auto& line : refusals) {
    // The first refused call names the reason: no token (the raw HTTP/2 push) or another
    // job's (the intruding trainer), whichever arrived first.
    REQUIRE_THAT(line, Contains("refused a call from 127.0.0.1:") && Contains("job token"));
  }
  if (test::kMeasureMemory) {
    const double grown = sysinfo::current_rss_mb() - before_mb;
    INFO("resident set grew by " << grown << " MiB under attack");
    REQUIRE(grown <= test::kMaxGrowthMb);
  }
}

namespace {

struct CorruptedJob {
  std::vector<std::string> trainer_errors{"", ""};
  std::vector<int> steps_done{0, 0};
  std::vector<std::string> server_errors;
  double seconds = 0;
  bool flipped = false;
};

// A sync job of 1 server and 2 trainers, 20 steps, in which trainer 1 reaches the server through
// a proxy that corrupts one byte as `plan` says.
CorruptedJob run_corrupted_job(test::FlippingProxy::Plan plan) {
  const milliseconds timeout(5000);
  Job job(1, 2, timeout);
  test::FlippingProxy proxy(port_of(job.endpoints[0]), plan);
  CorruptedJob out;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> trainers;
  for (int t = 0; t < 2; ++t) {
    trainers.emplace_back([&, t] {
      try {
        TwoLayer model(11);
        optim::SGD opt(model.parameters(), {.lr = 0.1});
        ps::PsEnv env = job.trainer_env(t, 2);
        if (t == 1) env.server_endpoints = {"127.0.0.1:" + std::to_string(proxy.port())};
        ps::TrainerOptions options;
        options.log = quiet;
        options.timeout = timeout;
        ps::ParameterServerTrainer trainer(model, opt, env, options);
        for (int step = 0; step < 20; ++step) {
          opt.zero_grad();
          backward_on(model, batch_input(300 + 2 * step + t, 5));
          trainer.step(5);
          out.steps_done[static_cast<size_t>(t)] = step + 1;
        }
        trainer.finish();
      } catch (const std::exception& e) {
        out.trainer_errors[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (auto& t : trainers) t.join();
  job.join();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.server_errors = job.errors;
  out.flipped = proxy.flipped();
  return out;
}

// Whatever was corrupted, the job stops within its timeout, trainer 1's error names it and the
// call, and no trainer trains on: nobody finishes 20 steps on weights from a corrupted step.
void expect_failed_cleanly(const CorruptedJob& job, const std::string& call) {
  INFO("trainer 0: " << job.trainer_errors[0]);
  INFO("trainer 1: " << job.trainer_errors[1]);
  REQUIRE(job.flipped);
  CHECK(job.seconds < 15 * test::kSlowdown);  // the 5 s timeout, with room for a loaded machine
  CHECK_THAT(job.trainer_errors[1], Contains("ps trainer 1, " + call));
  CHECK_FALSE(job.trainer_errors[0].empty());
  CHECK(job.steps_done[0] < 20);
  CHECK(job.steps_done[1] < 20);
  REQUIRE(job.server_errors.size() == 1);
  CHECK_THAT(job.server_errors[0], Contains("trainer 1"));
}

}  // namespace

TEST_CASE("ps: bytes corrupted on one trainer's connection fail the job, naming trainer and call",
          "[ps][hostile]") {
  using Proxy = test::FlippingProxy;
  SECTION("a gradient byte on its way to the server: the server's CRC-32C check refuses it") {
    const CorruptedJob job =
        run_corrupted_job({Proxy::Direction::kToServer, Proxy::Spot::kPayload, 3, 180});
    expect_failed_cleanly(job, "push");
    CHECK_THAT(job.trainer_errors[1],
               Contains("ps server 0 (127.0.0.1:") && Contains("push from trainer 1 (step 2)") &&
                   Contains("failed its CRC-32C check") && Contains("corrupted in transit"));
  }
  SECTION("a parameter byte on its way to the trainer: the trainer's check refuses it") {
    const CorruptedJob job =
        run_corrupted_job({Proxy::Direction::kToClient, Proxy::Spot::kPayload, 3, 180});
    expect_failed_cleanly(job, "pull");
    CHECK_THAT(job.trainer_errors[1], Contains("a pulled chunk at offset 0") &&
                                          Contains("failed its CRC-32C check") &&
                                          Contains("the parameters were not updated from it"));
  }
  SECTION("the framing of a push: gRPC's HTTP/2 layer refuses the connection") {
    const CorruptedJob job =
        run_corrupted_job({Proxy::Direction::kToServer, Proxy::Spot::kFrameHeader, 3, 180});
    expect_failed_cleanly(job, "push");
    // The frame went to a stream that does not exist; the push's own stream ended empty.
    CHECK_THAT(job.trainer_errors[1], Contains("push from trainer 1 carried no chunk"));
  }
}
