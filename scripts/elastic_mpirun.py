#!/usr/bin/env python3
"""Runs a trainer under mpirun and, when the job fails, starts it again with one process fewer from the newest checkpoint.

Usage: elastic_mpirun.py [--mpirun PATH] [--min-np M] [--max-restarts K] [--report FILE] [--grow STEP]... -np N
                         [MPIRUN ARGS...] -- TRAINER ARGS...

Under MPI a process that fails ends the whole job (MPI_Abort), and the Open MPI this project is tested
with has no user-level fault tolerance to shrink a communicator in place: the survivors cannot go on
inside the job. This supervisor goes on outside it. TRAINER ARGS must save checkpoints (--save DIR,
with --save-every K to lose at most K - 1 steps) and say the run's length (--steps S, counted from
where the run starts). When mpirun exits non-zero, the supervisor reads the newest committed checkpoint
in DIR and starts mpirun again with one process fewer, --resume DIR and the steps left; with
--reproducible the run ends on the bits of one that never failed (docs/elasticity.md). Planted failures
(--fail RANK:STEP) are passed to the first job only.

It gives up, with exit 1 and the checkpoints left as they are, when a job fails before saving a
checkpoint newer than the one it started from (a failure during the recovery, or one that repeats),
when fewer than --min-np processes (default 1) would be left, or after --max-restarts restarts
(default: N - 1). A job refused for its arguments (exit 2, e.g. a batch that does not split over the
smaller world) ends it at once. --report FILE: the launches as JSON.

--grow STEP (repeatable): the job stops after STEP steps, having saved them, and the supervisor starts
it again with one process more from that checkpoint (a process that was never in the run); with
--reproducible, to the bits of a run that never changed. Each STEP lies between the run's first and
last steps (the run starts fresh, or with --resume DIR from the --save directory).
"""
import json
import os
import re
import subprocess
import sys
import time


def usage(message):
    sys.stderr.write("elastic_mpirun: %s\n(usage: %s)\n" % (message, __doc__.splitlines()[2].strip()))
    sys.exit(2)


def flag_value(args, name):
    """The value of the last --name VALUE or --name=VALUE in args, or None."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a[len(name) + 1:]
    return value


def without_flag(args, name):
    """args without any --name VALUE or --name=VALUE."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == name:
            skip = True
            continue
        if a.startswith(name + "="):
            continue
        out.append(a)
    return out


def newest_checkpoint(directory):
    """(version number, data position) of the newest committed version in directory, or None."""
    best = None
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    for name in names:
        m = re.fullmatch(r"v-(\d+)", name)
        manifest = os.path.join(directory, name, "manifest.json")
        if not m or os.path.islink(os.path.join(directory, name)) or not os.path.isfile(manifest):
            continue
        number = int(m.group(1))
        if best is None or number > best[0]:
            best = (number, manifest)
    if best is None:
        return None
    with open(best[1]) as f:
        state = json.load(f)["training_state"]
    return best[0], state["step"] + state["skipped_steps"]


def main(argv):
    mpirun, min_np, max_restarts, report, np = "mpirun", 1, None, None, None
    mpirun_args, grows = [], []
    if "--" not in argv:
        usage("give the trainer and its arguments after --")
    split = argv.index("--")
    ours, trainer = argv[:split], argv[split + 1:]
    i = 0
    while i < len(ours):
        a = ours[i]
        value = ours[i + 1] if i + 1 < len(ours) else None
        if a in ("--mpirun", "--min-np", "--max-restarts", "--report", "--grow", "-np", "-n") and value is None:
            usage(a + " needs a value")
        if a == "--mpirun":
            mpirun = value
        elif a == "--min-np":
            min_np = int(value)
        elif a == "--max-restarts":
            max_restarts = int(value)
        elif a == "--report":
            report = value
        elif a == "--grow":
            if not value.isdigit() or int(value) < 1:
                usage("--grow STEP needs a step >= 1, got %r" % value)
            grows.append(int(value))
        elif a in ("-np", "-n"):
            np = int(value)
        else:
            mpirun_args.append(a)
            i += 1
            continue
        i += 2
    if np is None or np < 1:
        usage("-np N (N >= 1) is required")
    if not trainer:
        usage("no trainer after --")
    save = flag_value(trainer, "--save")
    steps = flag_value(trainer, "--steps")
    if save is None:
        usage("the trainer needs --save DIR: the checkpoints a smaller job goes on from")
    if steps is None or not steps.isdigit():
        usage("the trainer needs --steps S: the run's length, so that a restart trains only the steps left")
    if max_restarts is None:
        max_restarts = np - 1
    program, args = trainer[0], trainer[1:]
    start = newest_checkpoint(save) if flag_value(args, "--resume") == save else None
    first_step = start[1] if start else (None if flag_value(args, "--resume") else 0)
    launches = []
    end = first_step + int(steps) if first_step is not None else None
    for g in grows:
        if first_step is None:
            usage("--grow needs the run's first step: start fresh, or --resume the --save directory")
        if grows.count(g) > 1:
            usage("--grow %d is given twice (one process joins per --grow)" % g)
        if not first_step < g < end:
            usage("--grow %d: the run trains steps %d-%d, and the job grows between two of them" %
                  (g, first_step + 1, end))

    def next_stop(at):
        """Where a job starting after `at` steps stops: the next --grow step, or the end."""
        return min([g for g in grows if g > at] + [end])

    if grows:
        args = without_flag(args, "--steps") + ["--steps", str(next_stop(first_step) - first_step)]

    def write_report():
        if report:
            with open(report, "w") as f:
                json.dump({"launches": launches}, f)
                f.write("\n")

    while True:
        started_from = newest_checkpoint(save) if launches else None
        cmd = [mpirun] + mpirun_args + ["-np", str(np), program] + args
        t0 = time.monotonic()
        rc = subprocess.call(cmd)
        launches.append({"np": np, "exit": rc, "seconds": round(time.monotonic() - t0, 3),
                         "resumed_at": started_from[1] if started_from else None})
        newest = newest_checkpoint(save)
        if rc == 0:
            if not grows or newest is None or newest[1] >= end:
                write_report()
                return 0
            # The job stopped at a --grow step and saved it: one process more goes on from there.
            at = newest[1]
            np += 1
            args = without_flag(without_flag(without_flag(args, "--fail"), "--resume"), "--steps")
            args += ["--resume", save, "--steps", str(next_stop(at) - at)]
            sys.stderr.write("elastic_mpirun: the job of %d processes saved step %d; %d processes go on from it\n" %
                             (np - 1, at, np))
            continue
        why = None
        if rc == 2:
            why = "the job refused its arguments (exit 2)"
        elif first_step is None:
            why = "the run resumed a checkpoint outside --save, whose step the supervisor does not read"
        elif launches[:-1] and (newest is None or (started_from and newest[0] <= started_from[0])):
            why = "the job failed before saving a checkpoint newer than the one it started from"
        elif np - 1 < min_np:
            why = "fewer than --min-np %d processes would be left" % min_np
        elif sum(1 for l in launches if l["exit"] != 0) > max_restarts:
            why = "%d restarts, the most --max-restarts allows" % max_restarts
        if why:
            sys.stderr.write("elastic_mpirun: the job of %d processes failed (exit %d); giving up: %s; the checkpoints "
                             "in %s are kept\n" % (np, rc, why, save))
            write_report()
            return 1
        resumed_at = newest[1] if newest else 0
        np -= 1
        args = without_flag(without_flag(without_flag(args, "--fail"), "--resume"), "--steps")
        if newest:
            args += ["--resume", save]
        args += ["--steps", str(next_stop(resumed_at) - resumed_at)]
        sys.stderr.write("elastic_mpirun: the job failed (exit %d); %d processes go on from %s\n" %
                         (rc, np, "the checkpoint of step %d" % resumed_at if newest else "the start"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
