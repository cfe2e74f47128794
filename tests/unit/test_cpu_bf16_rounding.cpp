// The bf16 loops that round with AVX512-BF16's conversion instruction
// (tensor/cpu/bn_bf16_native_kernels.cpp) against the AVX-512 loops that round each element
// with integer arithmetic (float_to_bf16): the same bits, including f32 denormals, which the
// instruction alone flushes to zero, NaNs and infinities. Skipped on a CPU without AVX512-BF16.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dpar/core/dtype.h"
#include "gradcheck.h"
#include "tensor/cpu/avx512_bf16.h"
#include "tensor/cpu/isa.h"
#include "tensor/unary_math.h"

using namespace dpar;
using dpar::testing::random_tensor;

namespace {

bool native_bf16() {
  if (cpu::cpu_has_avx512_bf16()) return true;
  std::printf("skipped: this CPU has no AVX512-BF16 (or DPAR_CPU_ISA leaves it out)\n");
  return false;
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Equal bits, or both NaN (a NaN's payload depends on operand order, which two compilations of
// one formula may choose differently).
template <class Bits>
bool same(Bits a, Bits b, bool a_nan, bool b_nan) {
  return a == b || (a_nan && b_nan);
}

// The elements of a dense tensor (either layout) in memory order, as bits.
void check_same_bits(const Tensor& expected, const Tensor& actual, const char* what) {
  INFO(what);
  REQUIRE(expected.dtype() == actual.dtype());
  REQUIRE(expected.strides() == actual.strides());
  const auto n = static_cast<size_t>(expected.numel());
  size_t differing = 0;
  if (expected.dtype() == DType::bf16) {
    const auto* e = static_cast<const uint16_t*>(expected.raw_data());
    const auto* a = static_cast<const uint16_t*>(actual.raw_data());
    for (size_t i = 0; i < n; ++i) {
      differing +=
          !same(e[i], a[i], std::isnan(bf16_to_float(e[i])), std::isnan(bf16_to_float(a[i])));
    }
  } else {
    const auto* e = static_cast<const float*>(expected.raw_data());
    const auto* a = static_cast<const float*>(actual.raw_data());
    for (size_t i = 0; i < n; ++i) {
      differing += !same(bits_of(e[i]), bits_of(a[i]), std::isnan(e[i]), std::isnan(a[i]));
    }
  }
  CHECK(differing == 0);
}

// x in bf16: values in [-3, 3), with a denormal in channel 1 and, where specials, a NaN and an
// infinity (with batch statistics they would make their whole channels NaN).
Tensor make_input(const Shape& shape, MemoryFormat format, Generator& gen, bool specials) {
  Tensor f = random_tensor(shape, gen, -3.f, 3.f);
  std::vector<float> v = f.to_float_vector();
  const int64_t HW = shape[2] * shape[3];
  v[static_cast<size_t>(1 * HW)] = from_bits(0x00050000u);  // n 0, channel 1: a bf16 denormal
  if (specials && shape[0] > 1) {
    v[static_cast<size_t>((shape[1] + 2) * HW)] = std::numeric_limits<float>::quiet_NaN();
    v[static_cast<size_t>((shape[1] + 3) * HW)] = std::numeric_limits<float>::infinity();
  }
  Tensor x = Tensor::empty(shape, DType::bf16, Device::cpu(), format);
  x.copy_(Tensor::from_vector(v, shape));
  return x;
}

}  // namespace

TEST_CASE("f32 -> bf16 by AVX512-BF16's instruction has float_to_bf16's bits") {
  if (!native_bf16()) return;
  const std::vector<uint32_t> specials = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00018000u,
      0x007f8000u, 0x00800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0xff7fffffu,
      0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu};
  std::mt19937 bits(7);
  std::vector<float> from(100003);
  for (size_t i = 0; i < from.size(); ++i) {
    // Every 37th value a special one; the rest random bit patterns (every class of float).
    from[i] = from_bits(i % 37 == 0 ? specials[(i / 37) % specials.size()] : bits());
  }
  // Whole vectors, a tail, and the pieces of a parallel conversion.
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17},
                          int64_t{1000}, static_cast<int64_t>(from.size())}) {
    INFO("n = " << n);
    std::vector<uint16_t> to(static_cast<size_t>(n) + 1, 0xabcd);
    cpu::bf16_native::convert_f32_to_bf16(from.data(), to.data(), n);
    size_t differing = 0;
    for (int64_t i = 0; i < n; ++i)
      differing += to[static_cast<size_t>(i)] != float_to_bf16(from[static_cast<size_t>(i)]);
    CHECK(differing == 0);
    CHECK(to.back() == 0xabcd);  // nothing written past n
  }
}

TEST_CASE("bf16 batch norm rounded by AVX512-BF16's instruction has the AVX-512 loops' bits") {
  if (!native_bf16()) return;
  Generator gen(41);
  // Channel counts that are and are not multiples of 16; a channels-last run ending in a partial
  // vector (24 x 35), rows longer than a run (1040 channels), NCHW planes longer than one run.
  const std::vector<Shape> shapes = {{2, 24, 5, 7},   {1, 24, 5, 7},   {2, 576, 3, 3},
                                     {2, 16, 40, 40}, {2, 1040, 2, 1}, {3, 8, 1, 1}};
  for (const Shape& shape : shapes) {
    for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      for (bool batch_stats : {true, false}) {
        for (Activation act : {Activation::none, Activation::relu, Activation::hardswish}) {
          for (bool keep_y : {true, false}) {
            if (act == Activation::none && !keep_y) continue;
            INFO("shape [" << shape[0] << "," << shape[1] << "," << shape[2] << "," << shape[3]
                           << "] channels-last " << (format == MemoryFormat::ChannelsLast)
                           << " batch stats " << batch_stats << " activation "
                           << static_cast<int>(act) << " keep y " << keep_y);
            const int64_t C = shape[1];
            Tensor x = make_input(shape, format, gen, /*specials=*/!batch_stats);
            std::vector<float> w = random_tensor({C}, gen, 0.5f, 1.5f).to_float_vector();
            // With b[1] = 0, y and dx of channel 1 are f32 denormals (1/w[1] is still finite).
            w[1] = 2e-38f;
            w[2] = -w[2];
            const Tensor weight = Tensor::from_vector(w, {C});
            std::vector<float> b = random_tensor({C}, gen).to_float_vector();
            b[1] = 0.f;
            const Tensor bias = Tensor::from_vector(b, {C});
            const Tensor running_mean = random_tensor({C}, gen);
            const Tensor running_var = random_tensor({C}, gen, 0.5f, 2.f);
            struct Out {
              Tensor mean, var, y, z, dx, dweight, dbias;
            };
            auto run = [&](bool native) {
              Out o{running_mean.clone(),  running_var.clone(), Tensor(),          Tensor(),
                    Tensor::empty_like(x), Tensor::empty({C}),  Tensor::empty({C})};
              if (keep_y) o.y = Tensor::empty_like(x);
              if (act != Activation::none) o.z = Tensor::empty_like(x);
              auto forward = native ? cpu::bf16_native::batch_norm_forward_bf16
                                    : cpu::avx512::batch_norm_forward_bf16;
              forward(x, weight, bias, o.mean, o.var, batch_stats, 1e-3, act, o.y, o.z);
              if (keep_y) {
                Generator dz_gen(43);
                Tensor dz = make_input(shape, format, dz_gen, /*specials=*/false);
                auto backward = native ? cpu::bf16_native::batch_norm_backward_from_output_bf16
                                       : cpu::avx512::batch_norm_backward_from_output_bf16;
                backward(o.y, dz, weight, bias, o.var, batch_stats, 1e-3, act, o.dx, o.dweight,
                         o.dbias);
              }
              return o;
            };
            const Out expected = run(false), actual = run(true);
            check_same_bits(expected.mean, actual.mean, "mean");
            check_same_bits(expected.var, actual.var, "var");
            if (keep_y) {
              check_same_bits(expected.y, actual.y, "y");
              check_same_bits(expected.dx, actual.dx, "dx");
              check_same_bits(expected.dweight, actual.dweight, "dweight");
              check_same_bits(expected.dbias, actual.dbias, "dbias");
            }
            if (act != Activation::none) check_same_bits(expected.z, actual.z, "z");
          }
        }
      }
    }
  }
}

// Every bf16 value through the fused forward's activation: with y = x (weight 1, bias 0, the
// running statistics 0 and 1, eps 0), act(y) rounded to bf16 must have the bits of the unary
// kernels' formula on that value: the kinks, signed zeros, denormals, infinities and NaNs that
// random inputs rarely hit. (A product by 1/6 in place of hardswish's division by 6 passes this
// too: on bf16 inputs the two never round to different bf16 values, checked by mutation.)
TEST_CASE(
    "every bf16 value through the fused batch norm's activation has the unary formula's bits") {
  if (!native_bf16()) return;
  const Shape shape{1, 16, 64, 64};  // 65536 elements: every bf16 bit pattern once
  std::vector<uint16_t> patterns(65536);
  for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<uint16_t>(i);
  for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    Tensor x = Tensor::empty(shape, DType::bf16, Device::cpu(), format);
    std::memcpy(x.raw_data(), patterns.data(), patterns.size() * sizeof(uint16_t));
    const Tensor weight = Tensor::ones({16}), bias = Tensor::zeros({16});
    for (Activation act : {Activation::relu, Activation::hardswish}) {
      INFO("channels-last " << (format == MemoryFormat::ChannelsLast) << " activation "
                            << static_cast<int>(act));
      Tensor mean = Tensor::zeros({16}), var = Tensor::ones({16});
      Tensor y, z = Tensor::empty_like(x);
      cpu::bf16_native::batch_norm_forward_bf16(x, weight, bias, mean, var, false, 0.0, act, y, z);
      const auto* out = static_cast<const uint16_t*>(z.raw_data());
      size_t differing = 0;
      for (size_t i = 0; i < patterns.size(); ++i) {
        // y = x * 1 + 0: x itself, but -0 becomes +0.
        const float v = bf16_to_float(patterns[i]) * 1.f + 0.f;
        const float a = act == Activation::relu
                            ? kernels::unary_value<kernels::UnaryOp::relu>(v)
                            : kernels::unary_value<kernels::UnaryOp::hardswish>(v);
        const uint16_t expected = float_to_bf16(a);
        differing += !same(expected, out[i], std::isnan(a), std::isnan(bf16_to_float(out[i])));
      }
      CHECK(differing == 0);
    }
  }
}
