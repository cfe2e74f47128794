// Sharded DataParallel's API and failure paths with 2 ranks as threads (the equality with
// unsharded training on MobileNetV3-small is tests/multiproc/shard_worker.cpp's), plus
// clip_grad_norm and the optimizer hooks sharding relies on.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/optimizer_shards.h"
#include "dpar/nn/layers.h"
#include "dpar/optim/adamw.h"
#include "dpar/optim/clip_grad.h"
#include "dpar/optim/grad_scaler.h"
#include "dpar/optim/sgd.h"
#include "dpar/tensor/ops.h"
#include "unit/helpers.h"
#include "unit/two_ranks.h"

using namespace dpar;
using namespace dpar::dist;
using Catch::Matchers::Contains;
using dpar::test::run_two_ranks;

namespace {

// Initialised from its own generator: ranks are threads here, and the process-wide one is
// shared between them.
std::shared_ptr<nn::Sequential> small_net() {
  Generator gen(3);
  auto first = std::make_shared<nn::Linear>(6, 40), second = std::make_shared<nn::Linear>(40, 3);
  first->reset_parameters(gen);
  second->reset_parameters(gen);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(first);
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(second);
  return net;
}

DataParallelOptions sharded(std::shared_ptr<Group> group, ShardMode mode) {
  DataParallelOptions o;
  o.group = std::move(group);
  o.shard = mode;
  o.last_comm_buffer_size = 0.0005;  // a few buckets
  o.comm_buffer_size = 0.0005;
  return o;
}

Tensor loss_on(DataParallel& dp, int rank, uint64_t salt) {
  Generator gen(10 * salt + static_cast<uint64_t>(rank));
  Tensor x = Tensor::empty({4, 6});
  float* d = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) d[i] = gen.normal();
  return sum(mul(dp.forward(x), dp.forward(x)));
}

}  // namespace

TEST_CASE("parse_shard_mode and shard_mode_name", "[sharding]") {
  CHECK(parse_shard_mode("none") == ShardMode::none);
  CHECK(parse_shard_mode("optimizer") == ShardMode::optimizer);
  CHECK(parse_shard_mode("os") == ShardMode::optimizer);
  CHECK(parse_shard_mode("gradients") == ShardMode::gradients);
  CHECK(parse_shard_mode("os_g") == ShardMode::gradients);
  CHECK(std::string(shard_mode_name(ShardMode::gradients)) == "gradients");
  CHECK_THAT(error_of([] { parse_shard_mode("params"); }),
             Contains("shard mode 'params' is not one of none, optimizer (os), gradients (os_g)"));
}

TEST_CASE("sharded: the optimizer holds this rank's slices, which together make the model",
          "[sharding]") {
  for (ShardMode mode : {ShardMode::optimizer, ShardMode::gradients}) {
    DYNAMIC_SECTION(shard_mode_name(mode)) {
      auto results = run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
        auto net = small_net();
        DataParallel dp(net, sharded(group, mode));
        auto opt = dp.make_optimizer<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2});
        int64_t slice_elements = 0;
        for (const Tensor& s : dp.optimizer_parameters()) slice_elements += s.numel();
        for (int step = 0; step < 3; ++step) {
          opt->zero_grad();
          loss_on(dp, rank, static_cast<uint64_t>(step)).backward();
          // After backward: with gradients the model's .grad are released; the slices'
          // gradients are what the optimizer reads.
          for (const Tensor& p : dp.parameters()) {
            if (mode == ShardMode::gradients && p.grad().defined()) {
              DPAR_FAIL("a parameter kept a gradient under shard = gradients");
            }
          }
          for (const Tensor& s : opt->params()) {
            if (!s.grad().defined()) DPAR_FAIL("a slice has no gradient after backward");
          }
          opt->step();
        }
        std::vector<float> weights;
        for (const Tensor& p : dp.parameters()) {
          const auto v = p.to_float_vector();
          weights.insert(weights.end(), v.begin(), v.end());
        }
        return std::pair{slice_elements, weights};
      });
      CHECK(results[0].first + results[1].first == small_net()->num_parameters());
      CHECK(results[0].first > 0);
      CHECK(results[1].first > 0);
      CHECK(results[0].second == results[1].second);  // gathered: the same model everywhere
    }
  }
}

TEST_CASE("sharded: an optimizer that is not attached, or holds whole parameters, is an error",
          "[sharding]") {
  auto errors = run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
    auto net = small_net();
    DataParallel dp(net, sharded(group, ShardMode::optimizer));
    std::string wrong_params = error_of([&] {
      dp.attach_optimizer(
          std::make_shared<optim::SGD>(dp.parameters(), optim::SGDOptions{.lr = 0.1}));
    });
    // Built from the slices but never attached: the step cannot gather.
    optim::SGD loose(dp.optimizer_parameters(), {.lr = 0.1});
    loss_on(dp, rank, 1).backward();
    loose.step();
    std::string unattached = error_of([&] { loss_on(dp, rank, 2); });
    return std::pair{wrong_params, unattached};
  });
  for (const auto& [wrong_params, unattached] : errors) {
    CHECK_THAT(wrong_params, Contains("DataParallel(shard = optimizer): the SGD optimizer must be "
                                      "built from dp.optimizer_parameters()"));
    CHECK_THAT(unattached, Contains("no optimizer is attached"));
  }
}

TEST_CASE("sharded: GradScaler skips on every rank when one rank's slice holds an inf",
          "[sharding]") {
  auto stepped = run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
    auto net = small_net();
    DataParallel dp(net, sharded(group, ShardMode::gradients));
    auto opt = dp.make_optimizer<optim::SGD>(optim::SGDOptions{.lr = 0.1});
    amp::GradScaler scaler({.init_scale = 1024.0});
    std::vector<bool> out;
    for (int step = 0; step < 3; ++step) {
      opt->zero_grad();
      scaler.scale(loss_on(dp, rank, static_cast<uint64_t>(step))).backward();
      if (step == 1 && rank == 1) {
        // Only rank 1's slice sees it: rank 0 must still skip.
        Tensor g = opt->params().back().grad();
        g.data<float>()[0] = INFINITY;
      }
      out.push_back(scaler.step(*opt));
      scaler.update();
    }
    return out;
  });
  CHECK(stepped[0] == std::vector<bool>{true, false, true});
  CHECK(stepped[1] == stepped[0]);
}

TEST_CASE("clip_grad_norm: the norm of all gradients, clipped as torch does", "[sharding]") {
  Tensor a = Tensor::from_vector(std::vector<float>{3, 0}, {2});
  Tensor b = Tensor::from_vector(std::vector<float>{0, 4, 0}, {3});
  Tensor c = Tensor::zeros({2});  // no gradient: skipped
  a.set_grad(Tensor::from_vector(std::vector<float>{3, 0}, {2}));
  b.set_grad(Tensor::from_vector(std::vector<float>{0, 4, 0}, {3}));
  CHECK(optim::clip_grad_norm({a, b, c}, 10.0) == Approx(5.0));
  CHECK(a.grad().to_float_vector() == std::vector<float>{3, 0});  // under max_norm: unchanged
  CHECK(optim::clip_grad_norm({a, b, c}, 1.0) == Approx(5.0));
  CHECK(a.grad().to_float_vector()[0] == Approx(3.0 / (5.0 + 1e-6)));
  CHECK(b.grad().to_float_vector()[1] == Approx(4.0 / (5.0 + 1e-6)));
  CHECK_THAT(error_of([&] { optim::clip_grad_norm({a}, 0.0); }),
             Contains("max_norm must be > 0, got 0"));
}

TEST_CASE("Optimizer: step hooks, replace_parameters only without state", "[sharding]") {
  Tensor p = Tensor::zeros({3});
  p.set_grad(Tensor::ones({3}));
  optim::SGD opt({p}, {.lr = 0.5});
  int calls = 0;
  const int handle = opt.add_step_hook([&] { ++calls; });
  Tensor q = Tensor::zeros({2});
  opt.replace_parameters({q});  // no state yet
  CHECK(opt.params()[0].is_same(q));
  opt.replace_parameters({p});
  opt.step();
  CHECK(calls == 1);
  opt.remove_step_hook(handle);
  opt.step();
  CHECK(calls == 1);
  optim::SGD with_state({p}, {.lr = 0.5, .momentum = 0.9});
  with_state.step();
  CHECK(with_state.has_state());
  CHECK_THAT(error_of([&] { with_state.replace_parameters({q}); }), Contains("already has state"));
  CHECK(with_state.state_bytes() == 3 * sizeof(float));
}

TEST_CASE("optimizer shard sets: round trip, re-cut to another layout, and every failure named",
          "[sharding]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dpar_shards_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto net = small_net();
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    sum(mul(net->forward(Tensor::ones({2, 6})), 0.5)).backward();
    opt.step();
  }
  const OptimizerLayout whole = whole_parameter_layout(net->named_parameters());
  const std::string set = (dir / "set").string();
  save_optimizer_shards(set, whole, opt, nullptr);
  CHECK(fs::exists(set + "/index.json"));
  CHECK_FALSE(fs::exists(set + ".tmp"));

  auto same = [](const optim::StateDict& a, const optim::StateDict& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].first != b[i].first ||
          a[i].second.to_float_vector() != b[i].second.to_float_vector()) {
        return false;
      }
    }
    return true;
  };
  CHECK(same(read_optimizer_shards(set, whole, "SGD"), opt.state_dict()));

  // Another layout: parameter 0 (40 x 6 weights) cut in two tensors of 100 and 140 elements,
  // the other parameters whole; the pieces come back exactly.
  OptimizerLayout cut = whole;
  cut.tensors[0] = {{0, 0, 100, 0}};
  cut.tensor_shapes[0] = {100};
  cut.tensor_strides[0] = {1};
  cut.tensors.push_back({{0, 100, 240, 0}});
  cut.tensor_shapes.push_back({140});
  cut.tensor_strides.push_back({1});
  const optim::StateDict sliced = read_optimizer_shards(set, cut, "SGD");
  const auto momentum0 = opt.state_dict()[0].second.to_float_vector();
  std::vector<float> joined = sliced[0].second.to_float_vector();
  for (const auto& [key, t] : sliced) {
    if (key == "momentum_buffer." + std::to_string(cut.tensors.size() - 1)) {
      const auto rest = t.to_float_vector();
      joined.insert(joined.end(), rest.begin(), rest.end());
    }
  }
  CHECK(joined == momentum0);
  // The same re-cut from the unsharded state dict, without files.
  CHECK(same(slice_optimizer_state(opt.state_dict(), whole, cut), sliced));

  CHECK_THAT(error_of([&] { read_optimizer_shards(set, whole, "AdamW"); }),
             Contains("hold SGD state; this optimizer is AdamW"));
  auto other = std::make_shared<nn::Linear>(6, 41);
  OptimizerLayout wrong = whole_parameter_layout({{"0.weight", other->weight}});
  CHECK_THAT(error_of([&] { read_optimizer_shards(set, wrong, "SGD"); }),
             Contains("parameter '0.weight' has shape [40,6] there and [41,6] here"));
  OptimizerLayout unknown = whole_parameter_layout({{"head.weight", other->weight}});
  CHECK_THAT(error_of([&] { read_optimizer_shards(set, unknown, "SGD"); }),
             Contains("holds no state for parameter 'head.weight'"));

  // A flipped byte in a piece fails its CRC, naming file and tensor.
  const std::string file = set + "/rank-0-of-1.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-3, std::ios::end);
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  CHECK_THAT(error_of([&] { read_optimizer_shards(set, whole, "SGD"); }),
             Contains("fails its CRC-32C check (corrupted)"));

  // A set whose writing never finished: only <set>.tmp exists.
  fs::rename(set, set + ".tmp");
  CHECK_THAT(error_of([&] { read_optimizer_shards(set, whole, "SGD"); }),
             Contains("the set was never completed"));
  fs::remove_all(set + ".tmp");
  CHECK_THAT(error_of([&] { read_optimizer_shards(set, whole, "SGD"); }),
             Contains("missing (not a shard set, or removed)"));
  fs::remove_all(dir);
}

TEST_CASE(
    "sharded: zeroing through the model or the optimizer, and two synchronised backwards "
    "per step, train as unsharded does",
    "[sharding]") {
  // zero: 0 = opt->zero_grad(), 1 = dp.zero_grad(), 2 = the inner module's zero_grad().
  // twice: every other step runs two synchronised backwards (their gradients add up).
  auto run = [](ShardMode mode, int zero, bool twice) {
    return run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
      auto net = small_net();
      DataParallel dp(net, sharded(group, mode));
      auto opt = dp.make_optimizer<optim::SGD>(optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
      for (int step = 0; step < 4; ++step) {
        if (zero == 0) opt->zero_grad();
        if (zero == 1) dp.zero_grad();
        if (zero == 2) net->zero_grad();
        loss_on(dp, rank, static_cast<uint64_t>(2 * step)).backward();
        if (twice && step % 2 == 1) {
          loss_on(dp, rank, static_cast<uint64_t>(2 * step + 1)).backward();
        }
        opt->step();
      }
      std::vector<float> weights;
      for (const Tensor& p : net->parameters()) {
        const auto v = p.to_float_vector();
        weights.insert(weights.end(), v.begin(), v.end());
      }
      return weights;
    });
  };
  const auto reference = run(ShardMode::none, 0, false);
  const auto accumulated = run(ShardMode::none, 0, true);
  CHECK(reference[0] == reference[1]);
  for (ShardMode mode : {ShardMode::optimizer, ShardMode::gradients}) {
    for (int zero : {0, 1, 2}) {
      INFO(shard_mode_name(mode) << ", zeroing " << zero);
      const auto got = run(mode, zero, false);
      CHECK(got[0] == reference[0]);  // bitwise
      CHECK(got[1] == reference[0]);
    }
    // Unsharded adds the second backward's local gradients to the first's average before the
    // all-reduce; sharded adds the two averages: equal up to rounding.
    const auto got = run(mode, 0, true);
    CHECK(got[0] == got[1]);
    double worst = 0;
    for (size_t i = 0; i < got[0].size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(got[0][i] - accumulated[0][i])));
    }
    INFO(shard_mode_name(mode) << ": largest difference " << worst);
    CHECK(worst <= 1e-6);
    CHECK(got[0] != reference[0]);  // the second backward counted
  }
}

TEST_CASE("Storage: a pending write is finished at the first access to its memory, once",
          "[sharding]") {
  Tensor t = Tensor::zeros({4});
  // Another tensor on the same storage (elements 1 and 2), and the writer's own view through
  // an alias, which is never gated (the collective writing the memory must not wait for itself).
  Tensor view = Tensor::from_storage(t.storage(), 1, {2}, {1}, DType::f32);
  Tensor writer = Tensor::from_storage(Storage::alias(t.storage()), 0, {4}, {1}, DType::f32);
  int runs = 0;
  t.storage()->set_pending_write([&] {
    writer.data<float>()[2] = 7;
    ++runs;
  });
  CHECK(t.storage()->has_pending_write());
  CHECK_FALSE(writer.storage()->has_pending_write());
  CHECK(view.data<float>()[1] == 7);  // written before the address was handed out
  CHECK(runs == 1);
  CHECK_FALSE(t.storage()->has_pending_write());
  CHECK(t.data<float>()[2] == 7);
  CHECK(runs == 1);

  // A failed write is reported once, by the access that waited for it; the gate then opens.
  t.storage()->set_pending_write([] { DPAR_FAIL("the all-gather failed"); });
  CHECK_THAT(error_of([&] { (void)t.data<float>(); }), Contains("the all-gather failed"));
  CHECK_NOTHROW(t.data<float>());

  // A second write set while the first is pending finishes the first.
  std::vector<int> order;
  t.storage()->set_pending_write([&] { order.push_back(1); });
  t.storage()->set_pending_write([&] { order.push_back(2); });
  CHECK(order == std::vector<int>{1});
  (void)t.data<float>();
  CHECK(order == std::vector<int>{1, 2});

  // Readers on several threads: the one that comes first runs it, the others wait for it.
  std::atomic<int> finished{0};
  t.storage()->set_pending_write([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    writer.data<float>()[0] = 5;
    ++finished;
  });
  std::vector<std::thread> readers;
  std::atomic<int> saw_written{0};
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] { saw_written += t.data<float>()[0] == 5; });
  }
  for (auto& r : readers) r.join();
  CHECK(finished == 1);
  CHECK(saw_written == 4);
}

TEST_CASE(
    "sharded: the all-gather after a step overlaps the next forward, each bucket waited "
    "for at the first use of one of its parameters",
    "[sharding]") {
  struct Seen {
    size_t buckets = 0, gated_after_step = 0;
    bool early_open = false, late_still_gated = false, all_open_after_forward = false;
    double waited = -1;  // gather_wait_seconds of the last backward
    std::vector<float> weights;
  };
  auto run = [](bool overlap) {
    return run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
      auto net = small_net();
      DataParallelOptions options = sharded(group, ShardMode::optimizer);
      options.overlap_gather = overlap;
      DataParallel dp(net, options);
      auto opt = dp.make_optimizer<optim::SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      Seen s;
      for (int step = 0; step < 3; ++step) {
        opt->zero_grad();
        loss_on(dp, rank, static_cast<uint64_t>(step)).backward();
        opt->step();
      }
      const std::vector<BucketInfo> buckets = dp.buckets();
      s.buckets = buckets.size();
      const std::vector<Tensor> params = net->parameters();
      for (const Tensor& p : params) s.gated_after_step += p.storage()->has_pending_write();
      // Reading a parameter of the last bucket (the first layers': gathered first) waits for
      // that bucket alone; the first bucket's parameters stay gated until they are used.
      const Tensor early = net->parameter(buckets.back().parameter_names.front());
      const Tensor late = net->parameter(buckets.front().parameter_names.front());
      (void)early.data<float>();
      s.early_open = !early.storage()->has_pending_write();
      s.late_still_gated = late.storage()->has_pending_write();
      loss_on(dp, rank, 9).backward();
      s.waited = dp.last_comm_stats().gather_wait_seconds;
      s.all_open_after_forward = true;
      for (const Tensor& p : params) s.all_open_after_forward &= !p.storage()->has_pending_write();
      for (const Tensor& p : params) {
        const auto v = p.to_float_vector();
        s.weights.insert(s.weights.end(), v.begin(), v.end());
      }
      return s;
    });
  };
  const auto overlapped = run(true);
  for (const Seen& s : overlapped) {
    REQUIRE(s.buckets >= 2);
    CHECK(s.gated_after_step == 4);  // step() returned with every gather still to be waited for
    CHECK(s.early_open);
    CHECK(s.late_still_gated);  // another bucket, not read yet
    CHECK(s.all_open_after_forward);
    CHECK(s.waited > 0);  // the gates' waits in the forward, each timed (never exactly 0 ns)
  }
  CHECK(overlapped[0].weights == overlapped[1].weights);
  // overlap_gather = false: step() returns with every bucket gathered; the same weights.
  const auto in_step = run(false);
  for (const Seen& s : in_step) {
    CHECK(s.gated_after_step == 0);
    CHECK(s.waited > 0);  // timed inside step() instead, and counted the same way
    CHECK(s.weights == overlapped[0].weights);
  }
}
