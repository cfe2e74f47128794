#!/usr/bin/python3
"""Self-test of tb_events.py and plot_run.py: scripts/test_plot_run.py (exit 0 when all pass)."""
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

import crc32c

import plot_run
import tb_events

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_run.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEPS = 100
EVAL_STEPS = (33, 66, 100)  # the steps at which the 3 epochs ended
START = 1.7e9


def f32(x):
    """x as the float32 an Event's simple_value holds, so round trips compare exactly."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def realistic_run(steps=range(1, STEPS + 1), loss_offset=0.0):
    """(wall_time, step, tag, value) of a 2-rank AMP run logging every step, as the trainer does:
    one record per log line, eval scalars at the step that ended the epoch."""
    scalars = []
    for step in steps:
        wall = START + 0.25 * step
        values = {
            "train/loss": 6.9 * math.exp(-step / 40) + 0.5 + loss_offset,
            "train/top1": 0.9 * (1 - math.exp(-step / 30)),
            "train/lr": 0.01 * step if step <= 10 else 0.05 * (1 + math.cos(math.pi * step / 100)),
            "train/ips": 2000 + 50 * math.sin(step),
            "train/reader_cost": 0.001,
            "train/batch_cost": 0.128,
            "train/peak_memory_mb": 4096,
            "train/loss_scale": 65536.0 if step < 50 else 32768.0,
            "rank0/ips": 2000 + 50 * math.sin(step),
            "rank1/ips": 1900 + 50 * math.cos(step),
        }
        scalars += [(wall, step, tag, f32(value)) for tag, value in values.items()]
        if step in EVAL_STEPS:
            top1 = f32(0.2 + 0.2 * EVAL_STEPS.index(step))
            scalars += [(wall + 3.0, step, "eval/loss", f32(3.0 - step / 50)),
                        (wall + 3.0, step, "eval/top1", top1),
                        (wall + 3.0, step, "eval/top5", f32(top1 + 0.2))]
    return scalars


def write_run(dir_path, name="events.out.tfevents.1700000000.host.1.0", scalars=None):
    path = os.path.join(dir_path, name)
    tb_events.write_events(path, realistic_run() if scalars is None else scalars)
    return path


def run_plot(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def check_png(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(PNG_SIGNATURE), f"{path} is not a PNG"
    assert len(data) > 20_000, f"{path} is only {len(data)} bytes"


def test_crc32c_known_vector(tmp):
    assert crc32c.crc32c(b"123456789") == 0xE3069283


def test_round_trip(tmp):
    written = realistic_run()
    scalars, problems = tb_events.read_events(write_run(tmp, scalars=written))
    assert problems == [], problems
    assert scalars == written  # tags, steps, float32 values and double wall times, in order
    tags = {tag for _, _, tag, _ in scalars}
    assert {"rank0/ips", "rank1/ips", "eval/top5", "train/loss_scale"} <= tags
    assert sorted({step for _, step, tag, _ in scalars if tag == "eval/top1"}) == list(EVAL_STEPS)


def test_truncated_record_at_end_is_skipped(tmp):
    path = write_run(tmp)
    with open(path, "ab") as f:
        f.write(tb_events.frame(b"a record cut short by a killed run")[:-7])
    scalars, problems = tb_events.read_events(path)
    assert scalars == realistic_run()
    assert len(problems) == 1 and "truncated record" in problems[0], problems


def test_corrupt_last_record_is_skipped(tmp):
    path = write_run(tmp)
    size = os.path.getsize(path)
    record = bytearray(tb_events.frame(b"the last record"))
    record[-1] ^= 0xFF  # the data CRC
    with open(path, "ab") as f:
        f.write(record)
    scalars, problems = tb_events.read_events(path)
    assert scalars == realistic_run()
    assert problems == [f"{path}: skipped the last record at byte offset {size} "
                        f"(data CRC mismatch)"], problems


def test_corruption_in_the_middle_raises(tmp):
    path = write_run(tmp)
    with open(path, "rb") as f:
        valid = f.read()
    record = bytearray(tb_events.frame(b"damaged in the middle"))
    record[14] ^= 0x01  # a data byte: the data CRC no longer matches
    with open(path, "wb") as f:
        f.write(valid + record + valid)
    try:
        tb_events.read_events(path)
    except tb_events.EventFileError as e:
        assert str(e).startswith(path + ": "), e
        assert f"byte offset {len(valid)}," in str(e), e
    else:
        raise AssertionError("mid-file corruption was not reported")


def test_resumed_run_merges_files(tmp):
    # The first run logged steps 1..60 and died; the resumed one restarts after its step-50
    # checkpoint in a new file, and its values for steps 51..60 are the ones that count.
    write_run(tmp, "events.out.tfevents.1700000000.host.1.0", realistic_run(range(1, 61)))
    write_run(tmp, "events.out.tfevents.1700000100.host.2.0",
              realistic_run(range(51, STEPS + 1), loss_offset=1.0))
    run = plot_run.load_run(tmp)
    loss = run.series["train/loss"]
    assert [step for step, _, _ in loss] == list(range(1, STEPS + 1))
    resumed = {step: value for _, step, tag, value in
               realistic_run(range(51, STEPS + 1), loss_offset=1.0) if tag == "train/loss"}
    assert all(value == resumed[step] for step, _, value in loss if step > 50)


def test_plot_event_dir(tmp):
    write_run(tmp)
    result = run_plot(tmp, "--title", "self-test")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().split("\n")
    png = os.path.join(tmp, "run.png")
    assert lines[-1] == f"plot_run: wrote {png}", lines
    assert f"plot_run: {tmp}: {len(realistic_run())} points, steps 1..{STEPS}, 0 problem(s)" \
        in lines, lines
    check_png(png)
    assert plot_run.train_loss_tags(plot_run.load_run(tmp)) == ["train/loss"]


def test_plot_hex_loss_log(tmp):
    # A 2-rank --loss-log: FILE names FILE.rank0 and FILE.rank1; rank 1's last line is torn.
    log = os.path.join(tmp, "loss.txt")
    for rank in range(2):
        with open(f"{log}.rank{rank}", "w") as f:
            for step in range(1, STEPS + 1):
                f.write(f"{(step - 1) // 33} {(step - 1) % 33} "
                        f"{(6.9 * math.exp(-step / 40) + 0.5 + 0.01 * rank).hex()}\n")
            if rank == 1:
                f.write("3 1 0x1.2")
    out = os.path.join(tmp, "loss.png")
    result = run_plot(log, "-o", out)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().split("\n")
    assert lines[0] == f"plot_run: {log}: {2 * STEPS} points, steps 1..{STEPS}, 1 problem(s)", lines
    assert lines[-1] == f"plot_run: wrote {out}", lines
    check_png(out)
    run = plot_run.load_run(log)
    assert run.series["train/loss (rank 0)"][0][2] == 6.9 * math.exp(-1 / 40) + 0.5  # exact
    assert plot_run.train_loss_tags(run) == ["train/loss (rank 0)", "train/loss (rank 1)"]


def test_missing_dir_exits_2(tmp):
    missing = os.path.join(tmp, "no-such-run")
    result = run_plot(missing)
    assert result.returncode == 2, result
    assert result.stderr.strip().split("\n") == [
        f"plot_run: {missing}: no such file or directory (nor {missing}.rank<N>)"], result.stderr
    assert result.stdout == "", result.stdout


def test_dir_without_events_exits_2(tmp):
    result = run_plot(tmp)
    assert result.returncode == 2, result
    assert result.stderr.strip() == (f"plot_run: {tmp}: no events.out.tfevents.* files in "
                                     f"this directory"), result.stderr


def test_mid_file_corruption_exits_2(tmp):
    path = write_run(tmp)
    with open(path, "r+b") as f:
        f.seek(100)  # inside the second record (the first, file_version, is ~30 bytes)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x40]))
    result = run_plot(tmp)
    assert result.returncode == 2, result
    assert result.stderr.startswith(f"plot_run: {path}: corrupt record"), result.stderr
    assert "byte offset" in result.stderr, result.stderr


def main():
    tests = [(name, test) for name, test in globals().items() if name.startswith("test_")]
    passed = failed = 0
    for name, test in tests:
        tmp = tempfile.mkdtemp(prefix="test_plot_run.")
        try:
            test(tmp)
            passed += 1
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
        finally:
            shutil.rmtree(tmp)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
