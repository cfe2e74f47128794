// Optimizer trajectories against torch.optim (fixtures from fixtures_optim.py): five steps of
// each configuration on the same parameters and gradients; every parameter after every step
// must match within a relative error of 1e-5.
#include <functional>
#include <memory>

#include "dpar/optim/adamw.h"
#include "dpar/optim/rmsprop.h"
#include "dpar/optim/sgd.h"
#include "parity_util.h"

using namespace dpar;
using namespace dpar::optim;
using dpar::parity::ErrorTable;
using dpar::parity::Fixture;

namespace {

constexpr int kSteps = 5;
constexpr int kParams = 3;
constexpr double kTol = 1e-5;

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

void run_case(const Fixture& fx, const std::string& name, const MakeOptimizer& make,
              ErrorTable& table) {
  std::vector<Tensor> params;
  for (int p = 0; p < kParams; ++p) {
    params.push_back(fx["init." + std::to_string(p)].clone().set_requires_grad());
  }
  std::unique_ptr<Optimizer> opt = make(params);
  for (int s = 0; s < kSteps; ++s) {
    for (int p = 0; p < kParams; ++p) {
      const bool skip = name == "adamw_skip" && s == 1 && p == 1;
      params[p].set_grad(skip ? Tensor()
                              : fx["grad." + std::to_string(s) + "." + std::to_string(p)].clone());
    }
    opt->step();
    for (int p = 0; p < kParams; ++p) {
      const std::string key = name + "." + std::to_string(s) + "." + std::to_string(p);
      parity::check_close(params[p], fx[key], kTol, key, table, name);
    }
  }
}

}  // namespace

TEST_CASE("optimizers follow torch.optim trajectories", "[parity][optim]") {
  Fixture fx("optim.safetensors");
  ErrorTable table;
  run_case(
      fx, "sgd_plain",
      [](std::vector<Tensor> p) {
        return std::make_unique<SGD>(std::move(p), SGDOptions{.lr = 0.1});
      },
      table);
  run_case(
      fx, "sgd_momentum_wd",
      [](std::vector<Tensor> p) {
        return std::make_unique<SGD>(
            std::move(p),
            SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
      },
      table);
  run_case(
      fx, "sgd_nesterov",
      [](std::vector<Tensor> p) {
        return std::make_unique<SGD>(
            std::move(p),
            SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
      },
      table);
  run_case(
      fx, "rmsprop_plain",
      [](std::vector<Tensor> p) {
        return std::make_unique<RMSprop>(std::move(p), RMSpropOptions{.lr = 0.01});
      },
      table);
  run_case(
      fx, "rmsprop_centered_momentum",
      [](std::vector<Tensor> p) {
        return std::make_unique<RMSprop>(std::move(p), RMSpropOptions{.lr = 0.01,
                                                                      .alpha = 0.9,
                                                                      .eps = 1e-6,
                                                                      .weight_decay = 0.01,
                                                                      .momentum = 0.8,
                                                                      .centered = true});
      },
      table);
  for (const char* name : {"adamw", "adamw_skip"}) {
    run_case(
        fx, name,
        [](std::vector<Tensor> p) {
          return std::make_unique<AdamW>(
              std::move(p),
              AdamWOptions{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1});
        },
        table);
  }
  run_case(
      fx, "adam",
      [](std::vector<Tensor> p) {
        return std::make_unique<Adam>(std::move(p), AdamOptions{.lr = 0.01});
      },
      table);
  run_case(
      fx, "adam_l2",
      [](std::vector<Tensor> p) {
        return std::make_unique<Adam>(
            std::move(p),
            AdamOptions{
                .lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.05});
      },
      table);
  table.print("optimizer parity (5 steps, 3 parameters)");
}
