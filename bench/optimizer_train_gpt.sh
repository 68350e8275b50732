#!/usr/bin/env bash
# Optimizers against each other on train_gpt: the same model, data and schedule, a run per (optimizer, rate, steps,
# seed), each run's losses and wall time as a JSON line, and --log curves for plot_run.py.
# Usage: bench/optimizer_train_gpt.sh TRAIN_GPT OUT.jsonl LOGDIR RUN...
#   RUN: tag:optimizer:lr:steps:seed, e.g. muon-s1:muon:2e-2:1000:1
# The corpus is fixed (the Debian licence texts in /usr/share/common-licenses, 143 KB), so the figures do not move
# with this repository's docs; --warmup 100 (linear warm-up, then a cosine decay to a tenth at the last step).
# ZERO_BENCH_ARGS adds flags to every run (e.g. --stage 2).
set -eu
train_gpt=$1
out=$2
logdir=$3
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/timed_build.sh"
require_timed_build "$(dirname "$(dirname "$train_gpt")")" examples_optimization
licences=/usr/share/common-licenses
data=()
for f in GPL-3 GPL-2 LGPL-2.1 Apache-2.0 MPL-2.0 GFDL-1.3 Artistic CC0-1.0; do data+=(--data "$licences/$f"); done
mkdir -p "$logdir"
for run in "$@"; do
  IFS=: read -r tag optimizer lr steps seed <<<"$run"
  args=(--optimizer "$optimizer" --lr "$lr" --steps "$steps" --seed "$seed")
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$train_gpt" --sample 0 --json --warmup 100 "${data[@]}" "${args[@]}" ${ZERO_BENCH_ARGS:-} \
    --log "$logdir/$tag.jsonl" | tail -n 1 >"$logdir/$tag.json"
  end=$(date +%s.%N)
  python3 - "$logdir/$tag.json" "$tag" "${args[*]} ${ZERO_BENCH_ARGS:-}" "$start" "$end" "$steps" >>"$out" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read())
print(json.dumps({"tag": sys.argv[2], "args": sys.argv[3].strip(), "train": round(j["loss_train_eval"], 4),
                  "held": round(j["loss_held_out"], 4), "seconds": round(float(sys.argv[5]) - float(sys.argv[4]), 2),
                  "ms_per_step": round(j["ms_per_step"], 2), "steps": int(sys.argv[6])}))
PY
  tail -n 1 "$out"
done
