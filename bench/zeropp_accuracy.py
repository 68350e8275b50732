#!/usr/bin/env python3
"""zeropp_accuracy.py: ZeRO++'s cost in accuracy and its bytes per link level, measured with train_mlp.

Usage: zeropp_accuracy.py TRAIN_MLP [--steps 300] [--ranks 4] [--node-size 2] [--out bench/results]
                          [--plot docs/img/zeropp.png] [--check]

Trains the same model with the same seed (the same data and initial weights) under ZeRO stage 3, once
without ZeRO++ and once per technique and combination (qwZ, qgZ with int8 and int4 codes, int4 with
error feedback, hpZ, all three), on --ranks thread ranks grouped into nodes of --node-size. For each
run it records the loss of every step (--log) and the summary (--json): the bytes each rank sends per
step in total and between nodes, each next to its formula (the run fails if they differ). It then prints the table of
docs/zeropp.md (markdown), writes the runs as JSON lines (OUT/zeropp.jsonl) and draws the loss curves
and the bytes (PLOT, matplotlib, headless).

The accuracy metric is the final loss as the mean loss of the last W = steps/10 steps (one step's loss
is dominated by its batch). A run passes when its metric is within the tolerance of the baseline's of
the same precision: the standard error of the baseline's metric, sigma / sqrt(W), sigma being the
standard deviation of the baseline's loss over those W steps. That is the scatter the mean of W batches'
losses has from the batches alone: a difference below it cannot be told from a different draw of
batches, one above it is the quantization's. --check exits 1 if a run fails that or a formula."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# (label, extra flags, precision). The node size goes to every run (so the baseline's bytes between
# nodes are counted too); hpZ takes it as its argument.
RUNS = [
    ("stage 3", [], "fp32"),
    ("qwZ", ["--qwz"], "fp32"),
    ("qgZ int8", ["--qgz"], "fp32"),
    ("qgZ int4", ["--qgz", "--qgz-bits", "4"], "fp32"),
    ("qgZ int4 + error feedback", ["--qgz", "--qgz-bits", "4", "--qgz-error-feedback"], "fp32"),
    ("hpZ", ["--hpz"], "fp32"),
    ("qwZ + qgZ + hpZ", ["--qwz", "--qgz", "--hpz"], "fp32"),
    ("qwZ + qgZ int4 + hpZ", ["--qwz", "--qgz", "--qgz-bits", "4", "--hpz"], "fp32"),
    ("stage 3, bf16", [], "bf16"),
    ("qwZ + qgZ int4 + hpZ, bf16", ["--qwz", "--qgz", "--qgz-bits", "4", "--hpz"], "bf16"),
]


def run(train_mlp, index, label, flags, precision, args, workdir):
    log = os.path.join(workdir, f"run{index}.jsonl")
    cmd = [train_mlp, "--stage", "3", "--ranks", str(args.ranks), "--steps", str(args.steps), "--seed",
           str(args.seed), "--precision", precision, "--log", log, "--json"]
    if "--qwz" in flags or "--qgz" in flags:  # the trainers refuse --quant-block where nothing is quantized
        cmd += ["--quant-block", str(args.block)]
    for f in flags:
        cmd += [f, str(args.node_size)] if f == "--hpz" else [f]
    if "--hpz" not in flags:
        cmd += ["--node-size", str(args.node_size)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"zeropp_accuracy.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    losses = []
    with open(log) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "step":
                losses.append(rec["loss"])
    shown = [a for i, a in enumerate(cmd[1:]) if a != "--log" and (i == 0 or cmd[i] != "--log")]
    return {"label": label, "flags": flags, "precision": precision, "command": "train_mlp " + " ".join(shown),
            "losses": losses, "summary": summary}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("train_mlp")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--node-size", type=int, default=2)
    ap.add_argument("--block", type=int, default=256, help="--quant-block of every run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="folder for zeropp.jsonl (default: none)")
    ap.add_argument("--plot", help="image file of the loss curves and bytes (default: none)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a run misses the tolerance or a formula")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as work:
        results = [run(args.train_mlp, i, label, flags, prec, args, work) for i, (label, flags, prec) in enumerate(RUNS)]

    window = max(1, args.steps // 10)
    base = {r["precision"]: r for r in results if not r["flags"]}
    failures = []
    rows = []
    for r in results:
        s, b = r["summary"], base[r["precision"]]
        tail, base_tail = r["losses"][-window:], b["losses"][-window:]
        metric, base_metric = statistics.fmean(tail), statistics.fmean(base_tail)
        tolerance = statistics.pstdev(base_tail) / len(base_tail) ** 0.5
        # The largest difference along the way, as a running mean over the same window (early training
        # is where a coarse gradient shows most).
        d = [x - y for x, y in zip(r["losses"], b["losses"])]
        running = [statistics.fmean(d[max(0, k - window + 1):k + 1]) for k in range(len(d))]
        worst = max(range(len(running)), key=lambda k: abs(running[k]))
        r.update(metric=metric, delta=metric - base_metric, tolerance=tolerance,
                 within=abs(metric - base_metric) <= tolerance, worst=running[worst], worst_step=worst + 1)
        for key, formula in (("comm_bytes_per_rank_per_step", "comm_formula_bytes"),
                             ("comm_inter_node_bytes_per_rank_per_step", "comm_inter_node_formula_bytes")):
            if s[key] != s[formula]:
                failures.append(f"{r['label']}: {key} {s[key]} != formula {s[formula]}")
        if not r["within"]:
            failures.append(f"{r['label']}: final loss {metric:.5f} differs from the baseline's {base_metric:.5f} by more "
                            f"than {tolerance:.5f}")
        elem = 4 if r["precision"] == "fp32" else 2
        psi_bytes = elem * s["padded_params"]
        rows.append((r["label"], s["comm_bytes_per_rank_per_step"], s["comm_inter_node_bytes_per_rank_per_step"],
                     s["comm_inter_node_bytes_per_rank_per_step"] / psi_bytes,
                     s["comm_inter_node_bytes_per_rank_per_step"] / b["summary"]["comm_inter_node_bytes_per_rank_per_step"],
                     r["losses"][-1], metric, r["delta"], tolerance, r["within"], r["worst"], r["worst_step"]))

    print(f"train_mlp, stage 3, {args.ranks} ranks in nodes of {args.node_size}, {args.steps} steps, seed {args.seed}, "
          f"blocks of {args.block}; {results[0]['summary']['padded_params']} padded parameters (Psi); final loss: mean of "
          f"the last {window} steps; tolerance: the standard error of the baseline's mean, sigma / sqrt({window})\n")
    print("| run | bytes/step (total) | between nodes | between nodes / Psi | / baseline's | last loss | final loss "
          "(mean) | difference | tolerance | within | largest running difference (step) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]:.3f} | {row[4]:.3f} | {row[5]:.4f} | {row[6]:.4f} | "
              f"{row[7]:+.4f} | {row[8]:.4f} | {'yes' if row[9] else 'NO'} | {row[10]:+.4f} ({row[11]}) |")

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "zeropp.jsonl"), "w") as f:
            for r in results:
                f.write(json.dumps({k: r[k] for k in ("label", "precision", "command", "losses", "metric", "delta",
                                                       "tolerance", "within", "worst", "worst_step")} | {
                    "bytes_per_step": r["summary"]["comm_bytes_per_rank_per_step"],
                    "inter_node_bytes_per_step": r["summary"]["comm_inter_node_bytes_per_rank_per_step"],
                    "param_hash": r["summary"]["param_hash"]}) + "\n")
    if args.plot:
        import matplotlib
        if not os.environ.get("MPLBACKEND"):
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (loss_ax, diff_ax, bytes_ax) = plt.subplots(1, 3, figsize=(20, 5.5))
        for i, r in enumerate(results):
            loss_ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["label"],
                         linewidth=max(2.4 - 0.2 * i, 0.8), linestyle="-" if i % 2 == 0 else "--")
        loss_ax.set_xlabel("step")
        loss_ax.set_ylabel("loss (mean over the global batch)")
        loss_ax.set_yscale("log")
        loss_ax.set_title("loss, the same seed")
        loss_ax.legend(fontsize="small")
        # The difference from the baseline of the same precision, as a running mean over W steps (the
        # metric's window), so the quantization's effect shows apart from the batches' scatter.
        for i, r in enumerate(results):
            if not r["flags"]:
                continue
            b = base[r["precision"]]["losses"]
            d = [x - y for x, y in zip(r["losses"], b)]
            smooth = [statistics.fmean(d[max(0, k - window + 1):k + 1]) for k in range(len(d))]
            diff_ax.plot(range(1, len(d) + 1), smooth, label=r["label"], linewidth=1.4,
                         linestyle="-" if i % 2 == 0 else "--")
        diff_ax.axhline(0.0, color="black", linewidth=0.6)
        diff_ax.set_xlabel("step")
        diff_ax.set_ylabel(f"loss - baseline's loss (running mean of {window} steps)")
        diff_ax.set_title("difference from stage 3 without ZeRO++ (same precision)")
        diff_ax.legend(fontsize="small")
        names = [r["label"] for r in results]
        total = [r["summary"]["comm_bytes_per_rank_per_step"] / 2**20 for r in results]
        inter = [r["summary"]["comm_inter_node_bytes_per_rank_per_step"] / 2**20 for r in results]
        intra = [t - x for t, x in zip(total, inter)]
        bytes_ax.bar(range(len(results)), inter, label="between nodes")
        bytes_ax.bar(range(len(results)), intra, bottom=inter, label="within a node")
        bytes_ax.set_xticks(range(len(results)), names, rotation=25, ha="right", fontsize="small")
        bytes_ax.set_ylabel("MiB sent per rank per step")
        bytes_ax.set_title(f"bytes per link level ({args.ranks} ranks, nodes of {args.node_size})")
        bytes_ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"\nzeropp_accuracy.py: wrote {args.plot}")
    if failures:
        print("\n" + "\n".join(failures), file=sys.stderr)
        if args.check:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
