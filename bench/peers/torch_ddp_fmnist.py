"""PyTorch DDP peer for bench/time_to_accuracy.sh: full Fashion-MNIST at 32x32, the recipe of
dpar's examples/mobilenetv3/train defaults (mobilenet_v3_small, 10 classes, batch 64 per rank,
SGD momentum 0.9, weight decay 4e-5, peak lr 0.1 with 0.3 epochs of linear warmup then cosine,
random horizontal flip, mean 0.286 / std 0.353), N ranks x 1 thread over gloo on loopback.
Evaluates after every epoch; prints one JSON line with per-epoch top-1 and elapsed seconds and
the time at which top-1 first reached --target.
"""
import argparse
import gzip
import json
import math
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import torchvision

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(name):
    with gzip.open(os.path.join(DATA, name + ".gz")) as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def prepare(images, size):
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = (x - 0.286) / 0.353
    return x.expand(-1, 3, -1, -1).contiguous()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, a, out):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(a.seed)
    xtr = prepare(read_idx("train-images-idx3-ubyte"), a.img)
    ytr = torch.from_numpy(read_idx("train-labels-idx1-ubyte").astype(np.int64))
    xte = prepare(read_idx("t10k-images-idx3-ubyte"), a.img)
    yte = torch.from_numpy(read_idx("t10k-labels-idx1-ubyte").astype(np.int64))
    model = torch.nn.parallel.DistributedDataParallel(torchvision.models.mobilenet_v3_small(num_classes=10))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=4e-5)
    sampler = torch.utils.data.distributed.DistributedSampler(range(len(ytr)), world, rank, shuffle=True, seed=a.seed)
    steps_per_epoch = len(sampler) // a.batch
    total, warmup = a.epochs * steps_per_epoch, int(0.3 * steps_per_epoch)

    def lr_at(step):
        if step < warmup:
            return a.lr * step / warmup
        t = (step - warmup) / max(1, total - warmup)
        return 0.5 * a.lr * (1 + math.cos(math.pi * min(t, 1.0)))

    history, reached, step, t0 = [], None, 0, time.perf_counter()
    for epoch in range(a.epochs):
        model.train()
        sampler.set_epoch(epoch)
        idx = list(sampler)
        for b in range(steps_per_epoch):
            sel = torch.tensor(idx[b * a.batch:(b + 1) * a.batch])
            x, y = xtr[sel], ytr[sel]
            flip = torch.rand(len(sel)) < 0.5
            x[flip] = x[flip].flip(-1)
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            step += 1
        model.eval()
        correct = torch.zeros(2)
        with torch.no_grad():
            for b in range(rank * 1000, len(yte), world * 1000):
                correct[0] += (model(xte[b:b + 1000]).argmax(1) == yte[b:b + 1000]).sum()
                correct[1] += len(yte[b:b + 1000])
        dist.all_reduce(correct)
        top1 = (correct[0] / correct[1]).item()
        elapsed = time.perf_counter() - t0
        history.append({"epoch": epoch, "top1": top1, "elapsed_s": elapsed})
        if reached is None and top1 >= a.target:
            reached = elapsed
        if rank == 0:
            print(f"[torch] epoch {epoch}: top1 {top1:.4f}, {elapsed:.1f} s", flush=True)
    if rank == 0:
        out["result"] = {"history": history, "seconds_to_target": reached, "target": a.target,
                         "world": world, "torch": torch.__version__}
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--img", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.90)
    a = p.parse_args()
    out = mp.Manager().dict()
    mp.spawn(worker, args=(a.world, free_port(), a, out), nprocs=a.world, join=True)
    print(json.dumps(out["result"]))


if __name__ == "__main__":
    main()
