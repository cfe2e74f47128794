"""PyTorch reference for dpar's Vision Transformer (read by test_vit_parity.cpp).

Usage: /usr/bin/python3 tests/parity/fixtures_vit.py --seed 0 --out DIR

torchvision.models.VisionTransformer at the "ViT-Tiny" size of examples/vit (32 px images,
patch 4, 6 layers, 3 heads, width 192, MLP 768, 10 classes, no dropout), in training mode.
torchvision starts the classifier at zero (every logit 0, nothing to compare), so every
parameter is then moved by a small random amount. Writes:
  vit_state.safetensors   the state dict, torchvision's names
  vit_batch.safetensors   x [4,3,32,32], target [4], logits [4,10], loss [],
                          grad.<name> for every parameter (d loss / d parameter), grad.x
  vit_export_ref.safetensors  eval mode: x1 [1,3,32,32], x3, logits1/3, probs1/3
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torchvision.models import VisionTransformer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import save  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = VisionTransformer(image_size=32, patch_size=4, num_layers=6, num_heads=3,
                              hidden_dim=192, mlp_dim=768, num_classes=10)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.05 if p.dim() > 1 else 0.1
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    model.train()
    save(os.path.join(args.out, "vit_state.safetensors"),
         {k: v.detach().clone() for k, v in model.state_dict().items()}, metadata={"case": "vit"})
    x = torch.randn(4, 3, 32, 32, generator=gen).requires_grad_(True)
    target = torch.randint(0, 10, (4,), generator=gen)
    logits = model(x)
    loss = F.cross_entropy(logits, target)
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [x] + list(params.values()))
    tensors = {"x": x.detach(), "target": target, "logits": logits.detach(), "loss": loss.detach(),
               "grad.x": grads[0]}
    for (name, _), g in zip(params.items(), grads[1:]):
        tensors["grad." + name] = g
    save(os.path.join(args.out, "vit_batch.safetensors"), tensors, metadata={"case": "vit"})
    # Eval-mode references for the ONNX export check (onnx_check.py): batch 1 and batch 3.
    model.eval()
    ref = {}
    with torch.no_grad():
        for b in (1, 3):
            xb = torch.randn(b, 3, 32, 32, generator=gen)
            logits_b = model(xb)
            ref.update({f"x{b}": xb, f"logits{b}": logits_b, f"probs{b}": logits_b.softmax(1)})
    save(os.path.join(args.out, "vit_export_ref.safetensors"), ref, metadata={"case": "vit"})
    print(f"fixtures_vit: wrote vit_state and vit_batch ({len(params)} parameters) to {args.out}")


if __name__ == "__main__":
    main()
