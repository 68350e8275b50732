#!/usr/bin/env bash
# The price of --reproducible: train_mlp's step time and bytes sent per step against the default mode, same
# model, micro-batches, stage and N, the two modes interleaved run by run; JSON lines with the ratios.
#
# Each configuration runs `repeats` times per mode, alternating default and reproducible, and the medians
# are compared (timings on a shared machine are noisy; only the ratio within one run of this script
# means anything). With --link-gbps G the runs also go through a modeled link (comm::modeled), where the
# wider words cost what they would on that network.
#
# Usage: bench/reproducible.sh [--build DIR] [--out FILE.jsonl] [--steps K] [--repeats R] [--link-gbps G]
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
out=$root/bench/results/reproducible.jsonl
steps=30
repeats=3
gbps=
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --link-gbps) gbps=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--out FILE.jsonl] [--steps K] [--repeats R] [--link-gbps G]" >&2; exit 2 ;;
  esac
done
train_mlp=$build/examples/train_mlp
[ -x "$train_mlp" ] || { echo "no $train_mlp: build it first (ninja -C $build examples/train_mlp)" >&2; exit 1; }
source "$root/bench/timed_build.sh"
require_timed_build "$build" examples_optimization
# The model; each configuration gives its batch and micro-batch (64 rows in micro-batches of 16: M = 4 / N
# per rank in both modes; 256 in 64: four times the compute per micro-batch, the same reductions).
model=(--in 512 --hidden 512 --layers 8 --steps "$steps" --json)
small=(--batch 64 --micro-batch 16)
large=(--batch 256 --micro-batch 64)
links=("")
[ -n "$gbps" ] && links+=("--link-gbps $gbps --link-latency-us 20")
mkdir -p "$(dirname "$out")"
: >"$out"

for link in "${links[@]}"; do
  for config in "${small[*]} --stage 2 --ranks 1" "${small[*]} --stage 2 --ranks 2" "${small[*]} --stage 2 --ranks 4" \
                "${small[*]} --stage 3 --ranks 4" "${small[*]} --stage 0 --ranks 4" \
                "${small[*]} --stage 2 --ranks 4 --precision bf16" "${large[*]} --stage 2 --ranks 1" \
                "${large[*]} --stage 2 --ranks 4"; do
    results=()
    for ((k = 0; k < repeats; k++)); do
      for mode in "" "--reproducible"; do
        # shellcheck disable=SC2086
        results+=("$("$train_mlp" $config $link $mode "${model[@]}" 2>/dev/null </dev/null | tail -n1)")
      done
    done
    python3 - "$config $link" "$(cut -d' ' -f1-3 /proc/loadavg)" "${results[@]}" >>"$out" <<'PY'
import json, statistics, sys
flags, load, runs = sys.argv[1].strip(), sys.argv[2], [json.loads(r) for r in sys.argv[3:]]
default = [r for r in runs if not r["reproducible"]]
repro = [r for r in runs if r["reproducible"]]
med = lambda rs, k: statistics.median(r[k] for r in rs)
r = {"bench": "reproducible", "flags": flags, "loadavg": load, "ranks": runs[0]["ranks"], "stage": runs[0]["stage"],
     "precision": runs[0]["precision"], "accum": runs[0]["accum"], "repeats": len(default),
     "default_step_s": med(default, "time_step_s"), "reproducible_step_s": med(repro, "time_step_s"),
     "default_bytes_per_step": default[0]["comm_bytes_per_rank_per_step"],
     "reproducible_bytes_per_step": repro[0]["comm_bytes_per_rank_per_step"],
     "default_hashes": sorted({x["param_hash"] for x in default}),
     "reproducible_hashes": sorted({x["param_hash"] for x in repro})}
r["time_ratio"] = r["reproducible_step_s"] / r["default_step_s"]
r["bytes_ratio"] = (r["reproducible_bytes_per_step"] / r["default_bytes_per_step"]
                    if r["default_bytes_per_step"] else None)
print(json.dumps(r))
b = f"{r['bytes_ratio']:.2f}x bytes" if r["bytes_ratio"] else "no traffic"
print(f"{flags:75s} default {1e3 * r['default_step_s']:8.2f} ms  reproducible {1e3 * r['reproducible_step_s']:8.2f} ms"
      f"  {r['time_ratio']:.2f}x time, {b}", file=sys.stderr)
PY
  done
done
echo "wrote $out" >&2
