"""PyTorch reference run of MobileNetV3-small (read by test_mobilenet_parity.cpp).

Usage: /usr/bin/python3 tests/parity/fixtures_mobilenet.py --seed 0 --out DIR

Model: torch.manual_seed(seed); torchvision.models.mobilenet_v3_small(num_classes=10), then
every BatchNorm weight/bias/running stat and every bias is redrawn from the same seed (see
perturb()): at torchvision's init they are 1, 0, 0, 1 and 0, values under which a mix-up of
weight and bias, or of running mean and variance, would go unnoticed.

Mode: model.train(), but the classifier's Dropout (classifier.2) in eval mode. Dropout masks
come from each framework's own random generator and cannot match, so dropout is the identity
here; on the dpar side mobilenet_v3_small(10, /*dropout=*/0.0) is the same computation.
Everything else (BatchNorm batch statistics and running-stat updates) runs in training mode.

Data: one batch x [4,3,64,64] ~ N(0,1) and labels [4] uniform in [0,10).

Files written to DIR (tensor names are torchvision state-dict names unless noted):
  mobilenet_state.safetensors       the full state_dict before training (142 parameters and
                                    all BatchNorm buffers, num_batches_tracked as i64 [])
  mobilenet_batch.safetensors       input (f32 [4,3,64,64]), target (i64 [4]),
                                    logits (f32 [4,10]) and loss (f32 [], mean cross-entropy,
                                    no label smoothing) of the first forward pass
  mobilenet_grads.safetensors       the gradient of the loss w.r.t. every parameter, by name
  mobilenet_after_forward.safetensors
                                    the BatchNorm running_mean/running_var (and
                                    num_batches_tracked) after that first forward pass
  mobilenet_sgd3.safetensors        the full state_dict after 3 steps of
                                    torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4),
                                    each step: zero_grad, forward on the same batch, loss,
                                    backward, step (so step 1 uses the gradients above, and
                                    the running stats have seen 3 forward passes)
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import save  # noqa: E402

LR, MOMENTUM, WEIGHT_DECAY, STEPS = 0.1, 0.9, 1e-4, 3


def perturb(model):
    """Moves BN affine params, BN running stats and biases off their init values."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
            elif isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.05)


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def buffers(model):
    return {k: v.detach().clone() for k, v in model.named_buffers()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # fixtures bit-identical from run to run

    torch.manual_seed(args.seed)
    model = torchvision.models.mobilenet_v3_small(num_classes=10)
    perturb(model)
    x = torch.randn(4, 3, 64, 64)
    target = torch.randint(0, 10, (4,))

    model.train()
    dropout = model.classifier[2]
    assert isinstance(dropout, torch.nn.Dropout)
    dropout.eval()

    meta = {"seed": args.seed, "torch": torch.__version__, "torchvision": torchvision.__version__}
    save(os.path.join(args.out, "mobilenet_state.safetensors"), state(model), metadata=meta)

    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                          weight_decay=WEIGHT_DECAY)
    for step in range(STEPS):
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, target)
        loss.backward()
        if step == 0:
            save(os.path.join(args.out, "mobilenet_batch.safetensors"),
                 {"input": x, "target": target, "logits": logits, "loss": loss}, metadata=meta)
            grads = {name: p.grad.clone() for name, p in model.named_parameters()}
            assert len(grads) == 142, len(grads)
            save(os.path.join(args.out, "mobilenet_grads.safetensors"), grads, metadata=meta)
            save(os.path.join(args.out, "mobilenet_after_forward.safetensors"), buffers(model),
                 metadata=meta)
        opt.step()
    save(os.path.join(args.out, "mobilenet_sgd3.safetensors"), state(model),
         metadata=dict(meta, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, steps=STEPS))
    print(f"fixtures_mobilenet: loss {loss.item():.6f} after {STEPS} steps, wrote {args.out}")


if __name__ == "__main__":
    main()
