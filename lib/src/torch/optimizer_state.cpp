#include "optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <optional>
#include <sstream>

#include "dpar/torch/tensor.h"

namespace dpar::torch::internal {
namespace {

namespace to = ::torch::optim;

enum class Kind { sgd, adam, adamw, rmsprop };

std::optional<Kind> kind_if_known(const to::Optimizer& optimizer) {
  // AdamW before Adam: neither derives from the other today, but the more specific first.
  if (dynamic_cast<const to::AdamW*>(&optimizer)) return Kind::adamw;
  if (dynamic_cast<const to::Adam*>(&optimizer)) return Kind::adam;
  if (dynamic_cast<const to::SGD*>(&optimizer)) return Kind::sgd;
  if (dynamic_cast<const to::RMSprop*>(&optimizer)) return Kind::rmsprop;
  return std::nullopt;
}

Kind kind_of(const to::Optimizer& optimizer) {
  const auto kind = kind_if_known(optimizer);
  DPAR_CHECK(kind.has_value(),
             "dpar::torch: the state of this optimizer cannot be saved as a shard set: "
             "torch::optim::SGD, Adam, AdamW and RMSprop are understood");
  return *kind;
}

// What a parameter's state holds, under dpar's names. step < 0: the kind counts no steps.
struct Buffers {
  int64_t step = -1;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

template <class AdamState>
void adam_buffers(const AdamState& s, Buffers& b) {
  b.step = s.step();
  b.tensors = {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}};
  if (s.max_exp_avg_sq().defined()) b.tensors.emplace_back("max_exp_avg_sq", s.max_exp_avg_sq());
}

Buffers buffers_of(Kind kind, const to::OptimizerParamState& state) {
  Buffers b;
  switch (kind) {
    case Kind::sgd: {
      const auto& s = static_cast<const to::SGDParamState&>(state);
      if (s.momentum_buffer().defined()) b.tensors = {{"momentum_buffer", s.momentum_buffer()}};
      break;
    }
    case Kind::adam:
      adam_buffers(static_cast<const to::AdamParamState&>(state), b);
      break;
    case Kind::adamw:
      adam_buffers(static_cast<const to::AdamWParamState&>(state), b);
      break;
    case Kind::rmsprop: {
      const auto& s = static_cast<const to::RMSpropParamState&>(state);
      b.step = s.step();
      b.tensors = {{"square_avg", s.square_avg()}};
      if (s.momentum_buffer().defined())
        b.tensors.emplace_back("momentum_buffer", s.momentum_buffer());
      if (s.grad_avg().defined()) b.tensors.emplace_back("grad_avg", s.grad_avg());
      break;
    }
  }
  return b;
}

// The buffers a kind may keep, and the ones it must.
std::vector<std::string> known_buffers(Kind kind) {
  switch (kind) {
    case Kind::sgd:
      return {"momentum_buffer"};
    case Kind::adam:
    case Kind::adamw:
      return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    case Kind::rmsprop:
      return {"square_avg", "momentum_buffer", "grad_avg"};
  }
  return {};
}

template <class AdamState>
std::unique_ptr<to::OptimizerParamState> make_adam_state(const Buffers& b) {
  auto s = std::make_unique<AdamState>();
  s->step(b.step);
  for (const auto& [name, t] : b.tensors) {
    if (name == "exp_avg") s->exp_avg(t);
    if (name == "exp_avg_sq") s->exp_avg_sq(t);
    if (name == "max_exp_avg_sq") s->max_exp_avg_sq(t);
  }
  return s;
}

std::unique_ptr<to::OptimizerParamState> make_state(Kind kind, const Buffers& b) {
  switch (kind) {
    case Kind::sgd: {
      auto s = std::make_unique<to::SGDParamState>();
      if (!b.tensors.empty()) s->momentum_buffer(b.tensors.front().second);
      return s;
    }
    case Kind::adam:
      return make_adam_state<to::AdamParamState>(b);
    case Kind::adamw:
      return make_adam_state<to::AdamWParamState>(b);
    case Kind::rmsprop: {
      auto s = std::make_unique<to::RMSpropParamState>();
      s->step(b.step);
      for (const auto& [name, t] : b.tensors) {
        if (name == "square_avg") s->square_avg(t);
        if (name == "momentum_buffer") s->momentum_buffer(t);
        if (name == "grad_avg") s->grad_avg(t);
      }
      return s;
    }
  }
  return nullptr;
}

// optimizer.state()'s key for a parameter: libtorch 1.x spells the TensorImpl's address as
// text, 2.x keys by the address itself; the map's key type picks the overload.
std::string state_key(const at::Tensor& p, const std::string& /*tag*/) {
  std::ostringstream out;
  out << p.unsafeGetTensorImpl();
  return out.str();
}
[[maybe_unused]] void* state_key(const at::Tensor& p, void* /*tag*/) {
  return p.unsafeGetTensorImpl();
}
template <class Map>
auto key_of(const Map& /*state*/, const at::Tensor& p) {
  return state_key(p, typename Map::key_type{});
}

std::vector<at::Tensor> params_of(const to::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (const auto& group : optimizer.param_groups()) {
    out.insert(out.end(), group.params().begin(), group.params().end());
  }
  return out;
}

}  // namespace

std::string optimizer_kind(const to::Optimizer& optimizer) {
  switch (kind_of(optimizer)) {
    case Kind::sgd:
      return "SGD";
    case Kind::adam:
      return "Adam";
    case Kind::adamw:
      return "AdamW";
    case Kind::rmsprop:
      return "RMSprop";
  }
  return "?";
}

optim::StateDict state_dict_of(const to::Optimizer& optimizer) {
  const Kind kind = kind_of(optimizer);
  const std::vector<at::Tensor> params = params_of(optimizer);
  const auto& state = optimizer.state();
  optim::StateDict out;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = state.find(key_of(state, params[i]));
    if (it == state.end()) continue;
    const Buffers b = buffers_of(kind, *it->second);
    std::string suffix(1, '.');
    suffix += std::to_string(i);
    if (b.step >= 0) {
      out.emplace_back("step" + suffix, Tensor::from_vector(std::vector<int64_t>{b.step}, {}));
    }
    for (const auto& [name, t] : b.tensors)
      out.emplace_back(name + suffix, to_dpar(t.contiguous()));
  }
  return out;
}

void load_state_dict_into(to::Optimizer& optimizer, const optim::StateDict& state) {
  const Kind kind = kind_of(optimizer);
  const std::string who = "dpar::torch: loading " + optimizer_kind(optimizer) + " state";
  const std::vector<at::Tensor> params = params_of(optimizer);
  const std::vector<std::string> names = known_buffers(kind);
  std::vector<Buffers> incoming(params.size());
  std::vector<bool> any(params.size(), false);
  // Everything is checked before the optimizer's state changes.
  for (const auto& [key, t] : state) {
    const auto [buf, i] = optim::split_state_key(key, params.size(), who);
    const at::Tensor& p = params[i];
    any[i] = true;
    if (buf == "step") {
      DPAR_CHECK(kind != Kind::sgd && t.numel() == 1, who, ": unexpected entry '", key, "'");
      incoming[i].step = static_cast<int64_t>(t.item());
      continue;
    }
    DPAR_CHECK(std::find(names.begin(), names.end(), buf) != names.end(), who,
               ": unexpected entry '", key, "' (is this another optimizer's state?)");
    DPAR_CHECK(t.shape() == Shape(p.sizes().begin(), p.sizes().end()), who, ": entry '", key,
               "' has shape ", t.shape(), ", parameter ", i, " has shape ", p.sizes());
    incoming[i].tensors.emplace_back(
        buf, to_torch(t).to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!any[i]) continue;
    DPAR_CHECK(kind == Kind::sgd || incoming[i].step >= 0, who, ": parameter ", i,
               " has state but no 'step.", i, "' entry");
    const std::string required = kind == Kind::sgd       ? "momentum_buffer"
                                 : kind == Kind::rmsprop ? "square_avg"
                                                         : "exp_avg";
    const bool has = std::any_of(incoming[i].tensors.begin(), incoming[i].tensors.end(),
                                 [&](const auto& e) { return e.first == required; });
    DPAR_CHECK(has, who, ": parameter ", i, " has state but no '", required, ".", i, "' entry");
  }
  auto& live = optimizer.state();
  live.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    if (any[i]) live[key_of(live, params[i])] = make_state(kind, incoming[i]);
  }
}

size_t state_bytes_of(const to::Optimizer& optimizer) {
  const auto kind = kind_if_known(optimizer);
  if (!kind) return 0;
  size_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    for (const auto& [name, t] : buffers_of(*kind, *state).tensors) bytes += t.nbytes();
  }
  return bytes;
}

}  // namespace dpar::torch::internal
