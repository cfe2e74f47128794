"""A CPU run of the CUDA build has the CPU-only build's footprint (issue 23): libdpar opens its
CUDA backend (libdpar_cuda, which links cuBLAS, cuDNN and NCCL) only when a CUDA device is first
used, so a CPU process of a CUDA build must not carry the ~217 MB those libraries cost.

Usage: cpu_run_footprint.py <cuda build dir> <cpu-only build dir>
Runs the same short CPU training job (examples/mobilenetv3/train on Fashion-MNIST, one thread)
from each build, alternating, three times each, and compares the medians of the processes'
peak resident sets: the CUDA build's must be within 10% of the CPU-only build's.
Exit status 0 when it is, 1 with one line saying by how much it is not.
"""
import os
import statistics
import subprocess
import sys
import tempfile

TRAIN = "examples/mobilenetv3/train"
ARGS = ["--epochs", "1", "--limit-train", "256", "--limit-val", "64", "--batch-size", "32",
        "--threads", "1", "--workers", "1", "--print-freq", "1000", "--export", "false"]


def peak_rss_mb(build):
    """Peak resident set of one run, from wait4's rusage (KiB on Linux)."""
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen([os.path.join(build, TRAIN)] + ARGS, stdout=subprocess.DEVNULL,
                                stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            last = (err.read().strip().splitlines() or ["(no output)"])[-1]
            sys.exit(f"cpu_run_footprint: {build}/{TRAIN} failed ({proc.returncode}): {last}")
    return usage.ru_maxrss / 1024.0


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[3])
    cuda_build, cpu_build = sys.argv[1], sys.argv[2]
    cuda_mb, cpu_mb = [], []
    for _ in range(3):
        cuda_mb.append(peak_rss_mb(cuda_build))
        cpu_mb.append(peak_rss_mb(cpu_build))
    cuda, cpu = statistics.median(cuda_mb), statistics.median(cpu_mb)
    ratio = cuda / cpu
    print(f"cpu_run_footprint: peak RSS of a CPU training run: CUDA build {cuda:.1f} MB "
          f"({', '.join(f'{v:.1f}' for v in cuda_mb)}), CPU-only build {cpu:.1f} MB "
          f"({', '.join(f'{v:.1f}' for v in cpu_mb)}): {ratio:.3f}x (limit 1.10)")
    if ratio > 1.10:
        print(f"cpu_run_footprint: FAILED: the CUDA build's CPU run is {100 * (ratio - 1):.0f}% "
              "above the CPU-only build's: something loads the CUDA backend on the CPU path")
        sys.exit(1)


if __name__ == "__main__":
    main()
