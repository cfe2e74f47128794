"""PyTorch peer for bench_allreduce --device gpu: torch.distributed all-reduce (nccl) of f32
sums at 1 KB .. --max-mb, the same loop as dpar's side: `iters` calls enqueued back to back,
one synchronisation, median over --reps repetitions.

With --shared-gpu N every rank uses GPU N and takes its own NCCL_HOSTID, so NCCL treats the
ranks as separate hosts and talks over sockets on lo (as the dpar side does). Prints one JSON
line: {"torch": version, "seconds": {"<bytes>": seconds per call}}.
"""
import argparse
import json
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shared_gpu import share_one_gpu


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, a, port, queue):
    if a.shared_gpu >= 0:
        share_one_gpu(rank, "torch-bench-host")
        device = torch.device("cuda", a.shared_gpu)
    else:
        device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=a.world, device_id=device)
    seconds = {}
    size = 1024
    while size <= a.max_mb * (1 << 20):
        t = torch.zeros(size // 4, dtype=torch.float32, device=device)
        # As dpar's side: by size, but no more than about 0.2 s a repetition (ranks sharing one
        # GPU take milliseconds a call), rank 0's count for both.
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        per_call = (time.perf_counter() - t0) / 3
        by_time = int(0.2 / max(per_call, 1e-7))
        agreed = torch.tensor([min(max(5, min(int(64 * (1 << 20) / size), by_time)),
                                   max(5, a.max_iters))], dtype=torch.float32, device=device)
        dist.broadcast(agreed, 0)
        iters = int(agreed.item())
        for _ in range(iters):  # warm-up
            dist.all_reduce(t)
        torch.cuda.synchronize()
        runs = []
        for _ in range(a.reps):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            runs.append((time.perf_counter() - t0) / iters)
        seconds[str(size)] = statistics.median(runs)
        size *= 4
    dist.destroy_process_group()
    if rank == 0:
        queue.put(seconds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--max-mb", type=float, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--shared-gpu", type=int, default=-1)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, a, port, queue)) for r in range(a.world)]
    for proc in procs:
        proc.start()
    seconds = queue.get(timeout=1800)
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit("torch rank exited with %d" % proc.exitcode)
    print(json.dumps({"torch": torch.__version__, "seconds": seconds}))


if __name__ == "__main__":
    main()
