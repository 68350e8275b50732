#!/usr/bin/python3
"""Draws bus bandwidth against size per backend from bench_collectives' JSON lines, with memcpy as the yardstick.

Usage: plot_collectives.py RESULTS.jsonl OUT.png [--table]
       plot_collectives.py RESULTS.jsonl --targets
--table also prints a Markdown table of busbw (GB/s) and its ratio to memcpy at a few sizes.
--targets prints, as JSON lines, comm::threads against its targets (docs/performance.md): the 1 KiB
all_reduce median at N = 2 and 4 (limit 5 us at N = 2), and busbw at 64 MiB over memcpy at 64 MiB for
all_reduce, reduce_scatter and all_gather at N = 2 (limit 0.5). With several runs (records tagged
"run", see run_collectives.sh) each figure is the median over the runs, with the runs' min and max;
a run's memcpy is the mean of its memcpy records (before and after its collectives).
"""
import json
import statistics
import sys
from collections import defaultdict


OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
TABLE_SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26]


def human(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def series_name(r):
    """threads, mpi, mpi blocking, mpi fast, mpi fast blocking (without N: the plot has a row per N)."""
    if r["backend"] == "threads":
        return "threads"
    mode = "" if r["mode"] == "deterministic" else f" {r['mode']}"
    return f"mpi{mode}{' blocking' if r.get('blocking') else ''}"


def series_order(s):
    return ("mpi" in s, "fast" in s, "blocking" in s, s)


def load(path):
    machine, memcpy, coll = None, defaultdict(list), defaultdict(dict)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r["record"] == "machine":
                machine = machine or r
            elif r["record"] == "memcpy":
                memcpy[r["bytes"]].append(r["gbps"])
            elif r["record"] == "collective":
                coll[(r["ranks"], series_name(r), r["op"])][r["bytes"]] = r["busbw_gbps"]
    # Several memcpy runs (if any) are summarised by their median.
    memcpy = {b: statistics.median(v) for b, v in sorted(memcpy.items())}
    return machine, memcpy, coll


def nearest(table, size):
    """The value at the size closest to `size` (reduce_scatter/all_gather sizes are rounded to N)."""
    if not table:
        return None
    best = min(table, key=lambda b: abs(b - size))
    return table[best] if abs(best - size) <= size // 8 else None


def plot(machine, memcpy, coll, out):
    import matplotlib  # here, so that --targets runs without it

    matplotlib.use("Agg")  # no display on CI machines
    import matplotlib.pyplot as plt

    ranks = sorted({n for n, _, _ in coll})
    series = sorted({s for _, s, _ in coll}, key=series_order)
    colors = {s: f"C{i}" for i, s in enumerate(series)}
    fig, axes = plt.subplots(len(ranks), len(OPS), figsize=(4.2 * len(OPS), 3.8 * len(ranks)), sharex=True,
                             sharey=True, squeeze=False)
    for row, n in zip(axes, ranks):
        for ax, op in zip(row, OPS):
            if memcpy:
                ax.plot(list(memcpy), list(memcpy.values()), "k--", lw=1.5, label="memcpy (1 thread)")
            for s in series:
                pts = coll.get((n, s, op))
                if pts:
                    style = ":" if "blocking" in s else "-"
                    ax.plot(list(pts), list(pts.values()), style, color=colors[s], marker="o", ms=3, label=s)
            ax.set_title(f"{op}, N = {n}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
    sizes = sorted({b for pts in coll.values() for b in pts} | set(memcpy))
    ticks = [b for b in sizes if b & (b - 1) == 0][::2] or sizes
    for ax in axes[-1]:
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(b) for b in ticks], rotation=30)
        ax.set_xlabel("size (bytes of the larger buffer)")
    for ax in axes[:, 0]:
        ax.set_ylabel("busbw (GB/s)")
    axes[0, 0].legend(fontsize=8, loc="lower right")
    where = f"{machine['cpu']}, {machine['cores']} cores" if machine else "unknown machine"
    fig.suptitle(f"Collectives on one host: bus bandwidth vs size ({where}; float, out of place)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def table(memcpy, coll):
    keys = sorted({(n, s) for n, s, _ in coll}, key=lambda k: (series_order(k[1]), k[0]))
    head = "| backend | N | op | " + " | ".join(human(b) for b in TABLE_SIZES) + " |"
    print(head)
    print("|" + "---|" * (3 + len(TABLE_SIZES)))
    print("| memcpy | 1 | (GB/s) | " + " | ".join(f"{nearest(memcpy, b):.1f}" for b in TABLE_SIZES) + " |")
    for n, s in keys:
        for op in OPS:
            cells = []
            for b in TABLE_SIZES:
                v, m = nearest(coll.get((n, s, op), {}), b), nearest(memcpy, b)
                cells.append("-" if v is None else f"{v:.2g} ({100 * v / m:.2g}%)" if m else f"{v:.2g}")
            print(f"| {s} | {n} | {op} | " + " | ".join(cells) + " |")


TARGET_BYTES = 1 << 26
LATENCY_LIMIT_US = {2: 5.0}
BUSBW_LIMIT = 0.5


def spread(values):
    def g(v):
        return float(f"{v:.4g}")
    return {"median": g(statistics.median(values)), "min": g(min(values)), "max": g(max(values)), "runs": len(values)}


def targets(path):
    """The target records: one per (figure, N), each the median over runs with the min and max."""
    memcpy, latency, busbw = defaultdict(list), defaultdict(lambda: defaultdict(list)), defaultdict(dict)
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            run = r.get("run", 1)
            if r["record"] == "memcpy" and r["bytes"] == TARGET_BYTES:
                memcpy[run].append(r["gbps"])
            elif r["record"] == "latency" and r.get("backend") == "threads":
                for k in ("median_us", "p10_us", "p90_us", "mean_us"):
                    latency[r["ranks"]][k].append(r[k])
            elif (r["record"] == "collective" and r.get("backend") == "threads" and r["ranks"] == 2
                  and abs(r["bytes"] - TARGET_BYTES) <= TARGET_BYTES // 8):
                busbw[run][r["op"]] = r["busbw_gbps"]
    out = []
    for n, figs in sorted(latency.items()):
        rec = {"record": "target", "backend": "threads", "what": "all_reduce 1 KiB per-call time", "ranks": n}
        rec.update({k: spread(v) for k, v in figs.items()})
        if n in LATENCY_LIMIT_US:
            rec["limit_median_us"] = LATENCY_LIMIT_US[n]
            rec["met"] = rec["median_us"]["median"] <= LATENCY_LIMIT_US[n]
        out.append(rec)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        runs = [run for run in sorted(busbw) if op in busbw[run] and memcpy.get(run)]
        if not runs:
            continue
        fractions = [busbw[run][op] / statistics.mean(memcpy[run]) for run in runs]
        out.append({"record": "target", "backend": "threads", "what": "busbw at 64 MiB / memcpy at 64 MiB", "op": op,
                    "ranks": 2, "busbw_gbps": spread([busbw[run][op] for run in runs]),
                    "memcpy_gbps": spread([statistics.mean(memcpy[run]) for run in runs]),
                    "fraction": spread(fractions), "limit": BUSBW_LIMIT,
                    "met": statistics.median(fractions) >= BUSBW_LIMIT})
    for rec in out:
        print(json.dumps(rec))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--targets" in sys.argv and len(args) == 1:
        targets(args[0])
        return
    if len(args) != 2:
        sys.exit(__doc__)
    machine, memcpy, coll = load(args[0])
    plot(machine, memcpy, coll, args[1])
    if "--table" in sys.argv:
        table(memcpy, coll)


if __name__ == "__main__":
    main()
