#!/usr/bin/env python3
"""Where a GPU step's device time goes, kernel by kernel.

Reads the CSV that `ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum`
writes (one row per kernel launch) and prints, per report, the total device time and the
kernels that took the most of it, launches of the same kernel summed:

    ncu-kernels.py REPORT.csv [REPORT.csv ...] [--top N]

The probe's kernel_times stage (gpu-probe.sh) captures one bench_gpu training step this way.
Exit status 1 when a report holds no kernel table (ncu failed or captured nothing)."""
import argparse
import collections
import csv
import sys

UNIT_TO_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}


def summarise(path, top):
    with open(path, errors="replace", newline="") as f:
        rows = list(csv.reader(f))
    head_at = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head_at is None or "gpu__time_duration.sum" not in rows[head_at]:
        print(f"{path}: no kernel table with gpu__time_duration.sum")
        return False
    head = rows[head_at]
    name_col, time_col = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    unit = rows[head_at + 1][time_col] if head_at + 1 < len(rows) else ""
    to_ms = UNIT_TO_MS.get(unit, 1e-6)
    total = collections.defaultdict(float)
    launches = collections.Counter()
    for r in rows[head_at + 2:]:
        if len(r) <= max(name_col, time_col):
            continue
        try:
            t = float(r[time_col].replace(",", "")) * to_ms
        except ValueError:
            continue
        name = r[name_col].split("(")[0][:110]  # drop the parameter list
        total[name] += t
        launches[name] += 1
    all_ms = sum(total.values())
    print(f"== {path}: {sum(launches.values())} kernels, {all_ms:.3f} ms device time")
    for name, t in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        share = 100.0 * t / all_ms if all_ms else 0.0
        print(f"{t:8.3f} ms {share:5.1f}% x{launches[name]:4d}  {name}")
    return bool(launches)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    ok = [summarise(r, a.top) for r in a.reports]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
