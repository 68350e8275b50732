#!/usr/bin/env python3
"""plot_run.py: draws the trainers' --log files (loss, memory per rank by category, bytes sent and the
step's time split), several runs on one figure.

Usage: plot_run.py [-o FIGURE.png] [--title TEXT] LOG.jsonl...

Each log is the JSON lines train_mlp, train_mlp_cuda or train_gpt writes with --log FILE: a "run" line with the
settings, then one "step" line per step. The runs are told apart by what differs between them
(stage, ranks, precision, optimizer, ...), so stages 0-3 of one model appear as "stage 0" .. "stage 3"."""
import argparse
import json
import os
import sys

# The settings a label is made of, in this order, and how each is written.
LABEL_KEYS = [("trainer", "{}"), ("stage", "stage {}"), ("ranks", "N={}"), ("precision", "{}"),
              ("optimizer", "{}"), ("accum", "accum {}"), ("clip", "clip {}"), ("backend", "{}")]
# Memory categories, bottom to top of each bar.
CATEGORIES = [("params_bytes", "params"), ("grads_bytes", "grads"), ("master_bytes", "master"),
              ("optimizer_states_bytes", "optimizer states"), ("transient_peak_bytes", "transient peak")]
TIMES = [("compute_ms", "compute"), ("gather_ms", "gather/release"), ("reduce_ms", "reduce"),
         ("update_ms", "step()")]


def read_log(path):
    """The run line and the step lines of one log; a clear error for anything else."""
    run, steps = None, []
    with open(path) as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_run.py: {path}:{number}: not JSON ({e})")
            kind = line.get("kind")
            if kind == "run":
                run = line
            elif kind == "step":
                steps.append(line)
            elif kind == "resume":  # a resumed run appended to the log: its steps go on from the checkpoint's
                continue
            else:
                sys.exit(f"plot_run.py: {path}:{number}: kind {kind!r}, expected 'run', 'resume' or 'step'")
    if run is None:
        sys.exit(f"plot_run.py: {path}: no 'run' line; is this a trainer's --log file?")
    if not steps:
        sys.exit(f"plot_run.py: {path}: no steps logged")
    return run, steps


def labels(runs):
    """Names the runs by the settings that differ between them (all of them for a single run)."""
    keys = [(k, fmt) for k, fmt in LABEL_KEYS if len({json.dumps(r.get(k)) for r in runs}) > 1]
    if not keys:
        keys = [(k, fmt) for k, fmt in LABEL_KEYS if k in ("trainer", "stage", "ranks", "precision")]
    return [", ".join(fmt.format(r.get(k)) for k, fmt in keys) for r in runs]


def mib(b):
    return b / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", metavar="LOG.jsonl")
    ap.add_argument("-o", "--output", default="run.png", help="image file to write (default run.png)")
    ap.add_argument("--title", help="the figure's title (default: what the runs share)")
    args = ap.parse_args()

    try:
        import matplotlib
    except ImportError:
        # One line, not a traceback: which package, and how this project installs it.
        sys.exit(f"plot_run.py: this python3 ({sys.executable}) has no matplotlib: install python3-matplotlib "
                 "(scripts/setup.sh --no-build does), or pip install matplotlib")
    if not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")  # a file, not a window: works headless
    import matplotlib.pyplot as plt

    logs = [read_log(p) for p in args.logs]
    runs = [r for r, _ in logs]
    names = labels(runs)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    (loss_ax, mem_ax), (comm_ax, time_ax) = ax

    # Identical curves (the loss of every stage of one model, the bytes of stages 0-2) draw on top of
    # each other, so each later line is thinner and dashed to let the earlier ones show through.
    def style(i):
        return {"linewidth": max(3.0 - 0.6 * i, 0.8), "linestyle": "-" if i == 0 else (0, (4, 2 + i))}

    for i, ((run, steps), name) in enumerate(zip(logs, names)):
        loss_ax.plot([s["step"] for s in steps], [s["loss"] for s in steps], label=name, **style(i))
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("loss (mean over the global batch)")
    loss_ax.set_title("loss")
    loss_ax.legend(fontsize="small")

    # Memory per rank at the last step, by category, one stacked bar per run.
    bottoms = [0.0] * len(logs)
    for key, name in CATEGORIES:
        values = [mib(steps[-1].get(key, 0)) for _, steps in logs]
        mem_ax.bar(range(len(logs)), values, bottom=bottoms, label=name)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    mem_ax.set_xticks(range(len(logs)), names, rotation=20, ha="right", fontsize="small")
    mem_ax.set_ylabel("MiB per rank")
    mem_ax.set_title("memory per rank by category (last step)")
    mem_ax.set_ylim(top=max(bottoms) * 1.3)  # room for the legend above the bars
    mem_ax.legend(fontsize="small", ncol=3, loc="upper right")

    # Bytes each rank sends per step.
    for i, ((run, steps), name) in enumerate(zip(logs, names)):
        comm_ax.plot([s["step"] for s in steps], [mib(s["bytes_sent"]) for s in steps], label=name, **style(i))
    comm_ax.set_ylim(bottom=0, top=comm_ax.get_ylim()[1] * 1.15)  # from zero: the ratio between runs shows
    comm_ax.set_xlabel("step")
    comm_ax.set_ylabel("MiB sent per rank")
    comm_ax.set_title("communication per step")
    comm_ax.legend(fontsize="small")

    # Where a step's time went: the mean over the steps after the first (warm-up), stacked.
    bottoms = [0.0] * len(logs)
    have_split = any(k in steps[-1] for _, steps in logs for k, _ in TIMES)
    parts = TIMES if have_split else [("step_ms", "step")]
    for key, name in parts:
        values = []
        for _, steps in logs:
            tail = steps[1:] or steps
            values.append(sum(s.get(key, 0.0) for s in tail) / len(tail))
        time_ax.bar(range(len(logs)), values, bottom=bottoms, label=name)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    time_ax.set_xticks(range(len(logs)), names, rotation=20, ha="right", fontsize="small")
    time_ax.set_ylabel("ms per step (mean, first step left out)")
    time_ax.set_title("time per step")
    time_ax.set_ylim(top=max(bottoms) * 1.2)
    time_ax.legend(fontsize="small", ncol=len(parts), loc="upper right")

    if args.title:
        title = args.title
    else:
        shared = [fmt.format(runs[0].get(k)) for k, fmt in LABEL_KEYS
                  if len({json.dumps(r.get(k)) for r in runs}) == 1 and k in runs[0]]
        title = ", ".join(shared) + f", {runs[0].get('params', '?')} parameters"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"plot_run.py: wrote {args.output} ({len(logs)} run{'s' if len(logs) > 1 else ''})")


if __name__ == "__main__":
    main()
