#!/usr/bin/env bash
# train_mlp end to end: for each N and optimizer, stages 0-3 print the same param_hash, the measured
# model-state and communicated bytes equal the formulas, and the default run halves the loss.
# Usage: train_mlp_stages.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
check() {  # reads the JSON line, prints "hash", fails on a formula mismatch
  python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
assert j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"], j
assert j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
print(j["param_hash"])'
}
# Every optimizer the trainer offers (the library's list, zero/catalog.hpp), read from its --help.
e2e_run "$train_mlp" --help
e2e_sed optimizers 's/.*--optimizer TEXT:{\([^}]*\)}.*/\1/p'
optimizers=${optimizers//,/ }
echo "optimizers: $optimizers"
for opt in $optimizers; do
  for n in 1 3 4; do
    batch=$((n * 12))
    for stage in 0 1 2 3; do
      e2e_run "$train_mlp" --json --stage $stage --ranks $n --batch $batch --steps 25 --layers 3 --hidden 48 \
        --optimizer $opt
      e2e_filter h hex check
      echo "optimizer $opt N=$n stage $stage param_hash $h"
      [ "$stage" = 0 ] && first=$h
      e2e_same "$h" "$first" "optimizer $opt N=$n: stage $stage against stage 0"
    done
  done
done
# The demo's configuration, with each optimizer at its default rate: the loss must fall below half
# its first value.
for opt in $optimizers; do
  e2e_run "$train_mlp" --json --optimizer $opt
  python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
print("default run,", sys.argv[1] + ": loss", j["loss_first"], "->", j["loss_last"])
assert j["loss_last"] < 0.5 * j["loss_first"], j
assert j["stage"] == 3 and j["ranks"] == 4 and j["steps"] == 200, j
print("backend", j["backend"], "on", j.get("device", "the host"))' $opt <<<"$e2e_out" ||
    e2e_fail "the default run with $opt"
done
echo "1 passed, 0 failed"
