// Run under dpar-launch. Trains a small libtorch CNN with dpar::torch::DataParallel on
// rank-specific data and checks (1) parameters are bitwise equal on every rank and (2) they
// match, within 1e-6 relative, one process training the same model on the concatenation of
// all ranks' batches. Modes (--mode):
//   plain      the above
//   no_sync    gradient accumulation: 2 micro-batches per step, the first under no_sync()
//   unequal    rank r has 3+2r samples (forward_weighted: sample-weighted average)
//   bf16       gradients travel as bf16 (comm_dtype): equal across ranks, within bf16's
//              precision of the reference
//   buckets    tiny buckets, modules registered in another order than they run: the buckets
//              are rebuilt in the observed gradient-ready order (the head's first)
//   unused     a registered layer the forward never uses: an error naming it, unless
//              --find-unused (then it keeps its initial value and the rest trains)
//   mismatch   rank 1 builds a wider model: construction fails naming the parameter
//   buffers    a model with BatchNorm, each rank on its own batches: after the first eval
//              forward through DataParallel every rank holds rank 0's running statistics
//              (broadcast_buffers); with --no-broadcast-buffers they stay each rank's own
//   mixed      dpar's own DataParallel on a dpar model and dpar::torch's on a libtorch model,
//              interleaved on the same default group
//   checkpoint rank 0 saves after --save-at steps; a fresh model and optimizer restored from
//              it and trained on reach bitwise the weights of the uninterrupted run
//   die        --die-rank SIGKILLs itself at --die-step
//   detail     rank 1 all-reduces a libtorch tensor of another shape (run with
//              DPAR_DEBUG=DETAIL: the cross-rank check names both shapes)
//   timeout    rank 1 skips an all-reduce of a libtorch tensor (run with a short DPAR_TIMEOUT:
//              rank 0's error names the op and the timeout)
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "dpar/core/flags.h"
#include "dpar/distributed/data_parallel.h"
#include "dpar/dpar.h"
#include "dpar/torch.h"

namespace dt = dpar::torch;
namespace nn = ::torch::nn;

namespace {

struct NetImpl : nn::Module {
  // head_first: the head is registered before the convolutions it follows, so the reverse
  // registration order is not the order gradients become ready.
  NetImpl(int64_t width, bool head_first, bool with_unused) {
    if (head_first) head = register_module("head", nn::Linear(width, 5));
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, width, 3).padding(1)));
    conv2 = register_module("conv2",
                            nn::Conv2d(nn::Conv2dOptions(width, width, 3).stride(2).padding(1)));
    if (!head_first) head = register_module("head", nn::Linear(width, 5));
    if (with_unused) unused = register_module("unused", nn::Linear(width, 5));
  }
  at::Tensor forward(at::Tensor x) {
    x = ::torch::relu(conv1(x));
    x = ::torch::relu(conv2(x));
    x = ::torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return head(x);
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::Linear head{nullptr}, unused{nullptr};
};
TORCH_MODULE(Net);

Net make_model(int64_t width, bool head_first = false, bool with_unused = false) {
  ::torch::manual_seed(42);  // same initial weights on every rank and in the reference
  return Net(width, head_first, with_unused);
}

int64_t batch_of(int rank, bool unequal) { return unequal ? 3 + 2 * rank : 4; }

// Rank r's micro-batch m of step s, generated identically on every process.
std::pair<at::Tensor, at::Tensor> batch(int rank, int step, int micro, bool unequal) {
  const int64_t n = batch_of(rank, unequal);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 97 * rank + 13 * step + micro);
  return {at::randn({n, 3, 8, 8}, gen), at::randint(0, 5, {n}, gen)};
}

// Without weight decay when a layer is unused: its zero gradient would otherwise still move it
// (dpar's find_unused_parameters counts an unused parameter's gradient as zero).
::torch::optim::SGD make_sgd(nn::Module& m, bool decay = true) {
  return ::torch::optim::SGD(
      m.parameters(),
      ::torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(decay ? 1e-4 : 0.0));
}

at::Tensor flat_params(const nn::Module& m) {
  std::vector<at::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return at::cat(parts);
}

void check_equal_across_ranks(const at::Tensor& mine, int world, const char* what) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(at::empty_like(mine));
  dt::all_gather(all, mine);
  for (int r = 0; r < world; ++r) {
    DPAR_CHECK(at::equal(all[static_cast<size_t>(r)], mine), what, ": rank ", r,
               "'s parameters differ bitwise from rank ", dpar::dist::get_rank(), "'s");
  }
}

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(want.abs().max().item<double>(), 1e-12);
}

void die_now(int rank, int step) {
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::printf("rank %d: killing myself with SIGKILL at step %d (epoch ms %lld)\n", rank, step,
              static_cast<long long>(now_ms));
  std::fflush(stdout);
  std::raise(SIGKILL);
}

struct Run {
  std::string mode;
  int steps = 3;
  int rank = 0, world = 1;
  bool find_unused = false;
  int die_rank = -1, die_step = 1;
};

// Trains `steps` SGD steps of the wrapped model on this rank's data.
void train(const Run& run, dt::DataParallel<Net>& ddp, ::torch::optim::SGD& opt, int first_step,
           int last_step) {
  const bool unequal = run.mode == "unequal";
  const int micro_batches = run.mode == "no_sync" ? 2 : 1;
  for (int s = first_step; s < last_step; ++s) {
    if (run.rank == run.die_rank && s == run.die_step) die_now(run.rank, s);
    opt.zero_grad();
    for (int m = 0; m < micro_batches; ++m) {
      auto [x, y] = batch(run.rank, s, m, unequal);
      auto step = [&] {
        at::Tensor out = unequal ? ddp.forward_weighted(x.size(0), x) : ddp.forward(x);
        (::torch::nn::functional::cross_entropy(out, y) / micro_batches).backward();
      };
      if (m + 1 < micro_batches) {
        auto guard = ddp.no_sync();
        step();
      } else {
        step();
      }
    }
    opt.step();
  }
}

// The single-process reference: the same model trained on the concatenated batches.
at::Tensor reference(const Run& run) {
  const bool unequal = run.mode == "unequal";
  const int micro_batches = run.mode == "no_sync" ? 2 : 1;
  Net ref = make_model(8, run.mode == "buckets", run.mode == "unused");
  auto opt = make_sgd(*ref, run.mode != "unused");
  for (int s = 0; s < run.steps; ++s) {
    opt.zero_grad();
    for (int m = 0; m < micro_batches; ++m) {
      std::vector<at::Tensor> xs, ys;
      for (int r = 0; r < run.world; ++r) {
        auto [x, y] = batch(r, s, m, unequal);
        xs.push_back(x);
        ys.push_back(y);
      }
      (::torch::nn::functional::cross_entropy(ref->forward(at::cat(xs)), at::cat(ys)) /
       micro_batches)
          .backward();
    }
    opt.step();
  }
  return flat_params(*ref);
}

// dpar's own DataParallel beside the libtorch one, on the same group, steps interleaved.
void mixed(const Run& run) {
  dpar::manual_seed(7);
  auto own = std::make_shared<dpar::nn::Sequential>();
  own->push_back(std::make_shared<dpar::nn::Linear>(6, 4));
  own->push_back(std::make_shared<dpar::nn::ReLU>());
  own->push_back(std::make_shared<dpar::nn::Linear>(4, 3));
  dpar::dist::DataParallel own_dp(own);
  dpar::optim::SGD own_opt(own->parameters(), {.lr = 0.1});
  Net net = make_model(8);
  dt::DataParallel ddp(net);
  auto opt = make_sgd(*net);
  for (int s = 0; s < run.steps; ++s) {
    dpar::Generator gen(500 + static_cast<uint64_t>(run.rank) * 31 + static_cast<uint64_t>(s));
    std::vector<float> xv(24);
    for (float& v : xv) v = gen.normal();
    own_opt.zero_grad();
    dpar::mean(own_dp.forward(dpar::Tensor::from_vector(xv, {4, 6}))).backward();
    own_opt.step();
    train(run, ddp, opt, s, s + 1);
  }
  std::vector<float> own_flat;
  for (const auto& p : own->parameters()) {
    auto v = p.to_float_vector();
    own_flat.insert(own_flat.end(), v.begin(), v.end());
  }
  // dpar's parameters travel as a libtorch tensor: both kinds on the one group.
  check_equal_across_ranks(at::tensor(own_flat), run.world, "dpar's own DataParallel");
  check_equal_across_ranks(flat_params(*net), run.world, "dpar::torch::DataParallel");
}

int body(int argc, char** argv) {
  dpar::Flags flags("torch_ddp_worker", "dpar::torch::DataParallel checks (run under dpar-launch)");
  auto& mode = flags.add_string("mode", "plain", "what to check (see the file's comment)");
  auto& steps = flags.add_int("steps", 3, "SGD steps");
  auto& find_unused = flags.add_bool("find-unused", false, "find_unused_parameters");
  auto& no_broadcast_buffers =
      flags.add_bool("no-broadcast-buffers", false, "buffers mode: broadcast_buffers = false");
  auto& die_rank = flags.add_int("die-rank", -1, "this rank SIGKILLs itself at --die-step");
  auto& die_step = flags.add_int("die-step", 1, "step at which --die-rank dies");
  auto& save_at = flags.add_int("save-at", 2, "checkpoint mode: the step saved after");
  auto& dir = flags.add_string("dir", "", "checkpoint mode: where the checkpoint goes");
  flags.parse(argc, argv, /*allow_positional=*/true);  // a marker for the test's process checks
  at::set_num_threads(1);
  dpar::set_num_threads(1);
  dpar::dist::init_parallel_env();
  Run run;
  run.mode = mode;
  run.steps = static_cast<int>(steps);
  run.rank = dpar::dist::get_rank();
  run.world = dpar::dist::get_world_size();
  run.find_unused = find_unused;
  run.die_rank = static_cast<int>(die_rank);
  run.die_step = static_cast<int>(die_step);

  if (run.mode == "detail" || run.mode == "timeout") {
    at::Tensor t = at::ones({run.mode == "detail" && run.rank == 1 ? 999 : 1000});
    if (!(run.mode == "timeout" && run.rank == 1)) dt::all_reduce(t);
    dt::barrier();
    std::printf("rank %d: drill finished without error\n", run.rank);
    return 0;
  }

  if (run.mode == "buffers") {
    ::torch::manual_seed(3);
    nn::Sequential bn_net(nn::Conv2d(nn::Conv2dOptions(3, 4, 3)), nn::BatchNorm2d(4));
    dt::DataParallelOptions options;
    options.broadcast_buffers = !no_broadcast_buffers;
    dt::DataParallel ddp(bn_net, options);
    for (int s = 0; s < run.steps; ++s) ddp.forward(batch(run.rank, s, 0, false).first);
    bn_net->eval();
    ddp.forward(batch(run.rank, 0, 0, false).first);  // the first eval forward after training
    const auto& bn = *bn_net[1]->as<nn::BatchNorm2d>();
    const at::Tensor stats = at::cat({bn.running_mean, bn.running_var});
    std::vector<at::Tensor> all{at::empty_like(stats), at::empty_like(stats)};
    dt::all_gather(all, stats);
    const bool same = at::equal(all[0], all[1]);
    DPAR_CHECK(same == !no_broadcast_buffers, "running statistics ", same ? "equal" : "different",
               " across ranks with broadcast_buffers ", !no_broadcast_buffers);
    if (run.rank == 0) {
      std::printf("torch_ddp_worker: buffers: running statistics %s across ranks\n",
                  same ? "bitwise equal (rank 0's)" : "each rank's own");
    }
    dpar::dist::destroy();
    return 0;
  }

  if (run.mode == "mixed") {
    mixed(run);
    if (run.rank == 0) std::printf("torch_ddp_worker: mixed: both bitwise equal across ranks\n");
    dpar::dist::destroy();
    return 0;
  }

  const int64_t width = run.mode == "mismatch" && run.rank == 1 ? 9 : 8;
  Net net = make_model(width, run.mode == "buckets", run.mode == "unused");
  dt::DataParallelOptions options;
  if (run.mode == "buckets") {
    options.comm_buffer_size = 0.002;
    options.last_comm_buffer_size = 0.0005;
  }
  if (run.mode == "bf16") options.comm_dtype = dpar::DType::bf16;
  options.find_unused_parameters = run.find_unused;
  dt::DataParallel ddp(net, options);
  auto opt = make_sgd(*net, run.mode != "unused");
  const at::Tensor initial = flat_params(*net);

  if (run.mode == "checkpoint") {
    const std::string path = std::string(dir) + "/torch.ckpt";
    train(run, ddp, opt, 0, static_cast<int>(save_at));
    dpar::io::TrainingState state;
    state.global_step = save_at;
    dt::save_checkpoint(path, *net, &opt, state);
    train(run, ddp, opt, static_cast<int>(save_at), run.steps);
    const at::Tensor uninterrupted = flat_params(*net);
    Net fresh = make_model(width);
    ::torch::manual_seed(999);  // the restore must bring back the generator, too
    auto fresh_opt = make_sgd(*fresh);
    const auto restored = dt::load_checkpoint(path, *fresh, &fresh_opt);
    DPAR_CHECK(restored.global_step == save_at, "restored global_step ", restored.global_step);
    dt::DataParallel fresh_ddp(fresh);
    train(run, fresh_ddp, fresh_opt, static_cast<int>(restored.global_step), run.steps);
    DPAR_CHECK(at::equal(flat_params(*fresh), uninterrupted),
               "the resumed run's weights differ from the uninterrupted run's");
    if (run.rank == 0) {
      std::printf("torch_ddp_worker: checkpoint: resumed at step %lld, bitwise equal\n",
                  static_cast<long long>(save_at));
    }
    dpar::dist::destroy();
    return 0;
  }

  train(run, ddp, opt, 0, run.steps);
  const at::Tensor mine = flat_params(*net);
  check_equal_across_ranks(mine, run.world, "dpar::torch::DataParallel");
  const double rel = relative_error(mine, reference(run));
  const double tolerance = run.mode == "bf16" ? 1e-2 : 1e-6;
  DPAR_CHECK(rel <= tolerance, "parameters differ from the single-process reference: relative ",
             "error ", rel, " > ", tolerance);
  DPAR_CHECK(run.mode != "bf16" || rel > 0, "bf16: the parameters equal the f32 reference");
  if (run.mode == "unused") {
    DPAR_CHECK(at::equal(net->unused->weight.detach().flatten(),
                         initial.slice(0, mine.size(0) - 45, mine.size(0) - 5)),
               "the unused layer's weight changed");
  }
  if (run.mode == "buckets") {
    const auto buckets = ddp.buckets();
    DPAR_CHECK(buckets.front().parameter_names.front().rfind("head.", 0) == 0,
               "after the rebuild the first bucket starts with ",
               buckets.front().parameter_names.front(), ", not the head's gradients");
  }
  if (run.rank == 0) {
    const auto stats = ddp.last_comm_stats();
    std::printf(
        "torch_ddp_worker: %s on %d ranks, %d steps: bitwise equal across ranks, relative error "
        "%.2e vs single process; %s; communication %.3f ms, %.3f ms exposed\n",
        run.mode.c_str(), run.world, run.steps, rel, ddp.bucket_summary().c_str(),
        stats.comm_seconds * 1e3, stats.exposed_seconds * 1e3);
  }
  dpar::dist::destroy();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dpar::run_main("torch_ddp_worker", [&] { return body(argc, argv); });
}
