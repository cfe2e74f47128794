"""PyTorch DDP peer for bench_ddp (MobileNetV3-small) and bench_torch_ddp (--model resnet18: the
torchvision ResNet-18 with a 1-channel stem and 10 classes, as examples/libtorch builds it with
torch::nn, on [batch, 1, img, img] inputs): N processes x --threads threads, gloo on
the CPU; with --device cuda, nccl on GPU --gpu-index shared by every rank (each rank its own
NCCL_HOSTID, sockets on lo, as bench_ddp's ranks), or GPU <rank> with --gpu-index -1.

--channels-last puts the model and the input in torch.channels_last (PyTorch's fastest CPU
setting for convolutional networks, and on the GPU with cudnn.benchmark); without it, NCHW.

--model mobilenet_v3_large, --opt adamw and --zero (the optimizer state sharded by
torch.distributed.optim.ZeroRedundancyOptimizer, ZeRO stage 1) are bench_ddp --shard's peer.

Spawns the ranks itself (torch.multiprocessing) on loopback, trains on random data, and prints
one JSON line: {"img_per_s": total over ranks, "single_img_per_s": one process alone,
"scaling": img_per_s / (N * single), ...}.
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision

from shared_gpu import share_one_gpu


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model, opt, x, y, warmup, steps):
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    sync(x.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(x.device)
    return (time.perf_counter() - t0) / steps


def pick_device(a, rank):
    if a.device != "cuda":
        return torch.device("cpu")
    if a.gpu_index >= 0:
        share_one_gpu(rank, "torch-bench-host")
        device = torch.device("cuda", a.gpu_index)
    else:
        device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return device


def make_optimizer(a, params, zero):
    """bench_ddp's optimizers: SGD with momentum, or AdamW; zero: ZeroRedundancyOptimizer."""
    if a.opt == "adamw":
        cls, kwargs = torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2)
    else:
        cls, kwargs = torch.optim.SGD, dict(lr=0.01, momentum=0.9, weight_decay=4e-5)
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, **kwargs)
    return cls(params, **kwargs)


def make_model(a):
    if a.model == "resnet18":
        model = torchvision.models.resnet18(num_classes=10)
        model.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
        return model
    if a.model == "mobilenet_v3_large":
        return torchvision.models.mobilenet_v3_large(num_classes=1000)
    return torchvision.models.mobilenet_v3_small(num_classes=1000)


def memory_format(a):
    return torch.channels_last if a.channels_last else torch.contiguous_format


def make_batch(a, generator=None):
    channels, classes = (1, 10) if a.model == "resnet18" else (3, 1000)
    x = torch.randn(a.batch, channels, a.img, a.img, generator=generator)
    y = torch.randint(0, classes, (a.batch,), generator=generator)
    return x.contiguous(memory_format=memory_format(a)), y


def cpu_list(text):
    """The kernel's CPU-list format ("0-3,8") as a list of CPU numbers."""
    cpus = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def bind_to(cpus):
    """Binds every thread of this process (those started at import too) to `cpus`: the share
    dpar-launch --cpu_bind=cores gives the dpar rank of the same index (bench_ddp passes them),
    as Intel's guide for PyTorch on CPUs binds each instance to its own cores."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # the thread ended since the listing


def worker(rank, world, port, a, results):
    if a.cpu_shares:
        bind_to(cpu_list(a.cpu_shares.split("/")[rank]))
    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    device = pick_device(a, rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = make_model(a).to(device, memory_format=memory_format(a))
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = make_optimizer(a, ddp.parameters(), zero=a.zero)
    x, y = make_batch(a, torch.Generator().manual_seed(rank))
    sec = train(ddp, opt, x.to(device), y.to(device), a.warmup, a.steps)
    results[rank] = sec
    dist.destroy_process_group()


def single(a):
    torch.set_num_threads(a.threads)
    device = pick_device(a, 0)
    torch.manual_seed(0)
    model = make_model(a).to(device, memory_format=memory_format(a))
    opt = make_optimizer(a, model.parameters(), zero=False)
    x, y = make_batch(a)
    return a.batch / train(model, opt, x.to(device), y.to(device), a.warmup, a.steps)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--model", choices=["mobilenet_v3_small", "mobilenet_v3_large", "resnet18"],
                   default="mobilenet_v3_small")
    p.add_argument("--opt", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--zero", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--gpu-index", type=int, default=0)
    p.add_argument("--cpu-shares", default="",
                   help="rank r's CPUs are the r-th of these '/'-separated CPU lists")
    a = p.parse_args()
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(worker, args=(a.world, free_port(), a, results), nprocs=a.world, join=True)
    slowest = max(results.values())
    total = a.world * a.batch / slowest
    one = single(a)
    print(json.dumps({"img_per_s": total, "single_img_per_s": one,
                      "scaling": total / (a.world * one), "world": a.world, "batch": a.batch,
                      "params": sum(p.numel() for p in make_model(a).parameters()),
                      "torch": torch.__version__,
                      "layout": "channels_last" if a.channels_last else "nchw"}))


if __name__ == "__main__":
    main()
