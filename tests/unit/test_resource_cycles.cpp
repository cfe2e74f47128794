// Resources over time: creating and destroying the long-lived objects of a job again and again
// (process groups with their store, data loaders with workers, parameter-server clients with
// their server, inference models) must leave file descriptors, threads and memory where they
// started. A leak of one descriptor or thread per cycle is what ends a week-long job.
#include <dirent.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "dpar/core/sysinfo.h"
#include "dpar/data/dataloader.h"
#include "dpar/data/sampler.h"
#include "dpar/distributed/process_group.h"
#include "dpar/distributed/store.h"
#include "dpar/infer/runtime.h"
#include "dpar/io/onnx_export.h"
#include "dpar/nn/layers.h"
#include "dpar/optim/sgd.h"
#include "dpar/ps/ps.h"
#include "unit/helpers.h"
#include "unit/hostile_peer.h"

using namespace dpar;

namespace {

// 200 cycles in plain builds; sanitizer builds (several times slower) run 20 and leave leaks to
// LeakSanitizer, which checks every allocation at exit.
constexpr int kCycles = test::kMeasureMemory ? 200 : 20;

size_t count_entries(const char* dir) {
  size_t n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

struct Resources {
  size_t fds = 0;
  size_t threads = 0;
  double rss_mb = 0;
};

Resources now() {
  return {count_entries("/proc/self/fd"), count_entries("/proc/self/task"),
          sysinfo::current_rss_mb()};
}

// gRPC and OpenMP retire idle threads (and gRPC closes sockets) a moment after the objects
// using them are gone: the counts are read once they have held still for a second (at most
// 10 s).
Resources settled() {
  Resources r = now();
  int still = 0;
  for (int i = 0; i < 100 && still < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const Resources next = now();
    still = next.fds == r.fds && next.threads == r.threads ? still + 1 : 0;
    r = next;
  }
  return r;
}

// Runs one warm-up cycle (lazy globals: gRPC's and oneDNN's), measures, runs kCycles more and
// checks nothing grew.
template <class Cycle>
void check_cycles(const char* what, Cycle cycle) {
  cycle();
  const Resources before = settled();
  for (int i = 0; i < kCycles; ++i) cycle();
  const Resources after = settled();
  INFO(what << ": " << kCycles << " cycles; fds " << before.fds << " -> " << after.fds
            << ", threads " << before.threads << " -> " << after.threads << ", RSS "
            << before.rss_mb << " -> " << after.rss_mb << " MiB");
  CHECK(after.fds <= before.fds);
  CHECK(after.threads <= before.threads);
  if (test::kMeasureMemory) CHECK(after.rss_mb - before.rss_mb <= 32);
}

class TinyImages : public data::Dataset {
 public:
  size_t size() const override { return 16; }
  data::Example get(size_t index, Generator&) const override {
    return {Tensor::full({3, 4, 4}, static_cast<double>(index)), static_cast<int64_t>(index % 2)};
  }
  std::vector<std::string> class_names() const override { return {"a", "b"}; }
};

}  // namespace

TEST_CASE("200 cycles of store + 2-rank group leave fds, threads and memory as they were",
          "[resources]") {
  check_cycles("store + group", [] {
    dist::StoreServer server("127.0.0.1", 0, "cycle", 2);
    auto rank = [&](int r) {
      dist::StoreClientOptions so;
      so.log_waiting = false;
      auto store = std::make_shared<dist::StoreClient>(server.endpoint(),
                                                       dist::StoreIdentity{"cycle", 2, r}, so);
      dist::Group group(store, r, 2, dist::ProcessGroupOptions{});
      Tensor t = Tensor::full({8}, static_cast<double>(r));
      group.allreduce({t})->wait();
      return t.to_float_vector()[0];
    };
    auto second = std::async(std::launch::async, rank, 1);
    REQUIRE(rank(0) == 1.0f);
    REQUIRE(second.get() == 1.0f);
  });
}

TEST_CASE("200 cycles of a 2-worker data loader leave fds, threads and memory as they were",
          "[resources]") {
  auto set = std::make_shared<TinyImages>();
  check_cycles("data loader", [&] {
    data::DataLoader loader(set, std::make_shared<data::SequentialSampler>(set->size()),
                            data::DataLoaderOptions{.batch_size = 4, .num_workers = 2});
    loader.start_epoch(0);
    REQUIRE(loader.next().has_value());  // abandoned mid-epoch: workers must still go
  });
}

TEST_CASE("200 cycles of a parameter server and its trainer leave fds, threads and memory",
          "[resources]") {
  check_cycles("ps server + trainer", [] {
    ps::ServerOptions so;
    so.endpoint = "127.0.0.1:0";
    so.log = [](const std::string&) {};
    ps::Server server(so);
    std::thread serving([&] { server.run(); });
    nn::Linear model(4, 3);
    optim::SGD opt(model.parameters(), {.lr = 0.1});
    ps::PsEnv env;
    env.role = ps::Role::kTrainer;
    env.server_endpoints = {server.endpoint()};
    env.trainer_id = 0;
    env.num_trainers = 1;
    ps::TrainerOptions to;
    to.log = [](const std::string&) {};
    {
      ps::ParameterServerTrainer trainer(model, opt, env, to);
      trainer.finish();
    }
    serving.join();
  });
}

TEST_CASE("200 cycles of loading and running an inference model leave fds, threads and memory",
          "[resources]") {
  TempDir dir;
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 4, 3), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(4, 2)});
  net->eval();
  io::OnnxExportOptions o;
  o.height = o.width = 8;
  const std::string path = io::export_onnx(*net, dir.path.string(), o).model_path;
  check_cycles("inference model", [&] {
    infer::Model model = infer::Model::load(path);
    REQUIRE(model.run(Tensor::zeros({1, 3, 8, 8})).shape() == Shape{1, 2});
  });
}
