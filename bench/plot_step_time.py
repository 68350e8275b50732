#!/usr/bin/python3
"""Draws bench/step_time.sh's JSON lines: one panel per N, a stacked bar per stage and variant (compute,
exposed communication, optimizer, other), with the modeled link's time as a tick where there is one.

Usage: plot_step_time.py RESULTS.jsonl OUT.png [--table]
--table also prints a Markdown table of the splits (ms per step).
A variant is whatever else a run's flags set (a link, later --overlap): its flags without --stage and --ranks.
"""
import json
import re
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")  # no display on CI machines
import matplotlib.pyplot as plt  # noqa: E402

PARTS = [("time_compute_s", "compute", "#4c72b0"), ("time_comm_exposed_s", "exposed communication", "#dd8452"),
         ("time_optimizer_s", "optimizer", "#55a868"), ("time_other_s", "other", "#8c8c8c")]


def variant(r):
    flags = re.sub(r"--(stage|ranks) \S+", "", r["flags"])
    flags = re.sub(r"--link-gbps \S+ --link-latency-us \S+", "link", flags)
    return " ".join(flags.split()) or "no link"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    rows = [r for r in rows if r.get("bench") == "step_time"]
    ranks = sorted({r["ranks"] for r in rows})
    variants = list(OrderedDict.fromkeys(variant(r) for r in rows))
    stages = sorted({r["stage"] for r in rows})
    fig, axes = plt.subplots(1, len(ranks), figsize=(4.5 * len(ranks), 4.2), sharey=True, squeeze=False)
    width = 0.8 / len(variants)
    for ax, n in zip(axes[0], ranks):
        for vi, v in enumerate(variants):
            for s in stages:
                match = [r for r in rows if r["ranks"] == n and r["stage"] == s and variant(r) == v]
                if not match:
                    continue
                r = match[-1]
                x = s + (vi - (len(variants) - 1) / 2) * width
                bottom = 0.0
                for key, label, color in PARTS:
                    h = 1e3 * r[key]
                    ax.bar(x, h, width * 0.95, bottom=bottom, color=color, hatch="//" if vi else None,
                           edgecolor="white", label=label if (n == ranks[0] and s == stages[0] and vi == 0) else None)
                    bottom += h
                if "link_modeled_s" in r:
                    ax.plot([x - width / 2, x + width / 2], [1e3 * r["link_modeled_s"]] * 2, color="black", lw=1.5)
        ax.set_title(f"N = {n}")
        ax.set_xticks(stages)
        ax.set_xticklabels([f"stage {s}" for s in stages])
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("ms per step (mean over ranks and steps)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="black", lw=1.5))
    labels.append("modeled link time")
    note = "bars left to right: " + ", ".join(f"{v}{' (hatched)' if i else ''}" for i, v in enumerate(variants))
    fig.legend(handles, labels, loc="upper center", ncol=5, fontsize=8)
    fig.text(0.5, 0.005, note, ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 0.9))
    fig.savefig(sys.argv[2], dpi=120)
    print("wrote", sys.argv[2], file=sys.stderr)
    if "--table" in sys.argv[3:]:
        print("| N | stage | variant | step | compute | exposed comm | optimizer | other | modeled link |")
        print("|---|---|---|---|---|---|---|---|---|")
        for n in ranks:
            for s in stages:
                for v in variants:
                    for r in [r for r in rows if r["ranks"] == n and r["stage"] == s and variant(r) == v][-1:]:
                        cells = [f"{1e3 * r[k]:.1f}" for k in ("time_step_s", "time_compute_s", "time_comm_exposed_s",
                                                               "time_optimizer_s", "time_other_s")]
                        link = f"{1e3 * r['link_modeled_s']:.1f}" if "link_modeled_s" in r else "-"
                        print(f"| {n} | {s} | {v} | " + " | ".join(cells) + f" | {link} |")


if __name__ == "__main__":
    main()
