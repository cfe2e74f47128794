// One GPU, dpar beside PyTorch in the same invocation: MobileNetV3-small 224x224 training
// throughput (SGD momentum, random data) at each --batches size, peak GPU memory per training
// step (dpar's allocator peak vs torch.cuda.max_memory_allocated), and eval-mode forward
// latency at --infer-batches. The peer (bench/peers/torch_gpu.py) runs eager with
// channels_last and cudnn.benchmark = True, and torch.compile where it works. Training runs in
// each of --precisions: fp32, fp16 (autocast + GradScaler on both sides) and bf16 (autocast).
// --optim also times the optimizer step alone, multi-tensor kernels against per-parameter ones.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "bench_util.h"
#include "dpar/core/cuda_profiler.h"
#include "dpar/dpar.h"
#include "dpar/optim/adamw.h"
#include "dpar/optim/sgd.h"
#include "model/mobilenet_v3.h"

using namespace dpar;

namespace {

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

// Runs fn once with every op timed on the device (the profiler waits for the GPU at each op's
// start and end) and prints where that time went, op by op.
template <typename Fn>
void print_op_profile(const std::string& title, Fn&& fn) {
  profiler::reset();
  profiler::set_enabled(true);
  fn();
  profiler::set_enabled(false);
  std::printf("  profile of one %s (device time per op, synchronised):\n%s", title.c_str(),
              profiler::report().c_str());
}

// Runs fn once between cudaProfilerStart and cudaProfilerStop, unsynchronised as in the timed
// loop, so that `ncu --profile-from-start off` times exactly one step's (or forward's) kernels.
template <typename Fn>
void run_captured(Device gpu, Fn&& fn) {
  synchronize(gpu);
  set_cuda_profiler_capture(true);
  fn();
  synchronize(gpu);
  set_cuda_profiler_capture(false);
}

struct Report {
  bool profile = false;  // one step op by op, synchronised (DPAR_PROFILE)
  bool capture = false;  // one step between cudaProfilerStart/Stop (for ncu)
};

struct TrainResult {
  double img_per_s = 0, ms_per_step = 0, peak_mb = 0;
};

TrainResult train_throughput(Device gpu, int64_t batch, int64_t img, int64_t warmup, int64_t steps,
                             const std::string& precision, const Report& report) {
  manual_seed(0);
  auto model = models::mobilenet_v3_small(1000);
  model->train();
  model->to(gpu);
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 4e-5});
  auto [xc, yc] = bench::random_batch(batch, img, 1000, 1);
  // Channels-last images, as the peer gives its model (the layout dpar's GPU convolutions run
  // in): an NCHW batch would be laid out again at every step, and that copy kept for backward.
  const Tensor x = xc.to(gpu).contiguous(MemoryFormat::ChannelsLast), y = yc.to(gpu);
  const bool amp = precision != "fp32";
  amp::GradScaler scaler({.enabled = precision == "fp16"});
  auto step = [&] {
    opt.zero_grad();
    Tensor loss;
    {
      amp::Autocast autocast(precision == "bf16" ? DType::bf16 : DType::f16, amp);
      loss = cross_entropy(model->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  synchronize(gpu);
  Allocator& alloc = allocator_for(gpu);
  alloc.reset_peak_stats();  // the timed steps' peak, as the peer's reset_peak_memory_stats
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  synchronize(gpu);
  const double s = bench::seconds_since(t0) / static_cast<double>(steps);
  const TrainResult result{static_cast<double>(batch) / s, s * 1e3,
                           static_cast<double>(alloc.stats().peak_allocated_bytes) / 1048576.0};
  if (report.profile) {
    print_op_profile(precision + " step at batch " + std::to_string(batch), step);
  }
  if (report.capture) run_captured(gpu, step);
  return result;
}

double forward_latency_ms(Device gpu, int64_t batch, int64_t img, int64_t warmup, int64_t steps,
                          const Report& report) {
  manual_seed(0);
  auto model = models::mobilenet_v3_small(1000);
  model->eval();
  model->to(gpu);
  NoGradGuard no_grad;
  const Tensor x = bench::random_batch(batch, img, 1000, 2)
                       .images.to(gpu)
                       .contiguous(MemoryFormat::ChannelsLast);
  for (int64_t i = 0; i < warmup; ++i) model->forward(x);
  synchronize(gpu);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) model->forward(x);
  synchronize(gpu);
  const double ms = bench::seconds_since(t0) / static_cast<double>(steps) * 1e3;
  if (report.profile) {
    print_op_profile("eval forward at batch " + std::to_string(batch), [&] { model->forward(x); });
  }
  if (report.capture) run_captured(gpu, [&] { model->forward(x); });
  return ms;
}

// Milliseconds per optimizer step over MobileNetV3-small's parameters (gradients set once),
// with the multi-tensor kernels (one launch per step) or one launch per parameter.
double optimizer_step_ms(Device gpu, const std::string& which, bool multi, int64_t warmup,
                         int64_t steps) {
  manual_seed(0);
  auto model = models::mobilenet_v3_small(1000);
  model->to(gpu);
  std::vector<Tensor> params = model->parameters();
  for (Tensor& p : params) p.set_grad(Tensor::full(p.shape(), 1e-3, DType::f32, gpu));
  std::unique_ptr<optim::Optimizer> opt;
  if (which == "SGD") {
    opt = std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
  } else {
    opt = std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 1e-3});
  }
  opt->set_multi_tensor(multi);
  for (int64_t i = 0; i < warmup; ++i) opt->step();
  synchronize(gpu);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) opt->step();
  synchronize(gpu);
  return bench::seconds_since(t0) / static_cast<double>(steps) * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("bench_gpu", [&] {
    Flags flags("bench_gpu", "MobileNetV3-small on one GPU: dpar vs PyTorch");
    auto& device = flags.add_string("device", "gpu:0", "the GPU");
    auto& batches = flags.add_string("batches", "128,256", "training batch sizes");
    auto& precisions =
        flags.add_string("precisions", "fp32,fp16,bf16", "training precisions: fp32, fp16, bf16");
    auto& infer_batches = flags.add_string("infer-batches", "1,64", "inference batch sizes");
    auto& img = flags.add_int("img", 224, "image side");
    auto& warmup = flags.add_int("warmup", 5, "untimed steps");
    auto& steps = flags.add_int("steps", 20, "timed steps");
    auto& peer = flags.add_bool("peer", true, "also run the PyTorch peer");
    auto& compile = flags.add_bool("compile", true, "the peer also times torch.compile");
    auto& optim_step = flags.add_bool(
        "optim", true, "time the optimizer step alone: multi-tensor vs per parameter");
    auto& profile =
        flags.add_bool("profile", false,
                       "after each measurement, one step or forward timed op by op (DPAR_PROFILE)");
    auto& capture =
        flags.add_bool("capture", false,
                       "after each measurement, one step or forward between cudaProfilerStart and "
                       "cudaProfilerStop (for ncu --profile-from-start off)");
    flags.parse(argc, argv);
    const Report report{.profile = profile, .capture = capture};
    const Device gpu = Device::parse(device);
    check_device_available(gpu);
    // The peer needs the GPU machine's PyTorch: the python3 on PATH unless told otherwise.
    setenv("DPAR_PEER_PYTHON", "python3", /*overwrite=*/0);
    std::printf("bench_gpu: mobilenet_v3_small %lldpx, %lld timed steps | %s\n",
                static_cast<long long>(img), static_cast<long long>(steps),
                cuda_device_summary(gpu).c_str());
    const std::string common = " --img " + std::to_string(img) + " --warmup " +
                               std::to_string(warmup) + " --steps " + std::to_string(steps) +
                               (compile ? " --compile" : "");
    std::vector<std::string> precision_list;
    {
      std::stringstream in(precisions);
      for (std::string item; std::getline(in, item, ',');) {
        DPAR_CHECK(item == "fp32" || item == "fp16" || item == "bf16", "bench_gpu: --precisions: '",
                   item, "' is not fp32, fp16 or bf16");
        precision_list.push_back(item);
      }
    }
    for (int64_t batch : parse_list(batches)) {
      for (const std::string& precision : precision_list) {
        const TrainResult ours =
            train_throughput(gpu, batch, img, warmup, steps, precision, report);
        std::printf(
            "train batch %lld %s\n  dpar     %9.1f img/s (%7.2f ms/step)  peak GPU memory %8.1f "
            "MB\n",
            static_cast<long long>(batch), precision.c_str(), ours.img_per_s, ours.ms_per_step,
            ours.peak_mb);
        if (!peer) continue;
        const auto p = bench::run_peer(
            "torch_gpu.py",
            "--mode train --batch " + std::to_string(batch) + " --precision " + precision + common,
            1);
        const double theirs = p.at("img_per_s").get<double>();
        std::printf(
            "  pytorch  %9.1f img/s (%7.2f ms/step)  peak GPU memory %8.1f MB  (torch %s)\n",
            theirs, p.at("ms_per_step").get<double>(), p.at("peak_mb").get<double>(),
            p.at("torch").get<std::string>().c_str());
        if (p.contains("compiled_img_per_s")) {
          std::printf("  torch.compile %9.1f img/s\n", p.at("compiled_img_per_s").get<double>());
        }
        std::printf(
            "  ratio dpar/pytorch eager: %.2fx img/s (target >= 1.0); peak memory %.2fx "
            "(target <= 1.0)\n",
            ours.img_per_s / theirs, ours.peak_mb / p.at("peak_mb").get<double>());
      }
    }
    for (int64_t batch : parse_list(infer_batches)) {
      const double ours = forward_latency_ms(gpu, batch, img, warmup, steps, report);
      std::printf("infer batch %lld\n  dpar     %8.3f ms\n", static_cast<long long>(batch), ours);
      if (!peer) continue;
      const auto p = bench::run_peer("torch_gpu.py",
                                     "--mode infer --batch " + std::to_string(batch) + common, 1);
      const double theirs = p.at("ms").get<double>();
      std::printf("  pytorch  %8.3f ms", theirs);
      if (p.contains("compiled_ms"))
        std::printf("   torch.compile %8.3f ms", p.at("compiled_ms").get<double>());
      std::printf("\n  ratio dpar/pytorch eager: %.2fx latency (target <= 1.0)\n", ours / theirs);
    }
    if (optim_step) {
      const size_t n = models::mobilenet_v3_small(1000)->parameters().size();
      for (const std::string which : {"SGD", "AdamW"}) {
        const double multi = optimizer_step_ms(gpu, which, true, warmup, 10 * steps);
        const double single = optimizer_step_ms(gpu, which, false, warmup, 10 * steps);
        std::printf(
            "optimizer step %s (%zu parameters)\n  multi-tensor %8.3f ms   per-parameter %8.3f "
            "ms   (%.1fx)\n",
            which.c_str(), n, multi, single, single / multi);
      }
    }
    return 0;
  });
}
