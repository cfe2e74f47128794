#pragma once
// Weight initialisation, mirroring torch.nn.init. Each function fills the tensor in place
// (any layout, dtype or device; not recorded by autograd) and returns the same handle.
// Random values are drawn on the host in logical element order from the given generator
// (the process-wide one by default), so a seed fixes every value on every platform.
#include <cstdint>
#include <utility>

#include "dpar/core/random.h"
#include "dpar/tensor/tensor.h"

namespace dpar::nn::init {

enum class FanMode { FanIn, FanOut };
enum class Nonlinearity { Linear, Conv, Sigmoid, Tanh, ReLU, LeakyReLU };

// torch.nn.init.calculate_gain; param is LeakyReLU's negative slope.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);
// (fan_in, fan_out) of a weight of rank >= 2: dims 1 and 0 times the receptive field.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);

Tensor uniform_(Tensor tensor, double low = 0.0, double high = 1.0,
                Generator& gen = default_generator());
Tensor normal_(Tensor tensor, double mean = 0.0, double std = 1.0,
               Generator& gen = default_generator());
Tensor constant_(Tensor tensor, double value);
Tensor zeros_(Tensor tensor);
Tensor ones_(Tensor tensor);

// std = gain / sqrt(fan), gain = calculate_gain(nonlinearity, a). torch's defaults
// (a = 0, LeakyReLU) give gain sqrt(2), the same as ReLU.
Tensor kaiming_normal_(Tensor tensor, double a = 0.0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyReLU,
                       Generator& gen = default_generator());
// bound = sqrt(3) * gain / sqrt(fan).
Tensor kaiming_uniform_(Tensor tensor, double a = 0.0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU,
                        Generator& gen = default_generator());

// bound = gain * sqrt(6 / (fan_in + fan_out)) (Glorot).
Tensor xavier_uniform_(Tensor tensor, double gain = 1.0, Generator& gen = default_generator());
// Normal(mean, std) redrawn until it lies in [a, b], as torch.nn.init.trunc_normal_ (whose
// bounds are absolute values, not multiples of std).
Tensor trunc_normal_(Tensor tensor, double mean = 0.0, double std = 1.0, double a = -2.0,
                     double b = 2.0, Generator& gen = default_generator());

}  // namespace dpar::nn::init
