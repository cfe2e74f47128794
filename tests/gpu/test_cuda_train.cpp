// MobileNetV3-small on the GPU against the CPU backend: the same initial weights and batches,
// three SGD steps, then every parameter and BN buffer agrees to 1e-3 relative. Module::to moves
// a model in place, keeping the handles an optimizer holds.
//
// A running mean is the mean of values spread over +-sqrt(running_var) and is often much
// smaller than that spread; the few-ulp differences of the GPU's convolutions, grown over three
// steps, move it by a part of the spread, not of itself. So running means are compared relative
// to max(|mean|, sqrt(var)) of their layer (on the H100, relative to |mean| alone they differed
// by up to 4e-3 while every parameter agreed to 1e-3).
#include <algorithm>
#include <cmath>

#include "gpu/gpu_helpers.h"
#include "mobilenetv3/model/mobilenet_v3.h"

using namespace dpar;

namespace {

// Trains a fresh model (seeded init) on `device` for `steps` SGD steps; returns its state.
//
// The cuDNN engines are fixed to those cuDNN's heuristics put first (DPAR_CUDNN_BENCHMARK=0,
// read at the first convolution), the same in every run. Timed, the choice can change from run
// to run on a shared GPU: on an H200 beside other tests, one of eight runs picked engine 28
// instead of 0 for the stem convolution's forward pass (every other choice the same) and
// failed with six biases of the first blocks 0.3-1.6% off the CPU's (an earlier ctest run
// failed with the same figures), where the other runs agree to 1e-5. With the heuristics'
// choices (engine 28 there too; engine 61 instead of 0 for three depthwise weight gradients)
// 4 of 4 runs passed beside other tests. Which engine, or which pairing, moves those sums is
// not established yet (docs/gpu.md).
nn::NamedTensors train_steps(Device device, int steps) {
  setenv("DPAR_CUDNN_BENCHMARK", "0", 1);
  manual_seed(7);
  auto model = models::mobilenet_v3("mobilenet_v3_small", 10);
  model->train();
  model->to(device);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 4e-5});
  std::vector<int64_t> labels(8);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  for (int s = 0; s < steps; ++s) {
    const Tensor images = random_tensor({8, 3, 64, 64}, 500 + static_cast<uint64_t>(s)).to(device);
    const Tensor target = Tensor::from_vector(labels, {8}).to(device);
    opt.zero_grad();
    Tensor loss = cross_entropy(model->forward(images), target, 0.1);
    loss.backward();
    opt.step();
  }
  return model->state_dict();
}

// max |a - b| over max(max |a|, max sqrt(var)): a mean's error against the spread of the values
// it averages.
double spread_relative_error(const Tensor& a, const Tensor& b, const Tensor& var) {
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  const std::vector<float> v = var.to_float_vector();
  double diff = 0, scale = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(x[i] - y[i])));
    scale = std::max({scale, static_cast<double>(std::fabs(x[i])),
                      std::sqrt(std::max(0.0, static_cast<double>(v[i])))});
  }
  return diff / scale;
}

// The running variance beside a BatchNorm's running mean in a state dict.
Tensor running_var_of(const nn::NamedTensors& state, const std::string& mean_name) {
  const std::string var_name = mean_name.substr(0, mean_name.size() - 4) + "var";
  const auto var = std::find_if(state.begin(), state.end(),
                                [&](const auto& entry) { return entry.first == var_name; });
  REQUIRE(var != state.end());
  return var->second;
}

}  // namespace

TEST_CASE("Module::to moves parameters in place and keeps the optimizer's handles") {
  DPAR_REQUIRE_GPU();
  nn::Linear layer(4, 3);
  const Tensor handle = layer.weight;
  layer.to(kGpu);
  CHECK(handle.device() == kGpu);
  CHECK(layer.parameters()[0].device() == kGpu);
  layer.to(Device::cpu());
  CHECK(handle.device().is_cpu());
}

TEST_CASE("mobilenet_v3_small: 3 SGD steps on the GPU match the CPU backend") {
  DPAR_REQUIRE_GPU();
  const nn::NamedTensors cpu = train_steps(Device::cpu(), 3);
  const nn::NamedTensors gpu = train_steps(kGpu, 3);
  REQUIRE(cpu.size() == gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(cpu[i].first);
    REQUIRE(cpu[i].first == gpu[i].first);
    if (!is_floating(cpu[i].second.dtype())) {
      CHECK(cpu[i].second.to_int_vector() == gpu[i].second.to_int_vector());
      continue;
    }
    if (cpu[i].first.ends_with("running_mean")) {
      const Tensor var = running_var_of(cpu, cpu[i].first);
      CHECK(spread_relative_error(cpu[i].second, gpu[i].second, var) <= 1e-3);
      continue;
    }
    CHECK(relative_error(cpu[i].second, gpu[i].second) <= 1e-3);
  }
}

TEST_CASE("mobilenet_v3_small: after one step the GPU's BN statistics match the CPU's closely") {
  DPAR_REQUIRE_GPU();
  // One step: the statistics come from identical weights, so only the kernels' rounding differs.
  const nn::NamedTensors cpu = train_steps(Device::cpu(), 1);
  const nn::NamedTensors gpu = train_steps(kGpu, 1);
  REQUIRE(cpu.size() == gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    const std::string& name = cpu[i].first;
    if (!name.ends_with("running_mean")) continue;
    INFO(name);
    const Tensor var = running_var_of(cpu, name);
    CHECK(spread_relative_error(cpu[i].second, gpu[i].second, var) <= 1e-4);
    CHECK(relative_error(var, running_var_of(gpu, name)) <= 1e-4);
  }
}

TEST_CASE("Module::to(gpu) lays convolution weights out channels-last, gradients follow") {
  DPAR_REQUIRE_GPU();
  nn::Conv2d conv(4, 8, 3, 1, 1);
  const Tensor handle = conv.weight;
  const std::vector<float> before = handle.to_float_vector();
  conv.to(kGpu);
  CHECK(conv.weight.is_same(handle));
  CHECK(handle.device() == kGpu);
  CHECK(handle.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(handle.to_float_vector() == before);  // values in logical order are unchanged
  const Tensor x = random_tensor({2, 4, 6, 6}, 3).to(kGpu);
  sum(conv.forward(x)).backward();
  REQUIRE(handle.grad().defined());
  CHECK(handle.grad().is_contiguous(MemoryFormat::ChannelsLast));
  // Back on the CPU the weights are plain contiguous again, with the same values.
  conv.to(Device::cpu());
  CHECK(handle.is_contiguous());
  CHECK(handle.to_float_vector() == before);
}
