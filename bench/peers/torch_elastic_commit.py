"""PyTorch peer for bench_elastic_commit: the in-memory commit Horovod's elastic TorchState.save()
makes (copy.deepcopy of the model's and the optimizer's state_dict) for MobileNetV3-small with
SGD momentum, beside one training step, on random data.

Prints one JSON line: {"commit_ms": ..., "step_ms": ..., "threads": ..., "torch": ...}.
Run by bench_elastic_commit in the same invocation so both figures come from the same machine.
"""
import argparse
import copy
import json
import statistics
import time

import torch
import torchvision


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--commits", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=4e-5)
    model.train()
    x = torch.randn(a.batch, 3, a.img, a.img)
    y = torch.randint(0, 1000, (a.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    step()  # momentum buffers exist from here on, as in a running job
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    step_ms = (time.perf_counter() - t0) / a.steps * 1e3
    times = []
    for _ in range(a.commits):
        t0 = time.perf_counter()
        saved_model = copy.deepcopy(model.state_dict())
        saved_optimizer = copy.deepcopy(opt.state_dict())
        times.append((time.perf_counter() - t0) * 1e3)
        del saved_model, saved_optimizer
    print(json.dumps({"commit_ms": statistics.median(times), "step_ms": step_ms,
                      "threads": a.threads, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
