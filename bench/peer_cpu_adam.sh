#!/usr/bin/env bash
# DeepSpeed's CPU Adam against zero's host update, side by side in one run: the same AdamW step on 2^24 fp32 elements at 1 and 2 threads.
#
# 1. DeepSpeedCPUAdam (deepspeed from PyPI; its cpu_adam op compiled by torch's JIT with DeepSpeed's
#    own flags, -O3 -march=native) in a venv: one parameter of 2^24 fp32 elements, adamw_mode,
#    OMP_NUM_THREADS=1 and 2, best and median of 7 steps after a warm-up step.
# 2. bench_host_loops at the same size (--mib 64: its largest array is 2^24 fp32 elements): memcpy,
#    zero's AdamW update on one thread (for_each at the CPU's best ISA) and over a thread_pool of 1 and 2
#    (engine_options::host_threads).
# The records (JSON lines, also written to --out): every measurement, then one "comparison" line per
# thread count: zero_over_deepspeed = zero's G elem/s over DeepSpeed's, from the best of 7 for both
# (target >= 1.0 at 1 and 2 threads), with the ISA zero ran and the CPU's flags DeepSpeed compiled for.
# A plot of the comparison goes beside --out where matplotlib is found.
#
# Where the venv cannot be made or deepspeed and torch cannot be installed (no registry), it says so
# and exits 0 without records: a skipped peer, not a failure.
#
# Usage: bench/peer_cpu_adam.sh [--build DIR] [--venv DIR] [--out FILE.jsonl]
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
venv=${ZERO_PEER_VENV:-$HOME/.cache/zero-peer-venv}
out=$root/bench/results/peer_cpu_adam.jsonl
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--venv DIR] [--out FILE.jsonl]" >&2; exit 2 ;;
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

# 1. DeepSpeed, one process per thread count (torch reads OMP_NUM_THREADS at start).
for threads in 1 2; do
  # (DeepSpeed logs to stdout: the record goes to the file named by the second argument)
  OMP_NUM_THREADS=$threads DS_BUILD_OPS=0 "$venv/bin/python" - "$threads" "$records" >&2 <<'PY' ||
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
                      "n": n, "gelem_per_s_best": n / times[0] / 1e9, "gelem_per_s_median": n / times[3] / 1e9,
                      "time_s": {"min": times[0], "median": times[3], "max": times[-1]}}), file=out)
PY
    skip "DeepSpeedCPUAdam did not build or run in $venv (its op needs a C++ compiler and torch's headers)"
done

# 2. zero at the same size, in one process: memcpy, the update on one thread, and on a pool of 1 and 2.
"$bench" --mib 64 --reps 7 |
  grep -E '"case": "memcpy"|"case": "adamw", "type": "fp32"' >>"$records"

isa=$(grep -o '"isa": "[a-z0-9]*"' "$records" | head -1 | cut -d'"' -f4)
flags=$(grep -o -w -E 'avx512f|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')
/usr/bin/python3 - "$records" "$isa" "$flags" >"$out" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in records:
    print(json.dumps(r))
ds = {r["threads"]: r for r in records if r["case"] == "deepspeed_cpu_adam"}
zero = {}
for r in records:
    if r["case"] == "adamw" and r["loop"].startswith("pool of "):
        t = int(r["loop"].split()[-1])
        zero[t] = r["n"] / r["time_s"]["min"] / 1e9
for t in sorted(ds):
    if t in zero:
        print(json.dumps({"case": "comparison", "threads": t, "zero_isa": sys.argv[2], "cpu_flags": sys.argv[3].strip(),
                          "zero_gelem_per_s": zero[t], "deepspeed_gelem_per_s": ds[t]["gelem_per_s_best"],
                          "zero_over_deepspeed": zero[t] / ds[t]["gelem_per_s_best"], "target": 1.0}))
PY
cat "$out"

plot=${out%.jsonl}.png
/usr/bin/python3 - "$out" "$plot" <<'PY' || echo "peer_cpu_adam: no plot (matplotlib missing)" >&2
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [json.loads(l) for l in open(sys.argv[1]) if '"comparison"' in l]
threads = [r["threads"] for r in rows]
fig, ax = plt.subplots(figsize=(5, 3.2))
w = 0.38
ax.bar([t - w / 2 for t in threads], [r["deepspeed_gelem_per_s"] for r in rows], w, label="DeepSpeedCPUAdam")
ax.bar([t + w / 2 for t in threads], [r["zero_gelem_per_s"] for r in rows], w,
       label="zero (host_threads, %s)" % rows[0]["zero_isa"])
ax.set_xticks(threads)
ax.set_xlabel("threads")
ax.set_ylabel("G elements / s (best of 7)")
ax.set_title("AdamW step, 2^24 fp32 elements")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("plot:", sys.argv[2], file=sys.stderr)
PY
