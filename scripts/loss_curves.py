#!/usr/bin/python3
"""Compare two groups of training runs by their loss logs (`train --loss-log F`).

    scripts/loss_curves.py 'fp32=/tmp/fm/loss_fp32_*.txt' 'bf16=/tmp/fm/loss_bf16_*.txt'

Each log has a line "epoch step loss" per step (the loss as a C99 hex float). Every epoch is cut
into --pieces equal pieces (3: thirds) and each run's mean loss per piece is printed, then, per
group, the lowest, highest and mean run at each piece, the runs of the second group outside the
first group's range, and per piece the difference of the two groups' means with a two-sided
permutation test of it: the share of all ways to split the pooled runs into groups of the same
sizes whose difference of means is at least as large (exact up to 200000 splits, else 20000
random ones from a fixed seed). A run outside the other group's range says little with 8 runs a
side: even with one distribution, at least one of 8 runs falls outside the other 8's range in
77% of draws (the two extremes of 16 both lie among the first 8 with probability 8/16 * 7/15).
"""
import argparse
import collections
import glob
import itertools
import math
import random
import statistics
import sys


def piece_means(path, pieces):
    """The mean loss of each piece of each epoch, in order."""
    by_epoch = collections.defaultdict(list)
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            try:
                if len(fields) != 3:
                    raise ValueError("expected 'epoch step loss'")
                by_epoch[int(fields[0])].append(float.fromhex(fields[2]))
            except ValueError as e:
                raise ValueError(f"{path}:{number}: {e}: {line.strip()!r}") from None
    if not by_epoch:
        raise ValueError(f"{path}: no steps")
    means = []
    for epoch in sorted(by_epoch):
        losses = by_epoch[epoch]
        if len(losses) < pieces:
            raise ValueError(f"{path}: epoch {epoch} has {len(losses)} steps, fewer than {pieces}")
        for k in range(pieces):
            part = losses[k * len(losses) // pieces:(k + 1) * len(losses) // pieces]
            means.append(sum(part) / len(part))
    return means


def permutation_p(a, b, exact_limit=200000, samples=20000, seed=0):
    """Two-sided permutation p-value of mean(b) - mean(a)."""
    pooled = a + b
    observed = abs(statistics.fmean(b) - statistics.fmean(a))
    total = sum(pooled)
    n, nb = len(pooled), len(b)
    tolerance = 1e-12 * max(1.0, abs(observed))

    def at_least(chosen_sum):
        diff = chosen_sum / nb - (total - chosen_sum) / (n - nb)
        return abs(diff) >= observed - tolerance

    if math.comb(n, nb) <= exact_limit:
        splits = itertools.combinations(pooled, nb)
        hits = count = 0
        for chosen in splits:
            count += 1
            hits += at_least(sum(chosen))
        return hits / count
    rng = random.Random(seed)
    hits = sum(at_least(sum(rng.sample(pooled, nb))) for _ in range(samples))
    return (hits + 1) / (samples + 1)


def load_group(spec, pieces):
    name, _, pattern = spec.partition("=")
    paths = sorted(glob.glob(pattern))
    if not name or not paths:
        raise ValueError(f"{spec!r}: expected NAME=GLOB matching at least one loss log")
    runs = {path: piece_means(path, pieces) for path in paths}
    lengths = {len(v) for v in runs.values()}
    if len(lengths) != 1:
        raise ValueError(f"{name}: the runs have different numbers of epochs")
    return name, runs


def row(label, values):
    return f"{label:<28}" + " ".join(f"{v:7.3f}" for v in values)


def report(first, second, out=sys.stdout):
    (name_a, runs_a), (name_b, runs_b) = first, second
    width = len(next(iter(runs_a.values())))
    if len(next(iter(runs_b.values()))) != width:
        raise ValueError("the two groups have different numbers of epochs")
    for name, runs in (first, second):
        for path, means in runs.items():
            print(row(f"{name} {path.rsplit('/', 1)[-1]}", means), file=out)
    columns = {}
    for name, runs in (first, second):
        cols = list(zip(*runs.values()))
        columns[name] = cols
        print(row(f"{name} lowest", [min(c) for c in cols]), file=out)
        print(row(f"{name} highest", [max(c) for c in cols]), file=out)
        print(row(f"{name} mean of {len(runs)}", [statistics.fmean(c) for c in cols]), file=out)
    low = [min(c) for c in columns[name_a]]
    high = [max(c) for c in columns[name_a]]
    for path, means in runs_b.items():
        outside = [f"{j + 1}:{v - (high[j] if v > high[j] else low[j]):+.3f}"
                   for j, v in enumerate(means) if v > high[j] or v < low[j]]
        print(f"{name_b} {path.rsplit('/', 1)[-1]} outside {name_a}'s range: "
              f"{' '.join(outside) if outside else 'nowhere'}", file=out)
    ps = []
    for j in range(width):
        a, b = list(columns[name_a][j]), list(columns[name_b][j])
        p = permutation_p(a, b)
        ps.append(p)
        print(f"piece {j + 1}: {name_b} - {name_a} mean {statistics.fmean(b) - statistics.fmean(a):+.4f}"
              f", permutation p = {p:.3f}", file=out)
    return ps


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("first", help="NAME=GLOB of the reference runs' loss logs")
    parser.add_argument("second", help="NAME=GLOB of the runs compared with them")
    parser.add_argument("--pieces", type=int, default=3, help="pieces per epoch (default 3)")
    args = parser.parse_args(argv)
    if args.pieces < 1:
        parser.error("--pieces must be at least 1")
    try:
        report(load_group(args.first, args.pieces), load_group(args.second, args.pieces))
    except (OSError, ValueError) as e:
        print(f"loss_curves.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
