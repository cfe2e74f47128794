"""PyTorch peer for bench_train_step: training steps on random data, MobileNetV3-small (SGD) or
the ViT-Tiny of examples/vit (torchvision's VisionTransformer at 32 px, AdamW).

--channels-last puts the model and the input in torch.channels_last, PyTorch's documented
fastest CPU setting for convolutional networks (its oneDNN path); without it, NCHW.
--amp bf16 runs the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16), its
CPU mixed precision (bf16 oneDNN kernels for convolutions and linear layers).

Prints one JSON line: {"img_per_s": ..., "ms_per_step": ..., "threads": ..., "batch": ...,
"peak_rss_mb": ..., "rss_before_mb": ...} (the process's high-water mark, and its resident set
after the imports, before the model is built).
Run by bench_train_step in the same invocation so both figures come from the same machine state.
"""
import argparse
import json
import resource
import time

import torch
import torchvision


def current_rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mobilenet_v3_small")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--amp", default="", choices=["", "bf16"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rss_before_mb = current_rss_mb()
    torch.manual_seed(0)
    if a.model == "vit_tiny":
        a.classes = 10
        model = torchvision.models.VisionTransformer(
            image_size=a.img, patch_size=4, num_layers=6, num_heads=3, hidden_dim=192,
            mlp_dim=768, num_classes=a.classes)
    else:
        model = torchvision.models.mobilenet_v3_small(num_classes=a.classes)
    x = torch.randn(a.batch, 3, a.img, a.img)
    layout = "nchw"
    if a.channels_last:
        # Before the optimizer is built, so it holds the converted parameters.
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
        layout = "channels_last"
    if a.model == "vit_tiny":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=4e-5)
    model.train()
    y = torch.randint(0, a.classes, (a.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        # set_to_none: PyTorch's documented faster setting (its default since 2.0), as dpar's side
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = (time.perf_counter() - t0) / a.steps
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    print(json.dumps({"img_per_s": a.batch / dt, "ms_per_step": dt * 1e3, "threads": a.threads,
                      "batch": a.batch, "torch": torch.__version__, "peak_rss_mb": peak_rss_mb,
                      "rss_before_mb": rss_before_mb, "layout": layout, "amp": a.amp}))


if __name__ == "__main__":
    main()
