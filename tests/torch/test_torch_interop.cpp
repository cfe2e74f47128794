// dpar::torch in one process: zero-copy views both ways, the dtype map and its errors,
// collectives on libtorch tensors, the distributed sampler (against PyTorch's Python sampler),
// checkpoints of a module and its optimizer, and DataParallel in a world of one.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
// libtorch brings glog, whose CHECK macro is Catch's assertion's name.
#undef CHECK
#include <catch2/catch.hpp>

#include "dpar/dpar.h"
#include "dpar/torch.h"

namespace dt = dpar::torch;
using Catch::Matchers::Contains;

namespace {

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dpar_torch_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::vector<size_t> python_sampler(int64_t size, int world, int rank, bool shuffle, int seed,
                                   int epoch, bool drop_last) {
  const std::string cmd =
      "/usr/bin/python3 -c \"import torch.utils.data as d; s=d.DistributedSampler(range(" +
      std::to_string(size) + "), num_replicas=" + std::to_string(world) +
      ", rank=" + std::to_string(rank) + ", shuffle=" + (shuffle ? "True" : "False") +
      ", seed=" + std::to_string(seed) + ", drop_last=" + (drop_last ? "True" : "False") +
      "); s.set_epoch(" + std::to_string(epoch) + "); print(' '.join(map(str, s)))\"";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::vector<size_t> out;
  unsigned long v = 0;
  while (std::fscanf(pipe, "%lu", &v) == 1) out.push_back(v);
  REQUIRE(pclose(pipe) == 0);
  return out;
}

}  // namespace

TEST_CASE("torch tensors view as dpar tensors without copies, and back") {
  at::Tensor t = at::arange(24, at::kFloat).reshape({2, 3, 4});
  dpar::Tensor d = dt::to_dpar(t);
  CHECK(d.raw_data() == t.data_ptr());
  CHECK(d.shape() == dpar::Shape{2, 3, 4});
  CHECK(d.strides() == dpar::Shape{12, 4, 1});
  CHECK(d.dtype() == dpar::DType::f32);

  // A strided view (transposed, offset) keeps its strides and offset.
  at::Tensor v = t.select(0, 1).t();
  dpar::Tensor dv = dt::to_dpar(v);
  CHECK(dv.raw_data() == v.data_ptr());
  CHECK(dv.shape() == dpar::Shape{4, 3});
  CHECK(dv.strides() == dpar::Shape{1, 4});
  CHECK(dv.storage_offset() == 12);
  CHECK(dv.to_float_vector() ==
        dpar::Tensor::from_vector(
            std::vector<float>{12, 16, 20, 13, 17, 21, 14, 18, 22, 15, 19, 23}, {4, 3})
            .to_float_vector());

  // Round trip: the same memory, strides and dtype.
  at::Tensor back = dt::to_torch(dv);
  CHECK(back.data_ptr() == v.data_ptr());
  CHECK(back.strides() == v.strides());
  CHECK(at::equal(back, v));

  // Writes through either side are seen by the other.
  dpar::mul_(d, 2.0);
  CHECK(t[1][2][3].item<float>() == 46.f);
  back.fill_(-1);
  CHECK(t[1][0][0].item<float>() == -1.f);

  // Each side keeps the memory alive after the other is gone.
  const void* address = t.data_ptr();
  t = at::Tensor();
  v = at::Tensor();
  CHECK(d.raw_data() == address);
  CHECK(d.to_float_vector()[0] == 0.f);
  dpar::Tensor owned = dpar::Tensor::full({5}, 3.0);
  at::Tensor view = dt::to_torch(owned);
  owned = dpar::Tensor();
  CHECK(view.sum().item<float>() == 15.f);
}

TEST_CASE("the dtype map covers dpar's dtypes; anything else is named") {
  const std::pair<c10::ScalarType, dpar::DType> pairs[] = {{at::kFloat, dpar::DType::f32},
                                                           {at::kHalf, dpar::DType::f16},
                                                           {at::kBFloat16, dpar::DType::bf16},
                                                           {at::kLong, dpar::DType::i64},
                                                           {at::kByte, dpar::DType::u8}};
  for (const auto& [torch_type, dpar_type] : pairs) {
    at::Tensor t = at::zeros({3}, torch_type);
    CHECK(dt::to_dpar(t).dtype() == dpar_type);
    CHECK(dt::to_torch(dt::to_dpar(t)).scalar_type() == torch_type);
    CHECK(dt::to_torch(dt::to_dpar(t)).data_ptr() == t.data_ptr());
  }
  CHECK_THROWS_WITH(dt::to_dpar(at::zeros({2}, at::kDouble)),
                    Contains("dtype Double cannot be viewed as a dpar tensor"));
  CHECK_THROWS_WITH(dt::to_dpar(at::zeros({2}, at::kBool)), Contains("dtype Bool"));
  CHECK_THROWS_WITH(dt::to_dpar(at::zeros({3, 3}).to_sparse()),
                    Contains("a Sparse libtorch tensor cannot be viewed"));
  CHECK_THROWS_WITH(dt::to_dpar(at::Tensor()), Contains("undefined"));
  CHECK_THROWS_WITH(dt::to_torch(dpar::Tensor()), Contains("undefined"));
}

TEST_CASE("collectives on libtorch tensors run through dpar's groups") {
  CHECK_THROWS_WITH(dt::all_reduce(at::ones({2})),
                    Contains("call dpar::dist::init_parallel_env()"));
  auto group = std::make_shared<dpar::dist::Group>(nullptr, 0, 1);
  at::Tensor t = at::arange(6, at::kFloat);
  auto work = dt::all_reduce(t, dpar::dist::ReduceOp::Sum, /*async_op=*/true, group.get());
  work->wait();
  CHECK(at::equal(t, at::arange(6, at::kFloat)));
  std::vector<at::Tensor> gathered{at::zeros({6})};
  dt::all_gather(gathered, t, false, group.get());
  CHECK(at::equal(gathered[0], t));
  at::Tensor out = at::zeros({6});
  dt::reduce_scatter(out, {t}, dpar::dist::ReduceOp::Sum, false, group.get());
  CHECK(at::equal(out, t));
  dt::broadcast(t, 0, false, group.get());
  dt::barrier(group.get());
}

TEST_CASE("DistributedSampler gives PyTorch's indices, pads or drops, and resumes") {
  for (bool drop_last : {false, true}) {
    for (bool shuffle : {true, false}) {
      std::vector<size_t> all;
      for (int rank = 0; rank < 3; ++rank) {
        dt::DistributedSampler sampler(
            10,
            {.shuffle = shuffle, .seed = 5, .drop_last = drop_last, .rank = rank, .world_size = 3});
        sampler.set_epoch(2);
        CHECK(sampler.indices() == python_sampler(10, 3, rank, shuffle, 5, 2, drop_last));
        CHECK(sampler.num_samples() == (drop_last ? 3u : 4u));
        all.insert(all.end(), sampler.indices().begin(), sampler.indices().end());
      }
      std::sort(all.begin(), all.end());
      all.erase(std::unique(all.begin(), all.end()), all.end());
      CHECK(all.size() == (drop_last ? 9u : 10u));  // padding repeats, drop_last loses one
    }
  }
  dt::DistributedSampler sampler(100, {.seed = 1, .rank = 1, .world_size = 2});
  const auto epoch0 = sampler.indices();
  sampler.set_epoch(1);
  CHECK(sampler.indices() != epoch0);
  // Batches through next(), then a resume from the position.
  sampler.reset();
  auto first = sampler.next(8);
  REQUIRE(first.has_value());
  CHECK(first->size() == 8u);
  dt::DistributedSampler resumed(100, {.seed = 1, .rank = 1, .world_size = 2});
  resumed.set_epoch(1);
  resumed.set_position(sampler.position());
  CHECK(resumed.next(8) == sampler.next(8));
  CHECK_THROWS_WITH(resumed.set_position(51), Contains("this rank reads 50 per epoch"));

  // Through a libtorch data loader, which keeps a copy: set_epoch and set_position reach it.
  auto dataset = torch::data::datasets::TensorDataset(at::arange(100, at::kLong).unsqueeze(1))
                     .map(torch::data::transforms::Stack<torch::data::TensorExample>());
  dt::DistributedSampler shared(100, {.seed = 1, .rank = 1, .world_size = 2});
  auto loader =
      torch::data::make_data_loader(std::move(dataset), shared, torch::data::DataLoaderOptions(10));
  auto seen = [&] {
    std::vector<size_t> out;
    for (auto& b : *loader) {
      for (int64_t i = 0; i < b.data.size(0); ++i) {
        out.push_back(static_cast<size_t>(b.data[i][0].item<int64_t>()));
      }
    }
    return out;
  };
  shared.set_epoch(1);
  CHECK(seen() == sampler.indices());
  shared.set_epoch(2);
  const auto epoch2 = seen();
  CHECK(epoch2 == python_sampler(100, 2, 1, true, 1, 2, false));
  shared.set_position(30);  // resume after 30 samples of epoch 2
  CHECK(seen() == std::vector<size_t>(epoch2.begin() + 30, epoch2.end()));
  CHECK_THROWS_WITH((dt::DistributedSampler(10, {.rank = 3, .world_size = 2})),
                    Contains("rank 3 is not in a world of size 2"));
}

TEST_CASE("checkpoints of a libtorch module and optimizer resume bitwise") {
  const std::string dir = temp_dir("ckpt");
  auto make = [] {
    torch::manual_seed(3);
    return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::BatchNorm1d(8),
                                 torch::nn::ReLU(), torch::nn::Linear(8, 2));
  };
  auto step = [](torch::nn::Sequential& m, torch::optim::Optimizer& opt, int s) {
    torch::manual_seed(100 + s);
    at::Tensor x = torch::randn({5, 6});
    opt.zero_grad();
    m->forward(x).pow(2).mean().backward();
    opt.step();
  };
  auto model = make();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < 3; ++s) step(model, opt, s);
  dpar::io::TrainingState state;
  state.epoch = 1;
  state.global_step = 3;
  dt::save_checkpoint(dir + "/a.ckpt", *model, &opt, state);
  const at::Tensor after_save_draw = torch::randn({4});  // the generator state was saved
  for (int s = 3; s < 6; ++s) step(model, opt, s);

  auto fresh = make();
  torch::optim::Adam fresh_opt(fresh->parameters(), torch::optim::AdamOptions(1e-2));
  torch::manual_seed(77);
  const auto restored = dt::load_checkpoint(dir + "/a.ckpt", *fresh, &fresh_opt);
  CHECK(restored.global_step == 3);
  CHECK(restored.epoch == 1);
  CHECK(at::equal(torch::randn({4}), after_save_draw));
  for (int s = 3; s < 6; ++s) step(fresh, fresh_opt, s);
  auto a = model->parameters(), b = fresh->parameters();
  for (size_t i = 0; i < a.size(); ++i) CHECK(at::equal(a[i], b[i]));
  CHECK(at::equal(model[1]->as<torch::nn::BatchNorm1d>()->running_mean,
                  fresh[1]->as<torch::nn::BatchNorm1d>()->running_mean));

  // A different module: every difference named, nothing loaded.
  auto other = torch::nn::Sequential(torch::nn::Linear(6, 9), torch::nn::BatchNorm1d(9),
                                     torch::nn::ReLU(), torch::nn::Linear(9, 2));
  const at::Tensor before = other->parameters()[0].clone();
  CHECK_THROWS_WITH(
      dt::load_checkpoint(dir + "/a.ckpt", *other, nullptr),
      Contains("0.weight is Float[8,6] in the checkpoint, Float[9,6] in the module") &&
          Contains("nothing loaded"));
  CHECK(at::equal(other->parameters()[0], before));

  // A damaged file: named, with the problem.
  {
    std::fstream f(dir + "/a.ckpt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-20, std::ios::end);
    f.put('\x55');
  }
  CHECK_THROWS_WITH(dt::load_checkpoint(dir + "/a.ckpt", *fresh, &fresh_opt),
                    Contains(dir + "/a.ckpt"));
  CHECK_THROWS_WITH(dt::load_checkpoint(dir + "/missing.ckpt", *fresh, &fresh_opt),
                    Contains("missing.ckpt"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("DataParallel in a single process wraps the module and communicates nothing") {
  torch::manual_seed(1);
  auto net = torch::nn::Linear(4, 3);
  dt::DataParallel ddp(net);
  CHECK(ddp.group() == nullptr);
  at::Tensor out = ddp(torch::randn({2, 4}));
  CHECK(out.sizes() == at::IntArrayRef({2, 3}));
  out.sum().backward();
  CHECK(net->weight.grad().defined());
  CHECK_THAT(ddp.bucket_summary(), Contains("a world of one"));
  // A std::shared_ptr to a module works as well as a holder.
  auto impl = std::make_shared<torch::nn::LinearImpl>(4, 3);
  dt::DataParallel ddp2(impl);
  CHECK(ddp2(torch::randn({1, 4})).size(1) == 3);
}

TEST_CASE("sharded DataParallel in a single process: the optimizer, clipping and shard sets") {
  // In a world of one there is nothing to split: make_optimizer builds over the module's
  // parameters, and clipping, memory and shard sets work as in a single process.
  torch::manual_seed(2);
  dt::DataParallelOptions sharded;
  sharded.shard = dpar::dist::ShardMode::gradients;
  auto net = torch::nn::Linear(4, 3);
  dt::DataParallel ddp(net, sharded);
  auto opt = ddp.make_optimizer<torch::optim::AdamW>(torch::optim::AdamWOptions(0.1));
  CHECK(opt->param_groups().front().params().size() == 2);
  ddp(torch::randn({2, 4})).sum().backward();
  const double norm = ddp.clip_grad_norm(1e-3);
  CHECK(norm > 1e-3);
  double squares = 0;
  for (const auto& p : net->parameters()) squares += p.grad().pow(2).sum().item<double>();
  CHECK(std::sqrt(squares) == Approx(1e-3).epsilon(1e-3));  // clipped in place
  opt->step();
  CHECK(ddp.memory_stats().optimizer_state == 2 * (12 + 3) * sizeof(float));  // two moments

  // AdamW's state as a shard set (dpar's names), read back into a fresh AdamW.
  const std::string dir = temp_dir("shards");
  ddp.save_optimizer_state(*opt, dir + "/set");
  auto fresh = torch::nn::Linear(4, 3);
  dt::DataParallel fresh_ddp(fresh, sharded);
  auto fresh_opt = fresh_ddp.make_optimizer<torch::optim::AdamW>(torch::optim::AdamWOptions(0.1));
  fresh_ddp.load_optimizer_state(fresh_opt, dir + "/set");
  REQUIRE(fresh_opt->state().size() == 2);
  const auto& moments =
      static_cast<const torch::optim::AdamWParamState&>(*fresh_opt->state().begin()->second);
  CHECK(moments.step() == 1);
  CHECK(moments.exp_avg().defined());
  // Another optimizer's state is refused, naming both.
  auto sgd = fresh_ddp.make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.1));
  CHECK_THROWS_WITH(fresh_ddp.load_optimizer_state(sgd, dir + "/set"), Contains("AdamW"));
  std::filesystem::remove_all(dir);
}
