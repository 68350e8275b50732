#!/usr/bin/env bash
# DeepSpeed's CPU Adam against zero's host update, side by side in one run: the same AdamW step on 2^24 fp32 elements at 1 and 2 threads.
#
# 1. DeepSpeedCPUAdam (deepspeed from PyPI; its cpu_adam op compiled by torch's JIT with DeepSpeed's
#    own flags, -O3 -march=native) in a venv: one parameter of 2^24 fp32 elements, adamw_mode,
#    OMP_NUM_THREADS=1 and 2, best and median of 7 steps after a warm-up step.
# 2. bench_host_loops --adamw-only at the same size (--mib 64: its largest array is 2^24 fp32 elements):
#    memcpy, zero's AdamW update on one thread and over a thread_pool of 1 and 2 (engine_options::host_threads),
#    and a 1-rank engine's step() at host_threads 1 and 2, without and with the host offload tier; once on the engine's own allocation (huge pages) and
#    once on small pages (--small-pages: cache-line alignment on 4 KiB pages, as torch's allocator gives
#    DeepSpeed's tensors), which separates the loop from the memory it runs on.
# Both run --rounds times (default 3), interleaved. The records (JSON lines, also written to --out): every
# measurement, then one "comparison" line per zero figure (loop or engine step, pages) and thread count:
# zero_over_deepspeed = zero's best G elem/s over DeepSpeed's best, over all rounds (target >= 1.0 at 1 and 2
# threads), with the CPU's model, the ISA zero ran and the CPU's flags DeepSpeed compiled for.
# A plot of the comparison goes beside --out where matplotlib is found.
#
# Where the venv cannot be made or deepspeed and torch cannot be installed (no registry), it says so
# and exits 0 without records: a skipped peer, not a failure.
#
# Usage: bench/peer_cpu_adam.sh [--build DIR] [--venv DIR] [--out FILE.jsonl] [--rounds R]
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
venv=${ZERO_PEER_VENV:-$HOME/.cache/zero-peer-venv}
out=$root/bench/results/peer_cpu_adam.jsonl
rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--venv DIR] [--out FILE.jsonl] [--rounds R]" >&2; exit 2 ;;
  esac
done
bench=$build/bench/bench_host_loops
[ -x "$bench" ] || { echo "no $bench: build it first (ninja -C $build bench/bench_host_loops)" >&2; exit 1; }

skip() { echo "peer_cpu_adam: skipped: $*" >&2; exit 0; }
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv" 2>/dev/null ||
    skip "cannot make a venv at $venv (python3-venv missing?)"
fi
if ! "$venv/bin/python" -c "import deepspeed, torch" 2>/dev/null; then
  "$venv/bin/pip" install -q torch "deepspeed==0.19.8" ninja numpy >&2 ||
    skip "pip cannot install torch and deepspeed into $venv (no package registry?)"
fi

mkdir -p "$(dirname "$out")"
records=$(mktemp)
trap 'rm -f "$records"' EXIT

# Rounds, each: DeepSpeed at 1 and 2 threads (one process per thread count: torch reads OMP_NUM_THREADS at start),
# then zero in one process on the engine's memory and on small pages. The machine's memory bandwidth drifts
# between processes (other tenants, other builds): interleaving the peers and keeping each one's best over the
# rounds compares them under the same conditions.
for round in $(seq "$rounds"); do
  for threads in 1 2; do
    # (DeepSpeed logs to stdout: the record goes to the file named by the second argument)
    OMP_NUM_THREADS=$threads DS_BUILD_OPS=0 "$venv/bin/python" - "$threads" "$records" "$round" >&2 <<'PY' ||
import json, os, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
from deepspeed.ops.adam import DeepSpeedCPUAdam
n = 1 << 24
p = torch.nn.Parameter(torch.full((n,), 0.5))
p.grad = torch.full((n,), 1e-3)
opt = DeepSpeedCPUAdam([p], lr=1e-3, weight_decay=0.01, adamw_mode=True)
opt.step()  # warm: pages touched, the op loaded
times = []
for _ in range(7):
    t = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t)
times.sort()
import deepspeed
with open(sys.argv[2], "a") as out:
    print(json.dumps({"case": "deepspeed_cpu_adam", "version": deepspeed.__version__, "threads": int(sys.argv[1]),
                      "round": int(sys.argv[3]), "n": n, "gelem_per_s_best": n / times[0] / 1e9,
                      "gelem_per_s_median": n / times[3] / 1e9,
                      "time_s": {"min": times[0], "median": times[3], "max": times[-1]}}), file=out)
PY
      skip "DeepSpeedCPUAdam did not build or run in $venv (its op needs a C++ compiler and torch's headers)"
  done
  # zero at the same size: memcpy, the update on one thread and over a pool of 1 and 2, the 1-rank engine's step at
  # host_threads 1 and 2; on the engine's allocation, then on small pages (what torch's allocator gives DeepSpeed).
  for pages in "" --small-pages; do
    "$bench" --mib 64 --reps 7 --adamw-only $pages | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r["round"] = int(sys.argv[1])
    r.setdefault("pages", sys.argv[2])
    print(json.dumps(r))' "$round" "${pages:+small}" | sed 's/"pages": ""/"pages": "engine"/' >>"$records"
  done
done

isa=$(grep -o '"isa": "[a-z0-9]*"' "$records" | head -1 | cut -d'"' -f4)
flags=$(grep -o -w -E 'avx512f|avx512bw|avx512_bf16|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
/usr/bin/python3 - "$records" "$isa" "$flags" "$cpu" >"$out" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in records:
    print(json.dumps(r))
def best(rows):
    return max(rows) if rows else None
ds = {}
for r in records:
    if r["case"] == "deepspeed_cpu_adam":
        ds.setdefault(r["threads"], []).append(r["gelem_per_s_best"])
# zero's figures, the best over rounds: the loop over a pool of T threads and the engine's step at host_threads T,
# on the engine's memory and on small pages.
zero = {}
for r in records:
    if r["case"] != "adamw":
        continue
    loop = r["loop"]
    if loop.startswith("pool of "):
        key = ("loop", int(loop.split()[-1]))
    elif loop.startswith("engine step(), 1 rank") and r.get("pages") != "small":  # (the engine allocates its own)
        what = "engine step(), host offload" if "host offload" in loop else "engine step()"
        key = (what, int(loop.split(", ")[-1].split()[0]) if "threads" in loop else 1)
    else:
        continue
    zero.setdefault(key + (r.get("pages", "engine"),), []).append(r["n"] / r["time_s"]["min"] / 1e9)
for (what, t, pages), v in sorted(zero.items()):
    if t in ds:
        z, d = best(v), best(ds[t])
        print(json.dumps({"case": "comparison", "zero": what, "pages": pages, "threads": t, "rounds": len(v),
                          "cpu": sys.argv[4], "zero_isa": sys.argv[2], "cpu_flags": sys.argv[3].strip(),
                          "zero_gelem_per_s": z, "deepspeed_gelem_per_s": d, "zero_over_deepspeed": z / d,
                          "target": 1.0}))
PY
grep '"comparison"' "$out"

plot=${out%.jsonl}.png
/usr/bin/python3 - "$out" "$plot" <<'PY' || echo "peer_cpu_adam: no plot (matplotlib missing)" >&2
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [json.loads(l) for l in open(sys.argv[1]) if '"comparison"' in l]
threads = sorted({r["threads"] for r in rows})
series = [("DeepSpeedCPUAdam", lambda t: next(r["deepspeed_gelem_per_s"] for r in rows if r["threads"] == t))]
for what, pages in sorted({(r["zero"], r["pages"]) for r in rows}):
    series.append(("zero %s, %s pages" % (what, pages),
                   lambda t, what=what, pages=pages: next((r["zero_gelem_per_s"] for r in rows if r["threads"] == t
                                                           and r["zero"] == what and r["pages"] == pages), 0)))
fig, ax = plt.subplots(figsize=(6.4, 3.6))
w = 0.8 / len(series)
for i, (label, value) in enumerate(series):
    ax.bar([t - 0.4 + w * (i + 0.5) for t in threads], [value(t) for t in threads], w, label=label)
ax.set_xticks(threads)
ax.set_xlabel("threads")
ax.set_ylabel("G elements / s (best)")
ax.set_title("AdamW step, 2^24 fp32 elements (%s, %s)" % (rows[0]["cpu"], rows[0]["zero_isa"]), fontsize=8)
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("plot:", sys.argv[2], file=sys.stderr)
PY
