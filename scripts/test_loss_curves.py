#!/usr/bin/python3
"""Self-test of loss_curves.py: scripts/test_loss_curves.py (exit 0 when all pass)."""
import io
import os
import subprocess
import sys
import tempfile

import loss_curves

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loss_curves.py")


def write_log(path, epochs):
    """epochs: per epoch, the losses of its steps."""
    with open(path, "w") as f:
        for e, losses in enumerate(epochs):
            for i, v in enumerate(losses):
                f.write(f"{e} {i} {float(v).hex()}\n")


def row_in(text, label, values):
    """Whether text has the row `label` with these values."""
    return any(line.startswith(label) and
               [float(v) for v in line[len(label):].split()] == values
               for line in text.splitlines())


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def main():
    with tempfile.TemporaryDirectory() as d:
        # Two epochs of 6 steps: thirds of 2 steps each. Run r of group a has losses r + step;
        # group b is group a shifted by 10, above a's range everywhere; group near by 1, so
        # that only its last run leaves a's range (by 1).
        for r in range(4):
            epochs = [[10 * e + r + i for i in range(6)] for e in range(2)]
            write_log(os.path.join(d, f"a_{r}.txt"), epochs)
            write_log(os.path.join(d, f"b_{r}.txt"), [[v + 10 for v in ep] for ep in epochs])
            write_log(os.path.join(d, f"near_{r}.txt"), [[v + 1 for v in ep] for ep in epochs])
            write_log(os.path.join(d, f"same_{r}.txt"), epochs)

        check(loss_curves.piece_means(os.path.join(d, "a_1.txt"), 3) ==
              [1.5, 3.5, 5.5, 11.5, 13.5, 15.5], "piece means of one run")

        a = loss_curves.load_group(f"a={d}/a_*.txt", 3)
        b = loss_curves.load_group(f"b={d}/b_*.txt", 3)
        out = io.StringIO()
        ps = loss_curves.report(a, b, out)
        text = out.getvalue()
        check(len(ps) == 6, "a p-value per piece")
        # Only the two splits that separate a and b give a difference as large: 2 of C(8, 4).
        check(all(abs(p - 2 / 70) < 1e-12 for p in ps), f"separated groups: p = {ps}")
        check(row_in(text, "b mean of 4", [12, 14, 16, 22, 24, 26]), "b's means printed")
        check("b b_0.txt outside a's range: 1:+7.000 2:+7.000 3:+7.000 4:+7.000 5:+7.000 "
              "6:+7.000\n" in text, "b_0 above a's range at every piece")

        near = loss_curves.load_group(f"near={d}/near_*.txt", 3)
        out = io.StringIO()
        loss_curves.report(a, near, out)
        text = out.getvalue()
        check("near near_2.txt outside a's range: nowhere\n" in text, "near_2 inside a's range")
        check("near near_3.txt outside a's range: 1:+1.000 2:+1.000 3:+1.000 4:+1.000 5:+1.000 "
              "6:+1.000\n" in text, "near_3 above a's range by 1 at every piece")

        same = loss_curves.load_group(f"same={d}/same_*.txt", 3)
        ps = loss_curves.report(a, same, io.StringIO())
        check(all(p == 1.0 for p in ps), f"identical groups: p = {ps}")

        # Sampled splits where the exact count is too large agree with the exact p-value: 8
        # against 8 overlapping runs, C(16, 8) = 12870 splits counted or 20000 drawn.
        first = [0.1 * i for i in range(8)]
        second = [0.1 * i + 0.25 for i in range(8)]
        exact = loss_curves.permutation_p(first, second)
        sampled = loss_curves.permutation_p(first, second, exact_limit=0)
        check(0.05 < exact < 0.95 and abs(sampled - exact) < 0.02,
              f"sampled p {sampled} against exact {exact}")

        # A malformed log: one error line naming the file, exit status 1.
        bad = os.path.join(d, "bad_0.txt")
        with open(bad, "w") as f:
            f.write("0 0 not-a-number extra\n")
        r = subprocess.run(["/usr/bin/python3", SCRIPT, f"a={d}/a_*.txt", f"bad={bad}"],
                           capture_output=True, text=True)
        check(r.returncode == 1, f"malformed log: exit {r.returncode}")
        check(r.stderr.count("\n") == 1 and "bad_0.txt" in r.stderr,
              f"malformed log: {r.stderr!r}")
        r = subprocess.run(["/usr/bin/python3", SCRIPT, f"a={d}/a_*.txt", f"b={d}/none_*.txt"],
                           capture_output=True, text=True)
        check(r.returncode == 1 and "none_*" in r.stderr, f"no logs matched: {r.stderr!r}")
        # Three fields but a loss that is no number, and an empty log: the file and line named.
        with open(bad, "w") as f:
            f.write("0 0 0x1p+0\n0 1 zz\n")
        r = subprocess.run(["/usr/bin/python3", SCRIPT, f"a={d}/a_*.txt", f"bad={bad}"],
                           capture_output=True, text=True)
        check(r.returncode == 1 and "bad_0.txt:2:" in r.stderr, f"bad number: {r.stderr!r}")
        open(bad, "w").close()
        r = subprocess.run(["/usr/bin/python3", SCRIPT, f"a={d}/a_*.txt", f"bad={bad}"],
                           capture_output=True, text=True)
        check(r.returncode == 1 and "bad_0.txt: no steps" in r.stderr, f"empty: {r.stderr!r}")
    print("loss_curves.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
