"""PyTorch peer for bench_infer: MobileNetV3-small eval forward latency.

Measures eager mode and TorchScript (trace + freeze + optimize_for_inference). Prints one JSON
line: {"eager_ms": ..., "frozen_ms": ..., "batch": ..., "threads": ...} (median ms per batch).
"""
import argparse
import json
import statistics
import time

import torch
import torchvision


def timed(fn, x, warmup, iters):
    """Median of per-run times in ms: robust to other processes stealing the core now and then
    (bench_infer times dpar the same way)."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(x)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small().eval()
    x = torch.randn(a.batch, 3, a.img, a.img)
    eager = timed(model, x, a.warmup, a.iters)
    with torch.no_grad():
        frozen = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(model, x)))
    frozen_ms = timed(frozen, x, a.warmup, a.iters)
    print(json.dumps({"eager_ms": eager, "frozen_ms": frozen_ms, "batch": a.batch,
                      "threads": a.threads, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
