// Op-level parity with PyTorch 1.13: forward outputs, side effects (BatchNorm running stats)
// and the gradients of every input for the cases fixtures_ops.py writes. Each case runs with
// its activations in three layouts: contiguous NCHW, channels-last (4-D only; the layout
// dpar's models use) and a non-dense strided view, since every op must accept any strides.
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "parity/parity_util.h"

namespace {

using namespace dpar;
using parity::check_close;
using parity::ErrorTable;
using parity::Fixture;

constexpr double kTolerance = 1e-4;  // forward and backward, relative error per tensor

enum class Layout { Contiguous, ChannelsLast, Strided };

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::Contiguous:
      return "contiguous";
    case Layout::ChannelsLast:
      return "channels_last";
    case Layout::Strided:
      return "strided";
  }
  return "?";
}

// A differentiable input: the tensor handed to the op and the leaf whose gradient autograd
// fills. For the strided layout the op sees every other element of a twice-as-wide leaf.
struct Input {
  Tensor leaf;
  Tensor value;
  bool strided = false;

  Tensor grad() const {
    Tensor g = leaf.grad();
    if (!g.defined() || !strided) return g;
    return g.slice(-1, 0, g.size(-1), 2);
  }
};

Input make_input(const Tensor& src, Layout layout) {
  Input in;
  if (layout == Layout::Strided && src.dim() > 0) {
    Shape wide = src.shape();
    wide.back() *= 2;
    in.leaf = Tensor::zeros(wide);
    in.leaf.slice(-1, 0, wide.back(), 2).copy_(src);
    in.leaf.set_requires_grad();
    in.value = in.leaf.slice(-1, 0, wide.back(), 2);
    in.strided = true;
    return in;
  }
  const MemoryFormat format = (layout == Layout::ChannelsLast && src.dim() == 4)
                                  ? MemoryFormat::ChannelsLast
                                  : MemoryFormat::Contiguous;
  in.leaf = Tensor::empty(src.shape(), DType::f32, Device::cpu(), format);
  in.leaf.copy_(src);
  in.leaf.set_requires_grad();
  in.value = in.leaf;
  return in;
}

// What an op case receives: the fixture (for config and non-differentiable inputs) and the
// differentiable inputs by name ("x", "y", "weight", "bias"; absent ones are undefined).
// Running statistics are fresh copies under "running_mean" / "running_var" that the op may
// update in place; they are compared with running_*_after when the fixture has them.
using Args = std::map<std::string, Tensor>;
using OpFn = std::function<Tensor(const Fixture&, Args&)>;

// Runs one fixture file in every applicable layout, recording errors in table.
void run_case(const std::string& case_name, const OpFn& op, ErrorTable& table) {
  const Fixture f(case_name + ".safetensors");
  bool has_4d = false;
  for (const char* name : {"x", "y"}) has_4d |= f.has(name) && f[name].dim() == 4;
  std::vector<Layout> layouts{Layout::Contiguous};
  if (has_4d) layouts.push_back(Layout::ChannelsLast);
  layouts.push_back(Layout::Strided);

  for (Layout layout : layouts) {
    const std::string tag = case_name + " [" + layout_name(layout) + "]";
    INFO("case " << tag);
    std::map<std::string, Input> inputs;
    Args args;
    for (const char* name : {"x", "y", "weight", "bias"}) {
      if (!f.has(name)) continue;
      // Parameters stay contiguous; the layouts under test are those of activations.
      const bool activation = std::string(name) == "x" || std::string(name) == "y";
      inputs[name] = make_input(f[name], activation ? layout : Layout::Contiguous);
      args[name] = inputs[name].value;
    }
    for (const char* name : {"running_mean", "running_var"}) {
      if (f.has(name)) args[name] = f[name].clone();
    }

    const Tensor out = op(f, args);
    std::string line = tag + ":";
    auto check = [&](const Tensor& ours, const std::string& ref_name, const char* kind) {
      const double err = check_close(ours, f[ref_name], kTolerance, tag + " " + ref_name, table,
                                     case_name + " " + kind);
      char buf[64];
      std::snprintf(buf, sizeof buf, " %s=%.2e", ref_name.c_str(), err);
      line += buf;
    };
    check(out, "out", "forward");
    for (const char* name : {"running_mean", "running_var"}) {
      const std::string after = std::string(name) + "_after";
      if (f.has(after)) check(args[name], after, "forward");
    }
    if (f.has("grad_out")) {
      // A loss is [] on both sides; anything else must already have out's shape.
      const Tensor grad_out = f["grad_out"].reshape(out.shape());
      out.backward(grad_out);
      for (const auto& [name, input] : inputs) {
        const std::string ref = "grad_" + name;
        if (f.has(ref)) check(input.grad(), ref, "backward");
      }
    }
    std::printf("%s\n", line.c_str());
  }
}

Conv2dOptions conv_options(const Fixture& f) {
  Conv2dOptions opt;
  opt.stride = {f.int_at("cfg.stride", 0), f.int_at("cfg.stride", 1)};
  opt.padding = {f.int_at("cfg.padding", 0), f.int_at("cfg.padding", 1)};
  opt.dilation = {f.int_at("cfg.dilation", 0), f.int_at("cfg.dilation", 1)};
  opt.groups = f.int_at("cfg.groups");
  return opt;
}

void run_all(const std::string& title, const std::vector<std::string>& cases, const OpFn& op) {
  ErrorTable table;
  for (const std::string& name : cases) run_case(name, op, table);
  table.print("parity " + title);
}

}  // namespace

TEST_CASE("parity: conv2d matches torch", "[parity][conv2d]") {
  run_all("conv2d",
          {"conv2d_3x3s1p1_bias", "conv2d_3x3s2p1_nobias", "conv2d_1x1", "conv2d_dw5x5",
           "conv2d_groups2", "conv2d_dilation2"},
          [](const Fixture& f, Args& a) {
            return conv2d(a["x"], a["weight"], a["bias"], conv_options(f));
          });
}

TEST_CASE("parity: batch_norm matches torch", "[parity][batch_norm]") {
  run_all("batch_norm", {"batch_norm_train", "batch_norm_train_noaffine", "batch_norm_eval"},
          [](const Fixture& f, Args& a) {
            return batch_norm(a["x"], a["weight"], a["bias"], a["running_mean"], a["running_var"],
                              f.int_at("cfg.training") != 0, f.float_at("cfg.momentum"),
                              f.float_at("cfg.eps"));
          });
}

TEST_CASE("parity: activations match torch", "[parity][activation]") {
  const std::map<std::string, Tensor (*)(const Tensor&)> ops{
      {"relu", relu}, {"hardswish", hardswish}, {"hardsigmoid", hardsigmoid}, {"sigmoid", sigmoid}};
  for (const auto& [name, fn] : ops) {
    run_all(name, {name}, [fn = fn](const Fixture&, Args& a) { return fn(a["x"]); });
  }
}

TEST_CASE("parity: the activations and pointwise maths of a second model match torch",
          "[parity][activation]") {
  const std::map<std::string, std::function<Tensor(const Tensor&)>> ops{
      {"tanh", [](const Tensor& x) { return dpar::tanh(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApproximation::tanh); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"softplus", [](const Tensor& x) { return softplus(x); }},
      {"softplus_b2_t3", [](const Tensor& x) { return softplus(x, 2.0, 3.0); }},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.1); }},
      {"abs", [](const Tensor& x) { return dpar::abs(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.8); }},
      {"pow3", [](const Tensor& x) { return dpar::pow(x, 3.0); }},
      {"pow_half", [](const Tensor& x) { return dpar::pow(x, 0.5); }},
      {"erf", [](const Tensor& x) { return dpar::erf(x); }}};
  for (const auto& [name, fn] : ops) {
    run_all(name, {name}, [fn = fn](const Fixture&, Args& a) { return fn(a["x"]); });
  }
}

TEST_CASE("parity: exp, log and sqrt match torch", "[parity][unary]") {
  const std::map<std::string, Tensor (*)(const Tensor&)> ops{
      {"exp", dpar::exp}, {"log", dpar::log}, {"sqrt", dpar::sqrt}};
  for (const auto& [name, fn] : ops) {
    run_all(name, {name}, [fn = fn](const Fixture&, Args& a) { return fn(a["x"]); });
  }
}

TEST_CASE("parity: global_avg_pool2d and flatten match torch", "[parity][pool]") {
  run_all("global_avg_pool2d", {"global_avg_pool2d"},
          [](const Fixture&, Args& a) { return global_avg_pool2d(a["x"]); });
  run_all("flatten", {"flatten"}, [](const Fixture& f, Args& a) {
    return a["x"].flatten(f.int_at("cfg.start_dim"), f.int_at("cfg.end_dim"));
  });
}

TEST_CASE("parity: linear matches torch", "[parity][linear]") {
  run_all("linear", {"linear_bias", "linear_nobias"},
          [](const Fixture&, Args& a) { return linear(a["x"], a["weight"], a["bias"]); });
}

TEST_CASE("parity: broadcasting add, sub, mul, div match torch", "[parity][elementwise]") {
  run_all("add", {"add_same", "add_se", "add_bcast"},
          [](const Fixture&, Args& a) { return add(a["x"], a["y"]); });
  run_all("sub", {"sub_same", "sub_bcast"},
          [](const Fixture&, Args& a) { return sub(a["x"], a["y"]); });
  run_all("mul", {"mul_same", "mul_se", "mul_bcast"},
          [](const Fixture&, Args& a) { return mul(a["x"], a["y"]); });
  run_all("div", {"div_same", "div_bcast"},
          [](const Fixture&, Args& a) { return div(a["x"], a["y"]); });
}

TEST_CASE("parity: softmax and log_softmax match torch", "[parity][softmax]") {
  run_all("softmax", {"softmax_dim1", "softmax_dim0"},
          [](const Fixture& f, Args& a) { return softmax(a["x"], f.int_at("cfg.dim")); });
  run_all("log_softmax", {"log_softmax_dim1", "log_softmax_dim0"},
          [](const Fixture& f, Args& a) { return log_softmax(a["x"], f.int_at("cfg.dim")); });
}

TEST_CASE("parity: cross_entropy matches torch", "[parity][cross_entropy]") {
  run_all("cross_entropy", {"cross_entropy", "cross_entropy_ls0p1"}, [](const Fixture& f, Args& a) {
    return cross_entropy(a["x"], f["target"], f.float_at("cfg.label_smoothing"));
  });
}

TEST_CASE("parity: gather, index_select, embedding, where and max/min match torch",
          "[parity][index]") {
  run_all("gather", {"gather_dim1"},
          [](const Fixture& f, Args& a) { return gather(a["x"], 1, f["index"]); });
  run_all("index_select", {"index_select_dim0"},
          [](const Fixture& f, Args& a) { return index_select(a["x"], 0, f["index"]); });
  run_all("embedding", {"embedding_pad2"},
          [](const Fixture& f, Args& a) { return embedding(a["weight"], f["index"], 2); });
  run_all("where", {"where_bcast"},
          [](const Fixture& f, Args& a) { return where(f["cond"], a["x"], a["y"]); });
  run_all("masked_fill", {"masked_fill"},
          [](const Fixture& f, Args& a) { return masked_fill(a["x"], f["cond"], -1.5); });
  run_all("max", {"max_dim1"}, [](const Fixture&, Args& a) { return max(a["x"], 1).values; });
  run_all("min", {"min_dim0_keepdim"},
          [](const Fixture&, Args& a) { return min(a["x"], 0, true).values; });
}

TEST_CASE("parity: cat, stack, N-d matmul, linear on [..., C] and BatchNorm1d match torch",
          "[parity][shape]") {
  run_all("cat", {"cat_dim1"}, [](const Fixture&, Args& a) {
    return cat({a["x"], a["y"], a["x"]}, 1);
  });
  run_all("stack", {"stack_dim1"}, [](const Fixture&, Args& a) {
    return stack({a["x"], a["y"]}, 1);
  });
  run_all("matmul", {"matmul_bcast", "matmul_3d_2d", "matmul_vec"},
          [](const Fixture&, Args& a) { return matmul(a["x"], a["y"]); });
  run_all("linear", {"linear_3d"},
          [](const Fixture&, Args& a) { return linear(a["x"], a["weight"], a["bias"]); });
  run_all("batch_norm1d", {"batch_norm1d_2d", "batch_norm1d_3d"}, [](const Fixture& f, Args& a) {
    return batch_norm(a["x"], a["weight"], a["bias"], a["running_mean"], a["running_var"], true,
                      f.float_at("cfg.momentum"), f.float_at("cfg.eps"));
  });
}

TEST_CASE("parity: layer_norm and group_norm match torch", "[parity][layer_norm]") {
  run_all("layer_norm", {"layer_norm_affine"}, [](const Fixture&, Args& a) {
    return layer_norm(a["x"], {8}, a["weight"], a["bias"], 1e-5);
  });
  run_all("layer_norm", {"layer_norm_2d_noaffine"}, [](const Fixture&, Args& a) {
    return layer_norm(a["x"], {4, 6}, {}, {}, 1e-6);
  });
  run_all("group_norm", {"group_norm"}, [](const Fixture&, Args& a) {
    return group_norm(a["x"], 3, a["weight"], a["bias"], 1e-5);
  });
}

TEST_CASE("parity: losses match torch", "[parity][loss]") {
  run_all("cross_entropy", {"cross_entropy_ignore"},
          [](const Fixture& f, Args& a) { return cross_entropy(a["x"], f["target"], 0.1, -100); });
  run_all("nll_loss", {"nll_loss_ignore"},
          [](const Fixture& f, Args& a) { return nll_loss(a["x"], f["target"], -100); });
  run_all("mse_loss", {"mse_loss"},
          [](const Fixture&, Args& a) { return mse_loss(a["x"], a["y"]); });
  run_all("bce_with_logits", {"bce_with_logits"},
          [](const Fixture&, Args& a) { return binary_cross_entropy_with_logits(a["x"], a["y"]); });
}

TEST_CASE("parity: max, average and adaptive pooling match torch", "[parity][pool]") {
  run_all("max_pool2d", {"max_pool_3x3s2p1"},
          [](const Fixture&, Args& a) { return max_pool2d(a["x"], {3}, {2}, {1}); });
  run_all("max_pool2d", {"max_pool_3x3s2_ceil"},
          [](const Fixture&, Args& a) { return max_pool2d(a["x"], {3}, {2}, {0}, true); });
  run_all("avg_pool2d", {"avg_pool_3x3s2p1"},
          [](const Fixture&, Args& a) { return avg_pool2d(a["x"], {3}, {2}, {1}); });
  run_all("avg_pool2d", {"avg_pool_3x3s2p1_exclude_ceil"},
          [](const Fixture&, Args& a) { return avg_pool2d(a["x"], {3}, {2}, {1}, true, false); });
  run_all("adaptive_avg_pool2d", {"adaptive_avg_pool_3x5"}, [](const Fixture&, Args& a) {
    return adaptive_avg_pool2d(a["x"], {3, 5});
  });
}

TEST_CASE("parity: scaled dot-product attention matches torch", "[parity][attention]") {
  // query x, key y, value "weight" (the harness's names for three differentiable inputs).
  run_all("sdpa", {"sdpa"}, [](const Fixture&, Args& a) {
    return scaled_dot_product_attention(a["x"], a["y"], a["weight"]);
  });
  run_all("sdpa", {"sdpa_causal"}, [](const Fixture&, Args& a) {
    return scaled_dot_product_attention(a["x"], a["y"], a["weight"], {}, 0.0, true);
  });
  run_all("sdpa", {"sdpa_mask"}, [](const Fixture& f, Args& a) {
    return scaled_dot_product_attention(a["x"], a["y"], a["weight"], f["cond"]);
  });
}
