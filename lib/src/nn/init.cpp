#include "dpar/nn/init.h"

#include <cmath>
#include <vector>

#include "dpar/autograd/grad_mode.h"

namespace dpar::nn::init {

namespace {

void check_floating(const Tensor& t, const char* op) {
  DPAR_CHECK(t.defined(), op, ": tensor is undefined");
  DPAR_CHECK(is_floating(t.dtype()), op, ": expected a floating tensor, got ", t.dtype());
}

// Draws numel values on the host in logical order and copies them into t, whatever its
// layout, dtype or device: the values depend only on the generator, never on the layout.
// The whole fill holds the generator's lock, so threads sharing it (the default generator)
// take turns.
template <class Draw>
Tensor fill_random(Tensor t, Generator& gen, Draw draw) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    for (float& v : values) v = draw();
  }
  NoGradGuard no_grad;
  t.copy_(Tensor::from_vector(values, t.shape()));
  return t;
}

double fan_for(const Tensor& t, FanMode mode) {
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return static_cast<double>(mode == FanMode::FanIn ? fan_in : fan_out);
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv:
    case Nonlinearity::Sigmoid:
      return 1.0;
    case Nonlinearity::Tanh:
      return 5.0 / 3.0;
    case Nonlinearity::ReLU:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU:
      return std::sqrt(2.0 / (1.0 + param * param));
  }
  return 1.0;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor) {
  DPAR_CHECK(tensor.defined() && tensor.dim() >= 2,
             "init: fan in and fan out need a tensor of at least 2 dimensions, got ",
             tensor.defined() ? tensor.shape() : Shape{});
  int64_t receptive = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive *= tensor.size(d);
  return {tensor.size(1) * receptive, tensor.size(0) * receptive};
}

Tensor uniform_(Tensor tensor, double low, double high, Generator& gen) {
  check_floating(tensor, "init::uniform_");
  DPAR_CHECK(low <= high, "init::uniform_: low ", low, " exceeds high ", high);
  return fill_random(std::move(tensor), gen, [&] {
    return static_cast<float>(low + (high - low) * static_cast<double>(gen.uniform()));
  });
}

Tensor normal_(Tensor tensor, double mean, double std, Generator& gen) {
  check_floating(tensor, "init::normal_");
  DPAR_CHECK(std >= 0.0, "init::normal_: std must be non-negative, got ", std);
  return fill_random(std::move(tensor), gen, [&] {
    return static_cast<float>(mean + std * static_cast<double>(gen.normal()));
  });
}

Tensor xavier_uniform_(Tensor tensor, double gain, Generator& gen) {
  check_floating(tensor, "init::xavier_uniform_");
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(std::move(tensor), -bound, bound, gen);
}

Tensor trunc_normal_(Tensor tensor, double mean, double std, double a, double b, Generator& gen) {
  check_floating(tensor, "init::trunc_normal_");
  DPAR_CHECK(std >= 0.0 && a < b, "init::trunc_normal_: needs std >= 0 and a < b, got std ", std,
             ", [", a, ", ", b, "]");
  DPAR_CHECK(mean + 6 * std > a && mean - 6 * std < b, "init::trunc_normal_: [", a, ", ", b,
             "] is more than 6 std from the mean ", mean, ": redrawing would not end");
  return fill_random(std::move(tensor), gen, [&] {
    while (true) {
      const double v = mean + std * static_cast<double>(gen.normal());
      if (v >= a && v <= b) return static_cast<float>(v);
    }
  });
}

Tensor constant_(Tensor tensor, double value) {
  DPAR_CHECK(tensor.defined(), "init::constant_: tensor is undefined");
  NoGradGuard no_grad;
  tensor.fill_(value);
  return tensor;
}

Tensor zeros_(Tensor tensor) { return constant_(std::move(tensor), 0.0); }
Tensor ones_(Tensor tensor) { return constant_(std::move(tensor), 1.0); }

Tensor kaiming_normal_(Tensor tensor, double a, FanMode mode, Nonlinearity nonlinearity,
                       Generator& gen) {
  check_floating(tensor, "init::kaiming_normal_");
  const double fan = fan_for(tensor, mode);
  DPAR_CHECK(fan > 0, "init::kaiming_normal_: zero fan for shape ", tensor.shape());
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(fan);
  return normal_(std::move(tensor), 0.0, std, gen);
}

Tensor kaiming_uniform_(Tensor tensor, double a, FanMode mode, Nonlinearity nonlinearity,
                        Generator& gen) {
  check_floating(tensor, "init::kaiming_uniform_");
  const double fan = fan_for(tensor, mode);
  DPAR_CHECK(fan > 0, "init::kaiming_uniform_: zero fan for shape ", tensor.shape());
  const double bound = std::sqrt(3.0) * calculate_gain(nonlinearity, a) / std::sqrt(fan);
  return uniform_(std::move(tensor), -bound, bound, gen);
}

}  // namespace dpar::nn::init
