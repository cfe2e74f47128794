// Run under dpar-launch. dpar::torch::DataParallel with shard = optimizer / gradients against
// shard = none, on a small libtorch CNN with tiny buckets (several buckets, uneven slices at 3
// ranks), each rank on its own batches:
//   --check bitwise --opt sgd|adamw: 20 steps (every 3rd with a no_sync micro-batch first,
//       every 4th with unequal local batches) give bitwise equal weights in every mode, equal
//       on every rank;
//   --check memory: gradient and optimizer-state bytes per rank are about 1/N of unsharded;
//   --check clip: ddp.clip_grad_norm returns the norm one process computes on the concatenated
//       batch (torch::nn::utils::clip_grad_norm_) and the clipped step matches it;
//   --check save --dir D: 5 AdamW steps sharded, then D/model.ckpt and the shard set D/shards;
//   --check resume --dir D: on any number of ranks, 10 more steps after loading D into a
//       sharded (optimizer, gradients) or unsharded job are bitwise equal to each other;
//   --check kill-save --dir D: saves D/set_a, then rank 1 dies (SIGKILL) while one of
//       D/set_b_0, set_b_1, ... is being written (launch/kill_during_saves.h);
//   --check load --dir D: loads D/set_a (3 AdamW steps) into a sharded job of any size;
//   --check unattached: a sharded job whose optimizer was not made by make_optimizer fails at
//       its second forward with a line saying so.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "dpar/core/flags.h"
#include "dpar/dpar.h"
#include "dpar/torch.h"
#include "launch/kill_during_saves.h"  // tests/

namespace dt = dpar::torch;
namespace nn = ::torch::nn;
using dpar::dist::ShardMode;

namespace {

struct NetImpl : nn::Module {
  NetImpl() {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(8, 16, 3).stride(2).padding(1)));
    conv3 = register_module("conv3", nn::Conv2d(nn::Conv2dOptions(16, 16, 3).padding(1)));
    head = register_module("head", nn::Linear(16, 5));
  }
  at::Tensor forward(at::Tensor x) {
    x = ::torch::relu(conv1(x));
    x = ::torch::relu(conv2(x));
    x = ::torch::relu(conv3(x));
    return head(::torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

Net make_model() {
  ::torch::manual_seed(42);  // the same initial weights in every process and mode
  return Net();
}

// Rank r's micro-batch m of step s (n samples), the same in every process.
std::pair<at::Tensor, at::Tensor> batch(int rank, int step, int micro, int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7000 + 97 * rank + 13 * step + micro);
  return {at::randn({n, 3, 8, 8}, gen), at::randint(0, 5, {n}, gen)};
}

dt::DataParallelOptions options_for(ShardMode mode) {
  dt::DataParallelOptions o;
  o.shard = mode;
  o.comm_buffer_size = 0.004;  // ~1000 floats: conv3 spans buckets, slices are uneven at 3
  o.last_comm_buffer_size = 0.001;
  return o;
}

std::shared_ptr<::torch::optim::Optimizer> make_optimizer(dt::DataParallel<Net>& ddp,
                                                          const std::string& name) {
  if (name == "sgd") {
    return ddp.make_optimizer<::torch::optim::SGD>(
        ::torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  }
  DPAR_CHECK(name == "adamw", "--opt must be sgd or adamw, got ", name);
  return ddp.make_optimizer<::torch::optim::AdamW>(
      ::torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
}

at::Tensor flat_params(const nn::Module& m) {
  std::vector<at::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return at::cat(parts);
}

// Steps [first, last): every 3rd with a no_sync micro-batch first, every 4th with unequal
// local batches (rank r: 2 + r samples).
void train_steps(dt::DataParallel<Net>& ddp, ::torch::optim::Optimizer& opt, int first, int last) {
  const int rank = dpar::dist::get_rank();
  for (int s = first; s < last; ++s) {
    opt.zero_grad();
    if (s % 3 == 2) {
      auto guard = ddp.no_sync();
      auto [x, y] = batch(rank, s, 1, 2);
      (::torch::nn::functional::cross_entropy(ddp.forward(x), y) * 0.5).backward();
    }
    const bool unequal = s % 4 == 3;
    auto [x, y] = batch(rank, s, 0, unequal ? 2 + rank : 3);
    at::Tensor out = unequal ? ddp.forward_weighted(x.size(0), x) : ddp.forward(x);
    (::torch::nn::functional::cross_entropy(out, y) * (s % 3 == 2 ? 0.5 : 1.0)).backward();
    opt.step();
  }
}

struct Trained {
  at::Tensor weights;
  dpar::dist::ShardMemory memory;
  size_t buckets = 0;
};

Trained train(ShardMode mode, const std::string& opt_name, int steps) {
  Net net = make_model();
  dt::DataParallel<Net> ddp(net, options_for(mode));
  auto opt = make_optimizer(ddp, opt_name);
  train_steps(ddp, *opt, 0, steps);
  return {flat_params(*net), ddp.memory_stats(), ddp.buckets().size()};
}

void check_same_on_every_rank(const at::Tensor& mine) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < dpar::dist::get_world_size(); ++r) all.push_back(at::empty_like(mine));
  dt::all_gather(all, mine);
  for (size_t r = 0; r < all.size(); ++r) {
    DPAR_CHECK(at::equal(all[r], mine), "rank ", r, "'s weights differ bitwise from rank ",
               dpar::dist::get_rank(), "'s");
  }
}

void check_bitwise(const std::string& opt_name, int steps) {
  const Trained none = train(ShardMode::none, opt_name, steps);
  for (ShardMode mode : {ShardMode::optimizer, ShardMode::gradients}) {
    const Trained sharded = train(mode, opt_name, steps);
    const int64_t differing = (sharded.weights != none.weights).sum().item<int64_t>();
    DPAR_CHECK(differing == 0, "shard = ", dpar::dist::shard_mode_name(mode), " differs from ",
               "shard = none in ", differing, " of ", none.weights.numel(), " weights after ",
               steps, " steps (", opt_name, "); largest difference ",
               (sharded.weights - none.weights).abs().max().item<double>());
  }
  check_same_on_every_rank(none.weights);
  if (dpar::dist::get_rank() == 0) {
    std::printf(
        "torch_shard_worker: %d ranks, %s, %d steps, %zu buckets (no_sync and unequal batches "
        "included): shard optimizer and gradients bitwise equal to shard none, on every rank\n",
        dpar::dist::get_world_size(), opt_name.c_str(), steps, none.buckets);
  }
}

void check_memory() {
  const Trained none = train(ShardMode::none, "adamw", 3);
  const double n = dpar::dist::get_world_size();
  const double rounding = 64.0 * static_cast<double>(none.buckets);  // a 64-byte block per slice
  const double grads = static_cast<double>(none.memory.gradients);
  const double state = static_cast<double>(none.memory.optimizer_state);
  DPAR_CHECK(state > 0 && grads > 0, "unsharded: no optimizer state or gradients measured");
  for (ShardMode mode : {ShardMode::optimizer, ShardMode::gradients}) {
    const Trained s = train(mode, "adamw", 3);
    DPAR_CHECK(static_cast<double>(s.memory.optimizer_state) <= state / n + 2 * rounding,
               "shard = ", dpar::dist::shard_mode_name(mode), ": optimizer state ",
               s.memory.optimizer_state, " bytes per rank, more than 1/", n, " of ", state);
    const double grad_bound = (mode == ShardMode::optimizer ? grads : 0.0) + grads / n + rounding;
    DPAR_CHECK(static_cast<double>(s.memory.gradients) <= grad_bound,
               "shard = ", dpar::dist::shard_mode_name(mode), ": gradients ", s.memory.gradients,
               " bytes per rank, expected at most ", grad_bound);
    if (dpar::dist::get_rank() == 0) {
      std::printf(
          "torch_shard_worker: shard %s per rank: gradients %zu bytes (none %.0f), optimizer "
          "state %zu bytes (none %.0f)\n",
          dpar::dist::shard_mode_name(mode), s.memory.gradients, grads, s.memory.optimizer_state,
          state);
    }
  }
}

void check_clip() {
  const int rank = dpar::dist::get_rank(), world = dpar::dist::get_world_size();
  // One process on the concatenated batch: its mean loss's gradient is the ranks' average.
  Net reference = make_model();
  std::vector<at::Tensor> xs, ys;
  for (int r = 0; r < world; ++r) {
    auto [x, y] = batch(r, 0, 0, 3);
    xs.push_back(x);
    ys.push_back(y);
  }
  ::torch::nn::functional::cross_entropy(reference->forward(at::cat(xs)), at::cat(ys)).backward();
  double squares = 0;
  for (const auto& p : reference->parameters()) {
    squares += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  const double want = std::sqrt(squares);
  const double max_norm = want / 4;  // clipping engages
  const double single = ::torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm);
  ::torch::optim::SGD ref_opt(reference->parameters(), ::torch::optim::SGDOptions(0.5));
  ref_opt.step();

  for (ShardMode mode : {ShardMode::none, ShardMode::optimizer, ShardMode::gradients}) {
    Net net = make_model();
    dt::DataParallel<Net> ddp(net, options_for(mode));
    auto opt = ddp.make_optimizer<::torch::optim::SGD>(::torch::optim::SGDOptions(0.5));
    auto [x, y] = batch(rank, 0, 0, 3);
    ::torch::nn::functional::cross_entropy(ddp.forward(x), y).backward();
    const double got = ddp.clip_grad_norm(max_norm);
    DPAR_CHECK(std::abs(got - want) <= 1e-5 * want, "shard = ", dpar::dist::shard_mode_name(mode),
               ": clip_grad_norm returned ", got, ", the global norm is ", want,
               " (libtorch's single-process clip_grad_norm_: ", single, ")");
    opt->step();
    const at::Tensor mine = flat_params(*net), ref = flat_params(*reference);
    const double rel = (mine - ref).abs().max().item<double>() / ref.abs().max().item<double>();
    DPAR_CHECK(rel <= 1e-5, "shard = ", dpar::dist::shard_mode_name(mode),
               ": the clipped step differs from the single process's by ", rel, " (relative)");
  }
  if (rank == 0) {
    std::printf(
        "torch_shard_worker: clip_grad_norm on %d ranks = %.6f, the single process's %.6f, in "
        "shard none, optimizer and gradients; the clipped steps agree\n",
        world, want, single);
  }
}

void check_save(const std::string& dir) {
  Net net = make_model();
  dt::DataParallel<Net> ddp(net, options_for(ShardMode::optimizer));
  auto opt = make_optimizer(ddp, "adamw");
  train_steps(ddp, *opt, 0, 5);
  dt::save_checkpoint(dir + "/model.ckpt", *net, nullptr);
  ddp.save_optimizer_state(*opt, dir + "/shards");
  if (dpar::dist::get_rank() == 0) {
    std::printf("torch_shard_worker: %d ranks saved %s/shards after 5 steps\n",
                dpar::dist::get_world_size(), dir.c_str());
  }
}

void check_resume(const std::string& dir, int steps) {
  auto resumed = [&](ShardMode mode) {
    Net net = make_model();
    dt::load_checkpoint(dir + "/model.ckpt", *net, nullptr);
    dt::DataParallel<Net> ddp(net, options_for(mode));
    auto opt = make_optimizer(ddp, "adamw");
    ddp.load_optimizer_state(opt, dir + "/shards");
    train_steps(ddp, *opt, 5, 5 + steps);
    // Every parameter carries five steps of AdamW state (a fresh state would count one).
    DPAR_CHECK(opt->state().size() == opt->param_groups().front().params().size(),
               "the resumed optimizer lacks state for some parameters");
    return flat_params(*net);
  };
  const at::Tensor reference = resumed(ShardMode::none);
  for (ShardMode mode : {ShardMode::optimizer, ShardMode::gradients}) {
    const at::Tensor got = resumed(mode);
    DPAR_CHECK(at::equal(got, reference), "resume with shard = ", dpar::dist::shard_mode_name(mode),
               " differs from the unsharded resume after ", steps, " steps");
  }
  check_same_on_every_rank(reference);
  if (dpar::dist::get_rank() == 0) {
    std::printf(
        "torch_shard_worker: resumed on %d ranks: shard gradients, optimizer and none, %d steps "
        "bitwise equal\n",
        dpar::dist::get_world_size(), steps);
  }
}

void check_kill_save(const std::string& dir) {
  Net net = make_model();
  dt::DataParallel<Net> ddp(net, options_for(ShardMode::gradients));
  auto opt = make_optimizer(ddp, "adamw");
  train_steps(ddp, *opt, 0, 3);
  ddp.save_optimizer_state(*opt, dir + "/set_a");
  train_steps(ddp, *opt, 3, 5);
  dpar::testing::save_sets_until_rank1_dies(
      dir, dpar::dist::get_rank(), dpar::dist::get_world_size(), 200,
      [&](const std::string& path) { ddp.save_optimizer_state(*opt, path); });
}

// The set kill-save left intact loads, into a job of another size.
void check_load(const std::string& dir) {
  Net net = make_model();
  dt::DataParallel<Net> ddp(net, options_for(ShardMode::optimizer));
  auto opt = make_optimizer(ddp, "adamw");
  ddp.load_optimizer_state(opt, dir + "/set_a");
  train_steps(ddp, *opt, 3, 4);  // the first backward applies the state; the step counts on
  for (const auto& [key, state] : opt->state()) {
    const auto& s = static_cast<const ::torch::optim::AdamWParamState&>(*state);
    DPAR_CHECK(s.step() == 4, "a slice's AdamW step count is ", s.step(), " after loading ",
               "set_a (3 steps) and one more step, expected 4");
  }
  if (dpar::dist::get_rank() == 0) {
    std::printf("torch_shard_worker: %d ranks loaded set_a: AdamW state of step 3\n",
                dpar::dist::get_world_size());
  }
}

// A plain libtorch optimizer over the slices never gathers them: the next forward says so.
void check_unattached() {
  Net net = make_model();
  dt::DataParallel<Net> ddp(net, options_for(ShardMode::optimizer));
  ::torch::optim::SGD opt(ddp.optimizer_parameters(), ::torch::optim::SGDOptions(0.1));
  train_steps(ddp, opt, 0, 2);
}

int body(int argc, char** argv) {
  dpar::Flags flags("torch_shard_worker", "sharded dpar::torch::DataParallel checks");
  auto& check = flags.add_string("check", "bitwise", "what to check (see the file's comment)");
  auto& opt = flags.add_string("opt", "adamw", "bitwise: sgd or adamw");
  auto& steps = flags.add_int("steps", 20, "bitwise: steps; resume: steps after the resume");
  auto& dir = flags.add_string("dir", "", "save, resume: the checkpoint folder");
  flags.parse(argc, argv, /*allow_positional=*/true);  // a marker for the test's process checks
  at::set_num_threads(1);
  dpar::set_num_threads(1);
  dpar::dist::init_parallel_env();
  const std::string what = check;
  if (what == "bitwise") {
    check_bitwise(opt, static_cast<int>(steps));
  } else if (what == "memory") {
    check_memory();
  } else if (what == "clip") {
    check_clip();
  } else if (what == "save") {
    check_save(dir);
  } else if (what == "resume") {
    check_resume(dir, static_cast<int>(steps));
  } else if (what == "kill-save") {
    check_kill_save(dir);
  } else if (what == "load") {
    check_load(dir);
  } else if (what == "unattached") {
    check_unattached();
  } else {
    DPAR_FAIL("--check must be bitwise, memory, clip, save, resume, kill-save, load or ",
              "unattached, got ", what);
  }
  dpar::dist::destroy();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dpar::run_main("torch_shard_worker", [&] { return body(argc, argv); });
}
