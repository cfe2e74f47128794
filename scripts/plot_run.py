#!/usr/bin/python3
"""Plot one or more dpar training runs into a single PNG.

    scripts/plot_run.py RUN [RUN...] [-o OUT.png] [--title T] [--proto PATH]

A RUN is a TensorBoard event directory (every events.out.tfevents.* in it, merged), one event
file, or a --loss-log file (for a multi-rank run, FILE stands for FILE.rank0, FILE.rank1, ...).
The PNG (default: run.png beside the first RUN) has panels for loss against steps and against
wall time, top-1/top-5, learning rate, images/s per rank and the AMP loss scale; a panel
without data says so. Exit status 2 with one `plot_run: <path>: <what>` line when a RUN is
missing or broken.
"""
import argparse
import glob
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # no display on training machines
import matplotlib.pyplot as plt  # noqa: E402 (must follow the backend choice)

import tb_events  # noqa: E402 (lives beside this script, which puts its dir on sys.path)

EVENT_GLOB = "events.out.tfevents.*"
RANK_IPS = re.compile(r"rank(\d+)/ips$")
# The events' train/loss, or one rank's loss of a multi-rank loss log; not train/loss_scale.
TRAIN_LOSS = re.compile(r"train/loss( \(rank \d+\))?$")


class Run:
    """The scalars of one RUN: tag -> [(step, wall_time or None, value)] sorted by step."""

    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self.series = {}
        self.points = 0  # as read, before a resumed run's repeated steps are merged
        self.problems = []

    def add(self, tag, by_step):
        self.series[tag] = sorted((step, wall, value) for step, (wall, value) in by_step.items())

    def summary(self):
        steps = [step for points in self.series.values() for step, _, _ in points]
        step_range = f"steps {min(steps)}..{max(steps)}" if steps else "no steps"
        return (f"plot_run: {self.path}: {self.points} points, {step_range}, "
                f"{len(self.problems)} problem(s)")


def load_events(path, proto_path):
    files = sorted(glob.glob(os.path.join(path, EVENT_GLOB))) if os.path.isdir(path) else [path]
    if not files:
        raise tb_events.EventFileError(path, f"no {EVENT_GLOB} files in this directory")
    run = Run(path)
    merged = {}  # tag -> {step: (wall_time, value)}
    # Files sort by creation time (it leads the name). A resumed run starts a new file and logs
    # again the steps after its checkpoint: the later file's values are the ones that count.
    for file in files:
        scalars, problems = tb_events.read_events(file, proto_path)
        run.points += len(scalars)
        run.problems += problems
        for wall, step, tag, value in scalars:
            merged.setdefault(tag, {})[step] = (wall, value)
    for tag, by_step in merged.items():
        run.add(tag, by_step)
    return run


def loss_log_files(path):
    """[(label suffix, file)]: FILE itself, or FILE.rank0, FILE.rank1, ... of a multi-rank run."""
    if os.path.isfile(path):
        return [("", path)]
    ranked = [(int(f.rsplit(".rank", 1)[1]), f) for f in glob.glob(glob.escape(path) + ".rank*")
              if f.rsplit(".rank", 1)[1].isdigit()]
    return [(f" (rank {rank})", f) for rank, f in sorted(ranked)]


def parse_loss_line(line):
    """The loss of one "<epoch> <iter> <hex loss>" line; ValueError when it is not one."""
    epoch, iteration, loss = line.split()
    int(epoch), int(iteration)
    return float.fromhex(loss)


def load_loss_log(path):
    files = loss_log_files(path)
    if not files:
        raise tb_events.EventFileError(path, f"no such file or directory (nor {path}.rank<N>)")
    run = Run(path)
    for suffix, file in files:
        try:
            with open(file, errors="replace") as f:
                lines = f.read().split("\n")
        except OSError as e:
            raise tb_events.EventFileError(file, e.strerror)
        # The trainer ends every line with a newline, so text after the last one is a line cut
        # short by a killed run, and its number may be cut short too: skip it.
        torn = lines.pop()
        if torn:
            run.problems.append(f"{file}: skipped the unterminated last line {len(lines) + 1}")
        by_step = {}
        for number, line in enumerate(lines, 1):  # the line number is the global step
            try:
                by_step[number] = (None, parse_loss_line(line))
            except ValueError:
                raise tb_events.EventFileError(file, f"line {number} is not "
                                                     f"'<epoch> <iter> <hex loss>': {line!r}")
        run.points += len(by_step)
        run.add("train/loss" + suffix, by_step)
    return run


def load_run(path, proto_path=None):
    if "tfevents" in os.path.basename(path) or os.path.isdir(path):
        if not os.path.exists(path):
            raise tb_events.EventFileError(path, "no such file or directory")
        return load_events(path, proto_path)
    return load_loss_log(path)


def train_loss_tags(run):
    return sorted(tag for tag in run.series if TRAIN_LOSS.match(tag))


def plot_series(ax, points, use_time, t0, **style):
    """Draws (step | minutes since t0, value); returns whether anything was drawn."""
    if use_time:
        points = [(wall, value) for _, wall, value in points if wall is not None]
        xs = [(wall - t0) / 60 for wall, _ in points]
    else:
        xs = [step for step, _, _ in points]
    if not xs:
        return False
    ax.plot(xs, [point[-1] for point in points], **style)
    return True


def draw(runs, out_path, title):
    fig, axes = plt.subplots(3, 2, figsize=(16, 10), dpi=100)
    panels = {
        "loss": (axes[0][0], "loss", "step"),
        "loss_time": (axes[0][1], "loss", "wall time (minutes)"),
        "top1": (axes[1][0], "top-1 / top-5", "step"),
        "lr": (axes[1][1], "learning rate", "step"),
        "ips": (axes[2][0], "images/s", "step"),
        "loss_scale": (axes[2][1], "AMP loss scale", "step"),
    }
    has_data = dict.fromkeys(panels, False)
    several = len(runs) > 1

    def series(key, run, tag, label, use_time=False, t0=0.0, **style):
        prefix = f"{run.name}: " if several else ""
        drawn = plot_series(panels[key][0], run.series.get(tag, []), use_time, t0,
                            label=prefix + label, **style)
        has_data[key] |= drawn

    eval_marker = dict(linestyle="none", markersize=7, markeredgecolor="black")
    for index, run in enumerate(runs):
        color = f"C{index}"  # one colour per run in every panel but images/s
        walls = [wall for points in run.series.values() for _, wall, _ in points
                 if wall is not None]
        t0 = min(walls, default=0.0)
        for tag in train_loss_tags(run):
            label = tag.replace("train/", "train ")
            # Ranks of a multi-rank loss log share the run's colour; thin lines keep them legible.
            series("loss", run, tag, label, color=color, linewidth=0.8)
        series("loss", run, "eval/loss", "eval loss", color=color, marker="o", **eval_marker)
        series("loss_time", run, "train/loss", "train loss", use_time=True, t0=t0, color=color,
               linewidth=0.8)
        series("loss_time", run, "eval/loss", "eval loss", use_time=True, t0=t0, color=color,
               marker="o", **eval_marker)
        series("top1", run, "train/top1", "train top-1", color=color, linewidth=0.8)
        series("top1", run, "eval/top1", "eval top-1", color=color, marker="o", **eval_marker)
        series("top1", run, "eval/top5", "eval top-5", color=color, marker="^", **eval_marker)
        series("lr", run, "train/lr", "lr", color=color)
        ranks = sorted((int(m.group(1)), tag) for tag in run.series
                       if (m := RANK_IPS.match(tag)))
        for rank, tag in ranks:
            series("ips", run, tag, f"rank {rank}", linewidth=0.8)  # colours cycle per rank
        series("loss_scale", run, "train/loss_scale", "loss scale", color=color)

    for key, (ax, ylabel, xlabel) in panels.items():
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if has_data[key]:
            ax.legend(fontsize="small", loc="best")
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center",
                    fontsize=14, color="gray")
    if has_data["loss_scale"]:
        axes[2][1].set_yscale("log", base=2)  # dynamic loss scaling moves in powers of two
    fig.suptitle(title or ", ".join(run.path for run in runs))
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="event directory, event file, or --loss-log file")
    parser.add_argument("-o", "--output", help="PNG to write (default: run.png beside RUN 1)")
    parser.add_argument("--title", help="figure title (default: the RUN paths)")
    parser.add_argument("--proto", help="tensorboard_event.proto (default: "
                                        "lib/proto/ of this checkout)")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(path, args.proto) for path in args.runs]
    except tb_events.EventFileError as e:
        print(f"plot_run: {e}", file=sys.stderr)
        return 2
    for run in runs:
        print(run.summary())
        for problem in run.problems:
            print(f"plot_run: warning: {problem}")
    first = args.runs[0]
    out_path = args.output or os.path.join(
        first if os.path.isdir(first) else os.path.dirname(first) or ".", "run.png")
    draw(runs, out_path, args.title)
    print(f"plot_run: wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
