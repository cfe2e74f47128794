"""PyTorch peer for bench_gpu: MobileNetV3-small on one GPU, eager (channels_last,
cudnn.benchmark = True, fp32 without TF32 like dpar) and, with --compile, torch.compile.

--mode train prints {"img_per_s", "ms_per_step", "peak_mb" (max_memory_allocated during the
timed steps), "torch", "compiled_img_per_s"?}; --mode infer prints {"ms", "compiled_ms"?} for
an eval-mode forward under no_grad. One JSON line on stdout.
"""
import argparse
import json
import time

import torch
import torchvision


def timed(fn, warmup, steps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def print_kernel_profile(fn, title):
    """One call of fn under torch.profiler (no synchronisation between kernels): each kernel's
    total device time, and the step's sum, on stderr so that stdout stays one JSON line."""
    import sys
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()

    def device_us(e):  # the attribute's name changed across PyTorch releases
        for name in ("self_device_time_total", "self_cuda_time_total"):
            if getattr(e, name, None) is not None:
                return getattr(e, name)
        return 0

    events = [(device_us(e), e) for e in prof.key_averages()]
    events = sorted([t for t in events if t[0] > 0], key=lambda t: t[0], reverse=True)
    total = sum(t for t, _ in events)
    print(f"== {title}: {total / 1e3:.2f} ms of kernels", file=sys.stderr)
    for us, e in events[:60]:
        print(f"{us / 1e3:8.3f} ms {e.count:5d}x  {e.key[:150]}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    p.add_argument("--profile", action="store_true",
                   help="after timing, one step under torch.profiler: its kernels by CUDA time "
                        "on stderr (to set beside bench_gpu --profile)")
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=1000).to(dev)
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(a.batch, 3, a.img, a.img, device=dev).to(memory_format=torch.channels_last)
    out = {"torch": torch.__version__, "batch": a.batch}
    if a.mode == "train":
        model.train()
        y = torch.randint(0, 1000, (a.batch,), device=dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=4e-5)
        loss_fn = torch.nn.CrossEntropyLoss()
        amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
        scaler = torch.amp.GradScaler("cuda", enabled=a.precision == "fp16")

        def make_step(m):
            def step():
                opt.zero_grad()
                with torch.autocast("cuda", dtype=amp_dtype or torch.float32,
                                    enabled=amp_dtype is not None):
                    loss = loss_fn(m(x), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            return step

        step = make_step(model)
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        dt = timed(step, 0, a.steps)
        out.update(img_per_s=a.batch / dt, ms_per_step=dt * 1e3,
                   peak_mb=torch.cuda.max_memory_allocated() / 2**20)
        if a.profile:
            print_kernel_profile(step, f"PyTorch {a.precision} step at batch {a.batch}")
        if a.compile:
            try:
                out["compiled_img_per_s"] = a.batch / timed(make_step(torch.compile(model)),
                                                             a.warmup + 3, a.steps)
            except Exception as e:  # report, do not fail the eager figures
                out["compile_error"] = str(e).splitlines()[0][:200]
    else:
        model.eval()

        def make_fwd(m):
            def fwd():
                with torch.no_grad():
                    m(x)
            return fwd

        out["ms"] = timed(make_fwd(model), a.warmup, a.steps) * 1e3
        if a.profile:
            print_kernel_profile(make_fwd(model), f"PyTorch eval forward at batch {a.batch}")
        if a.compile:
            try:
                out["compiled_ms"] = timed(make_fwd(torch.compile(model)), a.warmup + 3,
                                           a.steps) * 1e3
            except Exception as e:
                out["compile_error"] = str(e).splitlines()[0][:200]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
