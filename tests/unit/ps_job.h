#pragma once
// The parameter-server tests' job: real servers on loopback, each on its own thread, and a
// small two-layer model whose parameters straddle blocks and servers (test_ps*.cpp).
#include <functional>
#include <mutex>
#include <thread>

#include "dpar/core/random.h"
#include "dpar/nn/layers.h"
#include "dpar/ps/ps.h"
#include "dpar/tensor/ops.h"
#include "unit/helpers.h"

namespace dpar::test {

using std::chrono::milliseconds;

inline void quiet(const std::string&) {}

// A job of `servers` real servers on loopback, each serving on its own thread.
struct Job {
  std::vector<std::string> endpoints;
  std::vector<std::unique_ptr<ps::Server>> servers;
  std::vector<std::thread> threads;
  std::vector<std::string> errors;
  std::mutex mu;

  Job(int num_servers, int num_trainers, milliseconds timeout = milliseconds(20000),
      const std::string& token = "secret", std::function<void(const std::string&)> log = quiet) {
    // Port 0: each server binds a free port itself and endpoint() names it. Picking ports
    // ahead with free_port() raced with parallel tests (and could return one port twice).
    for (int s = 0; s < num_servers; ++s) {
      servers.push_back(std::make_unique<ps::Server>(
          ps::ServerOptions{"127.0.0.1:0", s, num_servers, num_trainers, token, timeout, log}));
      endpoints.push_back(servers.back()->endpoint());
    }
    for (auto& server : servers) {
      threads.emplace_back([this, srv = server.get()] {
        try {
          srv->run();
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          errors.push_back(e.what());
        }
      });
    }
  }
  ps::PsEnv trainer_env(int id, int num_trainers, const std::string& token = "secret") const {
    ps::PsEnv env;
    env.role = ps::Role::kTrainer;
    env.server_endpoints = endpoints;
    env.trainer_id = id;
    env.num_trainers = num_trainers;
    env.job_token = token;
    return env;
  }
  void join() {
    for (auto& t : threads) t.join();
    threads.clear();
  }
  ~Job() {
    for (auto& s : servers) s->stop();
    join();
  }
};

// Two linear layers' worth of parameters (4*7+4 + 3*4+3 = 47 floats): with a block size of 8
// they straddle blocks and servers.
class TwoLayer : public nn::Module {
 public:
  explicit TwoLayer(uint64_t seed) : Module("TwoLayer") {
    manual_seed(seed);
    a_ = register_module("a", std::make_shared<nn::Linear>(7, 4));
    b_ = register_module("b", std::make_shared<nn::Linear>(4, 3));
  }
  Tensor forward(const Tensor& x) override { return (*b_)(relu((*a_)(x))); }

 private:
  std::shared_ptr<nn::Linear> a_, b_;
};

inline Tensor batch_input(uint64_t seed, int64_t rows) {
  Generator gen(seed);
  std::vector<float> v(static_cast<size_t>(rows * 7));
  for (float& x : v) x = static_cast<float>(gen.uniform() * 2 - 1);
  return Tensor::from_vector(v, {rows, 7});
}

// loss = mean(square(out - target)) for a fixed target derived from the input.
inline void backward_on(nn::Module& m, const Tensor& x) {
  Tensor out = m.forward(x);
  Tensor target = Tensor::full({x.size(0), 3}, 0.25);
  mean(square(sub(out, target))).backward();
}

}  // namespace dpar::test
