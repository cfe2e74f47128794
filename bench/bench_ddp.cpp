// Data-parallel training throughput: MobileNetV3-small 224x224, 2 ranks x 1 thread (--threads),
// batch 16 per rank, dpar DataParallel (Gloo) beside PyTorch DDP (gloo, channels-last, with an
// NCHW run beside it for reference) in the same invocation.
// Also reports scaling efficiency (2 ranks vs 2 x one process) and how much of each step's
// communication was hidden behind backward, and (--ceiling, on by default) what 2 independent
// processes without any communication reach together: the scaling this machine allows.
// Single process, independent processes and the collective job run in --rounds rounds, in
// alternating order, and the figures are medians over rounds of each round's ratios: on a
// shared machine the speed drifts by tens of percent within a minute, and a ratio of two runs
// made far apart measures the drift. Each run also reports CPU time per step (every thread of
// the process), so the CPU that communication costs on the shared cores is visible.
// (--lockstep, on by default) The independent processes also run waiting for each other after
// every step (bench/step_barrier.h), exchanging nothing: what stepping together costs on this
// machine, told apart from what DataParallel adds.
// (--cpu-bind cores, the default) Every rank of the collective jobs, every independent process
// and every rank of the PyTorch peer runs on its own share of the CPUs (dpar-launch
// --cpu_bind=cores; the peer binds its ranks to the same shares). Unbound: the one-process
// baselines (dpar's and the peer's), jobs whose shares would hold fewer CPUs than --threads,
// and everything under --ps.
//
// Run without arguments: the driver runs one process alone, then itself under dpar-launch
// with --worker, then the PyTorch peer (bench/peers/torch_ddp.py).
//
// --threads N gives every rank (and the single and independent processes, and the PyTorch
// peer) N intra-op threads: on a many-core machine, 2 ranks x 4 threads vs 4 ranks x 2.
// --device gpu trains on the GPU: every rank on GPU --gpu-index (ranks sharing one GPU talk
// over NCCL's socket transport, each with its own NCCL_HOSTID; -1: the launcher's GPU per
// rank), the collectives on dpar's NCCL group, the peer PyTorch DDP with nccl the same way.
//
// --ps adds the same training loop as a sync parameter-server job in the same invocation:
// itself under `dpar-launch --run_mode=ps --server_num=2 --trainer_num=<world>`, each trainer
// calling ps::ParameterServerTrainer::step(batch) instead of optimizer.step() (the servers run
// the same SGD), and prints its img/s beside the collective (DataParallel) figure and the ratio
// ps/collective.
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include "bench_ddp_shard.h"
#include "bench_util.h"
#include "cpu_binding.h"
#include "dpar/distributed/data_parallel.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/dpar.h"
#include "dpar/optim/adamw.h"
#include "dpar/ps/ps.h"
#include "dpar/tensor/allocator.h"
#include "model/mobilenet_v3.h"
#include "step_barrier.h"

using namespace dpar;
using bench::read_step_result;
using bench::run_shard_bench;
using bench::ShardBench;
using bench::StepResult;
using bench::write_step_result;

namespace {

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

// What a run trains: the model, the optimizer and DataParallel's sharding (--model, --opt,
// --shard; the defaults are the classic bench's MobileNetV3-small with SGD, unsharded).
struct TrainSetup {
  std::string model = "mobilenet_v3_small";
  std::string opt = "sgd";
  dist::ShardMode shard = dist::ShardMode::none;
  bool overlap_gather = true;
  // Called after every step, warm-up included, with the step's index (the lockstep ceiling's
  // barrier).
  std::function<void(int64_t)> after_step;
};

StepResult run_training(int64_t batch, int64_t img, int64_t warmup, int64_t steps, int seed,
                        double bucket_mb, DType comm_dtype, Device device,
                        const TrainSetup& setup) {
  manual_seed(0);
  auto model = models::mobilenet_v3(setup.model, 1000);
  model->train();
  model->to(device);
  dist::DataParallelOptions dp_options;
  if (bucket_mb > 0) dp_options.comm_buffer_size = bucket_mb;
  dp_options.comm_dtype = comm_dtype;
  dp_options.shard = setup.shard;
  dp_options.overlap_gather = setup.overlap_gather;
  dist::DataParallel dp(model, dp_options);
  std::shared_ptr<optim::Optimizer> opt;
  if (setup.opt == "adamw") {
    opt = dp.make_optimizer<optim::AdamW>(optim::AdamWOptions{.lr = 1e-3, .weight_decay = 1e-2});
  } else {
    DPAR_CHECK(setup.opt == "sgd", "bench_ddp: --opt must be sgd or adamw, got ", setup.opt);
    opt = dp.make_optimizer<optim::SGD>(
        optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .weight_decay = 4e-5});
  }
  const auto [host_x, host_y] = bench::random_batch(batch, img, 1000, static_cast<uint64_t>(seed),
                                                    MemoryFormat::ChannelsLast);
  const Tensor x = host_x.to(device), y = host_y.to(device);
  StepResult r;
  auto step = [&] {
    opt->zero_grad();
    cross_entropy(dp.forward(x), y).backward();
    opt->step();
  };
  auto finished = [&](int64_t i) {
    if (setup.after_step) setup.after_step(i);
  };
  for (int64_t i = 0; i < warmup; ++i) {
    step();
    finished(i);
  }
  if (device.is_cuda()) synchronize(device);
  dist::barrier();
  // The steady state's peak: the first iteration reduces whole buckets (it learns their order).
  Allocator& allocator = allocator_for(device);
  allocator.reset_peak_stats();
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    step();
    finished(warmup + i);
    const auto stats = dp.last_comm_stats();
    r.comm_seconds += stats.comm_seconds;
    r.exposed_seconds += stats.exposed_seconds;
    r.gather_wait_seconds += stats.gather_wait_seconds;
  }
  if (device.is_cuda()) synchronize(device);  // the GPU has finished every step
  r.cpu_seconds = (process_cpu_seconds() - cpu0) / static_cast<double>(steps);
  // The job's speed is the slowest rank's.
  Tensor elapsed =
      Tensor::from_vector(std::vector<float>{static_cast<float>(bench::seconds_since(t0))}, {1});
  if (dist::get_world_size() > 1)
    dist::default_group().allreduce({elapsed}, dist::ReduceOp::Max, /*async_op=*/false);
  r.seconds_per_step = elapsed.item() / static_cast<double>(steps);
  r.comm_seconds /= static_cast<double>(steps);
  r.exposed_seconds /= static_cast<double>(steps);
  r.gather_wait_seconds /= static_cast<double>(steps);
  const dist::ShardMemory memory = dp.memory_stats();
  r.parameter_bytes = memory.parameters;
  r.gradient_bytes = memory.gradients;
  r.optimizer_state_bytes = memory.optimizer_state;
  r.peak_bytes = allocator.stats().peak_allocated_bytes;
  return r;
}

// One trainer of the sync parameter-server job: the loop above with
// ParameterServerTrainer::step(batch) in place of DataParallel + optimizer.step(). Returns this
// trainer's seconds per step; comm_seconds is its push + pull time per step (the pull includes
// waiting for the other trainers' gradients and the servers' optimizer step).
StepResult run_ps_training(int64_t batch, int64_t img, int64_t warmup, int64_t steps) {
  manual_seed(0);
  auto model = models::mobilenet_v3_small(1000);
  model->train();
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 4e-5});
  ps::TrainerOptions options;
  options.mode = ps::Mode::kSync;
  options.log = [](const std::string&) {};
  ps::ParameterServerTrainer trainer(*model, opt, ps::env_from_environment(), options);
  const auto [x, y] =
      bench::random_batch(batch, img, 1000, static_cast<uint64_t>(trainer.trainer_id() + 1),
                          MemoryFormat::ChannelsLast);
  auto step = [&] {
    opt.zero_grad();
    cross_entropy(model->forward(x), y).backward();
    trainer.step(batch);
  };
  // Sync steps keep the trainers in lockstep, so after the warm-up they start together.
  for (int64_t i = 0; i < warmup; ++i) step();
  const ps::TrainerStats before = trainer.stats();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  StepResult r;
  r.seconds_per_step = bench::seconds_since(t0) / static_cast<double>(steps);
  const ps::TrainerStats& after = trainer.stats();
  r.comm_seconds =
      (after.push_seconds - before.push_seconds + after.pull_seconds - before.pull_seconds) /
      static_cast<double>(steps);
  r.exposed_seconds = r.comm_seconds;  // nothing overlaps backward in ps mode
  trainer.finish();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("bench_ddp", [&] {
    Flags flags("bench_ddp", "MobileNetV3-small data-parallel training: dpar vs PyTorch DDP");
    auto& world = flags.add_int("world", 2, "ranks");
    auto& threads = flags.add_int("threads", 1, "intra-op threads per rank (and per process)");
    auto& device_name = flags.add_string("device", "cpu", "cpu or gpu");
    auto& gpu_index = flags.add_int(
        "gpu-index", 0, "--device gpu: every rank on this GPU (-1: the launcher's GPU per rank)");
    auto& batch = flags.add_int("batch", 16, "images per rank per step");
    auto& img = flags.add_int("img", 224, "image side");
    auto& warmup = flags.add_int("warmup", 2, "untimed steps");
    auto& steps = flags.add_int("steps", 5, "timed steps");
    auto& peer = flags.add_bool("peer", true, "also run the PyTorch DDP peer");
    auto& worker = flags.add_bool("worker", false, "internal: run as one rank under dpar-launch");
    auto& solo = flags.add_bool("solo", false,
                                "internal: under dpar-launch, train alone (no communication)");
    auto& rounds = flags.add_int(
        "rounds", 3, "rounds of (one process, independent processes, collective job); medians");
    auto& ceiling = flags.add_bool("ceiling", true,
                                   "also time <world> independent processes at once: what this "
                                   "machine allows for scaling without any communication");
    auto& lockstep = flags.add_bool(
        "lockstep", true,
        "with --ceiling: also time them waiting for each other after every step (no data), as "
        "a synchronous job's ranks do: the cost of stepping together on this machine");
    auto& lockstep_segment = flags.add_string(
        "lockstep-segment", "", "internal (--solo): the lockstep barrier's shared-memory segment");
    auto& result = flags.add_string("result", "", "internal: where rank 0 writes its figures");
    auto& launcher = flags.add_string("launcher", DPAR_LAUNCHER, "dpar-launch binary");
    auto& cpu_bind_flag = flags.add_string(
        "cpu-bind", "cores",
        "none, or cores: each rank of the collective jobs, the independent processes and the "
        "PyTorch DDP peer on its own share of the CPUs (dpar-launch --cpu_bind)");
    auto& port = flags.add_int("start-port", 29300, "dpar-launch --start_port");
    auto& bucket_mb = flags.add_double(
        "bucket-mb", 0, "DataParallel comm_buffer_size in MB (0: the default, 25 MB after 1 MB)");
    auto& comm_dtype_name = flags.add_string(
        "comm-dtype", "f32", "DataParallel comm_dtype: f32, bf16 or f16 (compressed gradients)");
    auto& with_ps =
        flags.add_bool("ps", false, "also run the loop as a sync parameter-server job and compare");
    auto& ps_servers = flags.add_int("ps-servers", 2, "--ps: parameter servers");
    auto& ps_port = flags.add_int("ps-start-port", 0,
                                  "--ps: dpar-launch --start_port of the servers (0: free ports)");
    auto& ps_pairs =
        flags.add_int("ps-pairs", 3, "--ps: (collective, ps) job pairs, alternating; medians");
    auto& shard_name = flags.add_string(
        "shard", "",
        "none, optimizer or gradients: compare DataParallel with this sharding against unsharded "
        "(img/s, memory per rank at --memory-worlds) instead of the classic bench");
    auto& model_name =
        flags.add_string("model", "mobilenet_v3_small", "mobilenet_v3_small or mobilenet_v3_large");
    auto& opt_name = flags.add_string("opt", "sgd", "sgd (momentum) or adamw");
    auto& overlap_gather = flags.add_bool(
        "overlap-gather", true, "internal (--shard): the all-gather overlaps the next forward");
    auto& memory_worlds = flags.add_string("memory-worlds", "1,2,4",
                                           "--shard: the world sizes of the memory-per-rank table");
    flags.parse(argc, argv);
    TrainSetup setup;
    setup.model = model_name;
    setup.opt = opt_name;
    if (!shard_name.empty()) setup.shard = dist::parse_shard_mode(shard_name);
    setup.overlap_gather = overlap_gather;
    DPAR_CHECK(ps_pairs >= 1 && ps_servers >= 1 && rounds >= 1,
               "bench_ddp: --ps-pairs, --ps-servers and --rounds must be >= 1");
    DPAR_CHECK(threads >= 1 && world >= 1, "bench_ddp: --threads and --world must be >= 1");
    DPAR_CHECK(device_name == "cpu" || device_name == "gpu", "bench_ddp: --device=", device_name,
               ": expected cpu or gpu");
    set_num_threads(static_cast<int>(threads));
    const bool gpu = device_name == "gpu";
    // The device of this process: for a rank under the launcher, its GPU when --gpu-index -1.
    auto this_device = [&] {
      if (!gpu) return Device::cpu();
      const char* assigned = std::getenv("DPAR_DEVICE");
      const Device d = gpu_index >= 0 ? Device::cuda(static_cast<int>(gpu_index))
                       : assigned != nullptr && std::string(assigned).rfind("gpu:", 0) == 0
                           ? Device::parse(assigned)
                           : Device::cuda(0);
      check_device_available(d);
      return d;
    };
    if (gpu && gpu_index >= 0) {
      // Ranks sharing one GPU reach each other over NCCL's socket transport on loopback.
      setenv("NCCL_SOCKET_IFNAME", "lo", 0);
      setenv("NCCL_P2P_DISABLE", "1", 0);
      setenv("NCCL_SHM_DISABLE", "1", 0);
      setenv("NCCL_IB_DISABLE", "1", 0);
    }
    DType comm_dtype = DType::f32;
    if (comm_dtype_name == "bf16") {
      comm_dtype = DType::bf16;
    } else if (comm_dtype_name == "f16") {
      comm_dtype = DType::f16;
    } else if (comm_dtype_name != "f32") {
      throw FlagError("bench_ddp: --comm-dtype=" + comm_dtype_name + ": expected f32, bf16 or f16");
    }
    std::string cpu_bind = cpu_bind_flag;
    if (cpu_bind != "none" && cpu_bind != "cores") {
      throw FlagError("bench_ddp: --cpu-bind=" + cpu_bind + ": expected none or cores");
    }
    const auto allowed = static_cast<int64_t>(launch::allowed_cpus().size());
    if (cpu_bind == "cores" && !worker && !solo && world * threads > allowed) {
      std::printf(
          "  --cpu-bind cores: %lld ranks x %lld threads on %lld CPUs, so every process runs "
          "unbound\n",
          static_cast<long long>(world), static_cast<long long>(threads),
          static_cast<long long>(allowed));
      cpu_bind = "none";
    }
    if (cpu_bind == "cores" && !worker && !solo && with_ps) {
      // dpar-launch places ps jobs unbound; the collective job it is compared with runs alike.
      std::printf("  --cpu-bind cores: not with --ps (ps jobs run unbound), so no job is bound\n");
      cpu_bind = "none";
    }

    if (worker && ps::is_server()) {
      ps::init_server();
      ps::run_server();
      return 0;
    }
    if (worker && ps::is_worker()) {
      const StepResult r = run_ps_training(batch, img, warmup, steps);
      const std::string path =
          result + ".trainer" + std::to_string(ps::env_from_environment().trainer_id);
      std::ofstream(path) << r.seconds_per_step << " " << r.comm_seconds << "\n";
      return 0;
    }
    if (solo) {  // one of <world> independent processes: no init_parallel_env, no collectives
      const char* rank_variable = std::getenv("DPAR_RANK");
      const std::string rank = rank_variable ? rank_variable : "0";
      const char* world_variable = std::getenv("DPAR_WORLD_SIZE");
      TrainSetup solo_setup = setup;
      std::unique_ptr<bench::StepBarrier> barrier;
      if (!lockstep_segment.empty()) {
        barrier = std::make_unique<bench::StepBarrier>(
            lockstep_segment, world_variable ? std::atoi(world_variable) : 1, std::stoi(rank));
        solo_setup.after_step = [&](int64_t i) { barrier->arrive(i); };
      }
      // dpar-launch started this process as a rank, but it trains alone (a world-of-one
      // DataParallel, so that its step costs what a rank's does less the communication):
      // forget the launcher's rank variables, or DataParallel takes it for a rank that forgot
      // init_parallel_env() and refuses to train.
      for (const char* name : {"DPAR_RANK", "DPAR_WORLD_SIZE", "RANK", "WORLD_SIZE",
                               "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM"}) {
        unsetenv(name);
      }
      const StepResult r = run_training(batch, img, warmup, steps, 1, bucket_mb, comm_dtype,
                                        this_device(), solo_setup);
      std::ofstream(result + ".solo" + rank) << r.seconds_per_step << " " << r.cpu_seconds << "\n";
      return 0;
    }
    if (worker) {
      dist::init_parallel_env();
      if (gpu && gpu_index >= 0) {
        const std::string host = "dpar-bench-host-" + std::to_string(dist::get_rank());
        setenv("NCCL_HOSTID", host.c_str(), 1);  // before the first collective makes the comm
      }
      const StepResult r = run_training(batch, img, warmup, steps, dist::get_rank() + 1, bucket_mb,
                                        comm_dtype, this_device(), setup);
      if (dist::get_rank() == 0) write_step_result(result, r);
      dist::destroy();
      return 0;
    }

    // The three runs: one process alone (the scaling baseline), world ranks under dpar-launch,
    // and (--ceiling) world independent single processes at once, started like the ranks.
    auto run_job = [](const std::string& cmd, const std::string& what) {
      const int status = std::system(cmd.c_str());
      DPAR_CHECK(status == 0, "bench_ddp: the ", what, " run failed (status ", status, "): ", cmd);
    };
    auto run_single = [&] {
      return run_training(batch, img, warmup, steps, 1, bucket_mb, comm_dtype, this_device(),
                          setup);
    };
    const std::string result_file = "/tmp/bench_ddp_" + std::to_string(getpid()) + ".txt";
    const std::string device_args = " --threads " + std::to_string(threads) + " --device " +
                                    device_name + " --gpu-index " + std::to_string(gpu_index);
    const std::string worker_args =
        " --worker --result " + result_file + " --batch " + std::to_string(batch) + " --img " +
        std::to_string(img) + " --bucket-mb " + std::to_string(bucket_mb) + " --comm-dtype " +
        comm_dtype_name + device_args + " --model " + model_name + " --opt " + opt_name;
    const std::string timing_args =
        " --warmup " + std::to_string(warmup) + " --steps " + std::to_string(steps);
    // How a job of `ranks` processes is placed: bound (--cpu-bind cores) where the share
    // dpar-launch gives each has --threads CPUs, else unbound (the shard bench's memory runs at
    // 4 ranks on 2 cores). Its PyTorch peer is bound alike: each rank to the same share.
    auto shares_for = [&](int64_t ranks) {
      std::vector<std::vector<int>> shares;
      if (cpu_bind != "cores" || ranks * threads > allowed) return shares;
      const std::vector<int> cpus = launch::allowed_cpus();
      shares = launch::cpu_shares(cpus, launch::core_ids(cpus), static_cast<int>(ranks));
      for (const auto& share : shares) {
        if (static_cast<int64_t>(share.size()) < threads) return std::vector<std::vector<int>>();
      }
      return shares;
    };
    auto bind_for = [&](int64_t ranks) {
      return shares_for(ranks).empty() ? std::string("none") : std::string("cores");
    };
    auto peer_bind_args = [&](int64_t ranks) {
      std::string args;
      const auto shares = shares_for(ranks);
      // append(), not +: GCC 12 warns falsely (-Wrestrict) about operator+ on these strings.
      for (size_t r = 0; r < shares.size(); ++r) {
        args.append(r > 0 ? "/" : " --cpu-shares ").append(launch::cpu_list_text(shares[r]));
      }
      return args;
    };
    // A collective job of `ranks` ranks; shard: DataParallel's sharding there.
    auto run_job_with = [&](int64_t ranks, dist::ShardMode shard, bool overlap, int64_t job_warmup,
                            int64_t job_steps) {
      const std::string cmd =
          launcher + " --nproc_per_node=" + std::to_string(ranks) +
          " --cpu_bind=" + bind_for(ranks) + " --start_port=" + std::to_string(port) +
          " --log_dir=/tmp/bench_ddp_log_" + std::to_string(getpid()) + " " + std::string(argv[0]) +
          worker_args + " --shard " + dist::shard_mode_name(shard) +
          " --overlap-gather=" + (overlap ? "true" : "false") + " --warmup " +
          std::to_string(job_warmup) + " --steps " + std::to_string(job_steps) + " > /dev/null";
      run_job(cmd, std::to_string(ranks) + "-rank");
      const StepResult r = read_step_result(result_file);
      std::remove(result_file.c_str());
      return r;
    };
    auto run_collective = [&] { return run_job_with(world, setup.shard, true, warmup, steps); };
    if (!shard_name.empty()) {
      ShardBench bench;
      bench.model = model_name;
      bench.opt = opt_name;
      bench.shard = setup.shard;
      bench.world = world;
      bench.threads = threads;
      bench.batch = batch;
      bench.img = img;
      bench.warmup = warmup;
      bench.steps = steps;
      bench.rounds = rounds;
      bench.memory_worlds = memory_worlds;
      bench.peer = peer;
      bench.peer_bind_args = peer_bind_args(world);
      bench.run = run_job_with;
      return run_shard_bench(bench);
    }
    // The machine's own limit for scaling (shared cores, caches and memory bandwidth) before
    // any communication is added: summed img/s and the mean CPU per step of the processes.
    struct Independent {
      double images_per_s = 0;
      double cpu_seconds = 0;
    };
    // lockstep: the processes wait for each other after every step (bench/step_barrier.h).
    auto run_independent = [&](bool lockstep) {
      std::optional<bench::StepBarrierSegment> segment;
      if (lockstep) segment.emplace(static_cast<int>(world));
      const std::string cmd =
          launcher + " --nproc_per_node=" + std::to_string(world) +
          " --cpu_bind=" + bind_for(world) + " --start_port=" + std::to_string(port) +
          " --log_dir=/tmp/bench_ddp_solo_log_" + std::to_string(getpid()) + " " +
          bench::self_path() + " --solo --result " + result_file + " --batch " +
          std::to_string(batch) + " --img " + std::to_string(img) + " --warmup " +
          std::to_string(warmup) + " --steps " + std::to_string(steps) + device_args + " --model " +
          model_name + " --opt " + opt_name +
          (segment ? " --lockstep-segment " + segment->name() : std::string()) + " > /dev/null";
      run_job(cmd, lockstep ? "lockstep-processes" : "independent-processes");
      Independent out;
      for (int64_t r = 0; r < world; ++r) {
        const std::string path = result_file + ".solo" + std::to_string(r);
        double seconds = 0, cpu = 0;
        std::ifstream in(path);
        DPAR_CHECK(static_cast<bool>(in >> seconds >> cpu) && seconds > 0, "bench_ddp: process ", r,
                   " left no result in ", path);
        std::remove(path.c_str());
        out.images_per_s += static_cast<double>(batch) / seconds;
        out.cpu_seconds += cpu / static_cast<double>(world);
      }
      return out;
    };
    // (--ps) The same loop as a sync parameter-server job: world trainers + ps_servers
    // servers. The job's speed is the slowest trainer's.
    auto run_ps = [&] {
      const int first_port = ps_port > 0 ? static_cast<int>(ps_port)
                                         : bench::pick_free_ports(static_cast<int>(ps_servers));
      const std::string cmd = launcher +
                              " --run_mode=ps --server_num=" + std::to_string(ps_servers) +
                              " --trainer_num=" + std::to_string(world) +
                              " --ips=127.0.0.1 --start_port=" + std::to_string(first_port) +
                              " --log_dir=/tmp/bench_ddp_ps_log_" + std::to_string(getpid()) + " " +
                              bench::self_path() + worker_args + timing_args + " > /dev/null";
      run_job(cmd, "parameter-server");
      StepResult slowest;
      for (int64_t t = 0; t < world; ++t) {
        const std::string path = result_file + ".trainer" + std::to_string(t);
        StepResult r;
        std::ifstream in(path);
        DPAR_CHECK(static_cast<bool>(in >> r.seconds_per_step >> r.comm_seconds),
                   "bench_ddp: trainer ", t, " left no result in ", path);
        std::remove(path.c_str());
        if (r.seconds_per_step > slowest.seconds_per_step) slowest = r;
      }
      return slowest;
    };
    auto images_per_s = [&](const StepResult& r) {
      return static_cast<double>(world * batch) / r.seconds_per_step;
    };

    // Rounds in alternating order (single, independent free and in lockstep, collective; then
    // the reverse), so that no run always comes first and drift lands on every kind of run.
    std::vector<double> single_ips, multi_ips, independent_ips, scaling, limit, reach;
    std::vector<double> lockstep_ips, lockstep_limit, lockstep_reach;
    std::vector<double> comm_ms, exposed_ms, single_cpu_ms, multi_cpu_ms, independent_cpu_ms;
    StepResult last_multi;
    for (int64_t round = 0; round < rounds; ++round) {
      StepResult single, multi;
      Independent independent, together;
      auto run_multi = [&] { multi = run_collective(); };
      auto run_alone = [&] { single = run_single(); };
      auto run_ceiling = [&] {
        const bool free_first = round % 2 == 0;
        if (ceiling && lockstep && !free_first) together = run_independent(true);
        if (ceiling) independent = run_independent(false);
        if (ceiling && lockstep && free_first) together = run_independent(true);
      };
      if (round % 2 == 0) {
        run_alone();
        run_ceiling();
        run_multi();
      } else {
        run_multi();
        run_ceiling();
        run_alone();
      }
      last_multi = multi;
      const double one = static_cast<double>(batch) / single.seconds_per_step;
      single_ips.push_back(one);
      multi_ips.push_back(images_per_s(multi));
      scaling.push_back(multi_ips.back() / (static_cast<double>(world) * one));
      comm_ms.push_back(multi.comm_seconds * 1e3);
      exposed_ms.push_back(multi.exposed_seconds * 1e3);
      single_cpu_ms.push_back(single.cpu_seconds * 1e3);
      multi_cpu_ms.push_back(multi.cpu_seconds * 1e3);
      if (ceiling) {
        independent_ips.push_back(independent.images_per_s);
        independent_cpu_ms.push_back(independent.cpu_seconds * 1e3);
        limit.push_back(independent.images_per_s / (static_cast<double>(world) * one));
        reach.push_back(multi_ips.back() / independent.images_per_s);
      }
      if (ceiling && lockstep) {
        lockstep_ips.push_back(together.images_per_s);
        lockstep_limit.push_back(together.images_per_s / independent.images_per_s);
        lockstep_reach.push_back(multi_ips.back() / together.images_per_s);
      }
    }
    auto list = [](const std::vector<double>& v, const char* format) {
      std::string text;
      char buf[32];
      for (double x : v) {
        std::snprintf(buf, sizeof buf, format, x);
        if (!text.empty()) text += ' ';
        text += buf;
      }
      return text;
    };
    const double comm = bench::median(comm_ms), exposed = bench::median(exposed_ms);
    const double dpar_ips = bench::median(multi_ips);

    std::printf(
        "bench_ddp: mobilenet_v3_small %lldpx, %lld ranks x %lld thread(s) on %s, batch %lld per "
        "rank, %lld timed steps, %lld rounds (medians; per round in brackets), gradients as %s\n",
        static_cast<long long>(img), static_cast<long long>(world), static_cast<long long>(threads),
        gpu ? (gpu_index >= 0 ? ("cuda:" + std::to_string(gpu_index) + " (shared)").c_str()
                              : "one GPU per rank")
            : "cpu",
        static_cast<long long>(batch), static_cast<long long>(steps),
        static_cast<long long>(rounds), comm_dtype_name.c_str());
    std::printf(
        "  dpar     %8.2f img/s with %lld ranks | one process %7.2f img/s | scaling efficiency "
        "%.3f [%s]\n",
        dpar_ips, static_cast<long long>(world), bench::median(single_ips), bench::median(scaling),
        list(scaling, "%.3f").c_str());
    std::printf(
        "           communication per step %.1f ms, of which %.1f ms exposed after backward: "
        "%.0f%% hidden\n",
        comm, exposed, comm > 0 ? 100.0 * (1.0 - exposed / comm) : 0.0);
    std::printf("           CPU per step and process: one process %.1f ms, dpar rank 0 %.1f ms",
                bench::median(single_cpu_ms), bench::median(multi_cpu_ms));
    if (ceiling) std::printf(", independent %.1f ms", bench::median(independent_cpu_ms));
    std::printf("\n");
    if (ceiling) {
      std::printf(
          "  machine  %8.2f img/s from %lld independent processes (no communication): ceiling "
          "%.3f [%s]; dpar reaches %.0f%% of it [%s]\n",
          bench::median(independent_ips), static_cast<long long>(world), bench::median(limit),
          list(limit, "%.3f").c_str(), 100.0 * bench::median(reach), list(reach, "%.2f").c_str());
    }
    if (ceiling && lockstep) {
      std::printf(
          "  lockstep %8.2f img/s from them waiting for each other after every step (no data): "
          "%.3f of the ceiling [%s]; dpar reaches %.0f%% of it [%s]\n",
          bench::median(lockstep_ips), bench::median(lockstep_limit),
          list(lockstep_limit, "%.3f").c_str(), 100.0 * bench::median(lockstep_reach),
          list(lockstep_reach, "%.2f").c_str());
    }
    std::fflush(stdout);
    nlohmann::json json = {{"bench", "bench_ddp"},
                           {"img", img},
                           {"batch", batch},
                           {"ranks", world},
                           {"steps", steps},
                           {"rounds", rounds},
                           {"dpar_img_per_s", dpar_ips},
                           {"single_img_per_s", bench::median(single_ips)},
                           {"scaling", bench::median(scaling)}};
    if (ceiling) {
      json["independent_img_per_s"] = bench::median(independent_ips);
      json["ceiling"] = bench::median(limit);
    }
    if (ceiling && lockstep) {
      json["lockstep_img_per_s"] = bench::median(lockstep_ips);
      json["lockstep_of_ceiling"] = bench::median(lockstep_limit);
      json["dpar_of_lockstep"] = bench::median(lockstep_reach);
    }
    if (with_ps) {
      // Pairs of (collective, ps) jobs in ABBA order, so neither mode always runs first and a
      // burst of other work on the machine lands on both; the first collective job is the one
      // above.
      std::vector<double> coll_ips{images_per_s(last_multi)}, ps_ips, ratio;
      std::vector<StepResult> ps_runs;
      for (int64_t pair = 0; pair < ps_pairs; ++pair) {
        if (pair > 0 && pair % 2 == 0) coll_ips.push_back(images_per_s(run_collective()));
        ps_runs.push_back(run_ps());
        ps_ips.push_back(images_per_s(ps_runs.back()));
        if (pair % 2 == 1) coll_ips.push_back(images_per_s(run_collective()));
        ratio.push_back(ps_ips.back() / coll_ips.back());
      }
      double ps_comm = 0;
      for (const StepResult& r : ps_runs)
        ps_comm += r.comm_seconds / static_cast<double>(ps_runs.size());
      std::printf(
          "  --ps: %lld collective and %lld parameter-server jobs, alternating (ABBA), medians:\n",
          static_cast<long long>(coll_ips.size()), static_cast<long long>(ps_ips.size()));
      std::printf("  collective %8.2f img/s  (DataParallel, %lld ranks; per job:",
                  bench::median(coll_ips), static_cast<long long>(world));
      for (double v : coll_ips) std::printf(" %.1f", v);
      std::printf(
          ")\n  dpar ps    %8.2f img/s  (sync ParameterServerTrainer::step, %lld trainers + %lld "
          "servers; per job:",
          bench::median(ps_ips), static_cast<long long>(world), static_cast<long long>(ps_servers));
      for (double v : ps_ips) std::printf(" %.1f", v);
      std::printf(
          ")\n             push + pull %.1f ms per step, all after backward (the pull waits for "
          "every trainer)\n",
          ps_comm * 1e3);
      std::printf("  ratio ps/collective: %.2fx (median of the pairs' ratios; target >= 0.80)\n",
                  bench::median(ratio));
      json["collective_img_per_s"] = bench::median(coll_ips);
      json["ps_img_per_s"] = bench::median(ps_ips);
      json["ps_servers"] = ps_servers;
      json["ratio_ps_collective"] = bench::median(ratio);
    }
    if (peer) {
      // The peer is PyTorch DDP channels-last (model and input: its fastest documented setting
      // for a convolutional network, on the CPU and with cudnn.benchmark on the GPU); DDP in
      // NCHW runs beside it for reference.
      auto run_torch = [&](bool channels_last) {
        return bench::run_peer(
            "torch_ddp.py",
            "--world " + std::to_string(world) + " --batch " + std::to_string(batch) + " --img " +
                std::to_string(img) + " --warmup " + std::to_string(warmup) + " --steps " +
                std::to_string(steps) + " --threads " + std::to_string(threads) +
                (gpu ? " --device cuda --gpu-index " + std::to_string(gpu_index) : std::string()) +
                (channels_last ? " --channels-last" : "") + peer_bind_args(world),
            static_cast<int>(threads));
      };
      const auto p = run_torch(/*channels_last=*/true);
      const auto n = run_torch(/*channels_last=*/false);
      const double theirs = p.at("img_per_s").get<double>();
      const char* backend = gpu ? "nccl" : "gloo";
      std::printf(
          "  pytorch  %8.2f img/s with %lld ranks | one process %7.2f img/s | scaling efficiency "
          "%.3f (DDP, %s, channels-last)\n",
          theirs, static_cast<long long>(world), p.at("single_img_per_s").get<double>(),
          p.at("scaling").get<double>(), backend);
      std::printf(
          "  pytorch  %8.2f img/s with %lld ranks | one process %7.2f img/s | scaling efficiency "
          "%.3f (DDP, %s, NCHW, for reference: dpar/this %.2fx)\n",
          n.at("img_per_s").get<double>(), static_cast<long long>(world),
          n.at("single_img_per_s").get<double>(), n.at("scaling").get<double>(), backend,
          dpar_ips / n.at("img_per_s").get<double>());
      std::printf("  ratio dpar/pytorch channels-last (%lld ranks): %.2fx\n",
                  static_cast<long long>(world), dpar_ips / theirs);
      json["pytorch_img_per_s"] = theirs;
      json["pytorch_nchw_img_per_s"] = n.at("img_per_s").get<double>();
      json["ratio_dpar_pytorch"] = dpar_ips / theirs;
    }
    std::printf("%s\n", json.dump().c_str());
    return 0;
  });
}
