"""PyTorch reference values for dpar's differentiable ops (read by test_ops_parity.cpp).

Usage: /usr/bin/python3 tests/parity/fixtures_ops.py --seed 0 --out DIR

Writes one DIR/<case>.safetensors per (op, configuration), e.g. conv2d_dw5x5.safetensors.
Every file uses the same tensor names, so the C++ side can treat all cases alike:

  inputs     x            the (first) input, f32
             y            second operand of binary elementwise ops (add/sub/mul/div)
             weight, bias parameters (conv2d, linear, batch_norm); absent when the case has none
             running_mean, running_var
                          batch_norm running statistics BEFORE the call
             target       class indices for cross_entropy (i64 [N])
             index        i64 indices (gather, index_select, embedding)
             cond         u8 0/1 condition (where, masked_fill)
  config     cfg.stride, cfg.padding, cfg.dilation (i64 [2]), cfg.groups (i64 [1])   conv2d
             cfg.training (i64 [1]: 0/1), cfg.momentum, cfg.eps (f32 [1])        batch_norm
             cfg.dim (i64 [1])                       softmax / log_softmax
             cfg.label_smoothing (f32 [1])           cross_entropy
             cfg.start_dim, cfg.end_dim (i64 [1])    flatten
  outputs    out          the op's forward result
             running_mean_after, running_var_after
                          batch_norm running statistics after the call (training only)
  backward   grad_out     a random upstream gradient with out's shape ([] for a loss)
             grad_<name>  d(sum(out * grad_out)) / d(<name>) for every differentiable input
                          (grad_x, grad_y, grad_weight, grad_bias)

Inputs are drawn from torch.Generator seeded with --seed (one generator for the whole file,
cases in a fixed order), so a seed fully determines the fixtures. Inputs are continuous random
values, so landing exactly on a kink (relu at 0, hardswish at +-3) has probability zero;
log, sqrt and the divisor of div get strictly positive inputs.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import save  # noqa: E402


class Cases:
    def __init__(self, seed, out_dir):
        self.gen = torch.Generator().manual_seed(seed)
        self.out_dir = out_dir
        self.written = []

    def randn(self, *shape, scale=1.0):
        return torch.randn(shape, generator=self.gen) * scale

    def rand(self, *shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(shape, generator=self.gen)

    def write(self, name, fn, inputs, config=None, extra=None):
        """inputs: ordered dict name -> tensor; float tensors get gradients.

        fn(**inputs) returns the output (or (output, extra_dict) for ops with side outputs).
        """
        leaves = {}
        for k, v in inputs.items():
            if v is None:
                continue
            v = v.detach().clone()
            if v.is_floating_point() and not k.startswith("running_"):
                v.requires_grad_(True)
            leaves[k] = v
        # Ops that update state in place (batch_norm) get copies; the originals are saved.
        call_args = {k: (v.clone() if k.startswith("running_") else v) for k, v in leaves.items()}
        result = fn(**call_args)
        side = {}
        if isinstance(result, tuple):
            result, side = result
        grad_out = self.randn(*result.shape)
        tensors = {k: v.detach() for k, v in leaves.items()}
        for k, v in (config or {}).items():
            tensors["cfg." + k] = v
        tensors["out"] = result.detach()
        tensors.update({k: v.detach() for k, v in side.items()})
        tensors.update({k: v.detach() for k, v in (extra or {}).items()})
        diff = [(k, v) for k, v in leaves.items() if v.requires_grad]
        if diff:
            grads = torch.autograd.grad(result, [v for _, v in diff], grad_out)
            tensors["grad_out"] = grad_out
            for (k, _), g in zip(diff, grads):
                tensors["grad_" + k] = g
        save(os.path.join(self.out_dir, name + ".safetensors"), tensors,
             metadata={"case": name})
        self.written.append(name)


def i64(*values):
    return torch.tensor(values, dtype=torch.int64)


def f32(*values):
    return torch.tensor(values, dtype=torch.float32)


def conv_cases(c):
    # name, N, C, H, W, O, k, stride, padding, dilation, groups, bias
    configs = [
        ("conv2d_3x3s1p1_bias", 2, 4, 9, 9, 6, 3, 1, 1, 1, 1, True),
        ("conv2d_3x3s2p1_nobias", 2, 3, 10, 10, 8, 3, 2, 1, 1, 1, False),
        ("conv2d_1x1", 2, 8, 7, 7, 12, 1, 1, 0, 1, 1, False),
        ("conv2d_dw5x5", 2, 8, 11, 11, 8, 5, 2, 2, 1, 8, False),
        ("conv2d_groups2", 2, 4, 8, 8, 6, 3, 1, 1, 1, 2, True),
        ("conv2d_dilation2", 2, 3, 9, 9, 5, 3, 1, 2, 2, 1, True),
    ]
    for name, n, ch, h, w, o, k, s, p, d, g, has_bias in configs:
        x = c.randn(n, ch, h, w)
        weight = c.randn(o, ch // g, k, k, scale=(2.0 / (ch // g * k * k)) ** 0.5)
        bias = c.randn(o, scale=0.1) if has_bias else None

        def fn(x, weight, bias=None, s=s, p=p, d=d, g=g):
            return F.conv2d(x, weight, bias, stride=s, padding=p, dilation=d, groups=g)

        c.write(name, fn, {"x": x, "weight": weight, "bias": bias},
                config={"stride": i64(s, s), "padding": i64(p, p), "dilation": i64(d, d),
                        "groups": i64(g)})


def batch_norm_cases(c):
    momentum, eps = 0.01, 1e-3
    for name, training, affine in [("batch_norm_train", True, True),
                                   ("batch_norm_train_noaffine", True, False),
                                   ("batch_norm_eval", False, True)]:
        n, ch, h, w = 4, 6, 5, 5
        # A non-zero mean and non-unit scale per channel, as after a conv.
        x = c.randn(n, ch, h, w) * c.rand(1, ch, 1, 1, lo=0.5, hi=2.0) + c.randn(1, ch, 1, 1)
        inputs = {"x": x,
                  "weight": c.rand(ch, lo=0.5, hi=1.5) if affine else None,
                  "bias": c.randn(ch, scale=0.2) if affine else None,
                  "running_mean": c.randn(ch, scale=0.3),
                  "running_var": c.rand(ch, lo=0.5, hi=1.5)}

        def fn(x, running_mean, running_var, weight=None, bias=None, training=training):
            out = F.batch_norm(x, running_mean, running_var, weight, bias, training=training,
                               momentum=momentum, eps=eps)
            side = {}
            if training:
                side = {"running_mean_after": running_mean, "running_var_after": running_var}
            return out, side

        c.write(name, fn, inputs,
                config={"training": i64(int(training)), "momentum": f32(momentum),
                        "eps": f32(eps)})


def unary_cases(c):
    shape = (2, 5, 6, 7)
    c.write("relu", lambda x: F.relu(x), {"x": c.randn(*shape)})
    # Spread over [-6, 6] so the linear, quadratic and saturated pieces all occur.
    c.write("hardswish", lambda x: F.hardswish(x), {"x": c.randn(*shape, scale=3.0)})
    c.write("hardsigmoid", lambda x: F.hardsigmoid(x), {"x": c.randn(*shape, scale=3.0)})
    c.write("sigmoid", lambda x: torch.sigmoid(x), {"x": c.randn(*shape, scale=3.0)})
    c.write("tanh", lambda x: torch.tanh(x), {"x": c.randn(*shape, scale=2.0)})
    c.write("gelu", lambda x: F.gelu(x), {"x": c.randn(*shape, scale=2.0)})
    c.write("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), {"x": c.randn(*shape, scale=2.0)})
    c.write("silu", lambda x: F.silu(x), {"x": c.randn(*shape, scale=3.0)})
    c.write("softplus", lambda x: F.softplus(x), {"x": c.randn(*shape, scale=3.0)})
    c.write("softplus_b2_t3", lambda x: F.softplus(x, beta=2.0, threshold=3.0),
            {"x": c.randn(*shape, scale=3.0)})
    c.write("leaky_relu", lambda x: F.leaky_relu(x, 0.1), {"x": c.randn(*shape)})
    c.write("abs", lambda x: torch.abs(x), {"x": c.randn(*shape)})
    c.write("clamp", lambda x: torch.clamp(x, -0.5, 0.8), {"x": c.randn(*shape)})
    c.write("pow3", lambda x: torch.pow(x, 3.0), {"x": c.randn(3, 17)})
    c.write("erf", lambda x: torch.erf(x), {"x": c.randn(*shape)})
    c.write("pow_half", lambda x: torch.pow(x, 0.5), {"x": c.rand(3, 17, lo=0.1, hi=4.0)})
    c.write("exp", lambda x: torch.exp(x), {"x": c.randn(3, 17)})
    c.write("log", lambda x: torch.log(x), {"x": c.rand(3, 17, lo=0.1, hi=4.0)})
    c.write("sqrt", lambda x: torch.sqrt(x), {"x": c.rand(3, 17, lo=0.1, hi=4.0)})
    c.write("global_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 1),
            {"x": c.randn(3, 8, 7, 5)})
    c.write("flatten", lambda x: torch.flatten(x, 1), {"x": c.randn(3, 16, 1, 1)},
            config={"start_dim": i64(1), "end_dim": i64(-1)})


def linear_cases(c):
    for name, has_bias in [("linear_bias", True), ("linear_nobias", False)]:
        x = c.randn(5, 24)
        weight = c.randn(10, 24, scale=0.2)
        bias = c.randn(10, scale=0.1) if has_bias else None
        c.write(name, lambda x, weight, bias=None: F.linear(x, weight, bias),
                {"x": x, "weight": weight, "bias": bias})


def binary_cases(c):
    ops = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
    # name suffix -> (x shape, y shape, y strictly positive for div)
    shapes = [("same", (2, 3, 4, 5), (2, 3, 4, 5)),
              ("se", (2, 8, 5, 5), (2, 8, 1, 1)),  # squeeze-excitation scaling
              ("bcast", (2, 3, 4), (3, 1))]
    for op, fn in ops.items():
        for suffix, xs, ys in shapes:
            if op in ("sub", "div") and suffix == "se":
                continue
            x = c.randn(*xs)
            y = c.rand(*ys, lo=0.5, hi=2.0) if op == "div" else c.randn(*ys)
            c.write(f"{op}_{suffix}", lambda x, y, fn=fn: fn(x, y), {"x": x, "y": y})


def classification_cases(c):
    for dim in (1, 0):
        c.write(f"softmax_dim{dim}", lambda x, dim=dim: F.softmax(x, dim),
                {"x": c.randn(6, 10, scale=3.0)}, config={"dim": i64(dim)})
        c.write(f"log_softmax_dim{dim}", lambda x, dim=dim: F.log_softmax(x, dim),
                {"x": c.randn(6, 10, scale=3.0)}, config={"dim": i64(dim)})
    for name, ls in [("cross_entropy", 0.0), ("cross_entropy_ls0p1", 0.1)]:
        logits = c.randn(8, 10, scale=2.0)
        target = torch.randint(0, 10, (8,), generator=c.gen)
        c.write(name, lambda x, target, ls=ls: F.cross_entropy(x, target, label_smoothing=ls),
                {"x": logits, "target": target}, config={"label_smoothing": f32(ls)})


def index_cases(c):
    """gather, index_select, embedding, where, masked_fill, max/min over a dim."""
    def randint(hi, *shape):
        return torch.randint(0, hi, shape, generator=c.gen)

    c.write("gather_dim1", lambda x, index: torch.gather(x, 1, index),
            {"x": c.randn(3, 5, 4), "index": randint(5, 3, 2, 4)})
    c.write("index_select_dim0", lambda x, index: torch.index_select(x, 0, index),
            {"x": c.randn(4, 6), "index": torch.tensor([3, 0, 3, 1, 2])})
    c.write("embedding_pad2", lambda weight, index: F.embedding(index, weight, padding_idx=2),
            {"weight": c.randn(10, 6), "index": torch.tensor([[2, 5, 9, 0], [2, 2, 7, 1], [3, 3, 4, 8]])})
    cond = (torch.rand(3, 4, generator=c.gen) > 0.5).to(torch.uint8)
    c.write("where_bcast", lambda x, y, cond: torch.where(cond.bool(), x, y),
            {"x": c.randn(3, 4), "y": c.randn(4), "cond": cond})
    c.write("masked_fill", lambda x, cond: x.masked_fill(cond.bool(), -1.5),
            {"x": c.randn(3, 4), "cond": cond})
    c.write("max_dim1", lambda x: torch.max(x, 1).values, {"x": c.randn(4, 7)})
    c.write("min_dim0_keepdim", lambda x: torch.min(x, 0, keepdim=True).values,
            {"x": c.randn(4, 7)})


def shape_cases(c):
    """cat, stack, N-d matmul, linear on [..., C], BatchNorm1d shapes."""
    c.write("cat_dim1", lambda x, y: torch.cat([x, y, x], 1),
            {"x": c.randn(2, 3, 4), "y": c.randn(2, 2, 4)})
    c.write("stack_dim1", lambda x, y: torch.stack([x, y], 1),
            {"x": c.randn(3, 4), "y": c.randn(3, 4)})
    c.write("matmul_bcast", lambda x, y: torch.matmul(x, y),
            {"x": c.randn(2, 1, 3, 4), "y": c.randn(3, 4, 5)})
    c.write("matmul_3d_2d", lambda x, y: torch.matmul(x, y),
            {"x": c.randn(2, 5, 4), "y": c.randn(4, 3)})
    c.write("matmul_vec", lambda x, y: torch.matmul(x, y), {"x": c.randn(4), "y": c.randn(2, 4, 3)})
    c.write("linear_3d", lambda x, weight, bias: F.linear(x, weight, bias),
            {"x": c.randn(2, 3, 6), "weight": c.randn(4, 6, scale=0.3), "bias": c.randn(4)})
    momentum, eps = 0.1, 1e-5
    for name, shape in [("batch_norm1d_2d", (8, 5)), ("batch_norm1d_3d", (4, 5, 6))]:
        def fn(x, running_mean, running_var, weight, bias):
            out = F.batch_norm(x, running_mean, running_var, weight, bias, training=True,
                               momentum=momentum, eps=eps)
            return out, {"running_mean_after": running_mean, "running_var_after": running_var}
        c.write(name, fn, {"x": c.randn(*shape) * 2 + 0.5, "weight": c.rand(5, lo=0.5, hi=1.5),
                           "bias": c.randn(5, scale=0.2), "running_mean": c.randn(5, scale=0.3),
                           "running_var": c.rand(5, lo=0.5, hi=1.5)},
                config={"training": i64(1), "momentum": f32(momentum), "eps": f32(eps)})


def norm_layer_cases(c):
    """LayerNorm (affine and not, over one and two dims) and GroupNorm."""
    c.write("layer_norm_affine", lambda x, weight, bias: F.layer_norm(x, (8,), weight, bias, 1e-5),
            {"x": c.randn(2, 5, 8) * 2 + 1, "weight": c.rand(8, lo=0.5, hi=1.5),
             "bias": c.randn(8, scale=0.3)})
    c.write("layer_norm_2d_noaffine", lambda x: F.layer_norm(x, (4, 6), eps=1e-6),
            {"x": c.randn(3, 4, 6) * 3})
    c.write("group_norm", lambda x, weight, bias: F.group_norm(x, 3, weight, bias, 1e-5),
            {"x": c.randn(2, 6, 5, 4) + 0.5, "weight": c.rand(6, lo=0.5, hi=1.5),
             "bias": c.randn(6, scale=0.3)})


def loss_cases(c):
    """cross_entropy with ignore_index, nll_loss, mse_loss, binary_cross_entropy_with_logits."""
    target = torch.tensor([3, -100, 0, 9, -100, 4])
    c.write("cross_entropy_ignore", lambda x, target: F.cross_entropy(x, target, ignore_index=-100,
                                                                      label_smoothing=0.1),
            {"x": c.randn(6, 10, scale=2.0), "target": target})
    c.write("nll_loss_ignore", lambda x, target: F.nll_loss(x, target, ignore_index=-100),
            {"x": F.log_softmax(c.randn(6, 10), 1), "target": target})
    c.write("mse_loss", lambda x, y: F.mse_loss(x, y), {"x": c.randn(3, 7), "y": c.randn(3, 7)})
    c.write("bce_with_logits", lambda x, y: F.binary_cross_entropy_with_logits(x, y),
            {"x": c.randn(4, 5, scale=4.0), "y": c.rand(4, 5)})


def pool_cases(c):
    """max/avg pooling (padding, stride, ceil mode, count_include_pad) and adaptive averages.
    max pooling gets distinct values (a permutation), so ties cannot route gradients apart."""
    def distinct(*shape):
        n = 1
        for d in shape:
            n *= d
        return (torch.randperm(n, generator=c.gen).float() * 0.05 - 1.0).reshape(shape)

    c.write("max_pool_3x3s2p1", lambda x: F.max_pool2d(x, 3, 2, 1), {"x": distinct(2, 3, 9, 8)})
    c.write("max_pool_3x3s2_ceil", lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True),
            {"x": distinct(2, 3, 8, 8)})
    c.write("avg_pool_3x3s2p1", lambda x: F.avg_pool2d(x, 3, 2, 1), {"x": c.randn(2, 3, 9, 8)})
    c.write("avg_pool_3x3s2p1_exclude_ceil",
            lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
            {"x": c.randn(2, 3, 8, 7)})
    c.write("adaptive_avg_pool_3x5", lambda x: F.adaptive_avg_pool2d(x, (3, 5)),
            {"x": c.randn(2, 3, 7, 9)})


def attention_cases(c):
    """scaled dot-product attention, written out as torch computes it: softmax(q k^T / sqrt(E)
    + mask) v (torch 1.13 has no public F.scaled_dot_product_attention)."""
    def sdpa(q, k, v, mask=None, causal=False):
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if mask is not None:
            s = s.masked_fill(mask == 0, float("-inf"))
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2], s.shape[-1]).triu(1).bool(), float("-inf"))
        return torch.softmax(s, -1) @ v

    c.write("sdpa", lambda x, y, weight: sdpa(x, y, weight),
            {"x": c.randn(2, 3, 6, 8), "y": c.randn(2, 3, 9, 8), "weight": c.randn(2, 3, 9, 5)})
    c.write("sdpa_causal", lambda x, y, weight: sdpa(x, y, weight, causal=True),
            {"x": c.randn(2, 2, 7, 4), "y": c.randn(2, 2, 7, 4), "weight": c.randn(2, 2, 7, 4)})
    mask = (torch.rand(6, 9, generator=c.gen) > 0.3).to(torch.uint8)
    mask[:, 0] = 1  # every query sees at least one key
    c.write("sdpa_mask", lambda x, y, weight, cond: sdpa(x, y, weight, mask=cond),
            {"x": c.randn(2, 6, 8), "y": c.randn(2, 9, 8), "weight": c.randn(2, 9, 8),
             "cond": mask})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # fixtures bit-identical from run to run
    c = Cases(args.seed, args.out)
    conv_cases(c)
    batch_norm_cases(c)
    unary_cases(c)
    linear_cases(c)
    binary_cases(c)
    classification_cases(c)
    index_cases(c)
    shape_cases(c)
    norm_layer_cases(c)
    loss_cases(c)
    pool_cases(c)
    attention_cases(c)
    print(f"fixtures_ops: wrote {len(c.written)} cases to {args.out}")


if __name__ == "__main__":
    main()
