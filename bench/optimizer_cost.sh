#!/usr/bin/env bash
# The optimizer's part of a training step for each kind of optimizer against AdamW's, in one run: train_mlp's time_optimizer_s.
#
# train_mlp --hidden 1024 (2.18M parameters, fp32, stage 3) on 1 rank, for AdamW (element-wise), LAMB
# (tensor-wise: the per-tensor sums) and Muon (matrix: the Newton-Schulz products), at
# --host-threads 1 and 2, run --rounds times interleaved (this machine's memory bandwidth drifts between
# processes, so only figures of one run compare); each optimizer's best time_optimizer_s over the
# rounds, and its ratio to AdamW's at the same thread count (targets: LAMB <= 1.5, Muon as its products
# allow, see bench_host_loops' products cases). One JSON line per measurement and one "ratio" line per
# optimizer and thread count, with the CPU's model and the ISA the host loop ran, also written to --out.
# --isa LEVEL caps the host loops (train_mlp --host-isa: avx2 measures an AVX2 machine's loops on an
# AVX-512 one; the same bits).
#
# Usage: bench/optimizer_cost.sh [--build DIR] [--out FILE.jsonl] [--rounds R] [--steps S] [--optimizers "lamb muon"]
#                                [--isa avx512|avx2|sse2|scalar]
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
out=$root/bench/results/optimizer_cost.jsonl
rounds=3
steps=12
optimizers="lamb muon"
isa_flag=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --optimizers) optimizers=$2; shift 2 ;;
    --isa) isa_flag=(--host-isa "$2"); shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--out FILE.jsonl] [--rounds R] [--steps S] [--optimizers LIST] [--isa LEVEL]" >&2
       exit 2 ;;
  esac
done
trainer=$build/examples/train_mlp
[ -x "$trainer" ] || { echo "no $trainer: build it first (ninja -C $build examples/train_mlp)" >&2; exit 1; }
source "$root/bench/timed_build.sh"
require_timed_build "$build" examples_optimization
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mkdir -p "$(dirname "$out")"
records=$(mktemp)
trap 'rm -f "$records"' EXIT
for round in $(seq 1 "$rounds"); do
  for threads in 1 2; do
    for opt in adamw $optimizers; do
      line=$("$trainer" --hidden 1024 --ranks 1 --steps "$steps" --optimizer "$opt" --host-threads "$threads" \
        "${isa_flag[@]}" --json | tail -n 1)
      python3 - "$line" "$opt" "$threads" "$round" "$cpu" <<'EOF' | tee -a "$records"
import json, sys
r = json.loads(sys.argv[1])
print(json.dumps({"case": "train_mlp optimizer time", "optimizer": sys.argv[2], "host_threads": int(sys.argv[3]),
                  "round": int(sys.argv[4]), "time_optimizer_s": r["time_optimizer_s"],
                  "params": r["params"], "isa": r["host_isa"], "cpu": sys.argv[5]}))
EOF
    done
  done
done
python3 - "$records" <<'EOF' | tee -a "$records"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best = {}
for r in rows:
    k = (r["optimizer"], r["host_threads"])
    best[k] = min(best.get(k, float("inf")), r["time_optimizer_s"])
for (opt, threads), t in sorted(best.items()):
    if opt == "adamw":
        continue
    base = best[("adamw", threads)]
    print(json.dumps({"case": "ratio", "optimizer": opt, "host_threads": threads, "time_optimizer_s": t,
                      "adamw_s": base, "over_adamw": round(t / base, 2), "isa": rows[0]["isa"], "cpu": rows[0]["cpu"]}))
EOF
cat "$records" >> "$out"
