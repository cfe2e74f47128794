// DataParallel with 2 ranks as threads of this process: one StoreServer on loopback, and per
// rank its own StoreClient, Gloo Group and model copy. Results are compared on the main thread
// (Catch2 assertions are not thread-safe) against one process training on the same samples.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <thread>

#include "dpar/autograd/grad_mode.h"
#include "dpar/data/sampler.h"
#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/store.h"
#include "dpar/nn/init.h"
#include "dpar/nn/layers.h"
#include "dpar/optim/sgd.h"
#include "dpar/tensor/ops.h"
#include "unit/helpers.h"
#include "unit/two_ranks.h"

using namespace dpar;
using namespace dpar::dist;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using dpar::test::run_two_ranks;
using Values = std::vector<std::vector<float>>;

namespace {

// conv (channels-last weight) + BN + conv + BN + linear. The head comes early in parameter
// order (after the stem weight: own parameters precede children's) although it runs last, so
// its gradients are ready first while the initial bucket order (reverse registration) expects
// them last: the rebuild after iteration 1 has to move them.
class Net : public nn::Module {
 public:
  explicit Net(uint64_t seed, int64_t width = 8, bool with_extra = false) : Module("Net") {
    Generator gen(seed);
    head = register_module("head", std::make_shared<nn::Linear>(2 * width, 5));
    // A channels-last parameter (as conv weights are on the GPU): its gradient view in the
    // bucket has the same layout.
    stem_weight = register_parameter(
        "stem_weight",
        Tensor::empty({width, 3, 3, 3}, DType::f32, Device::cpu(), MemoryFormat::ChannelsLast));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(width));
    conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(width, 2 * width, 3, 2, 1));
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(2 * width));
    if (with_extra) extra = register_module("extra", std::make_shared<nn::Linear>(5, 5));
    NoGradGuard no_grad;
    nn::init::uniform_(stem_weight, -0.3, 0.3, gen);
    head->reset_parameters(gen);
    conv2->reset_parameters(gen);
    if (extra) extra->reset_parameters(gen);
  }

  Tensor forward(const Tensor& x) override {
    Conv2dOptions o;
    o.padding = {1, 1};
    Tensor h = relu(bn1->forward(conv2d(x, stem_weight, {}, o)));
    h = relu(bn2->forward(conv2->forward(h)));
    Tensor y = head->forward(global_avg_pool2d(h).flatten(1));
    return use_extra ? add(y, extra->forward(y)) : y;
  }

  std::shared_ptr<nn::Linear> head, extra;
  std::shared_ptr<nn::Conv2d> conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  Tensor stem_weight;
  bool use_extra = false;
};

struct Batch {
  Tensor x, y;
  Batch slice(int64_t begin, int64_t end) const {
    return {x.slice(0, begin, end), y.slice(0, begin, end)};
  }
};

Batch make_batch(uint64_t seed, int64_t n) {
  Generator gen(seed);
  Tensor x = Tensor::empty({n, 3, 8, 8});
  nn::init::normal_(x, 0.0, 1.0, gen);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int64_t>(gen.next_u64() % 5));
  return {x, Tensor::from_vector(labels, {n})};
}

Tensor loss_of(nn::Module& m, const Batch& b) { return cross_entropy(m.forward(b.x), b.y); }

Values values(const std::vector<Tensor>& ts) {
  Values out;
  for (const auto& t : ts) out.push_back(t.to_float_vector());
  return out;
}

Values grads(nn::Module& m) {
  Values out;
  for (const auto& p : m.parameters()) {
    out.push_back(p.grad().defined() ? p.grad().to_float_vector() : std::vector<float>{});
  }
  return out;
}

// max over tensors of max|a - b| / max|b|.
double max_rel_diff(const Values& a, const Values& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    double diff = 0, scale = 1e-12;
    for (size_t j = 0; j < a[i].size(); ++j) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i][j] - b[i][j])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i][j])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

optim::SGDOptions sgd() {
  optim::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return o;
}

DataParallelOptions options_for(std::shared_ptr<Group> group) {
  DataParallelOptions o;
  o.group = std::move(group);
  return o;
}

}  // namespace

TEST_CASE("2 ranks train like one process on the union of their samples", "[data_parallel]") {
  constexpr int kSteps = 3;
  constexpr int64_t kLocal = 4;
  for (const bool training : {false, true}) {
    DYNAMIC_SECTION((training ? "train-mode BN" : "eval-mode BN")) {
      auto results = run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
        // Different seeds: construction must broadcast rank 0's parameters.
        auto net = std::make_shared<Net>(rank == 0 ? 1 : 2);
        net->train(training);
        DataParallelOptions o = options_for(group);
        o.last_comm_buffer_size = 0.001;  // several buckets, rebuilt after step 1
        o.comm_buffer_size = 0.002;
        DataParallel dp(net, o);
        optim::SGD opt(dp.parameters(), sgd());
        for (int s = 0; s < kSteps; ++s) {
          const Batch b = make_batch(100 + s, 2 * kLocal).slice(rank * kLocal, (rank + 1) * kLocal);
          opt.zero_grad();
          loss_of(dp, b).backward();
          opt.step();
        }
        return values(dp.parameters());
      });
      CHECK(results[0] == results[1]);  // bitwise

      Net ref(1);
      ref.train(training);
      optim::SGD opt(ref.parameters(), sgd());
      for (int s = 0; s < kSteps; ++s) {
        const Batch all = make_batch(100 + s, 2 * kLocal);
        opt.zero_grad();
        // Eval-mode BN: literally the concatenated batch. Train-mode BN normalises per rank,
        // so the single-process equivalent is the mean of the two shards' losses.
        Tensor loss = training ? mul(add(loss_of(ref, all.slice(0, kLocal)),
                                         loss_of(ref, all.slice(kLocal, 2 * kLocal))),
                                     0.5)
                               : loss_of(ref, all);
        loss.backward();
        opt.step();
      }
      CHECK(max_rel_diff(results[0], values(ref.parameters())) <= 1e-5);
    }
  }
}

TEST_CASE("comm_dtype bf16/f16: compressed gradients are the average to the format's precision",
          "[data_parallel]") {
  constexpr int64_t kLocal = 4;
  const Batch all = make_batch(300, 2 * kLocal);
  // Reference: one process, the mean of the two shards' losses (eval-mode BN, so exact).
  Net ref(1);
  ref.train(false);
  add(loss_of(ref, all.slice(0, kLocal)), loss_of(ref, all.slice(kLocal, 2 * kLocal))).backward();
  Values expected = grads(ref);
  for (auto& g : expected) {
    for (float& v : g) v *= 0.5f;
  }
  for (const auto& [dtype, precision] :
       {std::pair{DType::bf16, 1.0 / 128}, std::pair{DType::f16, 1.0 / 1024}}) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      auto results = run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
        auto net = std::make_shared<Net>(rank == 0 ? 1 : 2);
        net->train(false);
        DataParallelOptions o = options_for(group);
        o.last_comm_buffer_size = 0.001;
        o.comm_buffer_size = 0.002;
        o.comm_dtype = dtype;
        DataParallel dp(net, o);
        Values out;
        for (int iteration = 0; iteration < 2; ++iteration) {  // before and after the rebuild
          dp.zero_grad();
          loss_of(dp, all.slice(rank * kLocal, (rank + 1) * kLocal)).backward();
          out = grads(dp);
          for (const auto& p : dp.parameters()) {
            if (p.grad().dtype() != DType::f32) DPAR_FAIL("a gradient is not f32");
          }
        }
        return out;
      });
      CHECK(results[0] == results[1]);  // every rank converts the same sum back
      // Each rank's share is rounded, then each partial sum: a few units of the format's
      // last place, relative to the tensor's largest gradient.
      const double diff = max_rel_diff(results[0], expected);
      INFO("max relative difference " << diff);
      CHECK(diff <= 4 * precision);
      CHECK(diff > 0);  // the gradients did travel compressed
    }
  }
  // Only floating 16-bit formats (or f32) are accepted.
  auto errors = run_two_ranks([&](int, std::shared_ptr<Group> group) {
    DataParallelOptions o = options_for(group);
    o.comm_dtype = DType::i64;
    return error_of([&] { DataParallel dp(std::make_shared<Net>(1), o); });
  });
  CHECK_THAT(errors[0], Contains("comm_dtype must be f32, bf16 or f16, got i64"));
}

TEST_CASE("no_sync accumulates locally; the next synchronised backward reduces the sum",
          "[data_parallel]") {
  struct Out {
    Values accumulated, synchronised, local_after_no_sync, local_expected;
  };
  auto results = run_two_ranks([](int rank, std::shared_ptr<Group> group) {
    const Batch b = make_batch(7, 8).slice(rank * 4, rank * 4 + 4);
    const Batch m0 = b.slice(0, 2), m1 = b.slice(2, 4);
    Out out;
    {
      auto net = std::make_shared<Net>(3);
      DataParallel dp(net, options_for(group));
      {
        auto guard = dp.no_sync();
        loss_of(dp, m0).backward();
      }
      out.local_after_no_sync = grads(dp);
      loss_of(dp, m1).backward();
      out.accumulated = grads(dp);
    }
    {
      auto net = std::make_shared<Net>(3);
      DataParallel dp(net, options_for(group));
      loss_of(dp, m0).backward();
      loss_of(dp, m1).backward();
      out.synchronised = grads(dp);
    }
    Net plain(3);
    loss_of(plain, m0).backward();
    out.local_expected = grads(plain);
    return out;
  });
  // Inside no_sync nothing was communicated: each rank has its own local gradient.
  CHECK(max_rel_diff(results[0].local_after_no_sync, results[0].local_expected) <= 1e-6);
  CHECK(max_rel_diff(results[1].local_after_no_sync, results[1].local_expected) <= 1e-6);
  CHECK(results[0].local_after_no_sync != results[1].local_after_no_sync);
  CHECK(results[0].accumulated == results[1].accumulated);
  CHECK(max_rel_diff(results[0].accumulated, results[0].synchronised) <= 1e-5);
}

TEST_CASE("unequal local batches give the sample-weighted average", "[data_parallel]") {
  const int64_t sizes[2] = {3, 5};
  auto results = run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
    auto net = std::make_shared<Net>(4);
    net->eval();
    DataParallel dp(net, options_for(group));
    optim::SGD opt(dp.parameters(), sgd());
    for (int s = 0; s < 2; ++s) {
      const Batch b = make_batch(200 + s, 8).slice(rank == 0 ? 0 : 3, rank == 0 ? 3 : 8);
      opt.zero_grad();
      cross_entropy(dp.forward(b.x, sizes[rank]), b.y).backward();
      opt.step();
    }
    return values(dp.parameters());
  });
  CHECK(results[0] == results[1]);
  Net ref(4);
  ref.eval();
  optim::SGD opt(ref.parameters(), sgd());
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad();
    loss_of(ref, make_batch(200 + s, 8)).backward();
    opt.step();
  }
  CHECK(max_rel_diff(results[0], values(ref.parameters())) <= 1e-5);
}

TEST_CASE("unused parameters: an error naming them, or zeros with find_unused_parameters",
          "[data_parallel]") {
  struct Out {
    std::string error;
    Values params, extra_grads;
  };
  // `extra` is used by rank 1 only: without the option both ranks fail (rank 0 names it);
  // with it, rank 0 contributes zeros.
  auto results = run_two_ranks([](int rank, std::shared_ptr<Group> group) {
    Out out;
    const Batch b = make_batch(300, 8).slice(rank * 4, rank * 4 + 4);
    auto net = std::make_shared<Net>(5, 8, true);
    {
      DataParallel dp(net, options_for(group));
      net->use_extra = false;  // unused everywhere: every rank reports the same names
      out.error = error_of([&] { loss_of(dp, b).backward(); });
    }
    DataParallelOptions o = options_for(group);
    o.find_unused_parameters = true;
    DataParallel dp(net, o);
    net->use_extra = rank == 1;
    optim::SGD opt(dp.parameters(), sgd());
    opt.zero_grad(true);
    loss_of(dp, b).backward();
    out.extra_grads = values({net->extra->weight.grad(), net->extra->bias.grad()});
    opt.step();
    out.params = values(dp.parameters());
    return out;
  });
  for (int r = 0; r < 2; ++r) {
    CHECK_THAT(results[r].error,
               Contains("DataParallel: rank " + std::to_string(r) +
                        ": 2 parameter(s) received no gradient in this backward pass: "
                        "extra.weight, extra.bias. Pass find_unused_parameters = true"));
  }
  CHECK(results[0].params == results[1].params);
  CHECK(results[0].extra_grads == results[1].extra_grads);

  // Reference: rank 0's shard does not use `extra`, rank 1's does; mean of the two losses.
  Net ref(5, 8, true);
  const Batch all = make_batch(300, 8);
  ref.use_extra = false;
  Tensor l0 = loss_of(ref, all.slice(0, 4));
  ref.use_extra = true;
  Tensor l1 = loss_of(ref, all.slice(4, 8));
  mul(add(l0, l1), 0.5).backward();
  CHECK(max_rel_diff(results[0].extra_grads,
                     values({ref.extra->weight.grad(), ref.extra->bias.grad()})) <= 1e-5);
}

TEST_CASE("mismatched models fail on every rank naming the parameter on both", "[data_parallel]") {
  auto errors = run_two_ranks([](int rank, std::shared_ptr<Group> group) {
    auto net = std::make_shared<Net>(6, rank == 0 ? 8 : 6);
    return error_of([&] { DataParallel dp(net, options_for(group)); });
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Contains("DataParallel: parameter 0 differs across ranks: rank 0 has "
                           "stem_weight f32[8,3,3,3], rank 1 has stem_weight f32[6,3,3,3]"));
  }
}

TEST_CASE("bucket summary, rebuild in ready order, gradients as bucket views", "[data_parallel]") {
  struct Out {
    std::string summary_before, summary_after;
    std::vector<BucketInfo> before, after;
    bool same_storage_within = true, distinct_across = true, layout_of_parameter = true;
    bool views_after_set_to_none = true;
    Values params;
    double comm_seconds = -1, exposed_seconds = -1;
  };
  auto results = run_two_ranks([](int rank, std::shared_ptr<Group> group) {
    Out out;
    auto net = std::make_shared<Net>(8);
    DataParallelOptions o = options_for(group);
    o.last_comm_buffer_size = 0.001;  // ~1 KB first bucket, then ~3 KB
    o.comm_buffer_size = 0.003;
    DataParallel dp(net, o);
    out.summary_before = dp.bucket_summary();
    out.before = dp.buckets();
    optim::SGD opt(dp.parameters(), sgd());
    auto check_views = [&] {
      bool ok = true;
      std::vector<const Storage*> firsts;
      for (const auto& bucket : dp.buckets()) {
        const Storage* storage = nullptr;
        for (const auto& name : bucket.parameter_names) {
          const Tensor param = net->parameter(name);
          const Tensor g = param.grad();
          if (!g.defined()) return false;
          if (!storage) storage = g.storage().get();
          ok = ok && g.storage().get() == storage;
          out.layout_of_parameter = out.layout_of_parameter && g.strides() == param.strides();
        }
        for (const Storage* s : firsts) out.distinct_across = out.distinct_across && s != storage;
        firsts.push_back(storage);
      }
      return ok;
    };
    for (int s = 0; s < 3; ++s) {
      const Batch b = make_batch(400 + s, 8).slice(rank * 4, rank * 4 + 4);
      opt.zero_grad(s == 2);  // the last step drops the gradients (set_to_none)
      loss_of(dp, b).backward();
      if (s == 0) out.after = dp.buckets();
      if (s < 2) out.same_storage_within = out.same_storage_within && check_views();
      if (s == 2) out.views_after_set_to_none = check_views();
      opt.step();
    }
    out.summary_after = dp.bucket_summary();
    out.params = values(dp.parameters());
    out.comm_seconds = dp.last_comm_stats().comm_seconds;
    out.exposed_seconds = dp.last_comm_stats().exposed_seconds;
    return out;
  });
  const Out& r0 = results[0];
  CHECK(std::regex_search(
      r0.summary_before,
      std::regex(
          R"(^all_reduce tensors: 9, after fusion: 2 buckets \[\d+\.\d (KB|MB), \d+\.\d (KB|MB)\]$)")));
  // Initially reverse registration order: the head (registered first) is in the last bucket.
  REQUIRE(r0.before.size() == 2);
  CHECK(r0.before[0].parameter_names.front() == "bn2.bias");
  const auto& last = r0.before[1].parameter_names;
  CHECK(std::find(last.begin(), last.end(), "head.weight") != last.end());
  // After the first iteration: the order gradients became ready, the head first.
  REQUIRE(!r0.after.empty());
  const auto& first = r0.after[0].parameter_names;
  CHECK(std::find(first.begin(), first.end(), "head.weight") != first.end());
  CHECK(std::find(first.begin(), first.end(), "head.bias") != first.end());
  CHECK(first.size() + r0.after.back().parameter_names.size() <= 9);
  CHECK(r0.after.size() == results[1].after.size());
  for (size_t i = 0; i < r0.after.size() && i < results[1].after.size(); ++i) {
    CHECK(r0.after[i].parameter_names == results[1].after[i].parameter_names);
  }
  CHECK(r0.summary_after != r0.summary_before);
  for (const auto& r : results) {
    CHECK(r.same_storage_within);
    CHECK(r.distinct_across);
    CHECK(r.layout_of_parameter);
    CHECK(r.views_after_set_to_none);
    CHECK(r.comm_seconds > 0);
    CHECK(r.exposed_seconds >= 0);
    CHECK(r.exposed_seconds <= r.comm_seconds + 1e-3);
  }
  CHECK(results[0].params == results[1].params);
}

TEST_CASE("DataParallel presents the wrapped module's names and broadcasts buffers",
          "[data_parallel]") {
  struct Out {
    std::vector<std::string> names, state_names;
    Values running_means_after_wrap;
  };
  auto results = run_two_ranks([](int rank, std::shared_ptr<Group> group) {
    auto net = std::make_shared<Net>(9);
    if (rank == 1) net->bn1->running_mean.fill_(5.0);
    DataParallel dp(net, options_for(group));
    Out out;
    for (const auto& [name, t] : dp.named_parameters()) out.names.push_back(name);
    for (const auto& [name, t] : dp.state_dict()) out.state_names.push_back(name);
    out.running_means_after_wrap = values({net->bn1->running_mean});
    return out;
  });
  Net plain(9);
  std::vector<std::string> names, state_names;
  for (const auto& [name, t] : plain.named_parameters()) names.push_back(name);
  for (const auto& [name, t] : plain.state_dict()) state_names.push_back(name);
  CHECK(results[0].names == names);
  CHECK(results[0].state_names == state_names);
  CHECK(results[1].running_means_after_wrap == results[0].running_means_after_wrap);
  CHECK(results[1].running_means_after_wrap[0] == std::vector<float>(8, 0.f));
}

namespace {

// Net under a module that records its buffers as each forward starts, i.e. after
// DataParallel's buffer broadcast.
class BufferProbe : public nn::Module {
 public:
  BufferProbe() : Module("BufferProbe") { net = register_module("net", std::make_shared<Net>(5)); }
  Tensor forward(const Tensor& x) override {
    at_entry = values(buffers());
    return net->forward(x);
  }
  std::shared_ptr<Net> net;
  Values at_entry;
};

// Running statistics of a single process that trains like the 2-rank test below (the mean of
// the two shards' losses, train-mode BN) but lets only shard `owner` update the buffers: the
// statistics a rank keeps when its forward starts from its own buffers each time.
Values reference_buffers(int owner, int steps, int64_t local) {
  BufferProbe ref;
  optim::SGD opt(ref.parameters(), sgd());
  auto snapshot = [&ref] {
    std::vector<Tensor> out;
    for (const auto& b : ref.buffers()) out.push_back(b.clone());
    return out;
  };
  auto restore = [&ref](const std::vector<Tensor>& from) {
    NoGradGuard no_grad;
    auto buffers = ref.buffers();
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(from[i]);
  };
  for (int s = 0; s < steps; ++s) {
    const Batch all = make_batch(700 + s, 2 * local);
    opt.zero_grad();
    const auto before = snapshot();
    Tensor loss0 = loss_of(ref, all.slice(0, local));
    const auto after0 = snapshot();
    restore(before);
    Tensor loss1 = loss_of(ref, all.slice(local, 2 * local));
    if (owner == 0) restore(after0);
    mul(add(loss0, loss1), 0.5).backward();
    opt.step();
  }
  return values(ref.buffers());
}

}  // namespace

TEST_CASE("broadcast_buffers: every training forward starts from rank 0's buffers",
          "[data_parallel]") {
  constexpr int kSteps = 3;
  constexpr int64_t kLocal = 4;
  struct Out {
    std::vector<Values> at_entry, after_forward;  // per step
    Values after_eval, after_second_eval, params;
  };
  for (const bool broadcast : {true, false}) {
    DYNAMIC_SECTION("broadcast_buffers=" << broadcast) {
      auto results = run_two_ranks([&](int rank, std::shared_ptr<Group> group) {
        auto probe = std::make_shared<BufferProbe>();
        DataParallelOptions o = options_for(group);
        o.broadcast_buffers = broadcast;
        DataParallel dp(probe, o);
        dp.train();
        optim::SGD opt(dp.parameters(), sgd());
        Out out;
        for (int s = 0; s < kSteps; ++s) {
          // Different data per rank: the running statistics drift apart in every forward.
          const Batch b = make_batch(700 + s, 2 * kLocal).slice(rank * kLocal, (rank + 1) * kLocal);
          opt.zero_grad();
          Tensor loss = loss_of(dp, b);
          out.at_entry.push_back(probe->at_entry);
          out.after_forward.push_back(values(dp.buffers()));
          loss.backward();
          opt.step();
        }
        dp.eval();
        NoGradGuard no_grad;
        const Batch b = make_batch(800, kLocal);
        dp.forward(b.x);
        out.after_eval = values(dp.buffers());
        // Eval forwards change no statistics: after the first, nothing is sent, so a local
        // change stays local.
        if (rank == 1) probe->net->bn1->running_mean.fill_(7.0);
        dp.forward(b.x);
        out.after_second_eval = values(dp.buffers());
        out.params = values(dp.parameters());
        return out;
      });
      const Out& r0 = results[0];
      const Out& r1 = results[1];
      REQUIRE(r0.at_entry.size() == kSteps);
      REQUIRE(r1.at_entry.size() == kSteps);
      CHECK(r0.params == r1.params);            // gradients are averaged either way
      CHECK(r0.at_entry[0] == r1.at_entry[0]);  // construction broadcasts every buffer
      for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s);
        CHECK(r0.after_forward[s] != r1.after_forward[s]);  // each forward used its own batch
        // Rank 0 always continues from its own statistics.
        if (s > 0) CHECK(r0.at_entry[s] == r0.after_forward[s - 1]);
        if (s > 0 && broadcast) {
          // Bitwise: every rank starts the forward with rank 0's buffers as they were right
          // after rank 0's previous forward.
          CHECK(r1.at_entry[s] == r0.at_entry[s]);
          CHECK(r1.at_entry[s] == r0.after_forward[s - 1]);
        }
        if (s > 0 && !broadcast) {
          CHECK(r1.at_entry[s] == r1.after_forward[s - 1]);
          CHECK(r1.at_entry[s] != r0.at_entry[s]);
        }
      }
      CHECK(r0.after_eval == r0.after_forward.back());
      CHECK(r1.after_eval == (broadcast ? r0 : r1).after_forward.back());
      CHECK(r0.after_second_eval == r0.after_eval);
      CHECK(r1.after_second_eval != r1.after_eval);  // the local change was not overwritten
      // The statistics follow the batches of the rank whose buffers the forwards start from.
      const double diff0 =
          max_rel_diff(r0.after_forward.back(), reference_buffers(0, kSteps, kLocal));
      INFO("rank 0 vs its reference: " << diff0);
      CHECK(diff0 <= 1e-5);
      if (!broadcast) {
        const double diff1 =
            max_rel_diff(r1.after_forward.back(), reference_buffers(1, kSteps, kLocal));
        INFO("rank 1 vs its reference: " << diff1);
        CHECK(diff1 <= 1e-5);
      }
    }
  }
}

TEST_CASE("evaluating through DataParallel on rank 0 alone names DataParallel's broadcast",
          "[data_parallel][errors]") {
  // The user never called a broadcast: the waiting rank says which of DataParallel's own
  // collectives it is in after a quarter of the timeout, and the error says what to do.
  const std::string log =
      std::filesystem::temp_directory_path() / ("dp_notice_" + std::to_string(::getpid()) + ".txt");
  auto errors = run_two_ranks(
      [&](int rank, std::shared_ptr<Group> group) {
        DataParallel dp(std::make_shared<Net>(4, 4), options_for(group));
        dp.train();
        {
          const Batch b = make_batch(900, 4).slice(rank * 2, rank * 2 + 2);
          loss_of(dp, b).backward();
        }
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past rank 0's timeout
          return std::string();
        }
        dp.eval();
        NoGradGuard no_grad;
        const int saved = ::dup(2);
        FILE* f = std::fopen(log.c_str(), "w");
        ::dup2(::fileno(f), 2);
        const std::string e = error_of([&] { dp.forward(make_batch(901, 2).x); });
        std::fflush(stderr);
        ::dup2(saved, 2);
        ::close(saved);
        std::fclose(f);
        return e;
      },
      std::chrono::seconds(2));
  CHECK_THAT(errors[0], StartsWith("DataParallel's buffer broadcast before a forward (every rank "
                                   "must run it; evaluate dp.module() on one rank, or set "
                                   "broadcast_buffers = false): broadcast("));
  CHECK_THAT(errors[0], Contains("timed out after 2"));
  std::ifstream in(log);
  const std::string notice((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(notice, Contains("dpar: rank 0 has waited 0 s in DataParallel's buffer broadcast "
                              "before a forward") ||
                         Contains("dpar: rank 0 has waited 1 s in DataParallel's buffer broadcast "
                                  "before a forward"));
  std::filesystem::remove(log);
}

TEST_CASE("DataParallel and DistributedSampler under a launcher need init_parallel_env()",
          "[data_parallel][errors]") {
  // What dpar-launch puts in a rank's environment; init_parallel_env() not called.
  ::setenv("DPAR_RANK", "1", 1);
  ::setenv("DPAR_WORLD_SIZE", "2", 1);
  ::setenv("DPAR_MASTER", "127.0.0.1:29999", 1);
  const std::string dp_error =
      error_of([] { DataParallel dp(std::make_shared<Net>(4, 4), DataParallelOptions{}); });
  const std::string sampler_error = error_of([] { data::DistributedSampler s(10, 0, 1); });
  ::unsetenv("DPAR_RANK");
  ::unsetenv("DPAR_WORLD_SIZE");
  ::unsetenv("DPAR_MASTER");
  CHECK_THAT(dp_error,
             StartsWith("DataParallel: this process was started by dpar-launch as rank 1 of 2 "
                        "(DPAR_WORLD_SIZE=2) but dpar::dist::init_parallel_env() was not called, "
                        "so it would train alone as rank 0 of 1; call init_parallel_env() first"));
  CHECK_THAT(sampler_error, StartsWith("DistributedSampler: this process was started by "
                                       "dpar-launch as rank 1 of 2 (DPAR_WORLD_SIZE=2)"));
  // Without a launcher both are a single process, as before.
  CHECK_NOTHROW(DataParallel(std::make_shared<Net>(4, 4), DataParallelOptions{}));
  CHECK(data::DistributedSampler(10, 0, 1).size() == 10);
}
