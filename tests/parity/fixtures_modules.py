"""PyTorch reference values for dpar's nn modules (read by test_modules_parity.cpp).

Usage: /usr/bin/python3 tests/parity/fixtures_modules.py --seed 0 --out DIR

Writes DIR/module_<case>.safetensors per case with:
  sd.<name>      the torch module's state dict (loaded into dpar's module, strict)
  x, (k, v)      inputs (f32; "ids" i64 for Embedding; "mask"/"kpm" u8 masks)
  out            the module's output in the stated mode
  grad_out       a random upstream gradient; grad.x (grad.k, grad.v) and grad.<param name>
                 d(sum(out * grad_out)) / d(input or parameter)
Cases (all in training mode unless noted; dropout 0 so both sides are deterministic):
  layer_norm, group_norm, batch_norm1d (and its running stats: sd_after.*), embedding_pad,
  mha_batch_first (self-attention, key padding mask), mha_weights_mean / mha_weights_heads
  (need_weights=True, averaged and per head), mha_seq_first_cross (query/key/value
  differ, u8 attn_mask), encoder_post_relu, encoder_pre_gelu (norm_first, batch_first,
  causal src_mask).
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import save  # noqa: E402


def randomize(module, gen):
    """Moves every parameter off its init value (ones, zeros) so names cannot be mixed up."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)


def write(out_dir, name, module, inputs, call, gen, after=False):
    leaves = {}
    for k, v in inputs.items():
        v = v.detach().clone()
        if v.is_floating_point():
            v.requires_grad_(True)
        leaves[k] = v
    state = {"sd." + k: v.detach().clone() for k, v in module.state_dict().items()}
    out = call(module, **leaves)
    grad_out = torch.randn(out.shape, generator=gen)
    params = dict(module.named_parameters())
    diff = [(k, v) for k, v in leaves.items() if v.requires_grad] + list(params.items())
    grads = torch.autograd.grad(out, [v for _, v in diff], grad_out, allow_unused=True)
    tensors = dict(state)
    tensors.update({k: v.detach() for k, v in leaves.items()})
    tensors["out"] = out.detach()
    tensors["grad_out"] = grad_out
    for (k, _), g in zip(diff, grads):
        if g is not None:
            tensors["grad." + k] = g
    if after:
        tensors.update({"sd_after." + k: v.detach().clone() for k, v in module.state_dict().items()})
    save(os.path.join(out_dir, "module_" + name + ".safetensors"), tensors, metadata={"case": name})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    rn = lambda *s: torch.randn(s, generator=gen)  # noqa: E731

    m = nn.LayerNorm(16, eps=1e-6)
    randomize(m, gen)
    write(args.out, "layer_norm", m, {"x": rn(3, 5, 16) * 2 + 1}, lambda m, x: m(x), gen)

    m = nn.GroupNorm(3, 6)
    randomize(m, gen)
    write(args.out, "group_norm", m, {"x": rn(2, 6, 4, 5)}, lambda m, x: m(x), gen)

    m = nn.BatchNorm1d(5, momentum=0.2)
    randomize(m, gen)
    write(args.out, "batch_norm1d", m, {"x": rn(4, 5, 7) + 0.5}, lambda m, x: m(x), gen, after=True)

    m = nn.Embedding(11, 6, padding_idx=3)
    write(args.out, "embedding_pad", m, {"ids": torch.tensor([[3, 1, 10], [0, 3, 3]])},
          lambda m, ids: m(ids), gen)

    m = nn.MultiheadAttention(24, 3, batch_first=True)
    randomize(m, gen)
    kpm = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.uint8)
    write(args.out, "mha_batch_first", m, {"x": rn(2, 6, 24), "kpm": kpm},
          lambda m, x, kpm: m(x, x, x, key_padding_mask=kpm.bool(), need_weights=False)[0], gen)

    m = nn.MultiheadAttention(16, 4)
    randomize(m, gen)
    mask = (torch.rand(5, 7, generator=gen) > 0.7).to(torch.uint8)
    mask[:, 0] = 0  # every query keeps one key
    write(args.out, "mha_seq_first_cross", m,
          {"x": rn(5, 2, 16), "k": rn(7, 2, 16), "v": rn(7, 2, 16), "mask": mask},
          lambda m, x, k, v, mask: m(x, k, v, attn_mask=mask.bool(), need_weights=False)[0], gen)

    # need_weights=True: the output and the weights (averaged over heads, then per head) side by
    # side in one tensor, so both carry gradients back.
    m = nn.MultiheadAttention(16, 4)
    randomize(m, gen)
    kpm = torch.tensor([[0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0]], dtype=torch.uint8)
    for average, name in [(True, "mha_weights_mean"), (False, "mha_weights_heads")]:
        write(args.out, name, m,
              {"x": rn(5, 2, 16), "k": rn(7, 2, 16), "v": rn(7, 2, 16), "kpm": kpm},
              lambda m, x, k, v, kpm, average=average: torch.cat(
                  [t.reshape(-1) for t in m(x, k, v, key_padding_mask=kpm.bool(),
                                             need_weights=True,
                                             average_attn_weights=average)]), gen)

    m = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0)
    randomize(m, gen)
    write(args.out, "encoder_post_relu", m, {"x": rn(5, 3, 16)}, lambda m, x: m(x), gen)

    m = nn.TransformerEncoderLayer(16, 4, dim_feedforward=24, dropout=0.0, activation="gelu",
                                   batch_first=True, norm_first=True)
    randomize(m, gen)
    causal = torch.triu(torch.ones(6, 6, dtype=torch.uint8), 1)
    m.eval()  # torch's training-mode fast path checks are off in eval too; the maths is the same
    write(args.out, "encoder_pre_gelu", m, {"x": rn(2, 6, 16), "mask": causal},
          lambda m, x, mask: m(x, src_mask=mask.bool()), gen)
    print(f"fixtures_modules: wrote 8 cases to {args.out}")


if __name__ == "__main__":
    main()
