// Run under dpar-launch. Sharded DataParallel (shard = optimizer / gradients) against unsharded
// DataParallel on MobileNetV3-small, in real processes (each rank's allocator is its own):
//   --check bitwise: the same steps (plain, no_sync accumulation, unequal local batches) with
//       shard none, optimizer and gradients give bitwise equal weights, equal on every rank;
//   --check memory: gradient and optimizer-state bytes per rank (memory_stats and the
//       allocator) are about 1/N of unsharded, plus at most one bucket;
//   --check clip: optim::clip_grad_norm on the sharded optimizer returns the norm a single
//       process computes on the concatenated batch, and clips the same step;
//   --check save --dir D: 5 AdamW steps sharded (optimizer), then D/model.safetensors, the
//       shard set D/shards, and the unsharded run's optimizer state D/full.safetensors;
//   --check resume --dir D: on any number of ranks, the next --steps steps after loading D's
//       optimizer state are bitwise equal whether the state comes from the shard set or the
//       unsharded file, into a sharded (gradients, optimizer) or unsharded job;
//   --check kill-save --dir D: saves D/set_a, then rank 1 dies (SIGKILL) while one of
//       D/set_b_0, set_b_1, ... is being written (launch/kill_during_saves.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/optimizer_shards.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"
#include "dpar/io/safetensors.h"
#include "dpar/nn/weights.h"
#include "dpar/optim/clip_grad.h"
#include "dpar/tensor/allocator.h"
#include "launch/kill_during_saves.h"        // tests/
#include "mobilenetv3/model/mobilenet_v3.h"  // examples/

using namespace dpar;
using namespace dpar::dist;

namespace {

constexpr int64_t kClasses = 10;
constexpr int64_t kImage = 32;

std::shared_ptr<nn::Module> make_model() {
  manual_seed(7);  // the same initial weights in every process and for every mode
  return models::mobilenet_v3_small(kClasses, /*dropout=*/0.0);
}

// Rank r's micro-batch m of step s (n samples), the same in every process.
std::pair<Tensor, Tensor> batch(int rank, int step, int micro, int64_t n) {
  Generator gen(5000 + 101 * static_cast<uint64_t>(rank) + 17 * static_cast<uint64_t>(step) +
                static_cast<uint64_t>(micro));
  std::vector<float> x(static_cast<size_t>(n * 3 * kImage * kImage));
  for (float& v : x) v = gen.normal();
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (auto& v : y) v = static_cast<int64_t>(gen.next_u64() % kClasses);
  return {Tensor::from_vector(x, {n, 3, kImage, kImage}), Tensor::from_vector(y, {n})};
}

std::shared_ptr<optim::Optimizer> make_optimizer(DataParallel& dp, const std::string& name) {
  if (name == "sgd") {
    return dp.make_optimizer<optim::SGD>(
        optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  }
  DPAR_CHECK(name == "adamw", "--opt must be sgd or adamw, got ", name);
  return dp.make_optimizer<optim::AdamW>(optim::AdamWOptions{.lr = 1e-3, .weight_decay = 1e-2});
}

std::vector<float> flat_params(nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    const auto v = p.to_float_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

DataParallelOptions options_for(ShardMode mode, double bucket_mb) {
  DataParallelOptions o;
  o.shard = mode;
  o.comm_buffer_size = bucket_mb;  // several buckets: uneven slices at 3 ranks
  o.last_comm_buffer_size = bucket_mb / 5;
  return o;
}

struct Trained {
  std::vector<float> weights;
  ShardMemory memory;
  size_t allocated = 0;  // allocator bytes over the model's own, after the last step
  size_t largest_bucket = 0;
  size_t buckets = 0;
};

// steps of: plain; every 3rd a no_sync micro-batch first; every 4th unequal local batches.
Trained train(ShardMode mode, const std::string& opt_name, int steps, double bucket_mb) {
  auto model = make_model();
  Allocator& allocator = allocator_for(Device::cpu());
  const size_t before = allocator.stats().allocated_bytes;
  DataParallel dp(model, options_for(mode, bucket_mb));
  auto opt = make_optimizer(dp, opt_name);
  const int rank = get_rank();
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    if (s % 3 == 2) {
      auto guard = dp.no_sync();
      auto [x, y] = batch(rank, s, 1, 2);
      mul(cross_entropy(dp.forward(x), y), 0.5).backward();
    }
    const bool unequal = s % 4 == 3;
    auto [x, y] = batch(rank, s, 0, unequal ? 2 + rank : 2);
    Tensor out = unequal ? dp.forward(x, x.size(0)) : dp.forward(x);
    mul(cross_entropy(out, y), s % 3 == 2 ? 0.5 : 1.0).backward();
    opt->step();
  }
  Trained t;
  t.memory = dp.memory_stats();
  t.allocated = allocator.stats().allocated_bytes - before;
  for (const auto& b : dp.buckets()) t.largest_bucket = std::max(t.largest_bucket, b.bytes);
  t.buckets = dp.buckets().size();
  t.weights = flat_params(*model);
  return t;
}

void check_bitwise(const std::string& opt_name, int steps, double bucket_mb) {
  const int rank = get_rank(), world = get_world_size();
  const Trained none = train(ShardMode::none, opt_name, steps, bucket_mb);
  for (ShardMode mode : {ShardMode::optimizer, ShardMode::gradients}) {
    const Trained sharded = train(mode, opt_name, steps, bucket_mb);
    DPAR_CHECK(sharded.weights.size() == none.weights.size(), "parameter counts differ");
    size_t differing = 0;
    for (size_t i = 0; i < none.weights.size(); ++i) {
      differing += std::memcmp(&none.weights[i], &sharded.weights[i], sizeof(float)) != 0;
    }
    DPAR_CHECK(differing == 0, "rank ", rank, ": shard = ", shard_mode_name(mode), " differs from ",
               "shard = none in ", differing, " of ", none.weights.size(), " weights after ", steps,
               " steps (", opt_name, ")");
  }
  // Every rank holds rank 0's weights, bit for bit.
  Tensor mine = Tensor::from_vector(none.weights, {static_cast<int64_t>(none.weights.size())});
  Tensor zeros = Tensor::zeros(mine.shape());
  Tensor theirs = rank == 0 ? mine.clone() : zeros;
  default_group().broadcast({theirs}, 0, /*async_op=*/false);
  DPAR_CHECK(std::memcmp(theirs.data<float>(), mine.data<float>(), mine.nbytes()) == 0, "rank ",
             rank, "'s weights differ from rank 0's");
  if (rank == 0) {
    std::printf(
        "shard_worker: %d ranks, %s, %d steps (no_sync and unequal batches included): shard "
        "optimizer and gradients bitwise equal to shard none, on every rank\n",
        world, opt_name.c_str(), steps);
  }
}

void check_memory(const std::string& opt_name, int steps, double bucket_mb) {
  const int world = get_world_size();
  const Trained none = train(ShardMode::none, opt_name, steps, bucket_mb);
  const double n = world;
  const double mb = 1024.0 * 1024.0;
  // Each bucket's slice rounds up to one 64-byte block per rank.
  const double rounding = 64.0 * static_cast<double>(none.buckets);
  for (ShardMode mode : {ShardMode::optimizer, ShardMode::gradients}) {
    const Trained s = train(mode, opt_name, steps, bucket_mb);
    const double grads = static_cast<double>(none.memory.gradients);
    const double state = static_cast<double>(none.memory.optimizer_state);
    const double state_bound = state / n + 2 * rounding;
    DPAR_CHECK(static_cast<double>(s.memory.optimizer_state) <= state_bound,
               "shard = ", shard_mode_name(mode), ": optimizer state ", s.memory.optimizer_state,
               " bytes per rank, more than 1/", world, " of ", state);
    // optimizer: the whole gradient buckets stay, plus the averaged slice; gradients: the
    // buckets are released after their reduce-scatter, only the slice stays.
    const double grad_bound = (mode == ShardMode::optimizer ? grads : 0.0) + grads / n + rounding;
    DPAR_CHECK(static_cast<double>(s.memory.gradients) <= grad_bound,
               "shard = ", shard_mode_name(mode), ": gradients ", s.memory.gradients,
               " bytes per rank, expected at most ", grad_bound);
    // The allocator agrees: what the run holds beyond the model is its gradients and state
    // (one bucket of slack for what a step leaves in flight).
    const double held = static_cast<double>(s.allocated);
    const double expected = static_cast<double>(s.memory.gradients + s.memory.optimizer_state);
    DPAR_CHECK(held <= expected + static_cast<double>(none.largest_bucket) + 1e5,
               "shard = ", shard_mode_name(mode), ": the allocator holds ", held,
               " bytes, expected about ", expected);
    if (get_rank() == 0) {
      std::printf(
          "shard_worker: %d ranks, %s: shard %s per rank: gradients %.2f MB (none %.2f), "
          "optimizer state %.2f MB (none %.2f), allocator %.2f MB over the model (none %.2f)\n",
          world, opt_name.c_str(), shard_mode_name(mode),
          static_cast<double>(s.memory.gradients) / mb, grads / mb,
          static_cast<double>(s.memory.optimizer_state) / mb, state / mb, held / mb,
          static_cast<double>(none.allocated) / mb);
    }
  }
}

void check_clip(double bucket_mb) {
  const int rank = get_rank(), world = get_world_size();
  // Eval-mode BN: the gradient of the mean loss over the concatenated batch is the average of
  // the ranks' gradients exactly (up to rounding).
  auto reference = make_model();
  reference->eval();
  std::vector<Tensor> xs, ys;
  for (int r = 0; r < world; ++r) {
    auto [x, y] = batch(r, 0, 0, 2);
    xs.push_back(x);
    ys.push_back(y);
  }
  cross_entropy(reference->forward(cat(xs, 0)), cat(ys, 0)).backward();
  const std::vector<Tensor> ref_params = reference->parameters();
  double squares = 0;  // in double, element by element
  for (const auto& p : ref_params) {
    for (float g : p.grad().to_float_vector()) squares += static_cast<double>(g) * g;
  }
  const double want = std::sqrt(squares);
  const double max_norm = want / 4;  // clipping engages
  const double single = optim::clip_grad_norm(ref_params, max_norm);
  DPAR_CHECK(std::abs(single - want) <= 1e-5 * want, "single process: clip_grad_norm returned ",
             single, ", the norm is ", want);
  optim::SGD ref_opt(ref_params, {.lr = 0.5});
  ref_opt.step();
  const std::vector<float> ref_weights = flat_params(*reference);

  for (ShardMode mode : {ShardMode::none, ShardMode::optimizer, ShardMode::gradients}) {
    // Twice, so that the second backward runs on the final (rebuilt) layout.
    for (int iteration = 0; iteration < 2; ++iteration) {
      auto model = make_model();
      model->eval();
      DataParallel dp(model, options_for(mode, bucket_mb));
      auto opt = dp.make_optimizer<optim::SGD>(optim::SGDOptions{.lr = 0.5});
      if (iteration == 1) {  // a step of lr 0 settles the layout without changing a weight
        opt->set_lr(0);
        auto [x, y] = batch(rank, 1, 0, 2);
        cross_entropy(dp.forward(x), y).backward();
        opt->step();
        opt->zero_grad();
        opt->set_lr(0.5);
      }
      auto [x, y] = batch(rank, 0, 0, 2);
      cross_entropy(dp.forward(x), y).backward();
      const double norm = optim::clip_grad_norm(*opt, max_norm);
      DPAR_CHECK(std::abs(norm - want) <= 1e-5 * want, "shard = ", shard_mode_name(mode),
                 ": clip_grad_norm returned ", norm, " on rank ", rank,
                 ", the norm of the "
                 "concatenated batch is ",
                 want);
      opt->step();
      const std::vector<float> got = flat_params(*model);
      double worst = 0, scale = 1e-12;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(got[i] - ref_weights[i])));
        scale = std::max(scale, static_cast<double>(std::abs(ref_weights[i])));
      }
      DPAR_CHECK(worst / scale <= 1e-5, "shard = ", shard_mode_name(mode),
                 ": the clipped step differs from the single process's by ", worst / scale);
    }
  }
  if (rank == 0) {
    std::printf(
        "shard_worker: %d ranks: clip_grad_norm = %.6g (single process on the concatenated "
        "batch %.6g) for shard none, optimizer and gradients\n",
        world, want, single);
  }
}

// AdamW steps [first, first + steps) on DataParallel (the batches depend on rank and step).
void adamw_steps(DataParallel& dp, optim::Optimizer& opt, int first, int steps) {
  for (int s = first; s < first + steps; ++s) {
    opt.zero_grad();
    auto [x, y] = batch(get_rank(), s, 0, 2);
    cross_entropy(dp.forward(x), y).backward();
    opt.step();
  }
}

std::shared_ptr<optim::Optimizer> adamw(DataParallel& dp) {
  return dp.make_optimizer<optim::AdamW>(optim::AdamWOptions{.lr = 1e-3, .weight_decay = 1e-2});
}

void check_save(const std::string& dir, double bucket_mb) {
  std::filesystem::create_directories(dir);
  {
    auto model = make_model();
    DataParallel dp(model, options_for(ShardMode::optimizer, bucket_mb));
    auto opt = adamw(dp);
    adamw_steps(dp, *opt, 0, 5);
    if (get_rank() == 0) nn::save_weights(*model, dir + "/model.safetensors");
    dp.save_optimizer_state(*opt, dir + "/shards");
  }
  auto model = make_model();
  DataParallel dp(model, options_for(ShardMode::none, bucket_mb));
  auto opt = adamw(dp);
  adamw_steps(dp, *opt, 0, 5);
  if (get_rank() == 0) io::save_safetensors(dir + "/full.safetensors", opt->state_dict());
  if (get_rank() == 0) {
    std::printf("shard_worker: %d ranks saved %s/shards and the unsharded state\n",
                get_world_size(), dir.c_str());
  }
}

void check_resume(const std::string& dir, const std::string& shards, int steps, double bucket_mb) {
  const optim::StateDict full = io::load_safetensors(dir + "/full.safetensors").tensors;
  // One resumed run: the model from D, the optimizer state from `source`.
  auto resumed = [&](ShardMode mode, bool from_shards) {
    auto model = make_model();
    nn::load_weights(*model, dir + "/model.safetensors");
    DataParallel dp(model, options_for(mode, bucket_mb));
    auto opt = adamw(dp);
    const OptimizerLayout whole = whole_parameter_layout(model->named_parameters());
    dp.load_optimizer_state(opt, [&](const OptimizerLayout& layout) {
      return from_shards ? read_optimizer_shards(shards, layout, opt->name())
                         : slice_optimizer_state(full, whole, layout);
    });
    adamw_steps(dp, *opt, 100, steps);
    return flat_params(*model);
  };
  const std::vector<float> reference = resumed(ShardMode::none, /*from_shards=*/false);
  const struct {
    ShardMode mode;
    bool from_shards;
  } runs[] = {{ShardMode::gradients, true},
              {ShardMode::optimizer, true},
              {ShardMode::none, true},
              {ShardMode::gradients, false}};
  for (const auto& run : runs) {
    const std::vector<float> got = resumed(run.mode, run.from_shards);
    DPAR_CHECK(std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)) == 0,
               "resume with shard = ", shard_mode_name(run.mode), " from ",
               run.from_shards ? "the shard set" : "the unsharded state",
               " differs from the unsharded resume after ", steps, " steps");
  }
  if (get_rank() == 0) {
    std::printf(
        "shard_worker: resumed on %d ranks from %s: shard gradients, optimizer and none, from "
        "the shard set or the unsharded state: %d steps bitwise equal to the unsharded resume\n",
        get_world_size(), shards.c_str(), steps);
  }
}

// Loads a shard set into a 3-rank sharded job and takes one step: the deferred load happens
// at the end of the first backward; AdamW's step counts say which step the set was saved at.
void check_load(const std::string& shards, double bucket_mb) {
  auto model = make_model();
  DataParallel dp(model, options_for(ShardMode::gradients, bucket_mb));
  auto opt = adamw(dp);
  dp.load_optimizer_state(opt, [&](const OptimizerLayout& layout) {
    return read_optimizer_shards(shards, layout, opt->name());
  });
  // Saved before the first backward applied it: the loaded state is what goes out (a resumed
  // run that checkpoints before it trains keeps its optimizer state).
  const std::string resaved = shards + "_resaved";
  dp.save_optimizer_state(*opt, resaved);
  const OptimizerLayout whole = whole_parameter_layout(model->named_parameters());
  const optim::StateDict a = read_optimizer_shards(shards, whole, "AdamW");
  const optim::StateDict b = read_optimizer_shards(resaved, whole, "AdamW");
  DPAR_CHECK(!a.empty() && a.size() == b.size(), "the re-saved set has ", b.size(), " entries, ",
             shards, " has ", a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    DPAR_CHECK(
        a[i].first == b[i].first && a[i].second.to_float_vector() == b[i].second.to_float_vector(),
        "the re-saved set differs from ", shards, " at ", a[i].first);
  }
  adamw_steps(dp, *opt, 0, 1);
  int64_t step = -1;
  for (const auto& [key, t] : opt->state_dict()) {
    if (key.rfind("step.", 0) == 0) {
      const auto s = static_cast<int64_t>(t.item());
      DPAR_CHECK(step < 0 || step == s, "slices disagree on the step: ", step, " and ", s);
      step = s;
    }
  }
  DPAR_CHECK(step >= 1, "no step count after loading ", shards);
  if (get_rank() == 0) {
    std::printf("shard_worker: %d ranks loaded %s: AdamW state of step %lld\n", get_world_size(),
                shards.c_str(), static_cast<long long>(step - 1));
  }
}

void check_kill_save(const std::string& dir, double bucket_mb) {
  auto model = make_model();
  DataParallel dp(model, options_for(ShardMode::gradients, bucket_mb));
  auto opt = adamw(dp);
  adamw_steps(dp, *opt, 0, 3);
  dp.save_optimizer_state(*opt, dir + "/set_a");
  adamw_steps(dp, *opt, 3, 2);
  dpar::testing::save_sets_until_rank1_dies(
      dir, get_rank(), get_world_size(), 200,
      [&](const std::string& path) { dp.save_optimizer_state(*opt, path); });
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("shard_worker", [&] {
    Flags flags("shard_worker", "sharded DataParallel against unsharded (run under dpar-launch)");
    auto& check = flags.add_string("check", "bitwise", "bitwise, memory or clip");
    auto& opt_name = flags.add_string("opt", "sgd", "sgd (momentum) or adamw");
    auto& steps = flags.add_int("steps", 20, "optimizer steps");
    auto& bucket_mb = flags.add_double("bucket-mb", 0.5, "comm_buffer_size in MB");
    auto& dir = flags.add_string("dir", "", "save, resume, kill-save: the checkpoint folder");
    auto& shards = flags.add_string("shards", "", "resume: the shard set (default <dir>/shards)");
    flags.parse(argc, argv, /*allow_positional=*/true);
    set_num_threads(1);
    init_parallel_env();
    if (check == "bitwise") {
      check_bitwise(opt_name, static_cast<int>(steps), bucket_mb);
    } else if (check == "memory") {
      check_memory(opt_name, static_cast<int>(steps), bucket_mb);
    } else if (check == "clip") {
      check_clip(bucket_mb);
    } else if (check == "save" || check == "resume" || check == "kill-save" || check == "load") {
      if (dir.empty()) throw FlagError("shard_worker: --check " + check + " needs --dir");
      if (check == "save") check_save(dir, bucket_mb);
      if (check == "resume") {
        check_resume(dir, shards.empty() ? dir + "/shards" : shards, static_cast<int>(steps),
                     bucket_mb);
      }
      if (check == "kill-save") check_kill_save(dir, bucket_mb);
      if (check == "load") check_load(shards, bucket_mb);
    } else {
      throw FlagError(
          "shard_worker: --check must be bitwise, memory, clip, save, resume, "
          "kill-save or load, got " +
          check);
    }
    destroy();
    return 0;
  });
}
