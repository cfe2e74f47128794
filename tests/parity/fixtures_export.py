"""PyTorch references for the ONNX export (read by test_export_parity.cpp and onnx_check.py).

Usage: /usr/bin/python3 tests/parity/fixtures_export.py --seed 0 --out DIR

Models (torchvision 0.14, created after torch.manual_seed(seed), eval mode):
  small  mobilenet_v3_small(num_classes=10), inputs 64x64
  large  mobilenet_v3_large(num_classes=7), inputs 32x32 (blocks without expansion conv and
         with residual connections, which the small model does not have together)
BatchNorm running statistics are measured on random batches and then every BatchNorm's
weight, bias, running mean and running variance is moved off them (calibrate_and_perturb()),
so folding is exercised with statistics far from 1, 0, 0, 1 while the output still depends
on the input; conv/linear biases and linear weights are redrawn too.

Files written to DIR for each model M in (small, large):
  export_M_state.safetensors   the state_dict (torchvision names, num_batches_tracked i64 [])
  export_M_ref.safetensors     x1 [1,3,S,S] and x3 [3,3,S,S] ~ N(0,1); logits1, logits3 and
                               probs1, probs3 (softmax over classes) from torch in eval mode
"""
import argparse
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import save  # noqa: E402

MODELS = {  # name -> (torchvision constructor, classes, image side)
    "small": (torchvision.models.mobilenet_v3_small, 10, 64),
    "large": (torchvision.models.mobilenet_v3_large, 7, 32),
}


def calibrate_and_perturb(model, side):
    """Realistic, non-trivial BatchNorm statistics.

    Untrained weights with BN at its init statistics (mean 0, var 1) shrink the signal layer
    by layer in eval mode until the output no longer depends on the input (the biases take
    over), and a parity test on such a model checks almost nothing. So the running statistics
    are first measured on random batches (cumulative average, momentum=None), then every BN's
    affine parameters and statistics are moved off those values: folding must get each of the
    four vectors right, and the output depends on the input and on the first layers.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.reset_running_stats()
                module.momentum = None
        model.train()
        for _ in range(4):
            model(torch.randn(8, 3, side, side))
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.momentum = 0.01
                std = module.running_var.sqrt()
                module.running_mean.add_(0.1 * std * torch.randn_like(std))
                module.running_var.mul_(torch.empty_like(std).uniform_(0.8, 1.25))
                module.weight.uniform_(0.8, 1.2)
                module.bias.normal_(0.0, 0.1)
            elif isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.05)
            if isinstance(module, torch.nn.Linear):
                # torchvision's N(0, 0.01) init makes the logits almost constant.
                module.weight.normal_(0.0, 1.0 / module.in_features ** 0.5)
        model.eval()
        # Logits of a few units: a saturated softmax (one-hot probabilities) would compare
        # nothing but zeros and ones.
        last = model.classifier[-1]
        scale = model(torch.randn(8, 3, side, side)).std().item() / 2.0
        last.weight.div_(scale)
        last.bias.div_(scale)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # fixtures bit-identical from run to run

    for name, (ctor, classes, side) in MODELS.items():
        torch.manual_seed(args.seed)
        model = ctor(num_classes=classes)
        calibrate_and_perturb(model, side)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        save(os.path.join(args.out, f"export_{name}_state.safetensors"), state)
        ref = {"x1": torch.randn(1, 3, side, side), "x3": torch.randn(3, 3, side, side)}
        with torch.no_grad():
            for b in ("1", "3"):
                logits = model(ref["x" + b])
                ref["logits" + b] = logits
                ref["probs" + b] = torch.softmax(logits, dim=1)
        save(os.path.join(args.out, f"export_{name}_ref.safetensors"), ref)


if __name__ == "__main__":
    main()
