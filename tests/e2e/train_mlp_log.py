#!/usr/bin/env python3
"""train_mlp --log and the progress line: the log has the run line and one line per step that agree
with the run's own summary, a save line's bytes are rank 0's data file (blocking and asynchronous
saves alike), a resumed run's log goes on from the checkpoint's step (appended to the
same file with a record of the resume point), a new run refuses an existing log without
--log-overwrite, symbolic links are not followed, and the progress
line (stderr not a terminal: one line per update) shows step, loss, samples/s, ms/step and ETA, and
on a terminal is redrawn in place.

Usage: train_mlp_log.py TRAIN_MLP"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

train_mlp = sys.argv[1]
MODEL = ["--layers", "3", "--hidden", "32", "--batch", "24", "--ranks", "3"]
failures = 0


def check(ok, msg):
    global failures
    if not ok:
        failures += 1
        print("FAIL:", msg)


def run(*args, expect=0):
    r = subprocess.run([train_mlp, *MODEL, *args], capture_output=True, text=True, timeout=120)
    check(r.returncode == expect, f"{' '.join(args)}: exit {r.returncode}, expected {expect}: {r.stderr[-400:]}")
    return r


def read(path):
    """The run line and the step lines (a resumed run's "resume" record is checked apart)."""
    lines = [json.loads(x) for x in open(path)]
    return lines[0], [x for x in lines[1:] if x["kind"] == "step"]


def check_save_bytes(saved, ckpt):
    """A save line's bytes: rank 0's data file of its version, whether the save blocked or not. The 3 ranks'
    files differ in size (the padding is the last rank's), so the mean over them would not pass."""
    vdir = os.path.join(ckpt, f"v-{saved['version']:08d}")
    sizes = [os.path.getsize(os.path.join(vdir, f"rank-{r:05d}-of-00003.bin")) for r in range(3)]
    check(sum(sizes) // 3 != sizes[0], f"the ranks' data files {sizes}: the mean is rank 0's")
    check(saved["bytes"] == sizes[0], f"the save line's bytes {saved['bytes']}, rank 0's data file {sizes[0]}: {saved}")


with tempfile.TemporaryDirectory() as tmp:
    log, ckpt = os.path.join(tmp, "a.jsonl"), os.path.join(tmp, "ckpt")
    r = run("--stage", "2", "--precision", "bf16", "--steps", "12", "--log", log, "--save", ckpt, "--json")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    head, steps = read(log)
    check(head["kind"] == "run" and head["trainer"] == "train_mlp" and head["stage"] == 2 and head["ranks"] == 3
          and head["precision"] == "bf16" and head["first_step"] == 0 and head["steps"] == 12, f"run line: {head}")
    check([s["step"] for s in steps] == list(range(1, 13)), f"steps {[s['step'] for s in steps]}")
    check([x["kind"] for x in map(json.loads, open(log))] == ["run"] + ["step"] * 12 + ["save"], "a new run's lines")
    saved = [x for x in map(json.loads, open(log)) if x["kind"] == "save"][0]
    check(saved["step"] == 12 and saved["version"] == 1 and saved["async"] is False and saved["bytes"] > 0
          and saved["stall_s"] == saved["write_s"] > 0, f"the save line: {saved}")
    check_save_bytes(saved, ckpt)
    # An asynchronous save's line means the same: rank 0's data file of that version.
    ckpt_async, log_async = os.path.join(tmp, "ckpt-async"), os.path.join(tmp, "async.jsonl")
    run("--stage", "2", "--precision", "bf16", "--steps", "4", "--save-every", "2", "--save-async", "--log", log_async,
        "--save", ckpt_async)
    async_saves = [x for x in map(json.loads, open(log_async)) if x["kind"] == "save"]
    check(len(async_saves) == 2 and all(x["async"] for x in async_saves), f"asynchronous save lines: {async_saves}")
    if async_saves:
        check_save_bytes(async_saves[-1], ckpt_async)  # the version kept (the older one is removed)
    # The same numbers as the summary: the log is written from the values the trainer reports.
    check(steps[0]["loss"] == summary["loss_first"] and steps[-1]["loss"] == summary["loss_last"],
          f"losses {steps[0]['loss']}, {steps[-1]['loss']} vs summary {summary['loss_first']}, {summary['loss_last']}")
    check(steps[-1]["accuracy"] == summary["accuracy_last"], "accuracy differs from the summary")
    check(steps[-1]["model_state_bytes"] == summary["model_state_bytes_per_rank"], "model-state bytes differ")
    check(steps[-1]["bytes_sent"] == summary["comm_bytes_per_rank_per_step"], "bytes sent differ")
    check(steps[-1]["grad_norm"] == summary["grad_norm"], "grad norm differs")  # bf16 computes it
    for s in steps:
        split = s["gather_ms"] + s["reduce_ms"] + s["update_ms"] + s["compute_ms"]
        # The split covers train_step; the step's time adds only the loss and accuracy reductions.
        check(0 < split <= s["step_ms"] + 1e-6, f"step {s['step']}: split {split} ms vs step {s['step_ms']} ms")
        check(s["samples_per_s"] > 0 and s["transient_bytes"] == 0, f"step {s['step']}: {s}")
        # The time split: measured parts that add up to the step (docs/performance.md, "Step time").
        parts = [s["time_compute_s"], s["time_comm_exposed_s"], s["time_optimizer_s"], s["time_other_s"]]
        check(all(p >= 0 for p in parts) and abs(sum(parts) - s["time_step_s"]) <= 1e-9,
              f"step {s['step']}: parts {parts} vs step {s['time_step_s']} s")
        check(abs(s["time_step_s"] * 1e3 - s["step_ms"]) <= 1e-6, f"step {s['step']}: step_ms vs time_step_s")
        check(s["time_compute_s"] * 1e3 == s["compute_ms"], f"step {s['step']}: compute_ms vs time_compute_s")
        # step() of stage 2 has the all-gather in it: the optimizer part excludes it.
        check(s["time_optimizer_s"] * 1e3 <= s["update_ms"] + 1e-9, f"step {s['step']}: optimizer vs update_ms")
    # The summary's split: the means over ranks and steps, adding up as well.
    parts = [summary[k] for k in ("time_compute_s", "time_comm_exposed_s", "time_optimizer_s", "time_other_s")]
    check(abs(sum(parts) - summary["time_step_s"]) <= 1e-9 and min(parts) >= 0,
          f"summary: parts {parts} vs step {summary['time_step_s']}")
    check(summary["time_comm_exposed_s"] > 0, "three ranks of stage 2 spent no time in collectives")
    # The progress line, one line per update off a terminal: the first and the last step at least.
    progress = [line for line in r.stderr.splitlines() if line.startswith("step ")]
    pattern = re.compile(r"^step +(\d+)/12  loss (\d+\.\d{4})  \d+ samples/s  \d+\.\d ms/step  ETA \d+:\d\d$")
    matches = [pattern.match(line) for line in progress]
    check(len(progress) >= 2 and all(matches), f"progress lines: {progress}")
    if len(progress) >= 2 and all(matches):
        check(matches[0].group(1) == "1" and matches[-1].group(1) == "12", f"first/last: {progress}")
        check(float(matches[-1].group(2)) == round(summary["loss_last"], 4), "last progress loss")
    check("\r" not in r.stderr, "carriage returns in a progress written to a file")

    # On a terminal (script(1) gives the trainer one) the line is redrawn in place: a carriage return
    # before each update, the rest of the old line erased, one newline at the end.
    if shutil.which("script"):
        cmd = " ".join([train_mlp, *MODEL, "--steps", "12", ">/dev/null"])
        tty = subprocess.run(["script", "-q", "-e", "-c", cmd, "/dev/null"], capture_output=True,
                             timeout=120).stdout.decode()  # bytes: text mode would turn \r into \n
        draws = tty.split("\r")[1:]
        check(len(draws) >= 2 and all(d.startswith("step ") and "\x1b[K" in d for d in draws[:-1]),
              f"terminal output: {tty!r}")
        check(tty.count("\n") == 1 and tty.rstrip("\r\n").endswith("ETA 0:00\x1b[K"), f"terminal end: {tty!r}")
    else:
        print("no script(1): the terminal form is not checked")

    # A resumed run's log goes on from the checkpoint's step.
    log2 = os.path.join(tmp, "b.jsonl")
    run("--stage", "3", "--precision", "bf16", "--steps", "4", "--resume", ckpt, "--log", log2)
    head2, steps2 = read(log2)
    check(head2["first_step"] == 12 and [s["step"] for s in steps2] == [13, 14, 15, 16],
          f"resumed: first_step {head2['first_step']}, steps {[s['step'] for s in steps2]}")
    resume = json.loads(open(log2).readlines()[1])
    check(resume == {"kind": "resume", "checkpoint": ckpt, "step": 12}, f"resume record: {resume}")

    # The same log, resumed into: appended to, never truncated, with a record of where the run took
    # up (the checkpoint and its step) after the new run line.
    before = open(log).read()
    run("--stage", "3", "--precision", "bf16", "--steps", "4", "--resume", ckpt, "--log", log)
    after = open(log).read()
    check(after.startswith(before), "the resumed run did not append to the log")
    lines = [json.loads(x) for x in after.splitlines()]
    kinds = [x["kind"] for x in lines]
    check(kinds == ["run"] + ["step"] * 12 + ["save", "run", "resume"] + ["step"] * 4, f"appended log kinds: {kinds}")
    if len(lines) == 19:
        check(lines[13]["first_step"] == 12 and lines[14] == {"kind": "resume", "checkpoint": ckpt, "step": 12},
              f"resume record: {lines[13:15]}")
        check([x["step"] for x in lines[15:]] == [13, 14, 15, 16], f"appended steps: {lines[15:]}")

    # A new run never writes into, nor silently discards, a log that holds something: refused before
    # anything runs, unless --log-overwrite says to replace it.
    r = run("--steps", "2", "--log", log, expect=2)
    check("--log-overwrite" in r.stderr and "already holds" in r.stderr, f"existing log: {r.stderr[:300]}")
    check(open(log).read() == after, "a refused run changed the log")
    run("--steps", "2", "--log", log, "--log-overwrite")
    head3, steps3 = read(log)
    check(head3["first_step"] == 0 and [s["step"] for s in steps3] == [1, 2], "--log-overwrite did not replace the log")
    r = run("--steps", "2", "--log-overwrite", expect=2)
    check("--log" in r.stderr, f"--log-overwrite alone: {r.stderr[:300]}")

    # Symbolic links are not followed: a dangling link's target is not created, a link to a file
    # leaves the file alone.
    target, link = os.path.join(tmp, "target.jsonl"), os.path.join(tmp, "link.jsonl")
    os.symlink(target, link)
    r = run("--steps", "2", "--log", link, expect=2)
    check("symbolic link" in r.stderr and not os.path.exists(target), f"dangling link: {r.stderr[:300]}")
    open(target, "w").close()
    r = run("--steps", "2", "--log", link, "--log-overwrite", expect=2)
    check("symbolic link" in r.stderr and os.path.getsize(target) == 0, f"link to a file: {r.stderr[:300]}")
    os.mkfifo(os.path.join(tmp, "fifo"))
    r = run("--steps", "2", "--log", os.path.join(tmp, "fifo"), expect=2)
    check("not a regular file" in r.stderr, f"a FIFO as the log: {r.stderr[:300]}")

    # A log that cannot be written is a usage error before anything runs.
    r = run("--steps", "2", "--log", os.path.join(tmp, "missing", "x.jsonl"), expect=2)
    check("--log" in r.stderr and "does not exist" in r.stderr, f"message: {r.stderr[:300]}")
    r = run("--steps", "2", "--log", tmp, expect=2)
    check("--log" in r.stderr, f"a directory as the log: {r.stderr[:300]}")

print("0 failed" if failures == 0 else f"{failures} failed")
sys.exit(1 if failures else 0)
