// Elastic training (dpar/distributed/elastic.h): the in-memory commit, the rank order of a
// round, a Gloo group's abort, and members (threads of this process) that form rounds on one
// store, hand the state to each other and go on when one leaves. Killed, stopped and joining
// processes are the multi-process drills' (tests/multiproc, mp_elastic_*).
#include <atomic>
#include <chrono>
#include <csignal>
#include <future>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "distributed/elastic_rendezvous.h"
#include "dpar/core/random.h"
#include "dpar/distributed/elastic.h"
#include "dpar/nn/layers.h"
#include "dpar/optim/sgd.h"
#include "dpar/tensor/ops.h"

using namespace dpar;
using namespace dpar::dist;
using namespace std::chrono_literals;

namespace {

// One SGD step of a Linear layer on inputs drawn from `seed`.
void train_step(nn::Linear& model, optim::Optimizer& optimizer, uint64_t seed) {
  Generator g(seed);
  std::vector<float> x(8 * 4);
  for (float& v : x) v = g.normal();
  optimizer.zero_grad();
  Tensor loss = sum(model.forward(Tensor::from_vector(x, {8, 4})));
  loss.backward();
  optimizer.step();
}

std::vector<float> weights(const nn::Module& model) {
  std::vector<float> out;
  for (const auto& [name, t] : model.state_dict()) {
    const Tensor c = t.contiguous();
    out.insert(out.end(), c.data<float>(), c.data<float>() + c.numel());
  }
  return out;
}

ElasticOptions member_options(const std::string& endpoint, int min, int max) {
  ElasticOptions o;
  o.endpoint = endpoint;
  o.job_id = "eltest";
  o.min_members = min;
  o.max_members = max;
  // Every round here closes on its max or expected count; the settle time only guards a slow
  // start (sanitizers) from closing round 0 before the third member arrives.
  o.settle = 5s;
  o.detect_after = 3s;
  o.elastic_timeout = 20s;
  o.group.timeout = 20s;
  o.log = [](const std::string&) {};
  return o;
}

}  // namespace

TEST_CASE("ElasticState restores every item to the last commit", "[elastic]") {
  manual_seed(3);
  nn::Linear model(4, 3);
  optim::SGD optimizer(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  int64_t step = 0;
  Generator rng(11);
  ElasticState state;
  state.add_module("model", model);
  state.add_optimizer("optimizer", optimizer);
  state.add_counter("step", step);
  state.add_generator("rng", rng);
  CHECK_FALSE(state.has_commit());
  CHECK_THROWS_WITH(state.restore(), Catch::Contains("nothing was committed"));

  train_step(model, optimizer, 1);
  step = 1;
  state.commit();
  CHECK(state.version() == 1);
  CHECK(state.committed_bytes() > 0);
  const uint64_t checksum = state.checksum();
  const std::vector<float> committed = weights(model);
  const uint64_t next_draw = Generator(rng).next_u64();

  // One more step, changing weights, momentum, counter, generator and learning rate.
  train_step(model, optimizer, 2);
  step = 2;
  rng.next_u64();
  optimizer.set_lr(0.5);
  state.restore();
  CHECK(weights(model) == committed);
  CHECK(step == 1);
  CHECK(rng.next_u64() == next_draw);
  CHECK(optimizer.lr() == 0.1);

  // The restored run takes step 2 exactly as the first time (momentum came back too).
  nn::Linear twin(4, 3);
  optim::SGD twin_optimizer(twin.parameters(), {.lr = 0.1, .momentum = 0.9});
  twin.load_state_dict(model.state_dict());
  twin_optimizer.load_state_dict(optimizer.state_dict());
  train_step(model, optimizer, 2);
  train_step(twin, twin_optimizer, 2);
  CHECK(weights(model) == weights(twin));

  state.restore();
  state.commit();  // the same state again: the same checksum, one version later
  CHECK(state.checksum() == checksum);
  CHECK(state.version() == 2);
  // State resumed from a checkpoint says how far along it is; commits count on from there.
  state.set_version(40);
  state.commit();
  CHECK(state.version() == 41);
  CHECK_THROWS_WITH(state.set_version(-1), Catch::Contains("must be >= 0"));

  CHECK_THROWS_WITH(state.add_counter("late", step), Catch::Contains("before the first commit"));
}

TEST_CASE("a round ranks the newest state first, then survivors in their old order", "[elastic]") {
  using dist::detail::RoundMember;
  std::vector<RoundMember> members{
      {"new", 5, -1, 0}, {"b", 5, 2, 1}, {"a", 5, 0, 2}, {"stale", 3, 1, 3}, {"newer", 5, -1, 4}};
  dist::detail::order_members(members);
  std::vector<std::string> ids;
  for (const auto& m : members) ids.push_back(m.id);
  CHECK(ids == std::vector<std::string>{"a", "b", "new", "newer", "stale"});
  const RoundMember parsed =
      dist::detail::parse_member(dist::detail::describe_member(members[1]), 7);
  CHECK(parsed.id == "b");
  CHECK(parsed.version == 5);
  CHECK(parsed.previous_rank == 2);
  CHECK(parsed.arrival == 7);
}

TEST_CASE("the batch policy keeps the per-rank batch or the global batch", "[elastic]") {
  StepPlan p = plan_step(BatchPolicy::KeepPerRankBatch, 4, 3, 2);
  CHECK(p.micro_batch == 4);
  CHECK(p.accumulation == 1);
  CHECK(p.global_batch == 8);
  CHECK(p.lr_scale == Approx(2.0 / 3.0));
  p = plan_step(BatchPolicy::KeepGlobalBatch, 4, 3, 2);  // 12 = 2 ranks x 2 micro-batches x 3
  CHECK(p.global_batch == 12);
  CHECK(p.micro_batch * p.accumulation * 2 == 12);
  CHECK(p.micro_batch <= 4);
  CHECK(p.accumulation == 2);
  CHECK(p.lr_scale == 1.0);
  p = plan_step(BatchPolicy::KeepGlobalBatch, 4, 3, 3);
  CHECK(p.micro_batch == 4);
  CHECK(p.accumulation == 1);
  p = plan_step(BatchPolicy::KeepGlobalBatch, 4, 3, 6);  // more ranks than planned: smaller
  CHECK(p.micro_batch == 2);
  CHECK(p.accumulation == 1);
  CHECK_THROWS_WITH(plan_step(BatchPolicy::KeepGlobalBatch, 4, 3, 5),
                    Catch::Contains("global batch of 12 (4 x 3 ranks) cannot be split into equal "
                                    "micro-batches over 5 ranks"));
}

namespace {

// Two Gloo ranks of one job, formed from threads of this process.
std::vector<std::shared_ptr<ProcessGroup>> two_gloo_ranks(const StoreServer& server,
                                                          const std::string& job) {
  std::vector<std::shared_ptr<ProcessGroup>> groups(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto store = std::make_shared<StoreClient>(server.endpoint(), StoreIdentity{job, 2, rank});
      ProcessGroupOptions options;
      options.timeout = 60s;
      groups[static_cast<size_t>(rank)] = make_gloo_group(store, rank, 2, options);
    });
  }
  for (auto& t : threads) t.join();
  return groups;
}

}  // namespace

TEST_CASE("aborting a gloo group fails a collective waiting for a silent rank at once",
          "[elastic]") {
  StoreServer server("127.0.0.1", 0, "aborttest", 2);
  std::vector<std::shared_ptr<ProcessGroup>> groups = two_gloo_ranks(server, "aborttest");
  // Rank 1 never joins this all-reduce; without the abort rank 0 would wait 60 s.
  Tensor x = Tensor::ones({1000});
  auto work = groups[0]->allreduce({x});
  std::this_thread::sleep_for(200ms);
  CHECK_FALSE(work->is_completed());
  const auto start = std::chrono::steady_clock::now();
  groups[0]->abort("rank 1 is gone (test)");
  CHECK_THROWS_WITH(work->wait(), Catch::Contains("rank 1 is gone (test)"));
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  // The group stays failed; the peer's pending work fails too (its connection closed).
  CHECK_THROWS_WITH(groups[0]->barrier(false)->wait(), Catch::Contains("aborted"));
  CHECK_THROWS(groups[1]->allreduce({Tensor::ones({4})}, ReduceOp::Sum, false));
}

// Gloo writes with writev, which raises SIGPIPE on a connection the peer has closed; its default
// action would kill the whole process (here: the test binary) before Gloo reports the broken
// pair. A Gloo group makes the process ignore SIGPIPE, as Python (and so PyTorch) always does.
TEST_CASE("a gloo peer that closes its connections mid-stream is an error, not SIGPIPE",
          "[elastic]") {
  StoreServer server("127.0.0.1", 0, "pipetest", 2);
  std::vector<std::shared_ptr<ProcessGroup>> groups = two_gloo_ranks(server, "pipetest");
  struct sigaction current {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &current) == 0);
  CHECK(current.sa_handler == SIG_IGN);
  groups[1]->abort("rank 1 closes its connections (test)");
  // 64 MB: far more than the socket buffers hold, so writes meet the peer's reset.
  CHECK_THROWS(groups[0]->allreduce({Tensor::ones({16 << 20})}, ReduceOp::Sum, false));
}

TEST_CASE("elastic members hand the state over and go on with two after one leaves", "[elastic]") {
  StoreServer server("127.0.0.1", 0, "eltest", 0);  // world size 0: an elastic job's store
  constexpr int kSteps = 6;
  constexpr int kLeaveAfter = 3;
  struct Result {
    std::vector<float> weights;
    uint64_t checksum = 0;
    std::vector<std::string> history;
    int64_t step = 0;
  };
  auto member = [&](int index) {
    manual_seed(100 + static_cast<uint64_t>(index));  // different initial weights: sync fixes it
    nn::Linear model(4, 3);
    optim::SGD optimizer(model.parameters(), {.lr = 0.05, .momentum = 0.9});
    int64_t step = 0;
    ElasticState state;
    state.add_module("model", model);
    state.add_optimizer("optimizer", optimizer);
    state.add_counter("step", step);
    ElasticJob job(member_options(server.endpoint(), 2, 3));
    job.run(state, [&](Group& group) {
      while (step < kSteps) {
        Generator g(static_cast<uint64_t>(step * 10 + group.rank()));
        std::vector<float> x(8 * 4);
        for (float& v : x) v = g.normal();
        optimizer.zero_grad();
        sum(model.forward(Tensor::from_vector(x, {8, 4}))).backward();
        std::vector<Tensor> grads;
        for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
        group.allreduce(grads, ReduceOp::Avg, false);
        optimizer.step();
        ++step;
        job.commit();
        if (step == kLeaveAfter && group.size() == 3 && group.rank() == 2) job.leave();
      }
    });
    state.commit();
    return Result{weights(model), state.checksum(), job.history(), step};
  };
  std::vector<std::future<Result>> futures;
  for (int i = 0; i < 3; ++i) futures.push_back(std::async(std::launch::async, member, i));
  std::vector<Result> results;
  for (auto& f : futures) results.push_back(f.get());

  int leavers = 0;
  std::vector<const Result*> survivors;
  for (const Result& r : results) {
    if (r.step == kLeaveAfter) {
      ++leavers;
      CHECK(r.history.size() == 1);
    } else {
      survivors.push_back(&r);
    }
  }
  REQUIRE(leavers == 1);
  REQUIRE(survivors.size() == 2);
  for (const Result* r : survivors) {
    CHECK(r->step == kSteps);
    REQUIRE(r->history.size() == 2);
    CHECK_THAT(r->history[0], Catch::Contains("of 3 (start)"));
    CHECK_THAT(r->history[1], Catch::Contains("of 2 (leave: rank 2 left)"));
  }
  CHECK(survivors[0]->weights == survivors[1]->weights);
  CHECK(survivors[0]->checksum == survivors[1]->checksum);
}

TEST_CASE("an elastic round below its minimum gives up after the elastic timeout", "[elastic]") {
  StoreServer server("127.0.0.1", 0, "eltest", 0);
  ElasticOptions options = member_options(server.endpoint(), 2, 3);
  options.elastic_timeout = 500ms;
  int64_t step = 0;
  ElasticState state;
  state.add_counter("step", step);
  ElasticJob job(options);
  CHECK_THROWS_WITH(job.run(state, [](Group&) {}),
                    Catch::Contains("round 0 has 1 of the 2 members it needs") &&
                        Catch::Contains("DPAR_ELASTIC_TIMEOUT"));
}

TEST_CASE("elastic members that lose the rendezvous store give up with one line", "[elastic]") {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0, "eltest", 0);
  const std::string endpoint = server->endpoint();
  ElasticOptions options = member_options(endpoint, 2, 2);
  options.detect_after = 1s;
  std::atomic<int> steps{0};
  auto member = [&] {
    int64_t step = 0;
    ElasticState state;
    state.add_counter("step", step);
    ElasticJob job(options);
    try {
      job.run(state, [&](Group& group) {
        for (;;) {  // the collectives need no store: only the watcher notices it is gone
          group.allreduce({Tensor::ones({4})}, ReduceOp::Sum, false);
          ++step;
          ++steps;
          job.commit();
          std::this_thread::sleep_for(20ms);
        }
      });
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("run() returned");
  };
  auto a = std::async(std::launch::async, member);
  auto b = std::async(std::launch::async, member);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (steps < 10 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  REQUIRE(steps >= 10);
  server->shutdown();
  const auto start = std::chrono::steady_clock::now();
  for (auto* f : {&a, &b}) {
    // The first to notice says it lost the store; the other may meet the loss as it forms the
    // next round, after its collective failed.
    CHECK_THAT(f->get(), Catch::StartsWith("elastic: ") &&
                             Catch::Contains("rendezvous store at " + endpoint));
  }
  CHECK(std::chrono::steady_clock::now() - start < 15s);
}
