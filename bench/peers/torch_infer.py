"""PyTorch peer for bench_infer: MobileNetV3-small eval forward latency.

Measures eager mode and TorchScript (trace + freeze + optimize_for_inference). Prints one JSON
line: {"eager_ms": ..., "frozen_ms": ..., "batch": ..., "threads": ...} (median ms per batch).
With --int8 also torch.ao.quantization FX post-training int8 (fbgemm, else onednn; calibrated
on a few random batches, then traced and frozen): "int8_ms" and "int8_engine", and
"int8_error" saying why an engine failed.
"""
import argparse
import copy
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
    p.add_argument("--int8", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small().eval()
    x = torch.randn(a.batch, 3, a.img, a.img)
    eager = timed(model, x, a.warmup, a.iters)
    with torch.no_grad():
        frozen = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(model, x)))
    frozen_ms = timed(frozen, x, a.warmup, a.iters)
    out = {"eager_ms": eager, "frozen_ms": frozen_ms, "batch": a.batch, "threads": a.threads,
           "torch": torch.__version__}
    if a.int8:
        # fbgemm is PyTorch's x86 int8 backend; a build without it (Debian's 1.13) may have
        # the oneDNN one, so that is tried next and the fbgemm failure is reported beside it.
        errors = []
        for engine in ["fbgemm", "onednn"]:
            try:
                out["int8_ms"] = timed(quantized_fx(model, x, engine), x, a.warmup, a.iters)
                out["int8_engine"] = engine
                break
            except Exception as e:  # the reason goes into the report instead of the figure
                errors.append(f"{engine}: {type(e).__name__}: {e}".splitlines()[0][:160])
        if errors:
            out["int8_error"] = "; ".join(errors)
    print(json.dumps(out))


def quantized_fx(model, x, engine):
    """FX graph-mode post-training static quantization with the engine's default qconfigs."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    torch.backends.quantized.engine = engine
    prepared = prepare_fx(copy.deepcopy(model).eval(), get_default_qconfig_mapping(engine),
                          example_inputs=(x,))
    with torch.no_grad():
        for _ in range(2):
            prepared(torch.randn(4, *x.shape[1:]))
        q = convert_fx(prepared)
        return torch.jit.freeze(torch.jit.trace(q, x))


if __name__ == "__main__":
    main()
