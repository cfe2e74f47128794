"""PyTorch reference trajectories for dpar's optimizers (read by test_optim_parity.cpp).

Usage: /usr/bin/python3 tests/parity/fixtures_optim.py --seed 0 --out DIR

Writes DIR/optim.safetensors with
  init.<p>          the starting value of parameter p (p = 0, 1, 2; the last one is large
                    enough for dpar's multi-threaded update path)
  grad.<s>.<p>      the gradient given to parameter p before step s (s = 0..4)
  <case>.<s>.<p>    parameter p after step s of the optimizer configured as <case>

Cases (the C++ test builds the same optimizers from the same options):
  sgd_plain                  SGD lr=0.1
  sgd_momentum_wd            SGD lr=0.1 momentum=0.9 dampening=0.1 weight_decay=0.01
  sgd_nesterov               SGD lr=0.05 momentum=0.9 nesterov weight_decay=1e-3
  rmsprop_plain              RMSprop lr=0.01
  rmsprop_centered_momentum  RMSprop lr=0.01 alpha=0.9 eps=1e-6 weight_decay=0.01
                             momentum=0.8 centered
  adamw                      AdamW lr=0.01 betas=(0.9, 0.99) weight_decay=0.1
  adamw_skip                 as adamw, but parameter 1 has no gradient at step 1 (skipped:
                             neither it nor its state advances)
  adam                       Adam lr=0.01 (no weight decay)
  adam_l2                    Adam lr=0.01 betas=(0.8, 0.95) eps=1e-6 weight_decay=0.05 (L2: added
                             to the gradient, unlike AdamW)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import save  # noqa: E402

SHAPES = [(4, 3), (7,), (180, 200)]
STEPS = 5

CASES = {
    "sgd_plain": lambda p: torch.optim.SGD(p, lr=0.1, foreach=False),
    "sgd_momentum_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1,
                                                 weight_decay=0.01, foreach=False),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                              weight_decay=1e-3, foreach=False),
    "rmsprop_plain": lambda p: torch.optim.RMSprop(p, lr=0.01, foreach=False),
    "rmsprop_centered_momentum": lambda p: torch.optim.RMSprop(
        p, lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.8, centered=True,
        foreach=False),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1,
                                         foreach=False),
    "adamw_skip": lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1,
                                              foreach=False),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, foreach=False),
    "adam_l2": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.95), eps=1e-6,
                                          weight_decay=0.05, foreach=False),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    gen = torch.Generator().manual_seed(args.seed)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(STEPS)]

    out = {}
    for p, t in enumerate(init):
        out[f"init.{p}"] = t
    for s in range(STEPS):
        for p, g in enumerate(grads[s]):
            out[f"grad.{s}.{p}"] = g
    for name, make in CASES.items():
        params = [t.clone().requires_grad_(True) for t in init]
        opt = make(params)
        for s in range(STEPS):
            for p, param in enumerate(params):
                skip = name == "adamw_skip" and s == 1 and p == 1
                param.grad = None if skip else grads[s][p].clone()
            opt.step()
            for p, param in enumerate(params):
                out[f"{name}.{s}.{p}"] = param.detach().clone()

    save(os.path.join(args.out, "optim.safetensors"), out,
         metadata={"seed": args.seed, "torch": torch.__version__})


if __name__ == "__main__":
    main()
