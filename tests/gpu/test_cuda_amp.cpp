// The loss scaler on CUDA against the CPU: unscale_and_check_finite must give bit-equal
// gradients (one f32 product per element on both backends) and the same found-inf decision,
// with the flag kept on the device until step() reads it.
#include <cmath>
#include <cstring>
#include <limits>

#include "dpar/optim/grad_scaler.h"
#include "gpu/gpu_helpers.h"

using namespace dpar;

namespace {

// Bit-equal, except that any two nans match: a GPU returns the canonical nan where x86 keeps
// the input's payload.
bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    if (!both_nan && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

struct ScaledStep {
  std::vector<Tensor> params, grads;  // grads after unscaling, on the CPU
  bool stepped = false;
  double scale_after = 0;
};

// One scaler step over parameters of several shapes (one large enough for many blocks, one
// gradient non-dense) on `device`, with `poison` written into one gradient element.
ScaledStep run(Device device, float poison) {
  const std::vector<Shape> shapes = {{3, 5}, {300, 257}, {7}};
  std::vector<Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    params.push_back(leaf_on(random_tensor(shapes[i], 10 + i), device));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor g = random_tensor(shapes[i], 20 + i, -4096, 4096);
    if (i == 1) {
      std::vector<float> v = g.to_float_vector();
      v[v.size() / 2] = poison;
      g = Tensor::from_vector(v, shapes[i]);
    }
    g = g.to(device);
    if (i == 0) g = g.transpose(0, 1).contiguous().transpose(0, 1);  // column-major: dense
    if (i == 2) {
      Tensor backing = Tensor::zeros({14}, DType::f32, device);
      backing.slice(0, 0, 14, 2).copy_(g);
      g = backing.slice(0, 0, 14, 2);  // every other element: not dense
    }
    params[i].set_grad(g);
  }
  optim::SGD opt(params, optim::SGDOptions{.lr = 0.1});
  amp::GradScaler scaler(amp::GradScalerOptions{.init_scale = 1024, .growth_interval = 1});
  scaler.unscale(opt);
  ScaledStep out;
  for (const Tensor& p : params) out.grads.push_back(p.grad().to(Device::cpu()));
  out.stepped = scaler.step(opt);
  scaler.update();
  out.scale_after = scaler.get_scale();
  for (const Tensor& p : params) out.params.push_back(p.detach().to(Device::cpu()));
  return out;
}

}  // namespace

TEST_CASE("the CUDA loss scaler unscales and checks like the CPU one") {
  DPAR_REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const float poison : {1.5f, inf, nan}) {
    INFO("poisoned element " << poison);
    const ScaledStep cpu = run(Device::cpu(), poison), gpu = run(kGpu, poison);
    CHECK(gpu.stepped == cpu.stepped);
    CHECK(cpu.stepped == std::isfinite(poison));
    CHECK(gpu.scale_after == cpu.scale_after);
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      INFO("parameter " << i);
      CHECK(same_values(cpu.grads[i].to_float_vector(), gpu.grads[i].to_float_vector()));
      CHECK(relative_error(cpu.params[i], gpu.params[i]) <= 1e-6);
    }
  }
}
